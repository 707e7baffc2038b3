"""Image codecs of the image routes (Pillow): encode RGB pixels as png / jpeg / webp, decode uploads.

Pixels are uint8 [H, W, 3] (RGB). `output_compression` (0-100) is OpenAI's: for jpeg and webp it is the
encoder's quality, 100 (OpenAI's default) the best and largest, lower values smaller files; png is lossless
and ignores it, as OpenAI's does.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

FORMATS = ("png", "jpeg", "webp")
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


class ImageDecodeError(ValueError):
    """An upload that is not a readable image."""


class ImageTooLarge(ImageDecodeError):
    """An upload whose header declares more pixels than allowed (refused before decoding)."""


def encode(pixels: np.ndarray, fmt: str, compression: int | None = None) -> bytes:
    """uint8 [H, W, 3] -> file bytes in `fmt`: png lossless (zlib level 6, `compression` ignored); jpeg / webp at
    quality `compression` (0-100; None: OpenAI's default 100). Raises ValueError for another format."""
    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB")
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, "PNG", compress_level=6)
    elif fmt in ("jpeg", "webp"):
        image.save(out, fmt.upper(), quality=100 if compression is None else compression)
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    return out.getvalue()


def decode(data: bytes, max_pixels: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """File bytes -> (uint8 [H, W, 3] RGB, uint8 [H, W] alpha or None when the image has none).

    Raises ImageTooLarge when the header declares more than `max_pixels` pixels (checked before any
    pixel is decoded: a few KB of PNG can declare gigabytes; also for Pillow's own decompression-bomb
    refusal), ImageDecodeError for bytes Pillow cannot read.
    """
    try:
        image = Image.open(io.BytesIO(data))
        if max_pixels is not None and image.width * image.height > max_pixels:
            raise ImageTooLarge(f"the image is {image.width}x{image.height} pixels; at most {max_pixels}")
        image.load()
    except Image.DecompressionBombError as exc:  # Pillow's own limit, met in open() before our check
        raise ImageTooLarge(str(exc)) from exc
    except UnidentifiedImageError as exc:   # its message names the BytesIO object ("<_io.BytesIO object at 0x...>")
        raise ImageDecodeError("not an image file Pillow reads (PNG, JPEG, WebP, GIF, BMP, TIFF, ...)") from exc
    except (OSError, ValueError) as exc:
        if isinstance(exc, ImageDecodeError):
            raise
        raise ImageDecodeError(str(exc) or "unreadable image") from exc
    alpha = None
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        alpha = np.asarray(rgba)[..., 3].copy()
        image = rgba
    return np.asarray(image.convert("RGB")).copy(), alpha


def padded_pixels(images: list[np.ndarray]) -> tuple[int, int]:
    """(Hmax, Wmax) of images [H, W, ...]: the height and width every image takes in `stack`'s tensor."""
    return max(image.shape[0] for image in images), max(image.shape[1] for image in images)


def check_padding(images: list[np.ndarray], max_pixels: int) -> None:
    """Raises ImageTooLarge when `stack` would give each image more than `max_pixels` (Hmax x Wmax): images of
    different shapes (a tall one and a wide one) pad to the largest height AND width, so each within the limit alone
    could still ask for gigabytes together (four of 57000x290 and 290x57000: 39 GB)."""
    height, width = padded_pixels(images)
    if height * width > max_pixels:
        raise ImageTooLarge(f"the request's images pad to {width}x{height} each in the image tensor ({height * width} "
                            f"pixels; the tensor holds every image at the largest width and height); the limit is "
                            f"{max_pixels}: send images of similar shapes or smaller ones")


def stack(images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """K images of any sizes -> (uint8 [K, Hmax, Wmax, 3] zero-padded, int32 [K, 2] (height, width) each):
    the INPUT_IMAGES / INPUT_IMAGE_SIZES tensors of the image pipelines."""
    sizes = np.array([image.shape[:2] for image in images], dtype=np.int32)
    padded = np.zeros((len(images), int(sizes[:, 0].max()), int(sizes[:, 1].max()), 3), np.uint8)
    for k, image in enumerate(images):
        padded[k, :image.shape[0], :image.shape[1]] = image
    return padded, sizes
