"""tts: the client-facing text-to-speech orchestrator (BLS, decoupled) over voice_tts.

REQUEST {"input": str, "voice": str, "speed": float} (no other non-null key: a 400 naming it) -> one
{"type": "audio.delta", "sample_rate": 24000, "transcript"} + AUDIO per sentence chunk that makes a sound (the next
chunk is synthesised while the current one is sent), then {"type": "done", "usage": {"input_tokens" (phoneme
tokens), "output_tokens": 0, "total_tokens"}}. An input of which the engine says nothing (no letters or digits, or
only ones it cannot read, such as Arabic-Indic digits) is a 400 naming `input`, code `nothing_to_speak`,
before any audio.
REQUEST {"action": "voices"} -> {"type": "voices", "voices": [str], "default": str}: the voices of the engine
voice_tts runs (its config parameter `engine`, read by omni_backends.voice.engines.stage_engine).
"""
from __future__ import annotations

import asyncio

import numpy as np

from omni_backends.errors import NOTHING_TO_SPEAK, RequestError
from omni_backends.serving import bls, events
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.voice.chunker import SentenceChunker
from omni_backends.voice import engines
from omni_backends.voice.tts import SAMPLE_RATE, check_speed

REQUEST_FIELDS = ("input", "voice", "speed")


class TritonPythonModel(AsyncDecoupledModel):
    request_fields, control_actions = REQUEST_FIELDS, ("voices",)

    def setup(self, args: dict) -> None:
        self.voices = engines.voices(engines.stage_engine(args["model_repository"]))

    async def handle(self, ctx):
        body = ctx.body()
        if events.wants_voices(body):
            yield events.voices_event(self.voices.names, self.voices.default, body, self.voices.resolve), None
            return
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise RequestError("input must be a non-empty string", param="input")
        voice = self.voices.resolve(body.get("voice"))
        speed = float(check_speed(1.0 if body.get("speed") is None else body["speed"]))
        chunker = SentenceChunker()
        chunks = [c for c in chunker.feed(text) + chunker.flush() if any(ch.isalnum() for ch in c)]
        if not chunks:
            raise RequestError("input contains nothing speakable (no letters or digits)", param="input",
                               code=NOTHING_TO_SPEAK)
        tokens, spoken = 0, False
        pending = asyncio.ensure_future(speak(ctx, chunks[0], voice, speed))
        try:
            for index, chunk in enumerate(chunks):
                audio, count = await pending
                if index + 1 < len(chunks):  # synthesise the next chunk while this one is sent
                    pending = asyncio.ensure_future(speak(ctx, chunks[index + 1], voice, speed))
                tokens += count
                if audio.size:   # letters the engine cannot read ("١٢٣") make no sound: no delta
                    spoken = True
                    yield {"type": "audio.delta", "sample_rate": SAMPLE_RATE, "transcript": chunk}, audio
        finally:
            pending.cancel()
        if not spoken:   # nothing sent yet, so the client gets a 400, not an empty file passed off as speech
            raise RequestError("input contains nothing the voice can speak (no letters or digits it reads)",
                               param="input", code=NOTHING_TO_SPEAK)
        yield {"type": "done", "usage": {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}}, None


async def speak(ctx, text: str, voice: str, speed: float) -> tuple[np.ndarray, int]:
    """One voice_tts call for the request `ctx`: (float32 [samples] PCM at 24 kHz, phoneme tokens spoken)."""
    result = await bls.infer(ctx, "voice_tts", {
        "TEXT": np.array([[text.encode()]], dtype=np.object_),
        "VOICE": np.array([[voice.encode()]], dtype=np.object_),
        "SPEED": np.array([[speed]], dtype=np.float32),
    }, ["AUDIO", "TOKENS"])
    return result["AUDIO"].reshape(-1), int(result["TOKENS"].reshape(-1)[0])
