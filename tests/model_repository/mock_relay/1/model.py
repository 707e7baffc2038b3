"""Framework test model (never a pipeline): relays its REQUEST to mock_stream through a streamed
BLS call and forwards every event, to test BLS streaming, error and cancellation propagation.

REQUEST "probe_release": true also watches every array of the child's responses (weakref callbacks) and
leaves the child's stream at its "done" event, before its FINAL (as qwen3_omni leaves the thinker's):
the stream is then drained and let go on a worker thread, right after the stub's clean-up thread was
asked to drop it. Each array must still be freed by a thread holding the GIL
(`omni_backends.serving.retire`). REQUEST {"action": "release_report"} answers one event
{"type": "release_report", "probed", "freed", "freed_without_gil"} (counts since the stub started; the
request's own cancellation poll first drops the iterators retired before it).
REQUEST "calls": N relays the request N times, one child stream after another (one "done" at the end), as an
orchestrator calls a stage once per chunk.
While the file named by $OMNI_TEST_HOLD_LOAD exists (at most 60 s), the model's load waits in `setup`: a test can
act on a stub that is loading (tests/conftest.py: hold_load_file)."""
import ctypes
import json
import os
import time
import weakref

import numpy as np

from omni_backends.serving import bls, events
from omni_backends.serving.decoupled import AsyncDecoupledModel

_REPORT = {"probed": 0, "freed": 0, "freed_without_gil": 0}
_WATCHED: dict = {}   # id(weakref) -> weakref (weak references to arrays hash by the array)


def _freed(ref) -> None:
    _WATCHED.pop(id(ref), None)
    _REPORT["freed"] += 1
    if not ctypes.pythonapi.PyGILState_Check():
        _REPORT["freed_without_gil"] += 1


class TritonPythonModel(AsyncDecoupledModel):
    def setup(self, args: dict) -> None:
        hold = os.environ.get("OMNI_TEST_HOLD_LOAD")
        deadline = time.monotonic() + 60
        while hold and os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.05)

    async def handle(self, ctx):
        body = ctx.body()
        if body.get("action") == "release_report":
            ctx.check()
            yield {"type": "release_report", **_REPORT}, None
            return
        probe = bool(body.get("probe_release"))
        calls = int(body.pop("calls", 1))
        inputs = {events.REQUEST: np.array([json.dumps(body).encode()], dtype=np.object_)}
        for call in range(calls):
            async for out in bls.stream(ctx, "mock_stream", inputs, [events.EVENT, events.AUDIO]):
                event = events.read_json(out[events.EVENT])
                if probe:
                    for array in out.values():
                        ref = weakref.ref(array, _freed)
                        _WATCHED[id(ref)] = ref
                        _REPORT["probed"] += 1
                event["relayed"] = True
                if event["type"] == "done" and call < calls - 1:
                    continue   # the child's stream runs to its FINAL; the next call follows
                yield event, out.get(events.AUDIO)
                if probe and event["type"] == "done":
                    return
