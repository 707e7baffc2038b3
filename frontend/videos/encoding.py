"""Video and preview files from decoded frames (PyAV for MP4, Pillow for the previews).

frames: uint8 [frames, height, width, 3] RGB (the pipeline's VIDEO tensor); height and width must be
even (yuv420p), which the pipelines' 16-pixel size grid guarantees.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import av
import numpy as np
from PIL import Image

VIDEO, THUMBNAIL, SPRITESHEET = "video", "thumbnail", "spritesheet"
FILE_NAMES = {VIDEO: "video.mp4", THUMBNAIL: "thumbnail.webp", SPRITESHEET: "spritesheet.jpg"}
CONTENT_TYPES = {VIDEO: "video/mp4", THUMBNAIL: "image/webp", SPRITESHEET: "image/jpeg"}
SPRITESHEET_TILES = 16


def _check(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(f"frames must be uint8 [frames, height, width, 3], got {frames.dtype} {frames.shape}")


def write_mp4(frames: np.ndarray, fps: int, path: Path, crf: int = 18) -> None:
    """Writes H.264 (libx264, yuv420p, `crf`) in an MP4 container with the index up front (faststart,
    which needs a seekable file), `fps` frames per second. Raises ValueError for frames of the wrong
    shape/dtype or odd sizes."""
    _check(frames)
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise ValueError(f"H.264 yuv420p needs even width and height, got {width}x{height}")
    with av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": str(crf)})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def thumbnail(frames: np.ndarray) -> bytes:
    """The first frame as a lossless WebP image."""
    _check(frames)
    out = io.BytesIO()
    Image.fromarray(frames[0]).save(out, format="WEBP", lossless=True)
    return out.getvalue()


def spritesheet(frames: np.ndarray, tiles: int = SPRITESHEET_TILES) -> bytes:
    """Up to `tiles` evenly spaced frames on a near-square grid, row by row, as one JPEG image."""
    _check(frames)
    picks = np.unique(np.linspace(0, len(frames) - 1, min(tiles, len(frames))).round().astype(int))
    columns = math.ceil(math.sqrt(len(picks)))
    rows = math.ceil(len(picks) / columns)
    height, width = frames.shape[1:3]
    sheet = np.zeros((rows * height, columns * width, 3), np.uint8)
    for slot, index in enumerate(picks):
        r, c = divmod(slot, columns)
        sheet[r * height:(r + 1) * height, c * width:(c + 1) * width] = frames[index]
    out = io.BytesIO()
    Image.fromarray(sheet).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_assets(frames: np.ndarray, fps: int, folder: Path) -> None:
    """Writes video.mp4, thumbnail.webp and spritesheet.jpg into `folder` (each through a temporary
    name, so a reader never sees a partial file)."""
    for variant in (VIDEO, THUMBNAIL, SPRITESHEET):
        final = folder / FILE_NAMES[variant]
        partial = final.with_name(f".{final.name}.part")
        if variant == VIDEO:
            write_mp4(frames, fps, partial)
        else:
            partial.write_bytes(thumbnail(frames) if variant == THUMBNAIL else spritesheet(frames))
        partial.replace(final)


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    """An uploaded reference image (PNG, JPEG, WebP, ... anything Pillow reads) as uint8 [height, width, 3]
    RGB. Raises ValueError if it is not an image or has more than `max_pixels` pixels."""
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > max_pixels:
            raise ValueError(f"image is {image.width}x{image.height}; at most {max_pixels} pixels are accepted")
        image.load()
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for bad files
        raise ValueError(f"not a readable image: {exc}") from exc
    return np.asarray(image.convert("RGB"), dtype=np.uint8)
