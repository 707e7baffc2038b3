"""The /v1/videos building blocks without a server: the SQLite job store (pagination, expiry, persistence),
PyAV/Pillow encoding, request resolution against a pipeline's limits, the runner's restart recovery, and its
queued jobs across a sleep of their pipeline (a Triton double under the real ModelControl)."""
from __future__ import annotations

import asyncio
import io
import json
import sqlite3

import av
import numpy as np
import pytest
from PIL import Image

from omni_frontend.errors import APIError, from_triton_message
from omni_frontend import model_control
from omni_frontend.model_control import ModelControl
from omni_frontend.pipelines import REGISTRY
from omni_frontend.routes.videos import VideoCreateRequest, resolve_params
from omni_frontend.triton_client import StreamResponse, TritonClient
from omni_frontend.tritonserver import free_port
from omni_frontend.videos import encoding
from omni_frontend.videos.runner import EVENT, VIDEO, VideoRunner, progress_percent
from omni_frontend.videos.store import COMPLETED, FAILED, IN_PROGRESS, QUEUED, VideoStore

pytestmark = pytest.mark.unit
DESCRIBED = {"defaults": {"size": "128x128", "seconds": "1", "fps": 16, "num_inference_steps": 20,
                          "guidance_scale": 4.0, "negative_prompt": ""},
             "limits": {"size_multiple": 16, "frame_step": 4, "max_width": 512, "max_height": 512, "max_frames": 81,
                        "max_inference_steps": 200, "max_reference_pixels": 1 << 24}, "image_to_video": False}


def _job(store: VideoStore, video_id: str, created_at: int = 1000):
    return store.create(video_id, model="wan", prompt=f"prompt of {video_id}", seconds="1", size="64x64",
                        params={"seed": 1, "fps": 16, "num_frames": 17, "num_inference_steps": 4}, created_at=created_at)


def test_store_lists_newest_first_with_cursor_pagination(tmp_path):
    store = VideoStore(tmp_path)
    for i in range(5):
        _job(store, f"video_{i}")
    page, more = store.list(limit=2)
    assert [j.id for j in page] == ["video_4", "video_3"] and more
    page, more = store.list(limit=2, after="video_3")
    assert [j.id for j in page] == ["video_2", "video_1"] and more
    page, more = store.list(limit=2, after="video_1")
    assert [j.id for j in page] == ["video_0"] and not more
    assert [j.id for j in store.list(limit=10, order="asc")[0]] == [f"video_{i}" for i in range(5)]
    with pytest.raises(KeyError):
        store.list(limit=2, after="video_missing")


def test_store_lifecycle_persists_across_connections(tmp_path):
    store = VideoStore(tmp_path)
    job = _job(store, "video_a")
    assert job.to_object()["status"] == QUEUED and job.to_object()["progress"] == 0
    assert store.start("video_a") and not store.start("video_a")       # queued -> in_progress once
    store.set_progress("video_a", 40)
    (store.job_dir("video_a") / "video.mp4").write_bytes(b"mp4")
    store.complete("video_a", inference_time_s=1.5, ttl_s=60)
    store.close()
    reopened = VideoStore(tmp_path)                                     # a restarted server
    obj = reopened.get("video_a").to_object()
    assert (obj["status"], obj["progress"], obj["expires_at"] - obj["completed_at"]) == (COMPLETED, 100, 60)
    assert obj["seed"] == 1 and obj["inference_time_s"] == 1.5
    assert (reopened.job_dir("video_a") / "video.mp4").read_bytes() == b"mp4"
    assert sqlite3.connect(tmp_path / "videos.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_expiry_removes_rows_and_files(tmp_path):
    store = VideoStore(tmp_path)
    for name in ("video_old", "video_new", "video_failed"):
        _job(store, name)
        store.start(name)
    store.complete("video_old", inference_time_s=1.0, ttl_s=10)
    store.complete("video_new", inference_time_s=1.0, ttl_s=10_000)
    store.fail("video_failed", "boom", "it broke", ttl_s=10)
    expires = store.get("video_old").expires_at
    assert store.delete_expired(now=expires - 1) == []
    assert sorted(store.delete_expired(now=expires)) == ["video_failed", "video_old"]
    assert store.get("video_old") is None and not store.job_dir("video_old").exists()
    assert store.get("video_new").status == COMPLETED and store.job_dir("video_new").exists()


def _frames(count=9, height=32, width=48) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([np.stack([x * 4 + t * 8, y * 6, np.full_like(x, 128)], -1)   # smooth moving ramps
                     for t in range(count)]).astype(np.uint8)


def test_encoding_writes_an_mp4_thumbnail_and_spritesheet(tmp_path):
    frames = _frames()
    encoding.write_assets(frames, 16, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spritesheet.jpg", "thumbnail.webp", "video.mp4"]
    with av.open(str(tmp_path / "video.mp4")) as container:
        stream = container.streams.video[0]
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        assert (stream.codec_context.name, stream.average_rate, container.format.name.split(",")[0]) == ("h264", 16, "mov")
    assert decoded.shape == frames.shape and np.abs(decoded.astype(int) - frames).mean() < 4
    thumbnail = Image.open(tmp_path / "thumbnail.webp")
    assert np.array_equal(np.asarray(thumbnail.convert("RGB")), frames[0])
    assert Image.open(tmp_path / "spritesheet.jpg").size == (3 * 48, 3 * 32)      # 9 frames -> 3 x 3
    with pytest.raises(ValueError):
        encoding.write_mp4(frames[:, :31], 16, tmp_path / "odd.mp4")
    png = io.BytesIO()
    Image.fromarray(frames[0]).save(png, "PNG")
    assert np.array_equal(encoding.decode_image(png.getvalue(), max_pixels=10_000), frames[0])
    for bad, pixels in ((b"not an image", 10_000), (png.getvalue(), 100)):
        with pytest.raises(ValueError):
            encoding.decode_image(bad, max_pixels=pixels)


@pytest.mark.parametrize("fields, expected", [
    ({}, {"width": 128, "height": 128, "num_frames": 17, "fps": 16, "num_inference_steps": 20, "seconds": "1"}),
    ({"seconds": "4", "fps": 8, "size": "64x32"}, {"width": 64, "height": 32, "num_frames": 33, "seconds": "4"}),
    ({"seconds": 2.5}, {"num_frames": 41, "seconds": "2.5"}),
    ({"num_frames": 21}, {"num_frames": 21, "seconds": "1.25"}),
    ({"seconds": "1", "num_frames": 17}, {"num_frames": 17, "seconds": "1"}),   # both, agreeing at 16 fps
    ({"seconds": "1", "fps": 4, "num_frames": 5}, {"num_frames": 5, "fps": 4, "seconds": "1"}),
])
def test_resolve_params_fills_defaults_and_rounds_frames_to_4k_plus_1(fields, expected):
    params, seconds, size = resolve_params(VideoCreateRequest(prompt="a cat", **fields), DESCRIBED)
    found = {**params, "seconds": seconds}
    assert {k: found[k] for k in expected} == expected
    assert size == f"{params['width']}x{params['height']}" and 0 <= params["seed"] < 2**31


@pytest.mark.parametrize("fields, param", [({"size": "100x100"}, "size"), ({"size": "1024x1024"}, "size"),
                                           ({"seconds": "-1"}, "seconds"), ({"seconds": "6"}, "seconds"),
                                           ({"seconds": "inf"}, "seconds"), ({"seconds": "1e308"}, "seconds"),
                                           ({"num_frames": 8}, "num_frames"), ({"num_inference_steps": 201},
                                                                               "num_inference_steps")])
def test_resolve_params_rejects_what_the_model_cannot_do(fields, param):
    with pytest.raises(APIError) as err:
        resolve_params(VideoCreateRequest(prompt="a cat", **fields), DESCRIBED)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("fields, made", [
    ({"seconds": "1", "num_frames": 5}, "seconds 1 at 16 fps makes 17 frames"),
    ({"seconds": 2, "num_frames": 17}, "seconds 2 at 16 fps makes 33 frames"),
    ({"seconds": "1", "fps": 8, "num_frames": 17}, "seconds 1 at 8 fps makes 9 frames")])
def test_seconds_and_num_frames_that_disagree_are_a_400(fields, made):
    """The job states `seconds`: a num_frames making another length would be a video of another length than
    the job says (a 5-frame video, ~0.3 s at 16 fps, reported as 1 s)."""
    with pytest.raises(APIError) as err:
        resolve_params(VideoCreateRequest(prompt="a cat", **fields), DESCRIBED)
    assert (err.value.status, err.value.param, err.value.code) == (400, "num_frames", "conflicting_parameters")
    assert err.value.message.startswith(f"{made} but num_frames is {fields['num_frames']}")


def test_progress_reaches_100_only_when_the_video_is_done():
    assert [progress_percent(s, 4) for s in range(5)] == [0, 20, 40, 60, 80]
    assert progress_percent(200, 200) == 99


def test_runner_restart_fails_interrupted_jobs_and_runs_queued_ones(tmp_path):
    """In-progress jobs of a server that died come back failed; queued ones are taken up again (here the
    pipeline is unreachable, so running it fails with a 503 error, which shows it was run)."""
    store = VideoStore(tmp_path)
    for name in ("video_running", "video_waiting"):
        _job(store, name)
    store.start("video_running")

    async def restart():
        triton = TritonClient(f"127.0.0.1:{free_port()}", timeout_s=5)
        runner = VideoRunner(store, triton, {"wan": "wan"}, max_queued=4, max_running=1, ttl_s=None)
        await runner.start()
        for _ in range(200):
            if store.get("video_waiting").status == FAILED:
                break
            await asyncio.sleep(0.05)
        await runner.stop()
        await triton.close()

    asyncio.run(restart())
    running, waiting = store.get("video_running"), store.get("video_waiting")
    assert running.status == FAILED and running.error["code"] == "server_restarted"
    assert waiting.status == FAILED and waiting.error["code"] == "triton_unavailable", waiting.error
    assert store.count(IN_PROGRESS) == store.count(QUEUED) == 0


def test_runner_stop_ends_a_worker_whose_job_finished_as_the_server_stopped(tmp_path):
    """The shutdown cancels the workers; a worker whose job had just finished (its task done, the worker not yet
    resumed) took the cancellation for a DELETE of that job, swallowed it and waited for the next job: stop()
    never returned."""
    store = VideoStore(tmp_path)
    _job(store, "video_last")

    async def scenario():
        triton = TritonClient(f"127.0.0.1:{free_port()}", timeout_s=5)
        runner = VideoRunner(store, triton, {"wan": "wan"}, max_queued=4, max_running=1, ttl_s=None)
        stopping = []

        async def finish_as_the_server_stops(job, _sleeps):
            store.complete(job.id, inference_time_s=0.0, ttl_s=None)
            stopping.append(asyncio.create_task(runner.stop()))   # the shutdown lands right as the job ends

        runner._run = finish_as_the_server_stops
        await runner.start()
        for _ in range(100):
            if stopping:
                break
            await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(stopping[0], 5)
        finally:
            await triton.close()

    asyncio.run(scenario())
    assert store.get("video_last").status == COMPLETED


class _Triton:
    """A Triton double for the runner and ModelControl: explicit model control over the `wan` pipeline's models
    (an unload ends once the model's requests in flight have, as in Triton) and the `wan` entry's stream, whose
    requests run until the test lets them finish. A request that arrives while its model is not READY gets
    Triton's own error; `gates[job id]` (an asyncio.Event) holds a request back before it arrives."""

    def __init__(self, models):
        self.states = {m: "READY" for m in models}
        self.inflight = dict.fromkeys(models, 0)
        self.finish: dict[str, asyncio.Event] = {}   # job id -> set it to end that request with its video
        self.gates: dict[str, asyncio.Event] = {}
        self.arrived: list[str] = []

    async def model_states(self):
        return dict(self.states)

    async def unload_model(self, model):
        self.states[model] = "UNLOADING" if self.inflight[model] else "UNAVAILABLE"

    async def load_model(self, model):
        self.states[model] = "READY"

    async def stream(self, model, inputs, request_id=None):
        if request_id in self.gates:
            await self.gates[request_id].wait()
        if self.states[model] != "READY":
            raise from_triton_message(f"Request for unknown model: '{model}' has no available versions")
        self.arrived.append(request_id)
        self.inflight[model] += 1
        try:
            yield StreamResponse({EVENT: np.array([json.dumps({"type": "progress", "step": 1, "total_steps": 4})
                                                   .encode()], dtype=np.object_)}, False)
            await self.finish.setdefault(request_id, asyncio.Event()).wait()
            event = {"type": "video", "num_frames": 5, "width": 32, "height": 32, "fps": 16, "seed": 1}
            yield StreamResponse({EVENT: np.array([json.dumps(event).encode()], dtype=np.object_),
                                  VIDEO: _frames(5, 32, 32)}, True)
        finally:
            self.inflight[model] -= 1
            if not self.inflight[model] and self.states[model] == "UNLOADING":
                self.states[model] = "UNAVAILABLE"


async def _until(condition, timeout_s=10.0):
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def _sleepable_runner(store, max_running):
    wan = REGISTRY["wan"]
    triton = _Triton(wan.models)
    control = ModelControl(triton, [wan])
    runner = VideoRunner(store, triton, {"wan": "wan", "sora-2": "wan"}, max_queued=8, max_running=max_running,
                         ttl_s=None, control=control, pipelines={"wan": "wan", "sora-2": "wan"})
    return triton, control, runner


def test_jobs_queued_when_their_pipeline_sleeps_wait_for_the_wake_and_running_ones_finish(tmp_path):
    """Sleeping `wan` with two jobs generating and two queued: the sleep waits for the two running ones (requests in
    flight) and unloads; the queued ones stay `queued` while it sleeps (the workers used to start them against the
    unloaded model: failed with "Request for unknown model: 'wan' has no available versions", for good) and run,
    oldest first, once it is awake again."""
    store = VideoStore(tmp_path)
    for i, name in enumerate(("video_a", "video_b", "video_c", "video_d")):
        _job(store, name, created_at=1000 + i)
    store.create("video_e", model="sora-2", prompt="an alias", seconds="1", size="64x64",   # wan by its alias
                 params={"seed": 1, "fps": 16, "num_frames": 17, "num_inference_steps": 4}, created_at=1004)

    async def scenario():
        triton, control, runner = _sleepable_runner(store, max_running=2)
        await runner.start()
        try:
            await _until(lambda: triton.arrived == ["video_a", "video_b"])
            sleep = asyncio.create_task(control.sleep("wan"))
            await _until(lambda: control.state("wan") == "falling_asleep")
            for name in ("video_a", "video_b"):   # in flight: they finish before the unload
                triton.finish[name].set()
            slept = await asyncio.wait_for(sleep, 10)
            assert slept["unloaded"] == ["wan", "wan_vae", "wan_dit", "wan_text_encoder"] and slept["pending"] == []
            assert control.state("wan") == "sleeping"
            await asyncio.sleep(0.3)   # the two workers are free: nothing starts while the pipeline sleeps
            assert [store.get(n).status for n in ("video_a", "video_b")] == [COMPLETED, COMPLETED]
            assert [store.get(n).status for n in ("video_c", "video_d", "video_e")] == [QUEUED] * 3
            assert triton.arrived == ["video_a", "video_b"]
            await control.wake("wan")
            await _until(lambda: len(triton.arrived) == 4)
            assert triton.arrived[2:] == ["video_c", "video_d"]   # oldest first, after the wake
            for name in ("video_c", "video_d"):
                triton.finish[name].set()
            await _until(lambda: "video_e" in triton.arrived)
            triton.finish["video_e"].set()
            await _until(lambda: store.count(COMPLETED) == 5)
        finally:
            await runner.stop()

    asyncio.run(scenario())
    assert all(store.get(n).error is None for n in ("video_c", "video_d", "video_e"))
    assert (store.job_dir("video_c") / "video.mp4").stat().st_size > 0


def test_a_job_whose_request_arrives_after_its_pipeline_began_to_sleep_waits_for_the_wake(tmp_path):
    """A job started while `wan` was awake whose request reached Triton only after the sleep had unloaded the model
    (no answer yet, "unknown model") goes back to `queued` and runs after the wake, instead of failing; a job that
    fails for its own reasons with no sleep begun still fails."""
    store = VideoStore(tmp_path)
    _job(store, "video_late")

    async def scenario():
        triton, control, runner = _sleepable_runner(store, max_running=1)
        triton.gates["video_late"] = asyncio.Event()
        await runner.start()
        try:
            await _until(lambda: store.get("video_late").status == IN_PROGRESS)
            await control.sleep("wan")   # nothing in flight in Triton yet: the models unload at once
            triton.gates["video_late"].set()   # the request arrives now
            await _until(lambda: store.get("video_late").status == QUEUED)
            await asyncio.sleep(0.2)
            assert store.get("video_late").status == QUEUED and triton.arrived == []
            await control.wake("wan")
            await _until(lambda: triton.arrived == ["video_late"])
            triton.finish["video_late"].set()
            await _until(lambda: store.get("video_late").status == COMPLETED)

            triton.states["wan"] = "UNAVAILABLE"   # gone without a sleep (no sleep began): the job fails
            _job(store, "video_broken")
            runner.submit(store.get("video_broken"))
            await _until(lambda: store.get("video_broken").status == FAILED)
        finally:
            await runner.stop()

    asyncio.run(scenario())
    assert store.get("video_late").error is None
    assert "unknown model" in store.get("video_broken").error["message"]


def test_a_sleep_lists_each_model_still_unloading_once(monkeypatch):
    """A stage that does not unload within UNLOAD_WAIT_S once its callers drained is `pending`, alone: the others
    unloaded (the list used to repeat it and name every stage of the pipeline)."""
    monkeypatch.setattr(model_control, "UNLOAD_WAIT_S", 0.3)
    triton = _Triton(REGISTRY["wan"].models)
    triton.inflight["wan_dit"] = 1   # a request that does not end
    slept = asyncio.run(ModelControl(triton, [REGISTRY["wan"]]).sleep("wan"))
    assert slept["pending"] == ["wan_dit"]
    assert triton.states == {"wan_text_encoder": "UNAVAILABLE", "wan_dit": "UNLOADING", "wan_vae": "UNAVAILABLE",
                             "wan": "UNAVAILABLE"}


def test_a_stage_shared_with_a_pipeline_still_draining_is_kept_by_the_next_sleep(monkeypatch):
    """Thirteenth outside test: `voice` was put to sleep with chats that outlasted UNLOAD_WAIT_S (pending), then `tts`:
    its sleep unloaded voice_tts, which only awake pipelines kept, and the voice chats still draining failed with 500
    `inference_error`. A sleeping pipeline whose entry is still UNLOADING keeps its models; once it drained, the next
    sleep unloads them."""
    monkeypatch.setattr(model_control, "UNLOAD_WAIT_S", 0.3)
    voice, tts = REGISTRY["voice"], REGISTRY["tts"]
    triton = _Triton(dict.fromkeys(voice.models + tts.models))
    triton.inflight["voice"] = 1   # a chat that outlasts the sleep's wait
    control = ModelControl(triton, [voice, tts])

    async def scenario():
        first = await control.sleep("voice")
        assert first["pending"] == ["voice", "voice_vad", "voice_llm", "voice_asr"] and first["kept"] == ["voice_tts"]
        slept = await control.sleep("tts")
        assert (slept["unloaded"], slept["kept"]) == (["tts"], ["voice_tts"]), slept
        assert triton.states["voice_tts"] == "READY"
        triton.inflight["voice"], triton.states["voice"] = 0, "UNAVAILABLE"   # the chat ended: voice unloaded
        again = await control.sleep("tts")
        assert (again["unloaded"], again["kept"]) == (["voice_tts"], []), again

    asyncio.run(scenario())


def test_the_whole_server_sleep_refuses_every_pipeline_before_the_first_drains(monkeypatch):
    """sleep_all (POST /sleep) refuses every awake pipeline at once: while `voice` drains, `tts` already answers 503
    `pipeline_sleeping` (it used to serve until voice's sleep ended), and voice_tts stays loaded for the voice chat
    still in flight."""
    monkeypatch.setattr(model_control, "UNLOAD_WAIT_S", 0.3)
    voice, tts = REGISTRY["voice"], REGISTRY["tts"]
    triton = _Triton(dict.fromkeys(voice.models + tts.models))
    triton.inflight["voice"] = 1
    control = ModelControl(triton, [voice, tts])

    async def scenario():
        task = asyncio.create_task(control.sleep_all())
        await asyncio.sleep(0.1)
        assert (control.state("voice"), control.state("tts")) == ("falling_asleep", "falling_asleep")
        with pytest.raises(APIError) as refused:
            control.check(tts)
        assert (refused.value.status, refused.value.code) == (503, "pipeline_sleeping")
        results = await task
        assert results["tts"]["kept"] == ["voice_tts"] and triton.states["voice_tts"] == "READY", results
        assert (control.state("voice"), control.state("tts")) == ("sleeping", "sleeping")

    asyncio.run(scenario())
