"""Framework test model (never a pipeline): relays its REQUEST to mock_stream through a streamed
BLS call and forwards every event, to test BLS streaming, error and cancellation propagation."""

from omni_backends.serving import bls, events
from omni_backends.serving.decoupled import AsyncDecoupledModel


class TritonPythonModel(AsyncDecoupledModel):
    async def handle(self, ctx):
        inputs = {events.REQUEST: ctx.input(events.REQUEST)}
        async for out in bls.stream(ctx, "mock_stream", inputs, [events.EVENT, events.AUDIO]):
            event = events.read_json(out[events.EVENT])
            event["relayed"] = True
            yield event, out.get(events.AUDIO)
