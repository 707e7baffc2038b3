"""Stage recovery: finds dead stages and restarts those of the awake pipelines without a server restart.

A stage is dead when its stub process died (the launcher sees it as a defunct child of tritonserver:
`TritonServer.crashed_stubs`) or when its heartbeat (omni_model_heartbeat_seconds) is older than
`recover_after_s` (a hung stub). Triton keeps such a model READY and never answers the requests the
stub held, so for each dead model the monitor
  1. marks it down in `Availability`: requests in flight through it fail at once with 503 naming it
     (not a hang until the client's timeout) and new ones get 503 at once;
  2. reloads it through `ModelControl.reload` (unload + load: a fresh stub; retried with backoff);
  3. marks it up once it is READY with a fresh heartbeat, so /health answers 200 again.
A stub that dies while its pipeline is not awake (falling asleep, sleeping, waking) gets step 1 too (its requests
would hold the sleep's drain and their clients for good) and stays down until the pipeline is awake, then step 2 and 3
(Triton may still read the model READY, so a wake alone would keep the dead stub).

A death is of one stub, which was last seen running at a known time (`crashed_stubs`; for a hung stub, when it was
found). A model that `ModelControl` loaded afresh after that time (`loaded_after`: a wake loading a model whose load
had failed when the stub died) runs new stubs, so the death needs no restart: the wake marks such a model up as it
ends (it is awake, not `recovering`), a pending restart finds it loaded and only checks it is alive, and a death
reported only after such a load is logged and left. A stub of the new load that dies too is a death of its own,
also while an earlier one of the same model is being handled.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from omni_frontend.availability import Availability
from omni_frontend.errors import APIError
from omni_frontend.liveness import HeartbeatReader
from omni_frontend.model_control import ModelControl

log = logging.getLogger("omni_frontend.recovery")
CrashedStubs = Callable[[], dict[int, tuple[str, float]]]   # {pid: (model, monotonic time last seen running)}


class StageMonitor:
    """Polls every `interval_s`; see the module doc. `recovering` holds the models being restarted and
    `recoveries` the last recovery time in seconds per model."""

    def __init__(self, control: ModelControl, availability: Availability, heartbeats: HeartbeatReader | None,
                 crashed_stubs: CrashedStubs | None = None, *, interval_s: float = 0.5,
                 recover_after_s: float = 30.0, retry_s: float = 2.0):
        self.control, self.availability, self.heartbeats = control, availability, heartbeats
        self.crashed_stubs = crashed_stubs
        self.interval_s, self.recover_after_s, self.retry_s = interval_s, recover_after_s, retry_s
        self.recovering: set[str] = set()
        self.recoveries: dict[str, float] = {}
        self._dead_seen: dict[str, float] = {}   # model being recovered -> when its newest dead stub was last seen running
        self._tasks: set[asyncio.Task] = set()
        control.on_wake(self._woke)

    async def run(self) -> None:
        """Runs until cancelled."""
        while True:
            try:
                for model, seen, crashed in await self._dead_models():
                    self._found_dead(model, seen, crashed)
            except Exception:  # noqa: BLE001 - the monitor must outlive any single failure
                log.exception("stage monitor iteration failed")
            await asyncio.sleep(self.interval_s)

    async def _dead_models(self) -> list[tuple[str, float, bool]]:
        """[(model, when its dead stub was last seen running, whether it crashed (else hung))]."""
        dead = []
        if self.crashed_stubs is not None:
            for pid, (model, seen) in (await asyncio.to_thread(self.crashed_stubs)).items():
                if self.control.loaded_after(model, seen):
                    log.warning("stage %s: a stub process (pid %d) died that a later load had already replaced; "
                                "nothing to restart", model, pid)
                    continue
                log.error("stage %s: its stub process (pid %d) died", model, pid)
                dead.append((model, seen, True))
        if self.heartbeats is not None:
            try:
                hung = await self.heartbeats.stale_models(self.control.awake_models(), self.recover_after_s)
            except httpx.HTTPError:
                hung = []
            found = time.monotonic()
            for model in hung:
                if model not in self.recovering:
                    log.error("stage %s: no heartbeat for %.0f s", model, self.recover_after_s)
                    dead.append((model, found, False))
        return dead

    def _found_dead(self, model: str, seen: float, crashed: bool) -> None:
        if model not in self.recovering:
            self._dead_seen[model] = seen
            self._start(model)
        elif crashed and seen > self._dead_seen[model]:
            # another stub of a model being handled died (a stub loaded since the first death): it needs its restart
            self._dead_seen[model] = seen
            self._mark_down(model)

    def _woke(self, name: str) -> None:
        """ModelControl.wake's listener: a model of the pipeline awaiting its restart that the wake loaded afresh after
        its dead stub was last seen running is up again now (its restart task only checks it is alive)."""
        fresh = [m for m in self.control.pipelines[name].models
                 if m in self.recovering and self.control.loaded_after(m, self._dead_seen[m])]
        if fresh:
            self.availability.mark_up(fresh)
            log.warning("stage %s: loaded afresh by the wake of %s; no restart needed", ", ".join(fresh), name)

    def _mark_down(self, model: str) -> None:
        error = APIError(503, f"model unavailable: stage {model} failed and is being restarted; retry shortly",
                         code="model_unavailable")
        failed = self.availability.mark_down([model], error)
        log.warning("stage %s is down: failed %d request(s) in flight; reloading it", model, failed)

    def _start(self, model: str) -> None:
        self.recovering.add(model)
        task = asyncio.create_task(self._recover(model))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, model: str) -> None:
        started = time.monotonic()
        self._mark_down(model)
        force = False   # restart even if loaded afresh since the death (that stub was not found alive either)
        try:
            while True:
                seen = self._dead_seen[model]
                try:   # reload() is False while no awake pipeline needs the model: it waits for a wake
                    if await self.control.reload(model, None if force else seen):
                        if await self._alive(model):
                            if self.control.loaded_after(model, self._dead_seen[model]):
                                break
                            continue   # a stub of that load died meanwhile (_found_dead): restart it
                        force = True
                        self._mark_down(model)   # a wake may have marked it up (_woke)
                except APIError as exc:
                    log.error("stage %s: reload failed: %s", model, exc.message)
                await asyncio.sleep(self.retry_s)
            self.recoveries[model] = time.monotonic() - started
            log.warning("stage %s recovered in %.1f s", model, self.recoveries[model])
        finally:
            self.availability.mark_up([model])
            self.recovering.discard(model)
            self._dead_seen.pop(model, None)

    async def _alive(self, model: str, timeout_s: float = 30.0) -> bool:
        """READY and (when metrics are known) a heartbeat newer than the reload."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (await self.control.client.model_states()).get(model) == "READY":
                if self.heartbeats is None:
                    return True
                try:
                    if not await self.heartbeats.stale_models([model], 2.0):
                        return True
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.1)
        return False

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
