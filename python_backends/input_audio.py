"""The one check of input audio, shared by every model that takes audio from a client (voice_asr's AUDIO,
voice_asr_stream's and the chat pipelines' INPUT_AUDIO, voice_vad's AUDIO): a NaN or infinite sample is a 400
naming the tensor, never a transcript of noise or an answer to it. The frontend's decoders refuse such audio
before it gets here (omni_frontend.audio); this check covers any Triton client."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError

SAMPLE_RATE = 16000   # Hz, every model's input audio


def check_audio(pcm: np.ndarray | None, name: str, *, allow_empty: bool = False, param: str | None = None) -> np.ndarray:
    """`pcm` as float32 [samples] (mono 16 kHz). Raises RequestError (HTTP 400, param `param`, default `name`)
    "<name> must hold finite mono 16 kHz samples" when it is missing, empty (unless `allow_empty`) or holds a
    NaN or infinite sample."""
    audio = None if pcm is None else np.asarray(pcm, dtype=np.float32).reshape(-1)
    if audio is None or (audio.size == 0 and not allow_empty) or not np.isfinite(audio).all():
        raise RequestError(f"{name} must hold finite mono 16 kHz samples", param=param or name)
    return audio
