"""Image codecs and the URL store of the image routes (no server)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from omni_frontend import images
from omni_frontend.image_store import ImageStore

pytestmark = pytest.mark.unit

PIXELS = np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt, pil_format", [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")])
def test_encode_writes_the_format_and_size(fmt, pil_format):
    image = Image.open(io.BytesIO(images.encode(PIXELS, fmt, 30)))
    assert image.format == pil_format and image.size == (40, 24)


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_output_compression_is_openais_100_the_default_and_best(fmt):
    """OpenAI's `output_compression` defaults to 100, the full quality; lower values give smaller, coarser files
    (it worked backwards: 100 was quality 0, the fifth outside test)."""
    def error(data: bytes) -> float:
        return float(np.abs(images.decode(data)[0].astype(int) - PIXELS).mean())

    best, half, worst = (images.encode(PIXELS, fmt, c) for c in (100, 50, 0))
    assert images.encode(PIXELS, fmt) == best and images.encode(PIXELS, fmt, None) == best
    assert len(best) > len(half) > len(worst) and error(best) < error(half) < error(worst)


def test_png_is_lossless_whatever_the_compression():
    assert np.array_equal(images.decode(images.encode(PIXELS, "png"))[0], PIXELS)
    assert images.encode(PIXELS, "png", 0) == images.encode(PIXELS, "png", 100) == images.encode(PIXELS, "png")


def test_decode_returns_alpha_and_rejects_non_images():
    rgba = np.dstack([PIXELS, np.full((24, 40), 7, np.uint8)])
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, "PNG")
    rgb, alpha = images.decode(out.getvalue())
    assert np.array_equal(rgb, PIXELS) and alpha is not None and (alpha == 7).all()
    assert images.decode(images.encode(PIXELS, "png"))[1] is None
    with pytest.raises(images.ImageDecodeError):
        images.decode(b"not an image")


def test_decode_refuses_too_many_pixels_from_the_header():
    png = images.encode(PIXELS, "png")
    assert images.decode(png, max_pixels=24 * 40)[0].shape == (24, 40, 3)
    with pytest.raises(images.ImageTooLarge, match="40x24"):
        images.decode(png, max_pixels=24 * 40 - 1)


def test_stack_pads_and_records_sizes():
    padded, sizes = images.stack([PIXELS, PIXELS[:10, :5]])
    assert padded.shape == (2, 24, 40, 3) and sizes.tolist() == [[24, 40], [10, 5]]
    assert np.array_equal(padded[1, :10, :5], PIXELS[:10, :5]) and not padded[1, 10:].any()


def test_store_serves_until_expiry_and_drops_the_oldest():
    store = ImageStore(ttl_s=60, max_items=2)
    first, _ = store.put(b"a", "image/png")
    second, expires = store.put(b"b", "image/webp")
    assert store.get(second) == (b"b", "image/webp") and expires > 0
    store.put(b"c", "image/png")
    assert store.get(first) is None and store.get("unknown") is None
    expired = ImageStore(ttl_s=0)
    key, _ = expired.put(b"x", "image/png")
    assert expired.get(key) is None


def test_store_holds_at_most_max_bytes_and_keeps_the_newest():
    """Only the item count was bounded: 512 full-size PNGs were up to 1.5 GB of the frontend's memory."""
    store = ImageStore(ttl_s=60, max_bytes=250)
    keys = [store.put(bytes(100), "image/png")[0] for _ in range(5)]
    assert [store.get(k) is not None for k in keys] == [False, False, False, True, True]
    big, _ = store.put(bytes(1000), "image/png")   # one image over the bound is still served, alone
    assert store.get(big) is not None and all(store.get(k) is None for k in keys)


@pytest.mark.parametrize("quality", ["ultra", "", "HIGH"])
def test_an_unknown_quality_is_refused_naming_the_field(quality):
    """`quality` took any string and the response claimed "high": now OpenAI's values only (gpt-image-1's auto / low /
    medium / high, dall-e-3's standard / hd), anything else a 400 naming `quality` (the route maps the error)."""
    from pydantic import ValidationError

    from omni_frontend.routes.images import ImageOptions, _quality

    with pytest.raises(ValidationError) as info:
        ImageOptions.model_validate({"prompt": "a cube", "quality": quality})
    assert info.value.errors()[0]["loc"] == ("quality",)
    for known, echoed in (("low", "low"), ("medium", "medium"), ("hd", "high"), ("auto", "high"), (None, "high")):
        assert _quality(ImageOptions.model_validate({"prompt": "a cube", "quality": known})) == echoed
