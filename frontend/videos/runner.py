"""Runs video jobs: a bounded queue in front of a few worker tasks, each driving one job through its
video pipeline model over Triton gRPC streaming and recording progress in the job store.

Video pipeline tensor protocol (client-facing Triton model, decoupled; any Triton client can use it):
  in   REQUEST      BYTES [1]        JSON {"prompt", "negative_prompt", "width", "height", "num_frames",
                                     "fps", "num_inference_steps", "guidance_scale", "seed"}, or
                                     {"action": "describe"}
       INPUT_IMAGE  UINT8 [h, w, 3]  optional reference image (image-to-video), RGB
  out  EVENT        BYTES [1]        JSON {"type": "describe", "defaults", "limits", "image_to_video"} |
                                     {"type": "progress", "step", "total_steps"} after each denoising step |
                                     {"type": "video", "num_frames", "width", "height", "fps", "seed"}
       VIDEO        UINT8 [f, h, w, 3]  the frames of the "video" event (empty otherwise)
Errors: the OpenAI envelope as the Triton error message (omni_frontend.errors.from_triton_message).

Lifecycle: `start()` (app startup) fails the jobs that were in progress when the server last stopped
(their denoising state is not kept) and queues again those that had not started; `stop()` (shutdown)
cancels running jobs and marks them failed. DELETE cancels a running job's task, which cancels its
gRPC stream: the pipeline stops between denoising steps and cancels its stage requests.

Sleep (omni_frontend.model_control): a job is taken in creation order, and not started while its pipeline is
not awake (falling asleep, sleeping or waking): it stays `queued`, set aside until the wake, then runs before
later jobs. Running jobs are requests in flight, so the sleep's unload waits for them. A job whose request
reached Triton only after a sleep began unloading the model (refused with "unknown model" before any response)
goes back to `queued` in the same way instead of failing.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import numpy as np

from omni_frontend.errors import APIError
from omni_frontend.model_control import AWAKE, ModelControl
from omni_frontend.triton_client import TritonClient
from omni_frontend.videos import encoding
from omni_frontend.videos.store import IN_PROGRESS, QUEUED, VideoJob, VideoStore

log = logging.getLogger("omni_frontend.videos")
REQUEST, INPUT_IMAGE, EVENT, VIDEO = "REQUEST", "INPUT_IMAGE", "EVENT", "VIDEO"
REFERENCE_FILE = "input_reference.png"
SWEEP_INTERVAL_S = 60.0


class QueueFull(APIError):
    def __init__(self, limit: int):
        super().__init__(429, f"too many videos are waiting ({limit} queued); retry after some finish",
                         code="queue_full")


def progress_percent(step: int, total: int) -> int:
    """Denoising step `step` of `total` -> 0..99; 100 is reserved for the finished video (the VAE
    decode and encoding count as one more step)."""
    return min(99, int(100 * step / (total + 1)))


class VideoRunner:
    """Queue + workers over `store`. `entries` maps a job's `model` to its client-facing Triton model. With
    `control`, `pipelines` maps a job's `model` (a pipeline's name or alias) to its pipeline's name (default: the
    model itself), and jobs of a pipeline that is not awake wait for its wake."""

    def __init__(self, store: VideoStore, triton: TritonClient, entries: dict[str, str], *, max_queued: int,
                 max_running: int, ttl_s: int | None, control: ModelControl | None = None,
                 pipelines: dict[str, str] | None = None):
        self.store, self.triton, self.entries = store, triton, entries
        self.max_queued, self.max_running, self.ttl_s = max_queued, max_running, ttl_s
        self.control, self.pipelines = control, pipelines or {}
        self._queue: asyncio.PriorityQueue[tuple[int, str]] = asyncio.PriorityQueue()   # (seq, id): oldest first
        self._parked: dict[str, list[tuple[int, str]]] = {}   # pipeline -> its jobs taken while it was not awake
        if control is not None:
            control.on_wake(self._woke)
        self._running: dict[str, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self._describe: dict[str, dict] = {}

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        for video_id in self.store.ids(IN_PROGRESS):
            self.store.fail(video_id, "server_restarted", "the server stopped while this video was being "
                            "generated; create it again", ttl_s=self.ttl_s)
        for video_id in self.store.ids(QUEUED):
            self._queue.put_nowait((self.store.get(video_id).seq, video_id))
        expired = self.store.delete_expired()
        if expired:
            log.info("removed %d expired video(s)", len(expired))
        self._tasks = [asyncio.create_task(self._worker(), name=f"video-worker-{i}") for i in range(self.max_running)]
        self._tasks.append(asyncio.create_task(self._sweep(), name="video-expiry"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- requests ---------------------------------------------------------------------------------
    async def describe(self, model: str) -> dict:
        """The pipeline's defaults and limits ({"defaults", "limits", "image_to_video"}); cached."""
        if model not in self._describe:
            inputs = {REQUEST: np.array([json.dumps({"action": "describe"}).encode()], dtype=np.object_)}
            async for response in self.triton.stream(self.entries[model], inputs):
                if EVENT in response.outputs:
                    event = json.loads(response.outputs[EVENT].reshape(-1)[0])
                    if event.get("type") == "describe":
                        self._describe[model] = event
            if model not in self._describe:
                raise APIError(500, f"{self.entries[model]} did not describe itself", code="inference_error")
        return self._describe[model]

    def submit(self, job: VideoJob) -> None:
        """Queues a job that the store holds as queued. Callers check `check_capacity` first."""
        self._queue.put_nowait((job.seq, job.id))

    def check_capacity(self) -> None:
        """Raises QueueFull (429) when `max_queued` jobs are already waiting."""
        if self.store.count(QUEUED) >= self.max_queued:
            raise QueueFull(self.max_queued)

    async def cancel(self, video_id: str) -> None:
        """Stops a running job (its Triton request is cancelled) and waits until it has stopped.
        A queued job needs nothing: the worker skips ids the store no longer holds as queued."""
        task = self._running.get(video_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- workers ----------------------------------------------------------------------------------
    def _pipeline(self, model: str) -> str:
        return self.pipelines.get(model, model)

    def _woke(self, pipeline: str) -> None:
        """ModelControl.on_wake: the jobs set aside while `pipeline` was not awake are queued again."""
        for item in self._parked.pop(pipeline, []):
            self._queue.put_nowait(item)

    async def _worker(self) -> None:
        while True:
            seq, video_id = await self._queue.get()
            job = self.store.get(video_id)
            if job is None or job.status != QUEUED:
                continue  # deleted (or already handled) while it waited
            pipeline = self._pipeline(job.model)
            if self.control is not None and self.control.state(pipeline) != AWAKE:
                self._parked.setdefault(pipeline, []).append((seq, video_id))   # _woke queues it again
                continue
            if not self.store.start(video_id):
                continue
            sleeps = self.control.sleeps(pipeline) if self.control is not None else 0   # noted while awake
            task = asyncio.create_task(self._run(self.store.get(video_id), sleeps))
            self._running[video_id] = task
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                # The worker itself is stopping (server shutdown), also when its job has just finished: only a
                # DELETE (the job's task cancelled, not this one) lets the worker go on.
                if asyncio.current_task().cancelling():
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                        self.store.fail(video_id, "server_shutdown", "the server shut down while this video was "
                                        "being generated; create it again", ttl_s=self.ttl_s)
                    raise
            except Exception:  # noqa: BLE001 - _run records its own failures
                log.exception("video job %s crashed", video_id)
            finally:
                self._running.pop(video_id, None)

    async def _run(self, job: VideoJob, sleeps: int) -> None:
        """Generates `job`; `sleeps`: its pipeline's ModelControl.sleeps() when the worker started it."""
        started = time.perf_counter()
        answered: list[bool] = []   # the pipeline answered (so it had the request) once this is not empty
        try:
            frames, fps = await self._generate(job, answered)
            writing = asyncio.ensure_future(asyncio.to_thread(encoding.write_assets, frames, fps,
                                                              self.store.job_dir(job.id)))
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:   # the thread cannot be stopped: the files go only once it has written
                with contextlib.suppress(Exception):
                    await writing
                raise
        except asyncio.CancelledError:
            raise  # deleted: the DELETE handler removes the row and files (after `cancel` returned)
        except Exception as exc:  # noqa: BLE001 - any failure ends the job as failed, never the worker
            if not answered and self._slept_since(job, sleeps) and self.store.requeue(job.id):
                # Sent as its pipeline began to sleep: the model unloaded before the request arrived. Not lost:
                # it waits for the wake like the jobs still queued (the worker sets it aside).
                log.info("video %s queued again: pipeline %s fell asleep as it started (%s)", job.id,
                         self._pipeline(job.model), exc)
                self._queue.put_nowait((job.seq, job.id))
                return
            if isinstance(exc, APIError):
                self.store.fail(job.id, exc.code or "generation_failed", exc.message, ttl_s=self.ttl_s)
                return
            log.exception("video %s failed", job.id)
            self.store.fail(job.id, "internal_error", f"{type(exc).__name__}: {exc}", ttl_s=self.ttl_s)
            return
        self.store.complete(job.id, inference_time_s=round(time.perf_counter() - started, 3), ttl_s=self.ttl_s)

    def _slept_since(self, job: VideoJob, sleeps: int) -> bool:
        return self.control is not None and self.control.sleeps(self._pipeline(job.model)) != sleeps

    async def _generate(self, job: VideoJob, answered: list[bool]) -> tuple[np.ndarray, int]:
        entry = self.entries.get(job.model)
        if entry is None:
            raise APIError(400, f"model '{job.model}' is not loaded", code="model_not_found")
        inputs = {REQUEST: np.array([json.dumps(job.params).encode()], dtype=np.object_)}
        reference = self.store.job_dir(job.id) / REFERENCE_FILE
        if reference.exists():
            inputs[INPUT_IMAGE] = await asyncio.to_thread(_read_png, reference)
        progress, frames, fps = 0, None, int(job.params["fps"])
        async for response in self.triton.stream(entry, inputs, request_id=job.id):
            if not answered:
                answered.append(True)
            if EVENT not in response.outputs:
                continue
            event = json.loads(response.outputs[EVENT].reshape(-1)[0])
            if event.get("type") == "progress":
                percent = progress_percent(int(event["step"]), int(event["total_steps"]))
                if percent != progress:
                    progress = percent
                    self.store.set_progress(job.id, percent)
            elif event.get("type") == "video":
                frames, fps = response.outputs[VIDEO], int(event.get("fps", fps))
        if frames is None or not frames.size:
            raise APIError(500, f"{entry} finished without a video", code="inference_error")
        return frames, fps

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            for video_id in self.store.delete_expired():
                log.info("video %s expired and was removed", video_id)


def save_reference(store: VideoStore, video_id: str, image: np.ndarray) -> None:
    """Keeps a job's reference image (uint8 [h, w, 3]) as a lossless PNG in its folder."""
    from PIL import Image

    Image.fromarray(image).save(store.job_dir(video_id) / REFERENCE_FILE, format="PNG")


def _read_png(path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
