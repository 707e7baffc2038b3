"""Qwen-Image text-to-image and edit end to end: launcher -> tritonserver (text encoder, step-batched DiT,
VAE, orchestrators) -> frontend, driven with the openai SDK, httpx and the frontend's Triton client, and
compared pixel for pixel with diffusers' `QwenImagePipeline` / `QwenImageEditPipeline` called in-process on
the same tiny checkpoint (same seed, steps, size, CFG)."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import zlib

import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omni_backends.paths import model_home
from omni_backends.qwen_image.loading import reference_pipeline
from omni_backends.qwen_image.serving.protocol import TINY
from omni_frontend.triton_client import TritonClient
from tests.harness import metric_value, wait_for

pytestmark = pytest.mark.integration

STAGES = ("qwen_image_text_encoder", "qwen_image_dit", "qwen_image_vae", "qwen_image", "qwen_image_edit")


@pytest.fixture(scope="module")
def reference(image_server):
    return reference_pipeline(model_home() / TINY)


@pytest.fixture(scope="module")
def edit_reference(image_server):
    return reference_pipeline(model_home() / TINY, "edit")


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def _expected(pipe, prompt, *, steps, seed, n=1, negative=None, cfg=1.0, size=64, **kwargs) -> list[np.ndarray]:
    out = pipe(prompt=prompt, negative_prompt=negative, true_cfg_scale=cfg, height=size, width=size,
               num_inference_steps=steps, num_images_per_prompt=n, generator=torch.Generator().manual_seed(seed),
               **kwargs).images
    return [np.asarray(image) for image in out]


def test_generation_is_bit_equal_to_diffusers(image_server, reference):
    result = _client(image_server).images.generate(model="qwen_image", prompt="a red cube on a table", size="64x64",
                                                   extra_body={"seed": 11, "num_inference_steps": 3,
                                                               "true_cfg_scale": 1.0})
    assert result.size == "64x64" and result.output_format == "png" and len(result.data) == 1
    pixels = _pixels(result.data[0].b64_json)
    assert pixels.shape == (64, 64, 3) and pixels.std() > 0
    assert np.array_equal(pixels, _expected(reference, "a red cube on a table", steps=3, seed=11)[0])
    assert result.usage.output_tokens == 16 and result.usage.input_tokens > 0


def test_two_images_with_true_cfg_are_different_and_bit_equal(image_server, reference):
    result = _client(image_server).images.generate(
        model="qwen_image", prompt="a blue sphere", n=2, size="64x64",
        extra_body={"seed": 5, "num_inference_steps": 2, "negative_prompt": "blurry", "true_cfg_scale": 4.0})
    got = [_pixels(d.b64_json) for d in result.data]
    assert len(got) == 2 and not np.array_equal(got[0], got[1])
    want = _expected(reference, "a blue sphere", steps=2, seed=5, n=2, negative="blurry", cfg=4.0)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_requests_batched_together_stay_bit_equal(image_server, reference):
    """Three jobs with different steps, CFG, n and prompt lengths: their steps share DiT forwards
    (batch_jobs > 1 in the progress events) and each image still equals its unbatched pipeline call."""
    jobs = [dict(prompt="a cat", num_inference_steps=6, seed=1, true_cfg_scale=1.0, n=1),
            dict(prompt="a long winding road through green hills at dawn", num_inference_steps=4, seed=2,
                 negative_prompt="dark", true_cfg_scale=3.0, n=2),
            dict(prompt="a lighthouse", num_inference_steps=5, seed=3, true_cfg_scale=1.0, n=1)]

    async def run(client, body):
        events, images = [], []
        inputs = {"REQUEST": np.array([json.dumps({**body, "width": 64, "height": 64}).encode()], dtype=np.object_)}
        async for response in client.stream("qwen_image", inputs):
            if "EVENT" in response.outputs:
                event = json.loads(response.outputs["EVENT"][0])
                events.append(event)
                if event["type"] == "image":
                    images.append(response.outputs["IMAGE"])
        return events, images

    async def main():
        client = TritonClient(image_server.grpc_url)
        try:
            return await asyncio.gather(*(run(client, body) for body in jobs))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert max(e.get("batch_jobs", 0) for events, _ in results for e in events) >= 2
    for body, (events, images) in zip(jobs, results):
        assert [e["step"] for e in events if e["type"] == "progress"] == list(range(1, body["num_inference_steps"] + 1))
        want = _expected(reference, body["prompt"], steps=body["num_inference_steps"], seed=body["seed"], n=body["n"],
                         negative=body.get("negative_prompt"), cfg=body["true_cfg_scale"])
        assert len(images) == body["n"] and all(np.array_equal(g, w) for g, w in zip(images, want))


def test_url_and_other_output_formats(image_server):
    client = _client(image_server)
    result = client.images.generate(model="qwen_image", prompt="a boat", size="32x48", response_format="url",
                                    extra_body={"seed": 3, "num_inference_steps": 2})
    response = httpx.get(result.data[0].url, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(response.content)).size == (32, 48)
    for fmt, pil_format in (("jpeg", "JPEG"), ("webp", "WEBP")):
        result = client.images.generate(model="qwen_image", prompt="a boat", size="32x48", output_format=fmt,
                                        output_compression=50, extra_body={"seed": 3, "num_inference_steps": 2})
        image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
        assert image.format == pil_format and image.size == (32, 48) and result.output_format == fmt
    assert httpx.get(f"{image_server.base_url}/files/images/nope.png", timeout=10).status_code == 404


def test_streamed_partial_images_then_completed(image_server):
    client = _client(image_server)
    events = list(client.images.generate(model="qwen_image", prompt="a red cube on a table", size="64x64",
                                         stream=True, partial_images=2,
                                         extra_body={"seed": 11, "num_inference_steps": 3, "true_cfg_scale": 1.0}))
    kinds = [e.type for e in events]
    assert kinds == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    plain = client.images.generate(model="qwen_image", prompt="a red cube on a table", size="64x64",
                                   extra_body={"seed": 11, "num_inference_steps": 3, "true_cfg_scale": 1.0})
    assert np.array_equal(_pixels(events[-1].b64_json), _pixels(plain.data[0].b64_json))
    assert not np.array_equal(_pixels(events[0].b64_json), _pixels(events[-1].b64_json))
    assert events[-1].usage.total_tokens > 0


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


SOURCE = np.zeros((64, 64, 3), np.uint8)
SOURCE[:, :32] = (200, 30, 30)
SOURCE[:, 32:] = (20, 40, 220)


EDIT = {"seed": 4, "num_inference_steps": 2, "true_cfg_scale": 1.0}


@pytest.fixture(scope="module")
def edited(edit_reference):
    """QwenImageEditPipeline's own result for SOURCE + "make it green" (64x64, EDIT settings)."""
    return _expected(edit_reference, "make it green", steps=2, seed=4, image=Image.fromarray(SOURCE))[0]


def test_edit_is_bit_equal_to_diffusers(image_server, edited):
    result = _client(image_server).images.edit(model="qwen_image_edit", image=("in.png", _png(SOURCE), "image/png"),
                                               prompt="make it green", size="64x64", extra_body=EDIT)
    assert result.size == "64x64" and np.array_equal(_pixels(result.data[0].b64_json), edited)


def test_streamed_masked_edit_keeps_the_unmasked_pixels(image_server, edited):
    mask = np.zeros((64, 64, 4), np.uint8)
    mask[..., 3] = 255
    mask[:16, :16, 3] = 0                                  # edit only the top-left corner
    events = list(_client(image_server).images.edit(
        model="qwen_image_edit", image=("in.png", _png(SOURCE), "image/png"),
        mask=("mask.png", _png(mask), "image/png"),
        prompt="make it green", size="64x64", stream=True, partial_images=1, extra_body=EDIT))
    assert [e.type for e in events] == ["image_edit.partial_image", "image_edit.completed"]
    out = _pixels(events[-1].b64_json)
    assert np.array_equal(out[:16, :16], edited[:16, :16]) and np.array_equal(out[16:], SOURCE[16:])


def test_two_image_edit_is_bit_equal_to_edit_plus(image_server):
    second = np.full((48, 80, 3), (250, 220, 10), np.uint8)
    result = _client(image_server).images.edit(
        model="qwen_image_edit", image=[("a.png", _png(SOURCE), "image/png"), ("b.png", _png(second), "image/png")],
        prompt="put the yellow bar on the flag", size="64x32", extra_body=EDIT)
    got = _pixels(result.data[0].b64_json)
    assert got.shape == (32, 64, 3)
    plus = reference_pipeline(model_home() / TINY, "edit_plus")
    out = plus(image=[Image.fromarray(SOURCE), Image.fromarray(second)], prompt="put the yellow bar on the flag",
               height=32, width=64, num_inference_steps=2, true_cfg_scale=1.0,
               generator=torch.Generator().manual_seed(4)).images[0]
    assert np.array_equal(got, np.asarray(out))


def test_completed_image_requests_are_in_the_per_pipeline_latency_histogram(image_server):
    """omni_frontend_e2e_seconds{pipeline} had no image series at all (the routes made no RequestTimer): each
    completed generation (plain or streamed) and edit now adds one observation under its pipeline."""
    metrics, client = f"{image_server.base_url}/metrics", _client(image_server)

    def count(pipeline):
        return metric_value(metrics, "omni_frontend_e2e_seconds_count", pipeline=pipeline) or 0

    before = count("qwen_image"), count("qwen_image_edit")
    client.images.generate(model="qwen_image", prompt="a boat", size="32x32", extra_body={"num_inference_steps": 1})
    list(client.images.generate(model="qwen_image", prompt="a boat", size="32x32", stream=True, partial_images=1,
                                extra_body={"num_inference_steps": 2}))
    client.images.edit(model="qwen_image_edit", image=("in.png", _png(SOURCE), "image/png"), prompt="make it red",
                       extra_body={"num_inference_steps": 1})
    assert (count("qwen_image"), count("qwen_image_edit")) == (before[0] + 2, before[1] + 1)


def test_models_list_image_pipelines(image_server):
    data = {m["id"]: m for m in httpx.get(f"{image_server.base_url}/v1/models", timeout=10).json()["data"]}
    assert data["qwen_image"]["kind"] == "image" and data["qwen_image_edit"]["kind"] == "image"
    assert "qwen_image_dit" in data["qwen_image"]["triton_models"]


def _stage_requests(server, models=STAGES) -> float:
    """Requests the image `models` have finished so far (one scrape of Triton's metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(server.metrics_url, timeout=10).text)
    return sum(sample.value for family in families for sample in family.samples
               if sample.name == "omni_requests_total" and sample.labels.get("model") in models)


GEN = {"model": "qwen_image", "prompt": "a cat", "size": "64x64"}


@pytest.mark.parametrize("body, status, param", [
    ({**GEN, "model": "nope"}, 404, "model"),
    ({**GEN, "prompt": "  "}, 400, "prompt"),
    ({**GEN, "size": "64by64"}, 400, "size"),
    ({**GEN, "size": "60x64"}, 400, "size"),
    ({**GEN, "size": "2048x2048"}, 400, "size"),
    ({**GEN, "n": 0}, 400, "n"),
    ({**GEN, "n": 11}, 400, "n"),
    ({**GEN, "response_format": "bmp"}, 400, "response_format"),
    ({**GEN, "model": "qwen_image_edit"}, 400, "model"),
    # OpenAI's API is typed: a JSON string is not a number, a number not a boolean (these used to be coerced)
    ({**GEN, "n": "2"}, 400, "n"),
    ({**GEN, "seed": "7"}, 400, "seed"),
    ({**GEN, "num_inference_steps": 2.5}, 400, "num_inference_steps"),
    ({**GEN, "true_cfg_scale": "4"}, 400, "true_cfg_scale"),
    ({**GEN, "output_compression": True}, 400, "output_compression"),
    ({**GEN, "stream": "true"}, 400, "stream"),
    ({**GEN, "stream": 1, "partial_images": 1}, 400, "stream"),
    ({**GEN, "action": "describe"}, 400, "action"),              # a pipeline-protocol key, not an extension
])
def test_bad_generation_input_is_a_4xx_before_any_model_work(image_server, body, status, param):
    before = _stage_requests(image_server)
    response = httpx.post(f"{image_server.base_url}/v1/images/generations", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["param"] == param
    assert _stage_requests(image_server) == before


@pytest.mark.parametrize("files, data, status, param", [
    ({"image": ("a.txt", b"not an image", "text/plain")}, {}, 400, "image"),
    ({"image": ("a.png", _png(SOURCE), "image/png"),
      "mask": ("m.png", _png(np.zeros((32, 32, 4), np.uint8)), "image/png")}, {}, 400, "mask"),
    ({"image": ("a.png", _png(SOURCE), "image/png")}, {"size": "4096x4096"}, 400, "size"),
    ({"image[]": [("a.png", _png(SOURCE), "image/png")] * 5}, {}, 400, "image"),
    ({"image": ("a.png", b"\x89PNG" + b"0" * (26 * 1024 * 1024), "image/png")}, {}, 413, "image"),
    ({}, {}, 400, "image"),
    ({"image": ("a.png", _png(np.zeros((64, 8, 3), np.uint8)), "image/png")}, {}, 400, "image"),  # was "width"
])
def test_bad_edit_input_is_a_4xx_before_any_model_work(image_server, files, data, status, param):
    before = _stage_requests(image_server)
    parts = [(k, f) for k, v in files.items() for f in (v if isinstance(v, list) else [v])]
    response = httpx.post(f"{image_server.base_url}/v1/images/edits", files=parts or [("x", ("x", b"", "text/plain"))],
                          data={"model": "qwen_image_edit", "prompt": "blue", **data}, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
    assert _stage_requests(image_server) == before


def _declared_png(width: int, height: int) -> bytes:
    """A few hundred bytes of PNG whose header declares width x height RGB pixels (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * (3 * width + 1) * 4)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("files, data, param, code", [
    ({}, {"n": "0"}, "n", "invalid_value"),                       # form values out of range were a 500
    ({}, {"true_cfg_scale": "nan"}, "true_cfg_scale", "invalid_value"),
    ({}, {"output_format": "gif"}, "output_format", "invalid_value"),
    ({}, {"stream": "maybe"}, "stream", "invalid_value"),         # was read as false
    ({}, {"negative_prompt": "x" * 32001}, "negative_prompt", "prompt_too_long"),
    ({"image": ("a.png", _declared_png(5000, 5000), "image/png")}, {}, "image", "image_too_large"),
    ({"image": ("a.png", _declared_png(60000, 60000), "image/png")}, {}, "image", "image_too_large"),  # was a 500
    ({"mask": ("m.png", _declared_png(5000, 5000), "image/png")}, {}, "mask", "image_too_large"),
])
def test_bad_edit_form_values_and_huge_declared_images_are_400(image_server, files, data, param, code):
    before = _stage_requests(image_server)
    parts = {"image": ("a.png", _png(SOURCE), "image/png"), **files}
    response = httpx.post(f"{image_server.base_url}/v1/images/edits", files=parts,
                          data={"model": "qwen_image_edit", "prompt": "blue", **data}, timeout=60)
    assert response.status_code == 400, response.text
    assert (response.json()["error"]["param"], response.json()["error"]["code"]) == (param, code)
    assert _stage_requests(image_server) == before


@pytest.mark.parametrize("body, param", [
    ({**GEN, "negative_prompt": "x" * 32001}, "negative_prompt"),
    ({**GEN, "size": "\uff16\uff14x\uff16\uff14"}, "size"),                     # full-width digits
])
def test_bad_generation_text_fields_are_400(image_server, body, param):
    response = httpx.post(f"{image_server.base_url}/v1/images/generations", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


@pytest.mark.parametrize("route, field, value", [
    ("generations", "style", "natural"),            # dall-e-3's field
    ("generations", "guidance_scale", 7.5),         # vLLM-Omni's, for guidance-distilled checkpoints
    ("generations", "num_inference_step", 50),      # a typo of num_inference_steps
    ("edits", "guidance_scale", "7.5"),
    ("edits", "strength", "0.5"),
])
def test_fields_the_image_pipeline_does_not_read_are_a_400_naming_them(image_server, route, field, value):
    """They used to be dropped (200, with the default image). The route refuses them against the fields the pipeline
    publishes ({"action": "fields"}), before admission, listing the route's fields (`size`, not the pipeline's
    `task`, `width`, `height`)."""
    before = _stage_requests(image_server, STAGES[:3])
    if route == "generations":
        response = httpx.post(f"{image_server.base_url}/v1/images/generations", timeout=60,
                              json={**GEN, "size": "16x16", "num_inference_steps": 1, field: value})
    else:
        response = httpx.post(f"{image_server.base_url}/v1/images/edits", timeout=60,
                              files={"image": ("a.png", _png(SOURCE), "image/png")},
                              data={"model": "qwen_image_edit", "prompt": "blue", "num_inference_steps": "1",
                                    field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", field, "unsupported_parameter")
    model = "qwen_image" if route == "generations" else "qwen_image_edit"
    assert error["message"].startswith(f"{field} is not a request field of POST /v1/images/{route} with model {model}")
    listed = error["message"].split("(its fields: ")[1].rstrip(")").split(", ")
    assert {"num_inference_steps", "true_cfg_scale", "size"} <= set(listed) and not {"task", "width", "height"} & set(listed)
    if field == "guidance_scale":
        assert "the classifier-free guidance scale is true_cfg_scale" in error["message"]
    assert _stage_requests(image_server, STAGES[:3]) == before


def test_openai_moderation_at_its_default_auto_is_accepted(image_server):
    """The SDK's ImageGenerateParams.moderation defaults to "auto" (the server does no filtering, so it changes
    nothing); it was refused as a field the pipeline does not read."""
    client = openai.OpenAI(base_url=f"{image_server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    reply = client.images.generate(model="qwen_image", prompt="a red cube", size="16x16", moderation="auto",
                                   extra_body={"num_inference_steps": 1})
    assert reply.size == "16x16" and len(reply.data) == 1


def test_an_edit_whose_text_encoding_fails_while_its_vae_encode_runs_leaves_the_server_serving(image_server):
    """The orchestrator encodes the prompt (text encoder) and the condition image (VAE) at once. A 16x4096
    image fails the text encoder at once (Qwen2-VL: aspect ratio over 200) while the VAE still encodes it:
    the request got its 400, then the still running VAE call asked the answered request `is_cancelled()`
    and tritonserver died (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), taking every pipeline."""
    sliver = (np.arange(16 * 4096 * 3) % 251).astype(np.uint8).reshape(4096, 16, 3)
    response = httpx.post(f"{image_server.base_url}/v1/images/edits", files={"image": ("a.png", _png(sliver), "image/png")},
                          data={"model": "qwen_image_edit", "prompt": "blue", "num_inference_steps": "1"}, timeout=120)
    assert response.status_code == 400 and response.json()["error"]["param"] == "image", response.text
    metrics = image_server.metrics_url
    for model in STAGES:   # the VAE call left behind is stopped, not run to its end for nobody
        assert wait_for(lambda m=model: metric_value(metrics, "omni_inflight_requests", model=m) == 0, 30), model
    assert image_server.process.poll() is None and httpx.get(f"{image_server.base_url}/health", timeout=10).status_code == 200
    result = _client(image_server).images.edit(model="qwen_image_edit", image=("in.png", _png(SOURCE), "image/png"),
                                               prompt="after", size="32x32", extra_body={"num_inference_steps": 1})
    assert len(result.data) == 1


def test_json_body_to_edits_is_rejected(image_server):
    response = httpx.post(f"{image_server.base_url}/v1/images/edits", json={"prompt": "blue"}, timeout=10)
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"


def test_cancel_mid_denoise_frees_the_batch_slot(image_server):
    metrics = image_server.metrics_url
    payload = json.dumps({**GEN, "size": "256x256", "num_inference_steps": 200, "seed": 1}).encode()
    sock = socket.create_connection(("127.0.0.1", image_server.port), timeout=30)
    sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    assert wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model="qwen_image_dit") == 1, 60)
    sock.close()                                           # the client goes away mid-denoise
    for model in STAGES:
        assert wait_for(lambda m=model: metric_value(metrics, "omni_inflight_requests", model=m) == 0, 30), model
    assert (metric_value(metrics, "omni_requests_total", model="qwen_image_dit", outcome="cancelled") or 0) >= 1
    result = _client(image_server).images.generate(model="qwen_image", prompt="after", size="32x32",
                                                   extra_body={"num_inference_steps": 1})
    assert len(result.data) == 1


def test_image_requests_past_the_pipeline_limits_get_429_at_once(image_server):
    """Overload control covers the image routes: with the default bounds (4 running + 4 queued per
    pipeline) 12 slow generations sent together give 200s with images and, for the rest, 429 with
    Retry-After and the envelope, answered before any admitted request finished."""
    import time

    async def one(client: httpx.AsyncClient):
        response = await client.post("/v1/images/generations", json={
            "model": "qwen_image", "prompt": "a red square", "size": "256x256", "num_inference_steps": 20})
        return response, time.monotonic()

    async def run():
        async with httpx.AsyncClient(base_url=image_server.base_url, timeout=600) as client:
            return await asyncio.gather(*(one(client) for _ in range(12)))

    results = asyncio.run(run())
    done = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code == 429]
    assert len(done) + len(refused) == 12 and len(done) >= 4 and refused, [r.status_code for r, _ in results]
    assert all(len(r.json()["data"]) == 1 for r, _ in done)
    for response, _ in refused:   # queue_timeout: a queued one that waited past the queue timeout (a loaded host)
        error = response.json()["error"]
        assert error["code"] in ("pipeline_overloaded", "queue_timeout") and int(response.headers["retry-after"]) >= 1
    overloaded = [t for r, t in refused if r.json()["error"]["code"] == "pipeline_overloaded"]
    assert len(overloaded) >= 12 - 8 and max(overloaded) < min(t for _, t in done)   # past 4 running + 4 queued
