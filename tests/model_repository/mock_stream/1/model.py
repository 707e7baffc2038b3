"""Framework test model (Triton's mock_llm idea; never a pipeline).

REQUEST JSON: {"text": str, "repeat": int, "delay_ms": int, "fail_at": int|null, "reject": bool,
"audio": bool}. Streams `repeat` events {"type": "text.delta", "text", "index"} (with a 100-sample
ramp as AUDIO when "audio"), then {"type": "done", "finish_reason": "stop", "usage"}.
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
        for i in range(repeat):
            if body.get("fail_at") is not None and i == int(body["fail_at"]):
                raise RuntimeError(f"mock failure at {i}")
            await asyncio.sleep(delay)
            ctx.check()
            audio = np.linspace(0, 1, 100, dtype=np.float32) if body.get("audio") else None
            yield {"type": "text.delta", "text": f"{body.get('text', 'tok')}{i}", "index": i}, audio
        yield {"type": "done", "finish_reason": "stop", "usage": {"completion_tokens": repeat}}, None
