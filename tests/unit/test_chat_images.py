"""Image content parts of chat and Responses requests (omni_frontend.chat_images, media_url, chat_protocol): data:
and http(s) URLs decoded to the INPUT_IMAGES / INPUT_IMAGE_SIZES tensors, every bad image a 400 naming its part."""
import base64
import http.server
import io
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from omni_frontend import pipelines
from omni_frontend.chat_protocol import ChatRequest, to_pipeline
from omni_frontend.config import RequestLimits
from omni_frontend.errors import APIError
from omni_frontend.responses_protocol import ResponsesRequest, chat_body, responses_params

pytestmark = pytest.mark.unit
LOCAL = RequestLimits(allow_private_media_urls=True)   # the tests' http.server listens on 127.0.0.1

OMNI = pipelines.REGISTRY["qwen3_omni"].content


def _pixels(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def _chat(*urls: str, model: str = "qwen3_omni") -> ChatRequest:
    parts = [{"type": "text", "text": "Look:"}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return ChatRequest(model=model, messages=[{"role": "user", "content": parts}])


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    redirects: dict[str, str] = {}   # path -> Location of a 302
    trickles: dict[str, tuple[bytes, float]] = {}   # path -> (body, seconds between its bytes)

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path in self.trickles:
            body, pause = self.trickles[self.path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:   # the client gave up
                pass
            return
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/slow.png":
            time.sleep(1.0)
        body = self.files.get(self.path)
        try:
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")
        except OSError:   # the client gave up (the timeout case)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_base():
    """A local http.server thread serving `_Handler.files`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_data_and_http_images_become_padded_tensors_and_image_parts(http_base):
    small, tall = _pixels(20, 30, 1), _pixels(50, 10, 2)
    _Handler.files["/tall.png"] = _png(tall)
    body, tensors = to_pipeline(_chat(_data_url(_png(small)), f"{http_base}/tall.png"), LOCAL, accepts=OMNI)
    assert body["messages"][0]["content"] == [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "image"}]
    images, sizes = tensors["INPUT_IMAGES"], tensors["INPUT_IMAGE_SIZES"]
    assert images.dtype == np.uint8 and images.shape == (2, 50, 30, 3)
    assert sizes.dtype == np.int32 and sizes.tolist() == [[20, 30], [50, 10]]
    assert np.array_equal(images[0, :20, :30], small) and np.array_equal(images[1, :50, :10], tall)
    assert not images[0, 20:].any() and not images[1, :, 10:].any()   # zero padding
    assert "INPUT_AUDIO" not in tensors


def test_pipelines_without_images_refuse_them_naming_the_type():
    with pytest.raises(APIError) as info:
        to_pipeline(_chat(_data_url(_png(_pixels(4, 4))), model="voice"), accepts=pipelines.REGISTRY["voice"].content)
    assert (info.value.status, info.value.param, info.value.code) == (400, "messages[0].content[1].type",
                                                                      "unsupported_content")


@pytest.mark.parametrize("url, code", [
    ("data:image/png;base64,!!!not-base64", "invalid_image_url"),
    ("data:image/png,rawtext", "invalid_image_url"),                         # not base64-encoded
    (_data_url(b"definitely not an image" * 4), "invalid_image"),
    ("file:///etc/passwd", "invalid_image_url"),
    ("ftp://example.com/a.png", "invalid_image_url"),
    ("no-scheme.png", "invalid_image_url"),
    ("http://127.0.0.1:9/closed.png", "image_url_not_allowed"),               # loopback: refused by default
    ("http://169.254.169.254/latest/meta-data", "image_url_not_allowed"),     # a cloud metadata service
    ("http://[::1]:9/a.png", "image_url_not_allowed"),
])
def test_every_bad_image_is_a_400_naming_the_url(url, code):
    with pytest.raises(APIError) as info:
        to_pipeline(_chat(_data_url(_png(_pixels(4, 4))), url), accepts=OMNI)
    assert (info.value.status, info.value.param, info.value.code) == (400, "messages[0].content[2].image_url.url", code)


def test_http_errors_sizes_and_timeouts_are_400s(http_base):
    _Handler.files["/big.png"] = _png(_pixels(64, 64))
    _Handler.files["/slow.png"] = _png(_pixels(4, 4))
    cases = [(f"{http_base}/missing.png", LOCAL, "image_url_unreachable", "HTTP 404"),
             ("http://127.0.0.1:9/closed.png", LOCAL, "image_url_unreachable", "could not be fetched"),
             (f"{http_base}/big.png", replace(LOCAL, max_image_bytes=1000), "image_too_large", "--max-image-bytes"),
             (f"{http_base}/big.png", replace(LOCAL, max_image_pixels=64 * 63), "image_too_large", "--max-image-pixels"),
             (f"{http_base}/slow.png", replace(LOCAL, image_fetch_timeout_s=0.3), "image_url_unreachable", "0.3 s")]
    for url, limits, code, words in cases:
        with pytest.raises(APIError) as info:
            to_pipeline(_chat(url), limits, accepts=OMNI)
        assert (info.value.param, info.value.code) == ("messages[0].content[1].image_url.url", code), url
        assert words in info.value.message
    _, tensors = to_pipeline(_chat(f"{http_base}/big.png"), replace(LOCAL, max_image_pixels=64 * 64), accepts=OMNI)
    assert tensors["INPUT_IMAGE_SIZES"].tolist() == [[64, 64]]


def test_data_url_size_and_image_count_limits():
    png = _png(_pixels(16, 16))
    with pytest.raises(APIError) as info:
        to_pipeline(_chat(_data_url(png)), RequestLimits(max_image_bytes=len(png) - 1), accepts=OMNI)
    assert (info.value.param, info.value.code) == ("messages[0].content[1].image_url.url", "image_too_large")
    with pytest.raises(APIError) as info:
        to_pipeline(_chat(*[_data_url(png)] * 3), RequestLimits(max_images=2), accepts=OMNI)
    assert (info.value.param, info.value.code) == ("messages[0].content[3]", "too_many_images")
    _, tensors = to_pipeline(_chat(*[_data_url(png)] * 2), RequestLimits(max_images=2), accepts=OMNI)
    assert tensors["INPUT_IMAGES"].shape == (2, 16, 16, 3)


def test_image_parts_need_a_url_object_in_a_user_message():
    for part, param in [({"type": "image_url", "image_url": "data:x"}, "messages[0].content[0].image_url"),
                        ({"type": "image_url"}, "messages[0].content[0].image_url")]:
        with pytest.raises(APIError) as info:
            to_pipeline(ChatRequest(model="qwen3_omni", messages=[{"role": "user", "content": [part]}]), accepts=OMNI)
        assert info.value.param == param
    url = _data_url(_png(_pixels(4, 4)))
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="qwen3_omni", messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]}]), accepts=OMNI)
    assert info.value.param == "messages[1].content[0]"


def test_responses_input_image_maps_to_chat_and_errors_name_the_responses_field():
    url = _data_url(_png(_pixels(8, 6)))
    req = ResponsesRequest(model="qwen3_omni", instructions="Be brief.", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": url, "detail": "low"}]}])
    _, tensors = to_pipeline(ChatRequest.model_validate(chat_body(req)), accepts=OMNI)
    assert tensors["INPUT_IMAGE_SIZES"].tolist() == [[8, 6]]
    bad = ResponsesRequest(model="qwen3_omni", instructions="Be brief.", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": "file:///etc/hosts"}]}])
    with pytest.raises(APIError) as info, responses_params(bad):
        to_pipeline(ChatRequest.model_validate(chat_body(bad)), accepts=OMNI)
    assert (info.value.param, info.value.code) == ("input[0].content[1].image_url", "invalid_image_url")


def test_media_urls_reach_only_public_or_allowed_hosts_also_through_redirects(http_base):
    """Server-side request forgery: a client's image URL made the server fetch any host, the loopback and a cloud
    metadata address too. By default only public addresses are fetched (--allow-private-media-urls lifts it);
    --allowed-media-domains keeps fetches to those hosts; a redirect's target is checked as the first URL."""
    port = http_base.rsplit(":", 1)[1]
    _Handler.files["/ok.png"] = _png(_pixels(4, 4))
    _Handler.redirects["/hop.png"] = f"http://localhost:{port}/ok.png"
    only_loopback_ip = replace(LOCAL, allowed_media_domains=("127.0.0.1",))
    for url, limits, code in [(f"{http_base}/ok.png", RequestLimits(), "image_url_not_allowed"),
                              (f"http://localhost:{port}/ok.png", RequestLimits(), "image_url_not_allowed"),
                              (f"http://localhost:{port}/ok.png", only_loopback_ip, "image_url_not_allowed"),
                              (f"{http_base}/hop.png", only_loopback_ip, "image_url_not_allowed"),
                              (f"{http_base}/ok.png", replace(LOCAL, allowed_media_domains=("example.com",)),
                               "image_url_not_allowed")]:
        with pytest.raises(APIError) as info:
            to_pipeline(_chat(url), limits, accepts=OMNI)
        assert (info.value.param, info.value.code) == ("messages[0].content[1].image_url.url", code), url
    for url in (f"{http_base}/ok.png", f"{http_base}/hop.png"):   # allowed: the host itself, and a redirect to it
        _, tensors = to_pipeline(_chat(url), replace(LOCAL, allowed_media_domains=("127.0.0.1", "localhost")),
                                 accepts=OMNI)
        assert tensors["INPUT_IMAGE_SIZES"].tolist() == [[4, 4]], url


def test_extreme_aspect_ratios_and_padding_past_the_pixel_limit_are_400s_naming_the_part():
    """Fifteenth outside test: a 4000x1 PNG passed the frontend and the thinker's image processor refused it (aspect
    ratio >= 200): a 500. Four images of 57000x290 and 290x57000, each within --max-image-pixels, padded to
    57000x57000 in the image tensor: numpy asked for 39 GB (a 500). Both are now 400s naming the part."""
    cases = [([(4000, 1)], RequestLimits(), "invalid_image", 1),
             ([(1, 250)], RequestLimits(), "invalid_image", 1),
             ([(2, 40), (40, 2)], RequestLimits(max_image_pixels=100), "image_too_large", 2)]
    for shapes, limits, code, part in cases:
        urls = [_data_url(_png(_pixels(h, w))) for h, w in shapes]
        with pytest.raises(APIError) as info:
            to_pipeline(_chat(*urls), limits, accepts=OMNI)
        assert (info.value.param, info.value.code) == (f"messages[0].content[{part}].image_url.url", code), shapes
    _, tensors = to_pipeline(_chat(_data_url(_png(_pixels(2, 40))), _data_url(_png(_pixels(2, 30)))),
                             RequestLimits(max_image_pixels=100), accepts=OMNI)   # alike shapes: 2 x 40 each
    assert list(tensors["INPUT_IMAGES"].shape) == [2, 2, 40, 3]


def test_a_body_that_trickles_in_is_cut_at_the_fetch_timeout(http_base):
    """Fifteenth outside test: a server sending its image a byte at a time held the fetch (and a worker thread) for
    hours: the body was read in 64 KiB chunks, the deadline checked between them. Now within ~2 x the timeout."""
    _Handler.trickles["/drip.png"] = (_png(_pixels(32, 32)), 0.1)   # 0.1 s a byte
    started = time.monotonic()
    with pytest.raises(APIError) as info:
        to_pipeline(_chat(f"{http_base}/drip.png"), replace(LOCAL, image_fetch_timeout_s=1.0), accepts=OMNI)
    assert info.value.code == "image_url_unreachable" and "1 s" in info.value.message, info.value.message
    assert time.monotonic() - started < 2.5
