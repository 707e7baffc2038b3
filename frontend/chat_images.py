"""Image content parts of chat messages -> pixels, and the pixels -> the pipeline's image tensors.

A part is OpenAI's {"type": "image_url", "image_url": {"url": "data:image/png;base64,..." | "https://...",
"detail": ...}} (`detail` is accepted and has no effect). The URL's bytes come from `media_url` and are decoded
with Pillow (`omni_frontend.images.decode`) to uint8 RGB [H, W, 3]; the request's images travel as INPUT_IMAGES
uint8 [K, Hmax, Wmax, 3] (zero-padded) + INPUT_IMAGE_SIZES int32 [K, 2] (each image's h, w). Blocking (network and
decoding): call from a worker thread, as `chat_protocol.to_pipeline` is.
"""
from __future__ import annotations

import numpy as np

from omni_frontend import images, media_url
from omni_frontend.config import RequestLimits
from omni_frontend.errors import bad_request

# Qwen2-VL's image processor (Qwen3-Omni's) refuses an image whose longer side is this many times the shorter or more
# (transformers' `smart_resize`): refused here, naming the part, not a 500 from the pipeline
MAX_ASPECT_RATIO = 200
CODES = {"invalid_url": "invalid_image_url", "too_large": "image_too_large", "unreachable": "image_url_unreachable",
         "not_allowed": "image_url_not_allowed"}


def image_part(part: dict, param: str, limits: RequestLimits) -> np.ndarray:
    """uint8 [H, W, 3] RGB of one image_url content part (`param`: its path, e.g. `messages[0].content[1]`).

    Limits (`RequestLimits`): max_image_bytes of the encoded file, max_image_pixels (H * W, from the header before
    decoding), image_fetch_timeout_s, allowed_media_domains and allow_private_media_urls for an http(s) URL
    (`media_url`). Raises APIError 400 naming `param + ".image_url"` for a part without {"url": str}, else
    `param + ".image_url.url"`: invalid_image_url (bad base64, unsupported scheme), image_url_not_allowed (a private
    or local host, or one not among --allowed-media-domains), image_too_large, image_url_unreachable, invalid_image
    (bytes that are no image)."""
    spec = part.get("image_url")
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
        raise bad_request("image_url needs {'url': 'data:image/...;base64,...' or 'https://...'}",
                          param=f"{param}.image_url")
    param += ".image_url.url"
    try:
        data = media_url.read(spec["url"], limits.max_image_bytes, limits.image_fetch_timeout_s,
                              limits.allowed_media_domains, limits.allow_private_media_urls)
    except media_url.MediaURLError as exc:
        hint = " (limit --max-image-bytes)" if exc.code == "too_large" else ""
        raise bad_request(f"{exc}{hint}", param=param, code=CODES[exc.code]) from None
    try:
        pixels, _ = images.decode(data, max_pixels=limits.max_image_pixels)
    except images.ImageTooLarge as exc:
        raise bad_request(f"{exc} (limit --max-image-pixels)", param=param, code="image_too_large") from None
    except images.ImageDecodeError as exc:
        raise bad_request(f"the URL's bytes are not an image: {exc}", param=param, code="invalid_image") from None
    height, width = pixels.shape[:2]
    if max(height, width) >= MAX_ASPECT_RATIO * min(height, width):
        raise bad_request(f"the image is {width}x{height}: its longer side must be less than {MAX_ASPECT_RATIO} times "
                          "its shorter one (the model's image processor)", param=param, code="invalid_image")
    return pixels


def check_padding(pixels: list[np.ndarray], param: str, limits: RequestLimits) -> None:
    """Raises APIError 400 image_too_large naming `param + ".image_url.url"` (the part whose image was added last)
    when the request's images pad to more than max_image_pixels each (`images.check_padding`)."""
    try:
        images.check_padding(pixels, limits.max_image_pixels)
    except images.ImageTooLarge as exc:
        raise bad_request(f"{exc} (limit --max-image-pixels)", param=f"{param}.image_url.url",
                          code="image_too_large") from None


def image_tensors(pixels: list[np.ndarray]) -> dict[str, np.ndarray]:
    """{"INPUT_IMAGES": uint8 [K, Hmax, Wmax, 3], "INPUT_IMAGE_SIZES": int32 [K, 2]} of K >= 1 images (`images.stack`);
    {} without images."""
    if not pixels:
        return {}
    padded, sizes = images.stack(pixels)
    return {"INPUT_IMAGES": padded, "INPUT_IMAGE_SIZES": sizes}
