"""tts: the client-facing text-to-speech orchestrator (BLS, decoupled) over voice_tts.

REQUEST {"input": str, "voice": str, "speed": float} -> one {"type": "audio.delta", "sample_rate": 24000,
"transcript"} + AUDIO per sentence chunk (up to `tts_lookahead` chunks, config parameter, are synthesised
at once, one per voice_tts instance, and sent in order),
then {"type": "done", "usage": {"input_tokens" (phoneme tokens), "output_tokens": 0, "total_tokens"}}.
REQUEST {"action": "voices"} -> {"type": "voices", "voices": [str], "default": str}.
"""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.serving import bls, events, model_config
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.serving.lookahead import ordered_map
from omni_backends.voice.chunker import SentenceChunker
from omni_backends.voice.tts import DEFAULT_VOICE, SAMPLE_RATE, check_speed, resolve_voice, voice_names


class TritonPythonModel(AsyncDecoupledModel):
    def setup(self, args: dict) -> None:
        self.voices = voice_names()
        self.lookahead = model_config.int_parameter(self.parameters, "tts_lookahead", 1)

    async def handle(self, ctx):
        body = ctx.body()
        if events.wants_voices(body):
            yield events.voices_event(self.voices, DEFAULT_VOICE), None
            return
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise RequestError("input must be a non-empty string", param="input")
        voice = resolve_voice(body.get("voice"), self.voices)
        speed = check_speed(float(body.get("speed") or 1.0))
        chunker = SentenceChunker()
        chunks = [c for c in chunker.feed(text) + chunker.flush() if any(ch.isalnum() for ch in c)]
        if not chunks:
            raise RequestError("input contains nothing speakable (no letters or digits)", param="input")
        tokens = 0

        async def texts():
            for chunk in chunks:
                yield chunk

        async for chunk, (audio, count) in ordered_map(texts(), lambda text: speak(ctx, text, voice, speed),
                                                       self.lookahead):
            tokens += count
            yield {"type": "audio.delta", "sample_rate": SAMPLE_RATE, "transcript": chunk}, audio
        yield {"type": "done", "usage": {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}}, None


async def speak(ctx, text: str, voice: str, speed: float) -> tuple[np.ndarray, int]:
    """One voice_tts call for the request `ctx`: (float32 [samples] PCM at 24 kHz, phoneme tokens spoken)."""
    result = await bls.infer(ctx, "voice_tts", {
        "TEXT": np.array([[text.encode()]], dtype=np.object_),
        "VOICE": np.array([[voice.encode()]], dtype=np.object_),
        "SPEED": np.array([[speed]], dtype=np.float32),
    }, ["AUDIO", "TOKENS"])
    return result["AUDIO"].reshape(-1), int(result["TOKENS"].reshape(-1)[0])
