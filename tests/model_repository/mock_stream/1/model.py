"""Framework test model (Triton's mock_llm idea; never a pipeline).

REQUEST JSON: {"text": str, "repeat": int, "delay_ms": int, "fail_at": int|null, "reject": bool,
"audio": bool, "voice": str|null}. Streams `repeat` events {"type": "text.delta", "text", "index"}, each
followed, when "audio" is true or a "voice" is set (the frontend forwards OpenAI's `audio.voice`), by
{"type": "audio.delta", "sample_rate": 24000, "transcript"} with a 100-sample ramp as AUDIO; then
{"type": "done", "finish_reason": "stop", "usage"}.
"fail_at": raises after that many deltas (internal error); "reject": a RequestError (400).
"""
import asyncio

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.serving.decoupled import AsyncDecoupledModel


class TritonPythonModel(AsyncDecoupledModel):
    async def handle(self, ctx):
        body = ctx.body()
        if body.get("reject"):
            raise RequestError("mock rejection", param="reject", code="mock")
        repeat, delay = int(body.get("repeat", 3)), float(body.get("delay_ms", 0)) / 1000
        speak = bool(body.get("audio") or body.get("voice"))
        for i in range(repeat):
            if body.get("fail_at") is not None and i == int(body["fail_at"]):
                raise RuntimeError(f"mock failure at {i}")
            await asyncio.sleep(delay)
            ctx.check()
            text = f"{body.get('text', 'tok')}{i}"
            yield {"type": "text.delta", "text": text, "index": i}, None
            if speak:
                yield {"type": "audio.delta", "sample_rate": 24000, "transcript": text}, np.linspace(0, 1, 100, dtype=np.float32)
        yield {"type": "done", "finish_reason": "stop", "usage": {"completion_tokens": repeat}}, None
