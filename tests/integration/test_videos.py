"""The `wan` video pipeline and the /v1/videos job API end to end: launcher -> tritonserver (wan_text_encoder,
wan_dit, wan_vae, wan) -> frontend job runner + SQLite store, driven with the openai SDK, httpx and
tritonclient; frames compared with diffusers' own WanPipeline on the same tiny checkpoint."""
from __future__ import annotations

import base64
import io
import json
import time
import warnings

import av
import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omni_backends.paths import model_home
from omni_bench.cli import main as bench_main
from omni_backends.wan import loading
from omni_backends.wan.serving.protocol import TINY
from omni_frontend.videos import encoding
from tests.harness import batched_finals, metric_value, overlapping_streams, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
# A job that runs for many seconds on the tiny model (cancel / queue / restart tests; deleted before it ends).
LONG = {"size": "256x256", "seconds": "1", "num_inference_steps": 200}
STAGES = ("wan", "wan_dit")


@pytest.fixture(scope="module")
def reference():
    """diffusers' WanPipeline on the tiny checkpoint; frames as uint8 [F, H, W, 3] like the pipeline's VIDEO."""
    pipe = loading.reference_pipeline(model_home() / TINY)

    def frames(prompt, *, width, height, num_frames, steps, seed, guidance_scale, guidance_scale_2=None,
               negative_prompt=""):
        with torch.no_grad():
            out = pipe(prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
                       num_inference_steps=steps, guidance_scale=guidance_scale, guidance_scale_2=guidance_scale_2,
                       generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
        return (out * 255).round().astype(np.uint8)
    return frames


def _client(server) -> openai.OpenAI:
    warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks the Sora API deprecated
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _create(server, **body) -> dict:
    response = httpx.post(f"{server.base_url}/v1/videos", json={"model": "wan", **body}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _get(server, video_id: str) -> dict:
    return httpx.get(f"{server.base_url}/v1/videos/{video_id}", timeout=30).json()


def _wait_status(server, video_id: str, statuses: tuple[str, ...], timeout_s: float = 120) -> dict:
    found = wait_for(lambda: (v := _get(server, video_id))["status"] in statuses and v, timeout_s, interval_s=0.05)
    assert found, f"{video_id} never reached {statuses}: {_get(server, video_id)}"
    return found


def _decode(data: bytes) -> tuple[np.ndarray, av.VideoStream]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        return frames, stream


def _delete_all(server) -> None:
    for video in httpx.get(f"{server.base_url}/v1/videos", params={"limit": 100}).json()["data"]:
        httpx.delete(f"{server.base_url}/v1/videos/{video['id']}", timeout=30)


def test_sync_create_answers_the_finished_mp4_and_a_leaving_client_deletes_its_job(wan_server):
    body = {"model": "wan", "prompt": "a red ball", "size": "64x64", "seconds": "1", "num_inference_steps": 2,
            "seed": 3}
    response = httpx.post(f"{wan_server.base_url}/v1/videos/sync", json=body, timeout=120)
    assert response.status_code == 200 and response.headers["content-type"] == "video/mp4", response.text
    video_id = response.headers["x-video-id"]
    frames, stream = _decode(response.content)
    assert frames.shape == (17, 64, 64, 3) and stream.codec_context.name == "h264"
    job = _get(wan_server, video_id)   # the job stays in the store, as a polled one does
    assert (job["status"], job["seed"], job["num_inference_steps"]) == ("completed", 3, 2)
    assert httpx.get(f"{wan_server.base_url}/v1/videos/{video_id}/content").content == response.content
    refused = httpx.post(f"{wan_server.base_url}/v1/videos/sync", json={**body, "size": "65x64"}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "size"
    # a client that leaves: its job is cancelled and deleted
    before = {v["id"] for v in httpx.get(f"{wan_server.base_url}/v1/videos", params={"limit": 100}).json()["data"]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{wan_server.base_url}/v1/videos/sync", json={"model": "wan", "prompt": "long", **LONG}, timeout=2)
    assert wait_for(lambda: {v["id"] for v in httpx.get(f"{wan_server.base_url}/v1/videos",
                                                        params={"limit": 100}).json()["data"]} == before, 30)
    assert wait_for(lambda: metric_value(wan_server.metrics_url, "omni_inflight_requests", model="wan_dit") == 0, 30)
    assert httpx.delete(f"{wan_server.base_url}/v1/videos/{video_id}").status_code == 200


def test_create_poll_download_with_the_sdk(wan_server, reference, tmp_path):
    client = _client(wan_server)
    video = client.videos.create(prompt="a cat walking on the grass", model="wan", size="64x64", seconds="1",
                                 extra_body={"num_inference_steps": 4, "seed": 7, "guidance_scale": 5.0,
                                             "negative_prompt": "blurry"})
    assert (video.object, video.status, video.progress, video.size, video.seconds) == ("video", "queued", 0, "64x64", "1")
    seen = []
    while video.status in ("queued", "in_progress"):
        seen.append(video.progress)
        time.sleep(0.02)
        video = client.videos.retrieve(video.id)
    assert video.status == "completed" and video.progress == 100 and video.error is None, video
    assert seen == sorted(seen) and video.completed_at >= video.created_at and video.expires_at > video.completed_at
    data = client.videos.download_content(video.id).read()
    frames, stream = _decode(data)
    assert frames.shape == (17, 64, 64, 3)                          # 1 s at 16 fps -> 4k+1 = 17 frames
    assert stream.codec_context.name == "h264" and stream.average_rate == 16
    expected = reference("a cat walking on the grass", width=64, height=64, num_frames=17, steps=4, seed=7,
                         guidance_scale=5.0, guidance_scale_2=3.0, negative_prompt="blurry")
    # The MP4 holds exactly diffusers' frames up to the codec: it decodes to what encoding them does ...
    local = tmp_path / "expected.mp4"
    encoding.write_mp4(expected, 16, local)
    assert np.array_equal(frames, _decode(local.read_bytes())[0])
    # ... and the codec's loss is what H.264 4:2:0 costs on a random model's noisy frames (PSNR ~25 dB).
    assert 10 * np.log10(255**2 / ((frames.astype(np.float64) - expected) ** 2).mean()) > 20
    thumbnail = client.videos.download_content(video.id, variant="thumbnail")
    assert thumbnail.response.headers["content-type"] == "image/webp"
    image = Image.open(io.BytesIO(thumbnail.read()))
    assert (image.format, image.size) == ("WEBP", (64, 64))
    assert np.array_equal(np.asarray(image.convert("RGB")), expected[0])   # lossless first frame
    sheet = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").read()))
    assert (sheet.format, sheet.size) == ("JPEG", (4 * 64, 4 * 64))         # 16 frames on a 4 x 4 grid
    # byte ranges, as players ask; a malformed Range is ignored (whole file), one outside the file a 416 envelope
    url = f"{wan_server.base_url}/v1/videos/{video.id}/content"
    part = httpx.get(url, headers={"range": "bytes=4-11"})
    assert part.status_code == 206 and part.content == data[4:12]
    for malformed in ("bytes=5-1", "garbage"):
        whole = httpx.get(url, headers={"range": malformed})
        assert whole.status_code == 200 and whole.content == data, malformed
    outside = httpx.get(url, headers={"range": f"bytes={len(data) + 10}-"})
    assert outside.status_code == 416 and outside.headers["content-range"] == f"bytes */{len(data)}"
    assert outside.json()["error"]["code"] == "range_not_satisfiable"
    page = client.videos.list(limit=1)
    assert [v.id for v in page.data] == [video.id]
    assert client.videos.delete(video.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_pipeline_frames_bit_equal_to_diffusers_while_batched(wan_server, reference):
    """Two concurrent requests straight to the `wan` Triton model share wan_dit forwards (batch_jobs 2: same
    latent shape, different prompts, seeds, step counts and CFG), yet each video's uint8 frames equal
    WanPipeline's with the same seed, bit for bit (two experts). The second is sent once the first is
    denoising, which has steps enough left for the second to join (200, the most: at 60 a quiet machine's first
    request once finished before the second's text encoding was done); the long one without CFG (half the forwards,
    here and in the reference), the short one with it."""
    bodies = [dict(prompt="a cat walking on the grass", width=48, height=32, num_frames=9,
                   num_inference_steps=200, guidance_scale=1.0, seed=3),
              dict(prompt="waves crashing on a beach at sunset", negative_prompt="blurry", width=48, height=32,
                   num_frames=9, num_inference_steps=6, guidance_scale=5.0, seed=11)]
    results = overlapping_streams(wan_server.grpc_url, "wan", bodies, "VIDEO")
    for body, (done, video) in zip(bodies, batched_finals(bodies, results)):
        assert done == {"type": "video", "num_frames": body["num_frames"], "width": body["width"],
                        "height": body["height"], "fps": 16, "seed": body["seed"]}
        expected = reference(body["prompt"], width=body["width"], height=body["height"],
                             num_frames=body["num_frames"], steps=body["num_inference_steps"], seed=body["seed"],
                             guidance_scale=body["guidance_scale"], guidance_scale_2=3.0,
                             negative_prompt=body.get("negative_prompt", ""))
        assert video.dtype == np.uint8 and np.array_equal(video, expected)


def test_delete_while_running_cancels_the_stage_work(wan_server):
    metrics = wan_server.metrics_url
    before = metric_value(metrics, "omni_requests_total", model="wan_dit", outcome="cancelled") or 0
    video = _create(wan_server, prompt="a slow pan", **LONG)
    running = wait_for(lambda: (v := _get(wan_server, video["id"]))["progress"] > 0 and v, 120, interval_s=0.02)
    assert running and running["status"] == "in_progress" and 0 < running["progress"] < 100
    assert all(metric_value(metrics, "omni_inflight_requests", model=m) == 1 for m in STAGES)
    deleted = httpx.delete(f"{wan_server.base_url}/v1/videos/{video['id']}", timeout=30)
    assert deleted.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
    assert wait_for(lambda: all(metric_value(metrics, "omni_inflight_requests", model=m) == 0 for m in STAGES), 5)
    assert metric_value(metrics, "omni_requests_total", model="wan_dit", outcome="cancelled") == before + 1
    assert httpx.get(f"{wan_server.base_url}/v1/videos/{video['id']}").status_code == 404
    assert httpx.get(f"{wan_server.base_url}/v1/videos", params={"limit": 100}).json()["data"] == []


def test_queue_full_gets_429(wan_server):
    """--max-running-videos 1 --max-queued-videos 2: one generating, two waiting, the next is refused."""
    first = _create(wan_server, prompt="long", **LONG)
    _wait_status(wan_server, first["id"], ("in_progress",))
    waiting = [_create(wan_server, prompt=f"waiting {i}", size="32x32", seconds="0.5") for i in range(2)]
    assert [_get(wan_server, v["id"])["status"] for v in waiting] == ["queued", "queued"]
    refused = httpx.post(f"{wan_server.base_url}/v1/videos", json={"prompt": "one too many", "size": "32x32"})
    assert refused.status_code == 429
    assert refused.json()["error"] == {"message": refused.json()["error"]["message"], "type": "rate_limit_error",
                                       "param": None, "code": "queue_full"}
    listed = httpx.get(f"{wan_server.base_url}/v1/videos").json()
    assert [v["id"] for v in listed["data"]] == [waiting[1]["id"], waiting[0]["id"], first["id"]]  # newest first
    _delete_all(wan_server)


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(out, "PNG")
    return out.getvalue()


REFERENCE_PNG = base64.b64encode(_png()).decode()


@pytest.mark.parametrize("body, param, code", [
    ({"size": "100x100"}, "size", None),
    ({"size": "64"}, "size", None),
    ({"size": "4096x4096"}, "size", None),
    ({"seconds": "0"}, "seconds", None),
    ({"seconds": "soon"}, "seconds", None),
    ({"seconds": "60"}, "seconds", None),                       # 961 frames: over the model's 81
    ({"num_frames": 10}, "num_frames", None),                   # not 4k+1
    ({"prompt": ""}, "prompt", "empty_prompt"),
    ({"prompt": None}, "prompt", "invalid_value"),
    ({"num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
    ({"num_inference_steps": 201}, "num_inference_steps", None),
    ({"seed": "7"}, "seed", "invalid_value"),                   # JSON types are strict
    ({"fps": "16"}, "fps", "invalid_value"),
    ({"num_frames": 5.0}, "num_frames", "invalid_value"),
    ({"guidance_scale": "4"}, "guidance_scale", "invalid_value"),
    ({"num_inference_steps": True}, "num_inference_steps", "invalid_value"),
    ({"resolution": "hd"}, "resolution", "unsupported_parameter"),   # unknown field
    ({"input_reference": {"image_url": f"data:image/png;base64,{REFERENCE_PNG}"}}, "input_reference",
     "unsupported_parameter"),                                  # text-to-video checkpoint
    ({"input_reference": {"image_url": "https://example.com/cat.png"}}, "input_reference", None),
])
def test_bad_create_requests_get_400(wan_server, body, param, code):
    response = httpx.post(f"{wan_server.base_url}/v1/videos", json={"prompt": "a cat", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code) and error["message"]


def test_bad_lookups_get_404_and_400(wan_server):
    base = wan_server.base_url
    # an unknown model is a 404 model_not_found, as on the chat, speech and image routes (it was a 400 here)
    unknown = httpx.post(f"{base}/v1/videos", json={"prompt": "a cat", "model": "sora-3"})
    assert unknown.status_code == 404, unknown.text
    assert (unknown.json()["error"]["type"], unknown.json()["error"]["param"], unknown.json()["error"]["code"]) == (
        "not_found_error", "model", "model_not_found")
    for method, path in (("GET", "/v1/videos/video_nope"), ("DELETE", "/v1/videos/video_nope"),
                         ("GET", "/v1/videos/video_nope/content")):
        response = httpx.request(method, base + path)
        assert response.status_code == 404 and response.json()["error"]["code"] == "video_not_found", response.text
    for params in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "video_nope"}):
        response = httpx.get(f"{base}/v1/videos", params=params)
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error", params
    # multipart (what the SDK sends) with an image file: refused for a text-to-video checkpoint
    files = {"input_reference": ("ref.png", _png(), "image/png")}
    response = httpx.post(f"{base}/v1/videos", data={"prompt": "a cat", "size": "32x32"}, files=files)
    assert response.status_code == 400 and response.json()["error"]["param"] == "input_reference"
    video = _create(wan_server, prompt="not yet", **LONG)
    early = httpx.get(f"{base}/v1/videos/{video['id']}/content")
    assert early.status_code == 400 and early.json()["error"]["code"] == "video_not_ready"
    assert httpx.get(f"{base}/v1/videos/{video['id']}/content", params={"variant": "gif"}).status_code == 400
    _delete_all(wan_server)


def test_bench_videos_workload_with_inprocess_baseline(wan_server, tmp_path):
    out = tmp_path / "videos.json"
    code = bench_main(["--base-url", wan_server.base_url, "--workload", "videos", "--num-prompts", "2",
                       "--num-warmups", "0", "--size", "32x32", "--frames", "5", "--steps", "2",
                       "--baseline", "inprocess", "--result-json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    level, baseline = result["levels"][0], result["baseline"]
    assert level["model"] == "wan" and level["summary"]["completed"] == 2
    assert [r["video_frames"] for r in level["requests"]] == [5, 5] == [r["video_frames"] for r in baseline["requests"]]
    assert level["summary"]["throughput"]["video_frames_per_s"] > 0 and "frames_per_second" in baseline["comparison"]
    assert httpx.get(f"{wan_server.base_url}/v1/videos").json()["data"] == []     # the bench deletes its videos


def test_a_job_queued_when_wan_sleeps_stays_queued_and_runs_after_the_wake(wan_server):
    """Sleeping `wan` with one job generating and one queued (--max-running-videos 1): the sleep lets the running
    one finish, the queued one stays `queued` while the pipeline sleeps and completes after the wake (it used to be
    started against the unloaded model and failed: "Request for unknown model: 'wan' has no available versions")."""
    running = _create(wan_server, prompt="running", size="64x64", seconds="1", num_inference_steps=20, seed=1)
    _wait_status(wan_server, running["id"], ("in_progress",))
    queued = _create(wan_server, prompt="queued", size="32x32", seconds="0.5", num_inference_steps=2, seed=1)
    admin = f"{wan_server.base_url}/v1/admin/pipelines/wan"
    try:
        slept = httpx.post(f"{admin}/sleep", timeout=120).json()
        assert slept["state"] == "sleeping" and slept["pending"] == [], slept
        assert _get(wan_server, running["id"])["status"] == "completed"
        time.sleep(1)   # the worker is free: nothing starts while the pipeline sleeps
        assert _get(wan_server, queued["id"])["status"] == "queued"
        assert httpx.post(f"{wan_server.base_url}/v1/videos", json={"prompt": "new"}).status_code == 503
    finally:
        woke = httpx.post(f"{admin}/wake", timeout=300).json()
    assert woke["state"] == "awake", woke
    done = _wait_status(wan_server, queued["id"], ("completed", "failed"))
    assert done["status"] == "completed" and done["error"] is None, done
    _delete_all(wan_server)


def test_restart_keeps_finished_videos_and_fails_interrupted_ones(wan_server):
    """Runs last (it restarts the shared server): completed jobs and their files survive; the job that was
    generating when the server stopped comes back failed with a clear error."""
    done = _create(wan_server, prompt="a red car driving at night", size="32x32", seconds="0.5",
                   num_inference_steps=3, seed=1)
    done = _wait_status(wan_server, done["id"], ("completed",))
    content = httpx.get(f"{wan_server.base_url}/v1/videos/{done['id']}/content").content
    interrupted = _create(wan_server, prompt="long", **LONG)
    _wait_status(wan_server, interrupted["id"], ("in_progress",))
    assert wan_server.restart() == 130
    assert _get(wan_server, done["id"]) == done
    assert httpx.get(f"{wan_server.base_url}/v1/videos/{done['id']}/content").content == content
    failed = _get(wan_server, interrupted["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_shutdown", failed
    assert [v.id for v in _client(wan_server).videos.list().data] == [interrupted["id"], done["id"]]
    _delete_all(wan_server)
