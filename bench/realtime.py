"""`scripts/bench --workload realtime`: spoken turns over `/v1/realtime` (OpenAI Realtime GA, the `openai`
SDK's realtime client), one session at a time, plus barge-in and the VAD stage's CPU cost per live session.

Each prompt is first spoken by the server's /v1/audio/speech (not timed), then sent as PCM16 24 kHz in
real-time-paced 100 ms chunks, followed by trailing silence.

Per turn (server VAD, the default session):
  speech_end_to_first_audio_s  the append of the chunk holding the last speech sample -> the first
                               response.output_audio.delta (includes the VAD's silence_duration_ms)
  speech_end_to_stopped_s      the same start -> input_audio_buffer.speech_stopped
  stopped_to_first_audio_s     speech_stopped -> the first response.output_audio.delta (transcription, LLM, TTS)
With `--turn-detection manual` the session has no VAD: the client appends only the speech, then commits
and sends response.create at once; speech_end_to_first_audio_s then runs from that last append.
`--commit-baseline` measures every turn a second time, right after it, with the response started at the
commit instead (server VAD with create_response off; the client sends response.create when it sees
input_audio_buffer.committed): no preemptive response (frontend --realtime-speculation-ms) can run, so
commit_baseline_speech_end_to_first_audio_s is the same turn without speculation, in the same run. The
frontend's omni_frontend_realtime_speculations_total (GET /metrics) before and after the turns gives
`speculations` {"adopted", "abandoned"} (only meaningful when no other client uses the server).
Barge-in (per prompt, a session asked for a long story): once its first audio delta arrives the prompt is
spoken over it; barge_in_s = the append of the chunk holding the first speech sample ->
response.done(status cancelled).
Same-run baseline, per prompt right after its turn: the prompt as text through POST /v1/chat/completions
(workload chat-audio, same voice and max tokens); chat_audio_ttfp_s = its time to first audio. The
difference to stopped_to_first_audio_s is what the realtime path adds (transcription, session, events).
VAD cost: `--vad-sessions` sessions stream the clips (speech and silence, real time, VAD on, no responses)
for `--vad-seconds`; the CPU time of the VAD model's Triton stub process (psutil; the server must run on
this machine) over that window, divided by sessions x seconds, is the fraction of one core per live session.
"""
from __future__ import annotations

import asyncio
import base64
import io
import time

import numpy as np
import openai
import soundfile as sf

from omni_bench.client import RequestOptions, send, synthesize_inputs
from omni_bench.metrics import request_metrics, stats

RATE = 24000
CHUNK_BYTES = RATE // 10 * 2  # 100 ms of PCM16
SPEECH_LEVEL = 600  # |sample| above this (int16) counts as speech when locating onset and end


def pcm16(wav: bytes) -> bytes:
    """PCM16 24 kHz mono bytes of a WAV from /v1/audio/speech."""
    pcm, rate = sf.read(io.BytesIO(wav), dtype="int16")
    if rate != RATE:
        raise ValueError(f"expected {RATE} Hz speech, got {rate}")
    return pcm.astype("<i2").tobytes()


def speech_chunks(pcm: bytes) -> tuple[int, int]:
    """Indexes of the 100 ms chunks holding the first and the last speech sample."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > SPEECH_LEVEL)
    return int(loud[0]) * 2 // CHUNK_BYTES, int(loud[-1]) * 2 // CHUNK_BYTES


class _Session:
    """One realtime connection whose events are read in the background with their arrival times."""

    def __init__(self, conn):
        self.conn, self.events = conn, []
        self._reader = asyncio.create_task(self._read())

    async def _read(self):
        async for event in self.conn:
            self.events.append((time.perf_counter(), event))

    async def wait(self, kind: str, timeout_s: float, after: int = 0):
        """(time, event) of the first event of type `kind` at or after index `after`; raises on error events."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            for t, event in self.events[after:]:
                if event.type == "error":
                    raise RuntimeError(f"error event: {event.error.message}")
                if event.type == kind:
                    return t, event
            if self._reader.done():
                raise RuntimeError(f"connection closed before {kind}")
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no {kind} within {timeout_s} s")

    async def append(self, pcm: bytes, pace: bool = True, mark: tuple[int, ...] = ()) -> dict[int, float]:
        """Append in 100 ms chunks (real-time paced); returns the append time of the chunks in `mark`."""
        times = {}
        for index, start in enumerate(range(0, len(pcm), CHUNK_BYTES)):
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + CHUNK_BYTES]).decode())
            if index in mark:
                times[index] = time.perf_counter()
            if pace:
                await asyncio.sleep(0.1)
        return times

    async def close(self):
        self._reader.cancel()


def _connect(args):
    client = openai.AsyncOpenAI(base_url=f"{args.base_url.rstrip('/')}/v1", api_key=args.api_key or "unused",
                                max_retries=0)
    return client.realtime.connect(model=args.model)


async def _turn(args, clip: bytes, silence_s: float, commit_baseline: bool = False) -> dict:
    """One spoken turn in a new session (`commit_baseline`: the client creates the response at the commit)."""
    first, last = speech_chunks(clip)
    manual = args.turn_detection == "manual"
    async with _connect(args) as conn:
        session = _Session(conn)
        try:
            await session.wait("session.created", 30)
            update = {"type": "realtime", "max_output_tokens": args.max_tokens}
            if args.voice:
                update["audio"] = {"output": {"voice": args.voice}}
            if manual:
                update.setdefault("audio", {})["input"] = {"turn_detection": None}
            elif commit_baseline:
                update.setdefault("audio", {})["input"] = {"turn_detection": {"type": "server_vad",
                                                                              "create_response": False}}
            await conn.session.update(session=update)
            await session.wait("session.updated", 30)
            audio = clip[:(last + 1) * CHUNK_BYTES] if manual else clip + b"\0\0" * int(silence_s * RATE)
            creator = asyncio.create_task(_create_at_commit(session)) if commit_baseline else None
            marks = await session.append(audio, mark=(last,))
            if manual:
                await conn.input_audio_buffer.commit()
                await conn.response.create()
            if creator is not None:
                await creator
            first_audio, _ = await session.wait("response.output_audio.delta", args.timeout)
            done_at, done = await session.wait("response.done", args.timeout)
            result = {"speech_end_to_first_audio_s": first_audio - marks[last], "e2e_s": done_at - marks[last],
                      "status": done.response.status,
                      "transcript": next((e.transcript for _, e in session.events
                                          if e.type == "conversation.item.input_audio_transcription.completed"), None),
                      "reply": next((e.transcript for _, e in session.events
                                     if e.type == "response.output_audio_transcript.done"), None)}
            if not manual:
                stopped, _ = await session.wait("input_audio_buffer.speech_stopped", 1)
                result["speech_end_to_stopped_s"] = stopped - marks[last]
                result["stopped_to_first_audio_s"] = first_audio - stopped
            return result
        finally:
            await session.close()


async def _create_at_commit(session: _Session) -> None:
    """response.create as soon as input_audio_buffer.committed arrives (the commit baseline)."""
    await session.wait("input_audio_buffer.committed", 120)
    await session.conn.response.create()


async def _speculations(client) -> dict[str, float] | None:
    """omni_frontend_realtime_speculations_total by outcome from the frontend's /metrics (None if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = await client.get("/metrics")
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "omni_frontend_realtime_speculations_total":
                found[sample.labels["outcome"]] = sample.value
    return found or None


async def _barge_in(args, clip: bytes) -> dict:
    first, _ = speech_chunks(clip)
    async with _connect(args) as conn:
        session = _Session(conn)
        try:
            await session.wait("session.created", 30)
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 400, "audio": {
                "input": {"turn_detection": {"type": "server_vad", "create_response": False}}}})
            await session.wait("session.updated", 30)
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Tell me a very long story about a dragon who lives in a castle."}]})
            await conn.response.create()
            await session.wait("response.output_audio.delta", args.timeout)
            sender = asyncio.create_task(session.append(clip, mark=(first,)))
            done_at, done = await session.wait("response.done", args.timeout)
            marks = await sender
            return {"barge_in_s": done_at - marks[first], "status": done.response.status,
                    "reason": done.response.status_details.reason if done.response.status_details else None}
        finally:
            await session.close()


def _vad_processes():
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "triton_python_backend_stub" in cmdline and "voice_vad/1/model.py" in cmdline:
            found.append(process)
    return found


async def _vad_cost(args, clips: list[bytes]) -> dict:
    """CPU of the VAD stub per live session while `--vad-sessions` sessions stream audio in real time."""
    processes = _vad_processes()
    if not processes:
        return {"error": "no voice_vad stub process on this machine (run the bench next to the server)"}
    stream = b"".join(c + b"\0\0" * RATE for c in clips)

    async def one(index: int):
        async with _connect(args) as conn:
            session = _Session(conn)
            try:
                await session.wait("session.created", 30)
                await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                    "type": "server_vad", "create_response": False}, "transcription": None}}})
                await session.wait("session.updated", 30)
                rotated = stream[index * CHUNK_BYTES * 7 % len(stream):] + stream  # sessions out of phase
                await session.append(rotated[:int(args.vad_seconds * 10) * CHUNK_BYTES])
                return sum(1 for _, e in session.events if e.type == "input_audio_buffer.speech_started")
            finally:
                await session.close()

    cpu = lambda: sum(sum(p.cpu_times()[:2]) for p in processes)  # noqa: E731 - user + system seconds
    before, started = cpu(), time.perf_counter()
    turns = await asyncio.gather(*(one(i) for i in range(args.vad_sessions)))
    used, wall = cpu() - before, time.perf_counter() - started
    return {"sessions": args.vad_sessions, "wall_s": wall, "vad_cpu_s": used, "turns_detected": sum(turns),
            "core_fraction_per_session": used / wall / args.vad_sessions}


async def run(args, prompts: list[str], client) -> dict:
    """All three phases; returns the result JSON (config is added by the caller)."""
    clips = [pcm16(wav) for wav in await synthesize_inputs(client, prompts, args.speech_model, None)]
    for clip in clips[:args.num_warmups]:
        await _turn(args, clip, args.silence_s)
    turns, barge_ins = [], []
    chat = RequestOptions("chat-audio", args.model, "/v1/chat/completions", args.voice or "alloy", args.max_tokens)
    counted = await _speculations(client)
    for index, (prompt, clip) in enumerate(zip(prompts, clips)):
        try:
            turns.append({"prompt": prompt, **await _turn(args, clip, args.silence_s)})
        except (RuntimeError, TimeoutError, openai.OpenAIError) as exc:
            turns.append({"prompt": prompt, "error": str(exc)})
        if args.commit_baseline and args.turn_detection != "manual":
            try:
                again = await _turn(args, clip, args.silence_s, commit_baseline=True)
                turns[-1]["commit_baseline_speech_end_to_first_audio_s"] = again["speech_end_to_first_audio_s"]
                turns[-1]["commit_baseline_stopped_to_first_audio_s"] = again["stopped_to_first_audio_s"]
            except (RuntimeError, TimeoutError, openai.OpenAIError) as exc:
                turns[-1]["commit_baseline_error"] = str(exc)
        baseline = await send(client, chat, index, prompt, time.perf_counter())
        if baseline.ok:
            turns[-1]["chat_audio_ttfp_s"] = request_metrics(baseline)["ttfp_s"]
        print(f"turn: {turns[-1]}", flush=True)
    for prompt, clip in zip(prompts[:args.barge_ins], clips):
        try:
            barge_ins.append({"prompt": prompt, **await _barge_in(args, clip)})
        except (RuntimeError, TimeoutError, openai.OpenAIError) as exc:
            barge_ins.append({"prompt": prompt, "error": str(exc)})
        print(f"barge-in: {barge_ins[-1]}", flush=True)
    speculations = None
    if counted is not None:
        now = await _speculations(client) or {}
        speculations = {k: now.get(k, 0) - counted.get(k, 0) for k in ("adopted", "abandoned")}
    vad = await _vad_cost(args, clips) if args.vad_sessions else None
    names = ("speech_end_to_first_audio_s", "speech_end_to_stopped_s", "stopped_to_first_audio_s", "e2e_s",
             "commit_baseline_speech_end_to_first_audio_s", "commit_baseline_stopped_to_first_audio_s",
             "chat_audio_ttfp_s")
    summary = {name: stats([t[name] for t in turns if name in t]) for name in names}
    summary["barge_in_s"] = stats([b["barge_in_s"] for b in barge_ins if b.get("status") == "cancelled"])
    return {"turns": turns, "barge_ins": barge_ins, "vad_cost": vad, "speculations": speculations,
            "summary": {k: v for k, v in summary.items() if v is not None},
            "failed": sum(1 for r in turns + barge_ins if "error" in r or "commit_baseline_error" in r
                          or r.get("status") in ("failed", None))}


def table(result: dict) -> str:
    """The summary as a table (times in ms) plus the VAD cost line."""
    width = max([len(name) + 4 for name in result["summary"]] + [32])
    lines = [f"== realtime: {len(result['turns'])} turns, {len(result['barge_ins'])} barge-ins, {result['failed']} failed",
             f"{'metric':<{width}}{'n':>5}" + "".join(f"{k:>10}" for k in ("mean", "median", "p90", "p99"))]
    for name, values in result["summary"].items():
        lines.append(f"{name.removesuffix('_s') + ' (ms)':<{width}}{values['n']:>5}"
                     + "".join(f"{values[k] * 1000:>10.1f}" for k in ("mean", "median", "p90", "p99")))
    if result.get("speculations"):
        lines.append(f"speculations: {result['speculations']['adopted']:.0f} adopted, "
                     f"{result['speculations']['abandoned']:.0f} abandoned (frontend /metrics over the turns)")
    vad = result.get("vad_cost")
    if vad and "error" not in vad:
        lines.append(f"VAD stub CPU: {vad['core_fraction_per_session'] * 100:.2f} % of one core per live session "
                     f"({vad['sessions']} sessions, {vad['wall_s']:.1f} s, {vad['turns_detected']} turns detected)")
    elif vad:
        lines.append(f"VAD cost not measured: {vad['error']}")
    return "\n".join(lines)
