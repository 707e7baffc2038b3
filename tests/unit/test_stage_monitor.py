"""The stage monitor against model control, with a fake Triton: a death is of one stub, and a model loaded afresh
after that stub was last seen running is not restarted for it (the real-server test is
tests/integration/test_framework.py::test_a_wake_after_one_that_failed_on_a_dead_stub_serves_at_once_without_a_reload)."""
from __future__ import annotations

import asyncio
import time

from omni_frontend.availability import Availability
from omni_frontend.model_control import ModelControl
from omni_frontend.pipelines import Pipeline
from omni_frontend.stage_monitor import StageMonitor

PIPELINE = Pipeline("relay", "chat", "relay_entry", ("stage", "relay_entry"))


class FakeTriton:
    """Model states and the loads / unloads asked for."""

    def __init__(self):
        self.states = {m: "READY" for m in PIPELINE.models}
        self.calls: list[tuple[str, str]] = []

    async def model_states(self) -> dict[str, str]:
        return dict(self.states)

    async def load_model(self, model: str) -> None:
        self.calls.append(("load", model))
        self.states[model] = "READY"

    async def unload_model(self, model: str) -> None:
        self.calls.append(("unload", model))
        self.states[model] = "UNAVAILABLE"


def _setup():
    triton, deaths = FakeTriton(), []
    availability = Availability({PIPELINE.entry: PIPELINE.models})
    control = ModelControl(triton, [PIPELINE], availability)

    def crashed_stubs():
        reported = {pid: death for pid, death in enumerate(deaths)}
        deaths.clear()
        return reported

    monitor = StageMonitor(control, availability, None, crashed_stubs, interval_s=0.01, retry_s=0.01)
    return triton, deaths, availability, control, monitor


async def _settle(monitor: StageMonitor, timeout_s: float = 2.0) -> None:
    await asyncio.sleep(0.05)
    deadline = time.monotonic() + timeout_s
    while monitor.recovering and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_a_wake_that_loads_a_stage_afresh_ends_its_pending_restart_without_a_reload():
    """The stub died while the wake loading it failed: the stage is held down until the next wake, which loads it
    afresh, answers awake (nothing down) and is not followed by a restart."""
    async def main():
        triton, deaths, availability, control, monitor = _setup()
        runner = asyncio.create_task(monitor.run())
        await control.sleep("relay")
        triton.states["stage"] = "UNAVAILABLE"       # its load failed: the stub died while it loaded
        deaths.append(("stage", time.monotonic()))
        await asyncio.sleep(0.1)
        assert set(availability.down()) == {"stage"} and monitor.recovering == {"stage"}
        triton.calls.clear()
        await control.wake("relay")
        assert availability.down() == {}             # the wake's answer: awake, not recovering
        await _settle(monitor)
        runner.cancel()
        assert triton.calls == [("load", "stage"), ("load", "relay_entry")]   # the wake's loads only
        assert not monitor.recovering and availability.down() == {}
    asyncio.run(main())


def test_a_death_reported_only_after_a_fresh_load_is_left():
    """The stub was last seen before the wake's load began but is reported after it: nothing is marked down."""
    async def main():
        triton, deaths, availability, control, monitor = _setup()
        await control.sleep("relay")
        seen = time.monotonic()
        await control.wake("relay")
        triton.calls.clear()
        deaths.append(("stage", seen))
        runner = asyncio.create_task(monitor.run())
        await _settle(monitor)
        runner.cancel()
        assert triton.calls == [] and availability.down() == {} and not monitor.recovering
    asyncio.run(main())


def test_a_stub_of_the_fresh_load_that_dies_is_restarted():
    """A stub the wake loaded dies too, reported while the first death is pending or after: the stage is restarted
    for real once the pipeline is awake."""
    async def main():
        triton, deaths, availability, control, monitor = _setup()
        runner = asyncio.create_task(monitor.run())
        await control.sleep("relay")
        deaths.append(("stage", time.monotonic()))
        await asyncio.sleep(0.1)
        assert monitor.recovering == {"stage"}
        load = triton.load_model

        async def load_model(model):
            await load(model)
            if model == "relay_entry":   # the wake's stub of `stage` dies once the wake has loaded it
                deaths.append(("stage", time.monotonic()))

        triton.load_model = load_model
        triton.calls.clear()
        await control.wake("relay")
        assert triton.calls == [("load", "stage"), ("load", "relay_entry")]
        triton.calls.clear()
        await asyncio.sleep(0.1)
        await _settle(monitor)
        runner.cancel()
        assert triton.calls == [("unload", "stage"), ("load", "stage")], triton.calls
        assert not monitor.recovering and availability.down() == {}
    asyncio.run(main())
