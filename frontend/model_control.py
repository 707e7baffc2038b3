"""The one place that loads and unloads Triton models (explicit model control): stage recovery
(`reload` a model whose stub died) and sleep/wake of pipelines both go through `ModelControl`, one
operation at a time.

A pipeline is awake (its models loaded, requests served) or sleeping (its requests get 503
`pipeline_sleeping`; the models no awake pipeline needs are unloaded, so their stub processes and
memory are gone). Models shared by pipelines (voice_tts serves `voice` and `tts`) stay loaded while
any awake pipeline needs them. Between the two it is `falling_asleep` (refusing new requests while
those in flight drain and its models unload) or `waking` (still refusing while its models load);
either way it is not awake, so /health does not judge its models (Triton's own readiness is false
meanwhile: see routes/system.health).

Every load that starts a model afresh (a wake's load of a model that was not READY, a reload's) is noted with the
`time.monotonic()` it began (`loaded_after`): a stub that was running before then is no longer the model's, so the
stage monitor does not restart a model for the death of a stub that a wake has already replaced.

Work the frontend holds outside Triton for a pipeline (queued video jobs: omni_frontend.videos.runner) is not
started while the pipeline is not awake: `on_wake` tells its holder when to start it, and `sleeps` counts the
sleeps begun, so a request sent as one began (and refused by the unloaded model) can be told from a real failure.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from omni_frontend.availability import Availability
from omni_frontend.errors import APIError
from omni_frontend.pipelines import Pipeline, triton_models
from omni_frontend.triton_client import TritonClient

log = logging.getLogger("omni_frontend.model_control")
AWAKE, SLEEPING, FALLING_ASLEEP, WAKING = "awake", "sleeping", "falling_asleep", "waking"
UNLOAD_WAIT_S = 60.0  # how long sleep() waits for unloads to finish (requests in flight delay them)
_LOADED = ("READY", "LOADING", "UNLOADING")   # Triton states of a model that still has (or may take) requests


class ModelControl:
    """Pipeline states and model loading over `client` for the launcher's `pipelines`; `availability` tells which
    models the stage monitor marked down (a sleep does not wait for them to unload)."""

    def __init__(self, client: TritonClient, pipelines: list[Pipeline], availability: Availability | None = None):
        self.client = client
        self.availability = availability or Availability()
        self.pipelines = {p.name: p for p in pipelines}
        self.sleeping: set[str] = set()   # every pipeline that is not awake (refused), transitions included
        self._transitions: dict[str, str] = {}   # name -> FALLING_ASLEEP | WAKING while sleep / wake runs
        self._sleeps: dict[str, int] = {}        # name -> sleeps begun (see `sleeps`)
        self._wake_listeners: list[Callable[[str], None]] = []
        self._fresh: dict[str, float] = {}        # model -> when its last successful fresh load began (monotonic)
        self._lock = asyncio.Lock()

    def state(self, name: str) -> str:
        """awake | falling_asleep | sleeping | waking."""
        if name not in self.sleeping:
            return AWAKE
        return self._transitions.get(name, SLEEPING)

    def awake_models(self) -> list[str]:
        """Every Triton model the awake pipelines need, in load order."""
        return triton_models([p for n, p in self.pipelines.items() if n not in self.sleeping])

    def sleeps(self, name: str) -> int:
        """How many sleeps of pipeline `name` have begun: a caller that notes it before sending a request knows,
        when the request fails, whether a sleep began meanwhile (the model may have unloaded before it arrived)."""
        return self._sleeps.get(name, 0)

    def loaded_after(self, model: str, seen: float) -> bool:
        """Whether a load that began after `seen` (time.monotonic()) started `model` afresh and succeeded: a stub of
        the model that was running at `seen` has been replaced since."""
        return self._fresh.get(model, float("-inf")) > seen

    async def _load_fresh(self, model: str) -> None:
        """Loads `model`, which is not READY (or was just unloaded): Triton starts new stubs for it."""
        began = time.monotonic()
        await self.client.load_model(model)
        self._fresh[model] = began

    def on_wake(self, listener: Callable[[str], None]) -> None:
        """Calls `listener(name)` each time pipeline `name` is awake again (after `wake` loaded its models)."""
        self._wake_listeners.append(listener)

    def check(self, pipeline: Pipeline) -> None:
        """Raises 503 `pipeline_sleeping` for a sleeping pipeline."""
        if pipeline.name in self.sleeping:
            raise APIError(503, f"pipeline '{pipeline.name}' is sleeping; wake it with "
                                f"POST /v1/admin/pipelines/{pipeline.name}/wake", param="model", code="pipeline_sleeping")

    def _get(self, name: str) -> Pipeline:
        pipeline = self.pipelines.get(name)
        if pipeline is None:
            raise APIError(404, f"pipeline '{name}' is not loaded; pipelines: {', '.join(self.pipelines)}",
                           param="name", code="pipeline_not_found")
        return pipeline

    async def sleep(self, name: str) -> dict:
        """Refuse new requests of pipeline `name` and unload the models no other pipeline needs (waiting up
        to UNLOAD_WAIT_S for the unloads: requests already in flight finish first).
        Returns {"unloaded": [...], "kept": [...] (still used by awake pipelines, or by sleeping ones whose requests
        in flight have not drained), "pending": [...]}."""
        pipeline = self._get(name)
        async with self._lock:
            self._refuse(name)
            return await self._sleep_refused(pipeline)

    async def sleep_all(self) -> dict[str, dict]:
        """Sleep every awake pipeline (vLLM's whole-server sleep): all refuse new requests at once, so their requests
        in flight drain together, then each unloads as `sleep` does, one after another. Returns {name: sleep's
        result}. A pipeline used to go on serving new requests while those before it drained (up to UNLOAD_WAIT_S
        each)."""
        async with self._lock:
            names = [n for n in self.pipelines if n not in self.sleeping]
            for name in names:
                self._refuse(name)
            try:
                return {name: await self._sleep_refused(self.pipelines[name]) for name in names}
            finally:
                for name in names:
                    self._transitions.pop(name, None)

    def _refuse(self, name: str) -> None:
        """Pipeline `name` is falling asleep: its new requests get 503 `pipeline_sleeping` from now on."""
        self.sleeping.add(name)
        self._sleeps[name] = self._sleeps.get(name, 0) + 1
        self._transitions[name] = FALLING_ASLEEP

    async def _sleep_refused(self, pipeline: Pipeline) -> dict:
        """`sleep` of a pipeline already refused (`_refuse`), under the lock. A model another pipeline still needs
        is kept: one of an awake pipeline, of one falling asleep after it (`sleep_all`), or of a sleeping one whose
        client-facing model is still UNLOADING (Triton waits for its requests in flight, which past an earlier sleep's
        UNLOAD_WAIT_S still call its stages: sleeping `tts` unloaded voice_tts under `voice` chats still draining,
        which failed with 500 `inference_error`)."""
        name = pipeline.name
        try:
            states = await self.client.model_states()   # sleeping again: unloads what is still loaded, if any
            draining = [p for n, p in self.pipelines.items() if n != name and n in self.sleeping
                        and (self._transitions.get(n) == FALLING_ASLEEP
                             or any(states.get(m) == "UNLOADING" for m in (p.entry, p.stream_entry) if m))]
            needed = set(self.awake_models()) | set(triton_models(draining))
            loaded = [m for m in reversed(pipeline.models) if states.get(m) in _LOADED]
            unload = [m for m in loaded if m not in needed]  # orchestrator first
            pending = await self._unload_callers_first(pipeline, unload)
        finally:
            self._transitions.pop(name, None)
        log.info("pipeline %s sleeping: unloaded %s", name, ", ".join(unload) or "nothing")
        return {"unloaded": unload, "kept": [m for m in pipeline.models if m in needed], "pending": pending}

    async def wake(self, name: str) -> dict:
        """Load every model of pipeline `name` that is not READY, then serve it again. Returns
        {"loaded": [...]}. Raises APIError (the pipeline stays asleep) when a model fails to load."""
        pipeline = self._get(name)
        async with self._lock:
            self._transitions[name] = WAKING
            try:
                states = await self.client.model_states()
                load = [m for m in pipeline.models if states.get(m) != "READY"]
                for model in load:
                    await self._load_fresh(model)
            finally:
                del self._transitions[name]
            self.sleeping.discard(name)
            log.info("pipeline %s awake: loaded %s", name, ", ".join(load) or "nothing")
            for listener in self._wake_listeners:
                listener(name)
            return {"loaded": load}

    async def reload(self, model: str, unless_loaded_after: float | None = None) -> bool:
        """Restart `model` with a fresh stub process (unload, then load: a load alone keeps a dead stub).
        Returns False (nothing done) when no awake pipeline needs it. With `unless_loaded_after` (when a stub of
        the model that died was last seen running), a model loaded afresh since then (`loaded_after`: a wake
        loaded it while the caller waited for the lock or for the wake) is not restarted again, and True is
        returned. Raises APIError on failure."""
        async with self._lock:
            if model not in self.awake_models():
                return False
            if unless_loaded_after is not None and self.loaded_after(model, unless_loaded_after):
                return True
            await self.client.unload_model(model)
            await self._load_fresh(model)
            return True

    async def _unload_callers_first(self, pipeline: Pipeline, models: list[str]) -> list[str]:
        """Unload `models`: first the pipeline's client-facing models (entry, stream_entry), waiting until their
        requests in flight have finished, then the stages they call (a stage idle between two calls of a
        request must not go while its caller still runs: the request would fail mid-stream). Returns the
        models still loaded after UNLOAD_WAIT_S in all; the stages stay loaded when the callers have not
        drained by then (sleeping the pipeline again unloads them)."""
        deadline = time.monotonic() + UNLOAD_WAIT_S
        callers = [m for m in models if m in (pipeline.entry, pipeline.stream_entry)]
        stages = [m for m in models if m not in callers]
        for phase, later in ((callers, stages), (stages, [])):
            for model in phase:
                await self.client.unload_model(model)
            pending = await self._wait_unloaded(phase, deadline)
            if pending:
                return pending + later
        return []

    async def _wait_unloaded(self, models: list[str], deadline: float) -> list[str]:
        """The `models` still loaded once all have unloaded, `deadline` passed, or every one left is down or routes
        through a model that is (a stub died: the requests it held never end, nor does its caller's BLS stream from
        it, so their unloads never do; the stage monitor reloads a dead stage once its pipeline is awake)."""
        availability = self.availability
        while True:
            states = await self.client.model_states()
            pending = [m for m in models if states.get(m) in _LOADED]
            down = availability.down().keys()
            if not pending or time.monotonic() > deadline or all(down & set(availability.route(m)) for m in pending):
                return pending
            await asyncio.sleep(0.1)
