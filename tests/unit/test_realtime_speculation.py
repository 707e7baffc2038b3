"""Preemptive realtime responses (omni_frontend/realtime/speculation.py) inside a real RealtimeSession.

Triton is replaced by `StageDouble` at its gRPC boundary (the stages themselves run in
tests/integration/test_realtime.py): the VAD stage returns the turn events a test scripts, the ASR stage
transcribes audio as its length, and the pipeline streams two spoken chunks, each stage when the test lets
it. The session, its speculation and the wire events are the real ones.
"""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter

from omni_frontend.admission import Gate
from omni_frontend.errors import APIError
from omni_frontend.model_control import ModelControl
from omni_frontend.pipelines import REGISTRY
from omni_frontend.realtime.session import RealtimeSession
from omni_frontend.triton_client import StreamResponse

pytestmark = pytest.mark.unit
CHUNK = 1600  # samples of one 100 ms append at 16 kHz
REPLY = [("Paris is", 0.25), ("the capital.", 0.5)]  # (transcript, seconds of audio) per spoken chunk


class StageDouble:
    """The Triton calls of a realtime session. `turns`: lists of VAD turn events, one list returned per VAD
    request that has audio (sample offsets in 16 kHz samples); `asr_gate` / `pipeline_gate`: set to let
    those stages answer; `hold`: the pipeline keeps its stream open after the reply (until cancelled); `fail`:
    an APIError the pipeline raises after the reply instead; `vad_refusals`: how many VAD STARTs to refuse as
    voice_vad does with every live sequence taken (429 too_many_sequences). Models load and unload as Triton's model control
    does them (`loaded`); a call to an unloaded model fails as Triton's does ("unknown model")."""

    def __init__(self):
        self.turns: list[list[dict]] = []
        self.asr_gate, self.pipeline_gate = asyncio.Event(), asyncio.Event()
        self.asr_gate.set()
        self.pipeline_gate.set()
        self.hold = False
        self.fail: APIError | None = None
        self.asr_calls: list[int] = []  # samples per transcription
        self.vad_starts: list[bool] = []  # sequence_start of each VAD request with audio
        self.vad_refusals = 0
        self.vad_ends: list[int] = []  # the sequence id of each VAD request with END
        self.vad_samples: list[int] = []  # the audio samples of each VAD request
        self.streams: list[dict] = []  # {"body", "cancelled", "finished"} per pipeline request
        self.prompt_checks: list[dict] = []  # the bodies of {"action": "prompt_tokens"} requests
        self.context_length = 8192  # of the double's LLM, in tokens: one a character
        self.loaded = set(REGISTRY["voice"].models)

    async def unload_model(self, model):
        self.loaded.discard(model)

    async def load_model(self, model):
        self.loaded.add(model)

    async def model_states(self):
        return {model: "READY" for model in self.loaded}

    def _check_loaded(self, model):
        if model not in self.loaded:
            raise APIError(500, f"inference failed: Request for unknown model: '{model}' has no available versions",
                           code="inference_error")

    async def infer(self, model, inputs, request_id=None, *, sequence_id=0, sequence_start=False, sequence_end=False,
                    timeout_s=None):
        self._check_loaded(model)
        if model == "voice_vad":
            if sequence_end:
                self.vad_ends.append(sequence_id)
            self.vad_samples.append(inputs["AUDIO"].size)
            if inputs["AUDIO"].size:
                self.vad_starts.append(sequence_start)
            if sequence_start and self.vad_refusals:
                self.vad_refusals -= 1
                self.turns.pop(0)
                raise APIError(429, "voice_vad serves at most 1024 live sequences", code="too_many_sequences")
            found = self.turns.pop(0) if inputs["AUDIO"].size and self.turns else []
            return {"EVENTS": np.array([json.dumps(found).encode()], dtype=np.object_)}
        assert model == "voice_asr"
        self.asr_calls.append(inputs["AUDIO"].size)
        await self.asr_gate.wait()
        result = {"text": f"{inputs['AUDIO'].size} samples", "segments": [], "language": "en", "duration": 0}
        return {"RESULT": np.array([json.dumps(result).encode()], dtype=np.object_)}

    async def stream(self, model, inputs, request_id=None, parameters=None):
        self._check_loaded(model)
        call = {"body": json.loads(inputs["REQUEST"][0]), "cancelled": False, "finished": False}
        if call["body"].get("action") == "prompt_tokens":   # as voice_llm answers it
            self.prompt_checks.append(call["body"])
            tokens, budget = sum(len(m["content"]) for m in call["body"]["messages"]), call["body"]["max_tokens"]
            if tokens + budget > self.context_length:
                raise APIError(400, f"prompt ({tokens} tokens) plus max_tokens ({budget}) exceeds the context length "
                               f"{self.context_length}", code="context_length_exceeded",
                               param="messages" if tokens >= self.context_length else "max_tokens")
            event = {"type": "prompt_tokens", "prompt_tokens": tokens, "context_length": self.context_length}
            yield StreamResponse({"EVENT": np.array([json.dumps(event).encode()], dtype=np.object_)}, True)
            return
        self.streams.append(call)
        try:
            await self.pipeline_gate.wait()
            for index, (text, seconds) in enumerate(REPLY):
                audio = np.full(int(seconds * 24000), 0.1, np.float32)
                event = {"type": "audio.delta", "transcript": text, "sample_rate": 24000,
                         "usage": {"prompt_tokens": 20, "completion_tokens": 3 * (index + 1)}}  # the counts so far
                yield StreamResponse({"EVENT": np.array([json.dumps(event).encode()], dtype=np.object_),
                                      "AUDIO": audio}, False)
            if self.fail is not None:
                raise self.fail
            if self.hold:
                await asyncio.Event().wait()
            done = {"type": "done", "finish_reason": "stop", "usage": {"prompt_tokens": 20, "completion_tokens": 6}}
            yield StreamResponse({"EVENT": np.array([json.dumps(done).encode()], dtype=np.object_)}, True)
            call["finished"] = True
        except asyncio.CancelledError:
            call["cancelled"] = True
            raise


class Client:
    """A session over the double, with the wire events it sent (parsed), a speculation counter, the pipeline's
    admission gate (`gate`, else one of its own: 4 slots, one queue place) and its ModelControl (sleep, wake)."""

    def __init__(self, speculation_ms: int | None, gate: Gate | None = None):
        self.triton = StageDouble()
        self.sent: list[dict] = []
        self.outcomes = Counter("speculations", "test", ["outcome"], registry=CollectorRegistry())

        async def send_text(text):
            self.sent.append(json.loads(text))

        self.gate = gate or Gate("voice", 4, 1)
        self.control = ModelControl(self.triton, [REGISTRY["voice"]])
        self.session = RealtimeSession(self.triton, REGISTRY["voice"], "voice", send_text, "req", self.gate,
                                       self.control, speculation_ms, self.outcomes)
        self.appended = 0

    def count(self, outcome: str) -> float:
        return self.outcomes.labels(outcome)._value.get()

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.sent]

    async def append(self, turns: list[dict] | None = None) -> None:
        """One 100 ms chunk of audio; `turns`: the VAD events its request returns (offsets from chunk ends)."""
        self.appended += CHUNK
        self.triton.turns.append([{**t, "sample": self.appended} for t in turns or []])
        pcm = np.full(CHUNK, 3000, "<i2").tobytes()
        await self.session.handle({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        await until(lambda: not self.triton.turns)

    async def start(self) -> None:
        """session.created, then input audio at 16 kHz (the stages' rate: offsets stay exact)."""
        await self.session.start()
        await self.session.handle({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})

    async def turn(self, events: dict[int, list[dict]], chunks: int = 12) -> None:
        """Appends `chunks` chunks; chunk i's VAD request returns events[i]."""
        for index in range(chunks):
            await self.append(events.get(index))


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def speculating() -> Client:
    """A session whose turn paused after 1 s of audio: its speculation's pipeline request is open (held)."""
    client = Client(200)
    await client.start()
    client.triton.hold = True
    await client.turn({1: [STARTED], 9: [PAUSED]}, chunks=10)
    await until(lambda: client.triton.streams)
    return client


STARTED = {"type": "speech_started", "audio_start": 0}
STOPPED = {"type": "speech_stopped", "audio_end": 8 * CHUNK}
PAUSED = {"type": "speech_paused", "audio_end": 8 * CHUNK}


def _comparable(events: list[dict]) -> list:
    """The events without their generated ids, for comparing two sessions' streams (the double's user
    transcript is the audio's length, which differs: compared on its own)."""
    return [(e["type"], e.get("delta"), (e.get("response") or {}).get("status"),
             None if e["type"].startswith("conversation.item.input_audio") else e.get("transcript")) for e in events]


def test_adopted_speculation_sends_what_a_plain_turn_sends_and_starts_at_the_pause():
    async def run(speculation_ms, events):
        client = Client(speculation_ms)
        await client.start()
        client.triton.pipeline_gate.clear()
        await client.turn(events, chunks=11)
        await asyncio.sleep(0.05)
        started_before_stop = len(client.triton.streams)
        await client.append([STOPPED])
        client.triton.pipeline_gate.set()
        await until(lambda: "response.done" in client.kinds())
        await client.session.close()
        return client, started_before_stop

    plain, plain_early = asyncio.run(run(None, {1: [STARTED]}))
    spec, spec_early = asyncio.run(run(200, {1: [STARTED], 9: [PAUSED]}))
    assert plain_early == 0 and spec_early == 1  # the speculation's pipeline request was sent at the pause
    assert _comparable(spec.sent) == _comparable(plain.sent)
    kinds = spec.kinds()
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed") \
        < kinds.index("response.created") < kinds.index("response.output_audio.delta") < kinds.index("response.done")
    done = spec.sent[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Paris is the capital."
    # the speculation answered the audio up to the pause; the committed item holds the whole turn
    assert spec.triton.asr_calls == [10 * CHUNK] and plain.triton.asr_calls == [12 * CHUNK]
    body = spec.triton.streams[0]["body"]
    assert body["messages"][-1] == {"role": "user", "content": f"{10 * CHUNK} samples"}
    # both ask the pipeline for a spoken reply whose first chunk holds at most 2 words
    assert body["first_chunk_words"] == plain.triton.streams[0]["body"]["first_chunk_words"] == 2
    assert body["modalities"] == ["audio"]
    completed = next(e for e in spec.sent if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert completed["transcript"] == f"{10 * CHUNK} samples"
    assert (spec.count("adopted"), spec.count("abandoned")) == (1, 0)
    assert [s["finished"] for s in spec.triton.streams] == [True]


def test_speech_resumed_abandons_and_the_reply_is_for_the_whole_turn():
    async def run():
        client = Client(200)
        await client.start()
        client.triton.asr_gate.clear()  # the speculation is still transcribing when the speaker goes on
        await client.turn({1: [STARTED], 5: [{**PAUSED, "audio_end": 4 * CHUNK}],
                           6: [{"type": "speech_resumed", "audio_start": 5 * CHUNK}]}, chunks=11)
        assert not any(k.startswith("response.") for k in client.kinds())
        await client.append([STOPPED])
        client.triton.asr_gate.set()
        await until(lambda: "response.done" in client.kinds())
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert (client.count("adopted"), client.count("abandoned")) == (0, 1)
    assert client.triton.asr_calls == [6 * CHUNK, 12 * CHUNK]  # the pause's audio, then the whole turn
    assert len(client.triton.streams) == 1  # the abandoned one never reached the pipeline
    assert client.triton.streams[0]["body"]["messages"][-1]["content"] == f"{12 * CHUNK} samples"
    assert client.kinds().count("response.created") == 1 and client.sent[-1]["response"]["status"] == "completed"


def test_a_client_event_abandons_a_running_speculation_and_cancels_its_pipeline_request():
    async def run():
        client = await speculating()
        await client.session.handle({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Also, hello."}]}})
        cancelled = client.triton.streams[0]["cancelled"]
        client.triton.hold = False
        await client.turn({1: [STOPPED]}, chunks=2)
        await until(lambda: "response.done" in client.kinds())
        await client.session.close()
        return client, cancelled

    client, cancelled = asyncio.run(run())
    assert cancelled and (client.count("adopted"), client.count("abandoned")) == (0, 1)
    # the turn was answered afresh, after the client's item
    last = client.triton.streams[-1]["body"]["messages"]
    assert [m["content"] for m in last[-2:]] == ["Also, hello.", f"{12 * CHUNK} samples"]
    assert client.sent[-1]["response"]["status"] == "completed"


def test_barge_in_cancels_an_adopted_response_end_to_end():
    async def run():
        client = Client(200)
        await client.start()
        client.triton.hold = True
        await client.turn({1: [STARTED], 9: [PAUSED], 11: [STOPPED]})
        await until(lambda: "response.output_audio.delta" in client.kinds())
        await client.append([{"type": "speech_started", "audio_start": 12 * CHUNK}])
        await until(lambda: "response.done" in client.kinds())
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert client.count("adopted") == 1 and client.triton.streams[0]["cancelled"]
    assert client.gate.running == 0  # the slot the speculation took, kept by its response, is free again
    done = client.sent[[e["type"] for e in client.sent].index("response.done")]
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"


def test_a_speculation_holds_an_admission_slot_and_starts_only_on_a_free_one():
    """A preemptive response is a pipeline request too: it takes a free slot of the gate (never queues, never
    counts as refused), its adopted response keeps that slot, an abandoned one frees it; with no slot free
    there is no speculation and the turn is answered when it ends, through the queue as any response."""
    async def run():
        client = await speculating()
        held = client.gate.running
        await client.session.handle({"type": "input_audio_buffer.clear"})  # abandons it
        freed = client.gate.running
        await client.session.close()
        full = Client(200, Gate("voice", max_inflight=1, max_queue=1))
        await full.start()
        other = full.gate.enter()  # another request holds the only slot
        await full.turn({1: [STARTED], 9: [PAUSED]}, chunks=11)
        await full.append([STOPPED])
        await until(lambda: full.gate.waiting)
        speculated = len(full.triton.streams)
        other.release()
        await until(lambda: "response.done" in full.kinds())
        await full.session.close()
        return client, held, freed, full, speculated

    client, held, freed, full, speculated = asyncio.run(run())
    assert (held, freed, client.count("abandoned")) == (1, 0, 1)
    assert speculated == 0 and (full.count("adopted"), full.count("abandoned")) == (0, 0)
    assert full.sent[-1]["response"]["status"] == "completed" and full.gate.running == 0


def test_closing_the_session_abandons_the_speculation():
    async def run():
        client = await speculating()
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert client.triton.streams[0]["cancelled"] and client.count("abandoned") == 1
    assert not any(k.startswith("response.") for k in client.kinds())
    assert client.gate.running == 0  # its admission slot is free again


def test_pause_events_are_asked_for_only_with_speculation_on():
    async def options(speculation_ms):
        client = Client(speculation_ms)
        await client.start()
        sent = dict(client.session.vad.options)
        await client.session.close()
        return sent

    assert asyncio.run(options(150))["pause_duration_ms"] == 150
    assert "pause_duration_ms" not in asyncio.run(options(None))


def test_launcher_flags():
    from omni_frontend.serve import parse_args

    assert parse_args([]).realtime_speculation_ms == 64 and not parse_args([]).no_realtime_speculation
    assert parse_args(["--realtime-speculation-ms", "120"]).realtime_speculation_ms == 120
    assert parse_args(["--no-realtime-speculation"]).no_realtime_speculation
    with pytest.raises(SystemExit):
        parse_args(["--realtime-speculation-ms", "-1"])
