"""Images in qwen3_omni chat end to end: launcher -> tritonserver -> frontend, driven with the openai SDK (chat
`image_url` parts as data: and http(s) URLs, Responses `input_image`) and tritonclient (INPUT_IMAGES straight to the
stage and co-located layouts); greedy answers compared with transformers' `generate` on the processor's inputs.
One server for the module (qwen3_omni, voice, and the co-located layout as model id "colocated")."""
from __future__ import annotations

import base64
import http.server
import io
import json
import threading

import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from omni_backends.paths import QWEN3_OMNI_TINY, model_home
from omni_backends.qwen3_omni.loading import load_image_processor
from tests.conftest import OMNI_CHAT_MAX_IMAGE_PIXELS
from tests.harness import triton_stream, triton_stream_error
from tests.qwen3_omni_reference import answer_text, greedy_text, processor

pytestmark = pytest.mark.integration

MAX_TOKENS = 12
SPOKEN_FRAMES = 12   # <= the code2wav left context (25 frames)
MAX_PIXELS = OMNI_CHAT_MAX_IMAGE_PIXELS   # the server's --max-image-pixels
QUESTION = "What is in the picture?"


def _image(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


FIRST, SECOND = _image(0, 40, 70), _image(1, 100, 52)   # 2 and 6 image tokens


@pytest.fixture(scope="module")
def server(omni_chat_server):
    """qwen3_omni, voice and the co-located layout as "colocated", --max-image-pixels MAX_PIXELS (tests/conftest.py)."""
    return omni_chat_server


class _Files(http.server.BaseHTTPRequestHandler):
    files = {"/second.png": _png(SECOND)}

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files_url():
    """Base URL of a local http.server thread serving `_Files.files`."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def reference():
    """(model, processor) of transformers on the checkpoint the launcher prepared."""
    ckpt = model_home() / QWEN3_OMNI_TINY
    proc = processor(AutoTokenizer.from_pretrained(ckpt), WhisperFeatureExtractor.from_pretrained(ckpt),
                     load_image_processor(ckpt))
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt).eval(), proc


def _expected(reference, images) -> list[int]:
    return _generated(reference, images)[0]


def _generated(reference, images):
    """(generated ids, prompt ids) of generate for QUESTION and `images`."""
    parts = [{"type": "text", "text": QUESTION}] + [{"type": "image"} for _ in images]
    return greedy_text(*reference, [{"role": "user", "content": parts}], images, MAX_TOKENS)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(server, *urls, model="qwen3_omni", **kwargs):
    parts = [{"type": "text", "text": QUESTION}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return _client(server).chat.completions.create(model=model, messages=[{"role": "user", "content": parts}],
                                                   modalities=["text"], temperature=0, max_tokens=MAX_TOKENS, **kwargs)


def test_chat_with_a_data_url_png_answers_as_generate(server, reference):
    ids, prompt = _generated(reference, [FIRST])
    assert len(ids) > 1
    reply = _chat(server, _data_url(_png(FIRST)))
    assert reply.choices[0].message.content == answer_text(reference[1].tokenizer, ids)
    assert reply.usage.completion_tokens == len(ids)
    assert reply.usage.prompt_tokens == len(prompt)
    assert int((prompt == reference[0].config.thinker_config.image_token_id).sum()) == 2   # 32x64 pixels after resize
    spoken = _client(server).chat.completions.create(   # the talker speaks it (compared in the next test)
        model="qwen3_omni", modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}, temperature=0,
        max_tokens=MAX_TOKENS, extra_body={"talker_max_frames": 8},
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                               {"type": "image_url", "image_url": {"url": _data_url(_png(FIRST))}}]}])
    message = spoken.choices[0].message
    assert message.content == reply.choices[0].message.content == message.audio.transcript
    assert len(base64.b64decode(message.audio.data)) > 44   # a WAV with samples


def test_two_images_data_and_http_url_streamed_answer_as_generate(server, reference, files_url):
    ids = _expected(reference, [FIRST, SECOND])
    chunks = _chat(server, _data_url(_png(FIRST)), f"{files_url}/second.png", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer_text(reference[1].tokenizer, ids)
    assert ids != _expected(reference, [FIRST])   # the second image changes the answer


def test_responses_input_image_answers_as_chat(server, reference):
    ids = _expected(reference, [FIRST])
    answer = _client(server).responses.create(model="qwen3_omni", temperature=0, max_output_tokens=MAX_TOKENS, input=[
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION},
                                     {"type": "input_image", "image_url": _data_url(_png(FIRST)), "detail": "auto"}]}])
    assert answer.output_text == answer_text(reference[1].tokenizer, ids)


@pytest.mark.parametrize("url, code", [
    ("data:image/png;base64,!!not-base64", "invalid_image_url"),
    (_data_url(b"this is not a png" * 8), "invalid_image"),
    (_data_url(_png(_image(2, 400, 300))), "image_too_large"),   # 120 000 pixels > --max-image-pixels
    ("file:///etc/hosts", "invalid_image_url"),
    ("http://127.0.0.1:9/nothing.png", "image_url_unreachable"),
])
def test_bad_images_are_a_400_naming_the_part_and_the_server_keeps_serving(server, reference, url, code):
    body = {"model": "qwen3_omni", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]}]}
    refused = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["type"] == "invalid_request_error", error
    assert (error["param"], error["code"]) == ("messages[0].content[1].image_url.url", code)
    assert _chat(server, _data_url(_png(FIRST)), max_completion_tokens=1).choices[0].finish_reason == "length"


def test_voice_refuses_images_naming_the_part_type(server):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(server, _data_url(_png(FIRST)), model="voice")
    error = info.value.body
    assert (error["param"], error["code"]) == ("messages[0].content[1].type", "unsupported_content"), error


def test_spoken_answer_about_an_image_equals_generate_in_both_layouts(server, reference):
    """The talker's M-RoPE positions of a 3-row image (IMAGE_GRID_THW from the thinker to the talker in the stage
    layout, in process in the co-located one): the served audio is `generate(return_audio=True)`'s (frames <= the
    code2wav left context, so the streamed audio is one full decode)."""
    model, proc = reference
    chat = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    inputs = proc(text=[proc.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)],
                  images=[SECOND], return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 4]]   # 3 rows of merged patches
    with torch.no_grad():
        seq, wav = model.generate(**inputs, return_audio=True, speaker="ethan", thinker_max_new_tokens=MAX_TOKENS,
                                  thinker_do_sample=False, thinker_eos_token_id=model.config.im_end_token_id,
                                  talker_max_new_tokens=SPOKEN_FRAMES + 1, talker_do_sample=False,
                                  talker_repetition_penalty=1.0)
    body = {"messages": chat, "voice": "ethan", "return_token_ids": True, "temperature": 0, "max_tokens": MAX_TOKENS,
            "talker_do_sample": False, "talker_repetition_penalty": 1.0, "talker_max_frames": SPOKEN_FRAMES}
    tensors = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_), "INPUT_IMAGES": SECOND[None],
               "INPUT_IMAGE_SIZES": np.array([SECOND.shape[:2]], np.int32)}
    for name in ("qwen3_omni", "qwen3_omni_colocated"):
        responses = triton_stream(server.grpc_url, name, tensors, 120)
        events = [json.loads(r.as_numpy("EVENT")[0]) for r in responses]
        audio = np.concatenate([r.as_numpy("AUDIO") for r, e in zip(responses, events) if e["type"] == "audio.delta"])
        assert events[-1]["token_ids"] == seq[0, inputs["input_ids"].shape[1]:].tolist(), name
        assert audio.shape == wav[0, 0].shape and wav.std() > 0.01, name
        np.testing.assert_allclose(audio, wav[0, 0].numpy(), atol=1e-5, err_msg=name)


def test_triton_clients_send_image_tensors_to_both_layouts(server, reference):
    """INPUT_IMAGES / INPUT_IMAGE_SIZES straight to the stage layout (BLS -> thinker) and the co-located model:
    the answer of generate; image tensors that do not fit the parts are an error naming the tensor."""
    ids = _expected(reference, [FIRST, SECOND])
    padded = np.zeros((2, 100, 70, 3), np.uint8)
    padded[0, :40, :70], padded[1, :100, :52] = FIRST, SECOND
    sizes = np.array([[40, 70], [100, 52]], np.int32)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"},
                                                      {"type": "image"}]}],
            "modalities": ["text"], "temperature": 0, "max_tokens": MAX_TOKENS, "return_token_ids": True}
    inputs = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_), "INPUT_IMAGES": padded,
              "INPUT_IMAGE_SIZES": sizes}
    for model in ("qwen3_omni", "qwen3_omni_colocated"):
        events = [json.loads(r.as_numpy("EVENT")[0]) for r in triton_stream(server.grpc_url, model, inputs, 120)]
        assert events[-1]["type"] == "done" and events[-1]["token_ids"] == ids, model
    for tensors, words in [({"INPUT_IMAGES": padded[:1], "INPUT_IMAGE_SIZES": sizes[:1]}, "2 image part(s) but 1"),
                           ({"INPUT_IMAGES": padded, "INPUT_IMAGE_SIZES": sizes + 1}, "INPUT_IMAGE_SIZES[0]"),
                           ({"INPUT_IMAGES": padded}, "INPUT_IMAGE_SIZES is missing")]:
        for model in ("qwen3_omni", "qwen3_omni_colocated", "qwen3_omni_thinker"):
            error = triton_stream_error(server.grpc_url, model, body, tensors=tensors)
            assert error is not None and words in error, (model, error)
