"""/v1/realtime (OpenAI Realtime GA events) on the real voice pipeline with the Silero VAD stage, driven by
the official `openai` SDK's realtime client and a raw WebSocket client for misbehaviour."""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import time

import httpx
import numpy as np
import openai
import pytest
import websockets
import websockets.sync.client

from omni_frontend.realtime.conversation import MAX_ITEMS
from tests.harness import metric_value, settle_limit_s, wait_for

pytestmark = pytest.mark.integration
QUESTION = "What is the capital of France?"
RATE = 24000
CHUNK = RATE // 10 * 2  # 100 ms of PCM16 at 24 kHz, in bytes
STAGES = ("voice", "voice_llm", "voice_tts", "voice_asr", "voice_vad")
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def speech(server, text: str, silence_before_s: float = 0.5, silence_after_s: float = 1.5) -> bytes:
    """`text` spoken by the server's own TTS (/v1/audio/speech, PCM16 24 kHz) between stretches of silence."""
    pad = lambda s: b"\0\0" * int(s * RATE)  # noqa: E731
    return pad(silence_before_s) + _spoken(server.base_url, text) + pad(silence_after_s)


@functools.lru_cache(maxsize=8)
def _spoken(base_url: str, text: str) -> bytes:
    response = httpx.post(f"{base_url}/v1/audio/speech", timeout=120,
                          json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return response.content


def transcribe(server, pcm16: bytes, rate: int = RATE) -> str:
    import io

    import soundfile as sf

    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm16, "<i2"), rate, format="WAV", subtype="PCM_16")
    response = httpx.post(f"{server.base_url}/v1/audio/transcriptions", timeout=120,
                          files={"file": ("reply.wav", wav.getvalue(), "audio/wav")}, data={"model": "whisper-1"})
    return response.json()["text"]


async def append_paced(conn, pcm16: bytes, chunk: int = CHUNK, pace_s: float = 0.1) -> float:
    """Append in 100 ms chunks at real-time pace; returns the perf_counter time of the last append."""
    for start in range(0, len(pcm16), chunk):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16[start:start + chunk]).decode())
        await asyncio.sleep(pace_s)
    return time.perf_counter()


async def until(conn, kind: str, events: list | None = None, timeout_s: float = 120):
    """Read events (recording them) until one of type `kind`; returns it."""
    async def read():
        async for event in conn:
            if events is not None:
                events.append((time.perf_counter(), event))
            if event.type == "error" and kind != "error":
                raise AssertionError(f"error event: {event.error}")
            if event.type == kind:
                return event
        raise AssertionError(f"connection closed before {kind}")
    return await asyncio.wait_for(read(), timeout_s)


def connect(server):
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    return client.realtime.connect(model="voice")


async def text_turn(conn, text: str) -> str:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()
    done = await until(conn, "response.done")
    assert done.response.status == "completed"
    return done.response.output[0].content[0].text


def inflight_back_to_zero(server, timeout_s: float = 60.0) -> bool:
    """Every stage idle again (a stateless stage such as voice_tts finishes the chunk it is synthesising)."""
    return wait_for(lambda: all(metric_value(server.metrics_url, "omni_inflight_requests", model=m) == 0 for m in STAGES),
                    timeout_s, 0.05)


def speculations(server) -> dict[str, float]:
    """The frontend's omni_frontend_realtime_speculations_total by outcome (preemptive responses)."""
    return {outcome: metric_value(f"{server.base_url}/metrics", "omni_frontend_realtime_speculations_total",
                                  outcome=outcome) or 0 for outcome in ("adopted", "abandoned")}


def test_spoken_turn_with_server_vad(voice_server):
    """The SDK streams the spoken question in real-time-paced 100 ms chunks; server VAD ends the turn,
    the audio is transcribed, and the spoken answer itself, transcribed back, says Paris. The response was
    started at the pause before the end of the turn (a speculation) and adopted."""
    question = speech(voice_server, QUESTION)
    before = speculations(voice_server)

    async def run():
        async with connect(voice_server) as conn:
            created = await until(conn, "session.created")
            assert created.session.audio.input.turn_detection.type == "server_vad"
            events = []
            sender = asyncio.create_task(append_paced(conn, question))
            done = await until(conn, "response.done", events)
            await sender
            return created, events, done

    created, events, done = asyncio.run(run())
    kinds = [e.type for _, e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "response.created", "response.output_item.added", "response.content_part.added",
             "response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.done",
             "response.content_part.done", "response.output_item.done", "response.done"]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order), kinds
    started = next(e for _, e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for _, e in events if e.type == "input_audio_buffer.speech_stopped")
    assert 200 <= started.audio_start_ms <= 700 and stopped.audio_end_ms > started.audio_start_ms + 1000
    heard = next(e for _, e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert heard.item_id == started.item_id and "capital of france" in heard.transcript.lower()
    assert done.response.status == "completed" and done.response.usage.output_tokens > 0
    reply = b"".join(base64.b64decode(e.delta) for _, e in events if e.type == "response.output_audio.delta")
    assert len(reply) / 2 / RATE > 1.0 and np.abs(np.frombuffer(reply, "<i2")).max() > 1000
    transcript = next(e for _, e in events if e.type == "response.output_audio_transcript.done").transcript
    assert "paris" in transcript.lower() and "paris" in transcribe(voice_server, reply).lower()
    assert done.response.output[0].content[0].transcript == transcript
    after = speculations(voice_server)
    assert after["adopted"] == before["adopted"] + 1 and after["abandoned"] == before["abandoned"], (before, after)
    assert inflight_back_to_zero(voice_server)


def test_a_pause_mid_utterance_is_not_the_end_of_the_turn(voice_server):
    """The speaker pauses inside the question ("What is the capital ... of France?", ~0.6 s of silence with
    Kokoro's own edge pads; the turn ends after 800 ms): the response started at that pause is abandoned
    when the speech resumes (its requests cancelled), and the one reply is for the whole question."""
    pause = b"\0\0" * int(0.2 * RATE)
    utterance = (b"\0\0" * int(0.5 * RATE) + _spoken(voice_server.base_url, "What is the capital") + pause
                 + _spoken(voice_server.base_url, "of France?") + b"\0\0" * int(1.5 * RATE))
    before = speculations(voice_server)

    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "silence_duration_ms": 800}}}})
            await until(conn, "session.updated")
            events = []
            sender = asyncio.create_task(append_paced(conn, utterance))
            done = await until(conn, "response.done", events)
            await sender
            return events, done

    events, done = asyncio.run(run())
    kinds = [e.type for _, e in events]
    assert kinds.count("input_audio_buffer.speech_started") == 1 and kinds.count("input_audio_buffer.committed") == 1
    assert kinds.count("response.created") == 1 and done.response.status == "completed"
    heard = next(e for _, e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "capital of france" in heard.transcript.lower(), heard.transcript
    transcript = next(e for _, e in events if e.type == "response.output_audio_transcript.done").transcript
    assert "paris" in transcript.lower(), transcript
    after = speculations(voice_server)
    # one abandoned at the pause inside the question, one adopted at its end
    assert after["abandoned"] >= before["abandoned"] + 1 and after["adopted"] == before["adopted"] + 1, (before, after)
    assert inflight_back_to_zero(voice_server)


def test_text_turn_and_multi_turn_memory(voice_server):
    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={**NO_VAD, "output_modalities": ["text"],
                                               "instructions": "You are a helpful assistant. Answer in one short sentence."})
            await until(conn, "session.updated")
            answers = [await text_turn(conn, q) for q in (QUESTION, "And what is the capital of Italy?",
                                                          "Which two cities did we talk about?")]
        async with connect(voice_server) as fresh:  # the same last question without the history
            await until(fresh, "session.created")
            await fresh.session.update(session={**NO_VAD, "output_modalities": ["text"],
                                                "instructions": "You are a helpful assistant. Answer in one short sentence."})
            control = await text_turn(fresh, "Which two cities did we talk about?")
            # response.cancel from the client: the response still ends with response.done
            await fresh.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Write a very long story about a dragon."}]})
            await fresh.response.create(response={"max_output_tokens": 400})
            created = await until(fresh, "response.created")
            await fresh.response.cancel()
            cancelled = await until(fresh, "response.done")
        return answers, control, created, cancelled

    answers, control, created, cancelled = asyncio.run(run())
    assert cancelled.response.id == created.response.id and cancelled.response.status == "cancelled"
    assert cancelled.response.status_details.reason == "client_cancelled"
    assert cancelled.response.usage is not None  # the counts so far (it was null)
    assert "Paris" in answers[0] and "Rome" in answers[1]
    assert "Paris" in answers[2] and "Rome" in answers[2], answers
    assert "Paris" not in control and "Rome" not in control, control


def test_a_committed_turn_is_retrieved_with_its_audio(voice_server):
    """conversation.item.retrieve of a transcribed user audio item carries the audio (it had none: a session dropped
    a turn's audio once transcribed), base64 PCM16 at the session's input rate: transcribed back, the same words;
    its length is the committed audio's."""
    pcm = speech(voice_server, QUESTION, 0.2, 0.3)

    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session=NO_VAD)
            await until(conn, "session.updated")
            for start in range(0, len(pcm), 48000):
                await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + 48000]).decode())
            await conn.input_audio_buffer.commit()
            committed = await until(conn, "input_audio_buffer.committed")
            await until(conn, "conversation.item.input_audio_transcription.completed")
            await conn.conversation.item.retrieve(item_id=committed.item_id)
            return await until(conn, "conversation.item.retrieved")

    retrieved = asyncio.run(run())
    part = retrieved.item.content[0]
    assert part.type == "input_audio" and "capital" in part.transcript.lower(), part.transcript
    audio = base64.b64decode(part.audio)
    # 24 kHz in and out (16 kHz in between); the input's streaming resampler holds back ~1 ms at a commit
    assert 0 <= len(pcm) - len(audio) <= 480, (len(audio), len(pcm))
    heard = transcribe(voice_server, audio).lower()
    assert "capital" in heard and "france" in heard, heard


def test_voice_vad_serves_string_correlation_ids_as_sequences_of_their_own(voice_server):
    """A Triton client's string correlation ids (tritonclient's sequence_id takes str too): the CORRID control was
    TYPE_UINT64, so Triton wrote a string id's bytes into an 8-byte tensor: ids sharing their first 8 bytes shared
    one VAD state, and a longer one overflowed the buffer and aborted tritonserver (every pipeline gone). The model
    now reads request.correlation_id(): string ids are sequences like int ones, and the server stays up."""
    import tritonclient.grpc as grpcclient

    pcm = np.frombuffer(_spoken(voice_server.base_url, QUESTION), "<i2").astype(np.float32) / 32768
    speech = np.interp(np.arange(0, pcm.size, 1.5), np.arange(pcm.size), pcm).astype(np.float32)   # 16 kHz
    silence = np.zeros(16000, np.float32)
    client = grpcclient.InferenceServerClient(voice_server.grpc_url)

    def vad(sequence, audio, start=False, end=False):
        tensor = grpcclient.InferInput("AUDIO", [1, audio.size], "FP32")
        tensor.set_data_from_numpy(audio[None])
        result = client.infer("voice_vad", [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end,
                              client_timeout=30)
        return json.loads(result.as_numpy("EVENTS").reshape(-1)[0])

    def turn(a, b):   # A's second turn, after B STARTed, with offsets counted from A's first sample
        vad(a, np.concatenate([silence, speech, silence]), start=True)
        vad(b, silence, start=True)
        found = vad(a, np.concatenate([silence, speech]))
        vad(a, silence, end=True)
        vad(b, silence, end=True)
        return found

    try:
        by_int = turn(7_700_001, 7_700_002)
        by_string = turn("session-aaaa", "session-bbbb")   # the same first 8 bytes
        for n in range(4):
            vad(f"realtime-session-{n:04d}-0123456789abcdef", silence, start=True, end=True)   # 40 bytes
        time.sleep(2)
        live = client.is_server_live()
    finally:
        client.close()
    started = [e for e in by_int if e["type"] == "speech_started"]
    assert started and started[0]["sample"] > 2 * 16000 + speech.size, by_int   # counted from A's first sample
    assert by_string == by_int and live


def test_barge_in_cancels_the_response_end_to_end(voice_server):
    """Speech appended while the reply plays cancels it: response.done(cancelled, turn_detected) and every
    stage's in-flight count back to 0; then the client truncates the item to what it played."""
    interruption = speech(voice_server, "Stop, please tell me something else.", 0.0, 1.0)
    onset = np.flatnonzero(np.abs(np.frombuffer(interruption, "<i2")) > 600)[0] * 2 // CHUNK  # chunk with speech

    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            # create_response off: the interruption is not answered, so the stages go idle after the cancel
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 400,
                                               "audio": {"input": {"turn_detection": {"create_response": False}}}})
            await until(conn, "session.updated")
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Tell me a very long story about a dragon who lives in a castle."}]})
            await conn.response.create()
            events = []
            reader = asyncio.create_task(until(conn, "response.done", events))
            while not any(e.type == "response.output_audio.delta" for _, e in events):
                await asyncio.sleep(0.02)
            spoke_at = None
            for index, start in enumerate(range(0, len(interruption), CHUNK)):
                if reader.done():
                    break
                await conn.input_audio_buffer.append(audio=base64.b64encode(interruption[start:start + CHUNK]).decode())
                spoke_at = spoke_at or (time.perf_counter() if index >= onset else None)
                await asyncio.sleep(0.1)
            done = await reader
            # the client heard 3/4 of the first spoken chunk (realtime: 2 words, so at least one whole word):
            # truncate the cancelled item to it
            item = done.response.output[0]
            first = next(e for _, e in events if e.type == "response.output_audio.delta")
            heard_ms = len(base64.b64decode(first.delta)) // 2 * 1000 // RATE * 3 // 4
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=heard_ms)
            truncated = await until(conn, "conversation.item.truncated")
            await conn.conversation.item.retrieve(item_id=item.id)
            retrieved = await until(conn, "conversation.item.retrieved")
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=10**7)
            too_far = await until(conn, "error")
            return events, spoke_at, done, (item, heard_ms, truncated, retrieved, too_far)

    events, spoke_at, done, (item, heard_ms, truncated, retrieved, too_far) = asyncio.run(run())
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    # the opened part and item are closed in order before response.done (they used to stay open), and
    # response.done has the usage so far (it was null)
    closing = [e.type for _, e in events if getattr(e, "item_id", None) == item.id and e.type.endswith(".done")
               or getattr(getattr(e, "item", None), "id", None) == item.id and e.type.endswith(".done")]
    assert closing == ["response.output_audio.done", "response.output_audio_transcript.done",
                       "response.content_part.done", "response.output_item.done", "conversation.item.done"], closing
    closed = next(e for _, e in events if e.type == "response.output_item.done")
    assert closed.item.status == "incomplete" and closed.item.content[0].transcript == item.content[0].transcript
    assert done.response.usage.input_tokens > 10 and done.response.usage.output_tokens >= 2
    started_at = next(t for t, e in events if e.type == "input_audio_buffer.speech_started")
    done_at = next(t for t, e in events if e.type == "response.done")
    print(f"\nbarge-in: speech onset appended -> response.done(cancelled) {done_at - spoke_at:.3f} s "
          f"(speech_started -> response.done {done_at - started_at:.3f} s)")
    # the cancel needs no model time: only the VAD must see the speech (issue 11: within 500 ms)
    assert started_at <= done_at and done_at - spoke_at < 0.5
    assert inflight_back_to_zero(voice_server)
    # conversation.item.truncate: the transcript keeps only the words that were heard
    full, cut = item.content[0].transcript, retrieved.item.content[0].transcript
    assert item.status == "incomplete" and truncated.audio_end_ms == heard_ms
    assert 0 < len(cut.split()) < len(full.split()) and full.startswith(cut), (full, cut)
    assert too_far.error.param == "audio_end_ms"


def test_realtime_rejects_misbehaving_clients_and_keeps_serving(voice_server):
    url = voice_server.base_url.replace("http", "ws") + "/v1/realtime?model=voice"
    big = base64.b64encode(b"\0" * (10 * 1024 * 1024 + 2)).decode()
    cases = [
        ("{not json", "invalid_json"),
        (json.dumps({"type": "response.audio.delta"}), "unknown_event"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "***"}), "invalid_base64"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": big}), "audio_too_large"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
        (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm",
                                                                                         "rate": 44100}}}}}),
         "unsupported_audio_format"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": 3}}}}}),
         "invalid_value"),
        (json.dumps({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 5}),
         "item_not_found"),
        (json.dumps({"type": "input_audio_buffer.append"}), "invalid_value"),
        ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": '
         '[{"type": "input_text", "text": "hi \\ud800"}]}}', "invalid_unicode"),  # reached voice_llm: a 5xx failure
        ('{"type": "session.update", "session": {"instructions": "\\udfff"}}', "invalid_unicode"),
    ]
    with websockets.sync.client.connect(url, max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        for message, code in cases:
            ws.send(message)
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["code"] == code, (message[:80], event)
        ws.send(b"\x00binary")
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "invalid_json"
        # still serving this session: a valid update is applied
        ws.send(json.dumps({"type": "session.update", "event_id": "evt_1",
                            "session": {"audio": {"input": {"turn_detection": {"silence_duration_ms": 700}}}}}))
        updated = json.loads(ws.recv(timeout=30))
        detection = updated["session"]["audio"]["input"]["turn_detection"]
        assert updated["type"] == "session.updated" and detection["silence_duration_ms"] == 700
        assert detection["threshold"] == 0.5 and detection["prefix_padding_ms"] == 300  # deep merge kept the rest
    # unknown model: an error event, then the socket closes with 1008
    with websockets.sync.client.connect(url.replace("model=voice", "model=nope")) as ws:
        assert json.loads(ws.recv())["error"]["code"] == "model_not_found"
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1008
    # a client that vanishes mid-response without a close frame: its Triton request is cancelled
    with websockets.sync.client.connect(url) as ws:
        ws.recv()
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Write a very long story about a dragon."}]}}))
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400,
                                                                    "output_modalities": ["text"]}}))
        while json.loads(ws.recv(timeout=60))["type"] != "response.output_text.delta":
            pass
        ws.socket.close()  # gone without a close frame
    assert inflight_back_to_zero(voice_server)
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200


def _refused(ws, event: dict) -> tuple[dict, dict]:
    """Send `event` (with event_id "evt_bad"), read its `error` event, then send a harmless session.update:
    (the error, the session.updated that follows it directly: nothing was started in between)."""
    ws.send(json.dumps({**event, "event_id": "evt_bad"}))
    error = json.loads(ws.recv(timeout=60))
    ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
    return error, json.loads(ws.recv(timeout=60))


def test_unknown_voice_is_refused_by_session_update_and_the_session_keeps_its_voice(voice_server):
    """An unknown voice used to be accepted by session.update and to fail only at response.create. The
    pipeline's own voice check now runs at the update: an error naming session.audio.output.voice, and the
    session keeps its voice and answers with speech."""
    url = voice_server.base_url.replace("http", "ws") + "/v1/realtime?model=voice"
    with websockets.sync.client.connect(url) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        error, updated = _refused(ws, {"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": "nope"}}}})
        assert error["type"] == "error", error
        assert (error["error"]["type"], error["error"]["param"], error["error"]["event_id"]) == (
            "invalid_request_error", "session.audio.output.voice", "evt_bad")
        assert "nope" in error["error"]["message"] and "jf_alpha" in error["error"]["message"]  # lists the voices
        assert updated["type"] == "session.updated" and updated["session"]["audio"]["output"]["voice"] == "alloy"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {  # a shipped voice
            "output": {"voice": "jf_nezumi"}, "input": {"turn_detection": None}}}}))
        assert json.loads(ws.recv(timeout=60))["session"]["audio"]["output"]["voice"] == "jf_nezumi"
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                         "content": [{"type": "input_text", "text": "Hi"}]}}))
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv(timeout=120)))
    assert [e for e in events if e["type"] == "error"] == []
    assert events[-1]["response"]["status"] in ("completed", "incomplete")
    assert events[-1]["response"]["audio"]["output"]["voice"] == "jf_nezumi"
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) > RATE // 10 and np.abs(np.frombuffer(audio, "<i2")).max() > 1000  # it spoke


VOICE_PART = base64.b64encode(b"\0\1\2").decode()  # 3 bytes: not whole PCM16 samples


@pytest.mark.parametrize("event, code, param", [
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "threshold": "0.5"}}}}}, "invalid_value", "session.audio.input.turn_detection.threshold"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "semantic_vad", "eagerness": "sometimes"}}}}}, "invalid_value", "session.audio.input.turn_detection.eagerness"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": {
        "type": "audio/pcm", "rate": 44100}}}}}, "unsupported_audio_format", "session.audio.input.format.rate"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"format": {
        "type": "audio/opus"}}}}}, "invalid_value", "session.audio.output.format.type"),
    ({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 0}}, "invalid_value",
     "session.max_output_tokens"),
    ({"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": "5"},
     "invalid_value", "audio_end_ms"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_txt", "text": "hi"}]}}, "invalid_value", "item.content[0].type"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": VOICE_PART}]}},
     "invalid_audio", "item.content[1].audio"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": "not base64!"}]}}, "invalid_base64", "item.content[0].audio"),
    ({"type": "conversation.item.create", "previous_item_id": "item_nope", "item": {"type": "message", "role": "user",
                                                                                   "content": [{"type": "input_text", "text": "hi"}]}},
     "item_not_found", "previous_item_id"),
    ({"type": "response.create", "response": {"tools": [{"type": "function", "name": "f"}]}}, "unsupported_feature",
     "response.tools"),
    ({"type": "response.create", "response": {"audio": {"output": {"voice": "nope"}}}}, "invalid_value",
     "response.audio.output.voice"),
    # a forced tool call, logprobs: chat refuses them too (they used to be accepted and dropped)
    ({"type": "session.update", "session": {"type": "realtime", "tool_choice": "required"}}, "unsupported_feature",
     "session.tool_choice"),
    ({"type": "session.update", "session": {"type": "realtime", "include": ["item.input_audio_transcription.logprobs"]}},
     "unsupported_feature", "session.include"),
    ({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "get_weather"}}},
     "unsupported_feature", "response.tool_choice"),
    ({"type": "response.create", "response": {"voice": "echo"}}, "unknown_parameter", "response.voice"),
    ({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 131073}}, "invalid_value",
     "session.instructions"),   # over --max-text-chars
    ({"type": "response.create", "response": {"instructions": "x" * 131073}}, "invalid_value", "response.instructions"),
    # instructions the LLM's context cannot hold (~15,000 tokens against SmolLM2's 8,192): every response failed
    ({"type": "session.update", "session": {"type": "realtime", "instructions": "Be nice. " * 5000}},
     "context_length_exceeded", "session.instructions"),
    ({"type": "response.create", "response": {"instructions": "Be nice. " * 5000}}, "context_length_exceeded",
     "response.instructions"),
])
def test_error_events_name_the_wrong_field_of_the_client_event(voice_server, event, code, param):
    """Every refused event gets an `error` whose param is the wrong field in the event's own notation
    (indices in brackets), its event_id, and nothing starts: the next event is served at once."""
    url = voice_server.base_url.replace("http", "ws") + "/v1/realtime?model=voice"
    with websockets.sync.client.connect(url) as ws:
        ws.recv()
        error, updated = _refused(ws, event)
    assert error["type"] == "error", error
    assert (error["error"]["type"], error["error"]["code"], error["error"]["param"], error["error"]["event_id"]) == (
        "invalid_request_error", code, param, "evt_bad"), error
    assert updated["type"] == "session.updated" and updated["session"]["audio"]["output"]["voice"] == "alloy"


def test_a_response_cancelled_before_it_starts_still_ends_and_frees_the_session(voice_server):
    """response.cancel right behind response.create used to cancel the task before its first step: no
    response.created / response.done, and every later response.create was refused as already active."""
    url = voice_server.base_url.replace("http", "ws") + "/v1/realtime?model=voice"
    create = json.dumps({"type": "response.create", "response": {"max_output_tokens": 2, "output_modalities": ["text"]}})
    with websockets.sync.client.connect(url) as ws:
        ws.recv()
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                         "content": [{"type": "input_text", "text": "Hi"}]}}))
        ws.send(create)
        ws.send(json.dumps({"type": "response.cancel"}))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv(timeout=30)))
        kinds = [e["type"] for e in events]
        assert "response.created" in kinds and "error" not in kinds, kinds
        assert events[-1]["response"]["status"] == "cancelled"
        assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"
        ws.send(create)  # the session is free again
        while (event := json.loads(ws.recv(timeout=60)))["type"] != "response.done":
            assert event["type"] != "error", event
        assert event["response"]["status"] in ("completed", "incomplete")
    assert inflight_back_to_zero(voice_server)


def test_session_update_merges_and_vad_can_be_turned_off(voice_server):
    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "threshold": 0.6}}, "output": {"voice": "echo"}}})
            partial = (await until(conn, "session.updated")).session
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            kept = (await until(conn, "session.updated")).session
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            off = (await until(conn, "session.updated")).session
            await conn.input_audio_buffer.append(audio=base64.b64encode(speech(voice_server, QUESTION)).decode())
            await conn.input_audio_buffer.commit()
            events = []
            await until(conn, "conversation.item.input_audio_transcription.completed", events)
            # a user audio item created directly is transcribed too
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": base64.b64encode(speech(voice_server, QUESTION)).decode()}]})
            added = await until(conn, "conversation.item.added")
            created = await until(conn, "conversation.item.input_audio_transcription.completed")
            return partial, kept, off, events, added, created

    partial, kept, off, events, added, created = asyncio.run(run())
    assert created.item_id == added.item.id and "capital of france" in created.transcript.lower()
    detection = partial.audio.input.turn_detection
    assert detection.threshold == 0.6 and detection.silence_duration_ms == 500 and detection.prefix_padding_ms == 300
    assert kept.audio.input.turn_detection.threshold == 0.6 and kept.audio.output.voice == "echo"
    assert kept.instructions == "Be brief." and off.audio.input.turn_detection is None
    kinds = [e.type for _, e in events]
    assert "input_audio_buffer.speech_started" not in kinds and kinds[0] == "input_audio_buffer.committed"


@pytest.mark.parametrize("fmt, rate", [({"type": "audio/pcm", "rate": 16000}, 16000),
                                       ({"type": "audio/pcm", "rate": 8000}, 8000), ({"type": "audio/pcmu"}, 8000)])
def test_transcription_session_input_formats(voice_server, fmt, rate):
    """type "transcription" sessions: VAD + transcription events, no responses; input at 16 / 8 kHz PCM and
    G.711 μ-law is resampled for the stages."""
    import av

    pcm = np.frombuffer(speech(voice_server, QUESTION, 0.3, 1.2), "<i2")
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = RATE
    audio = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])
    if fmt["type"] == "audio/pcmu":
        encoder = av.CodecContext.create("pcm_mulaw", "w")
        encoder.sample_rate, encoder.layout, encoder.format = rate, "mono", "s16"
        frame = av.AudioFrame.from_ndarray(audio[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        data = b"".join(bytes(p) for p in encoder.encode(frame) + encoder.encode(None))
    else:
        data = audio.astype("<i2").tobytes()

    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={"type": "transcription", "audio": {"input": {"format": fmt}}})
            updated = (await until(conn, "session.updated")).session
            events = []
            width = 1 if fmt["type"] == "audio/pcmu" else 2  # bytes per sample: appends carry whole samples
            chunk = len(data) // (len(pcm) // (RATE // 10)) // width * width  # 100 ms
            sender = asyncio.create_task(append_paced(conn, data, chunk=chunk, pace_s=0.005))
            completed = await until(conn, "conversation.item.input_audio_transcription.completed", events)
            await sender
            await asyncio.sleep(0.5)
            await conn.response.create()
            refused = await until(conn, "error", events)
            return updated, events, completed, refused

    updated, events, completed, refused = asyncio.run(run())
    assert updated.type == "transcription"
    kinds = [e.type for _, e in events]
    assert kinds[:3] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed"]
    assert "capital of france" in completed.transcript.lower() and completed.usage.seconds > 1.0
    assert "response.created" not in kinds and refused.error.code == "invalid_session_type"


def test_a_burst_of_client_events_neither_stalls_the_server_nor_grows_without_bound(voice_server):
    """Thirteenth outside test: 10 000 tiny conversation.item.create events sent at once (1 MB) kept the frontend's
    event loop for 25 s, so /health and every other client waited as long: the session handled frame after frame
    without suspending, and each item's id was checked against every earlier item (quadratic). A 5 MB text item
    was kept whole, and a client's event_id of 100 000 characters came back whole in its error. Now /health answers
    during such a burst (5 000 items here; it took 8 s before), every item is added and the oldest deleted beyond
    the session's bound on items (conversation.MAX_ITEMS), an item's text is bounded by --max-text-chars as chat's
    is, and an error's event_id by 256 characters."""
    url = voice_server.base_url.replace("http", "ws") + "/v1/realtime?model=voice"
    items = 5000
    with websockets.sync.client.connect(url, max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                          "content": [{"type": "input_text",
                                                                                       "text": "x" * 140_000}]}}))
        refused = json.loads(ws.recv(timeout=30))
        assert refused["type"] == "error" and refused["error"]["param"] == "item.content[0].text", refused
        ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "i" * 100_000, "event_id": "e" * 100_000}))
        unknown = json.loads(ws.recv(timeout=30))["error"]   # client text in errors is bounded, as on HTTP routes
        assert unknown["code"] == "item_not_found" and len(unknown["message"]) <= 2048, len(unknown["message"])
        assert unknown["event_id"].startswith("eee") and len(unknown["event_id"]) <= 256
        for i in range(items):
            ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "id": f"item_{i}", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
        sent = time.monotonic()
        health = httpx.get(f"{voice_server.base_url}/health", timeout=120)
        health_s = time.monotonic() - sent
        added, deleted = 0, []
        while added < items or len(deleted) < items - MAX_ITEMS:
            event = json.loads(ws.recv(timeout=120))
            assert event["type"] in ("conversation.item.added", "conversation.item.done",
                                     "conversation.item.deleted"), event
            added += event["type"] == "conversation.item.added"
            if event["type"] == "conversation.item.deleted":
                deleted.append(event["item_id"])
            else:
                last = event["item"]["id"]
        handled_s = time.monotonic() - sent
        assert last == f"item_{items - 1}"
        # the session holds MAX_ITEMS items at most: the oldest went, each with conversation.item.deleted
        assert deleted == [f"item_{i}" for i in range(items - MAX_ITEMS)]
    assert health.status_code == 200 and health_s < min(handled_s / 2, settle_limit_s(1.0)), (health_s, handled_s)


def test_eight_concurrent_sessions(voice_server):
    """8 sessions at once, each streaming the spoken question through server VAD: every one is transcribed
    and answered, and the VAD stage sees the sessions' requests batched together. Their responses go through
    the pipeline's admission like HTTP requests: at most --max-inflight (4) run on `voice` at once, counted in
    the frontend's gauges, the others wait their turn (8 used to run at once, the frontend gauge at 0).
    The peaks are watched once every session is set up (session.update asks `voice` for the prompt's length,
    a control request outside admission). A speculation abandoned at resumed speech frees its slot once its
    gRPC call is cancelled, while Triton may still be winding the request down: the Triton peak may exceed 4
    by the number abandoned, never more."""
    question = speech(voice_server, QUESTION, 0.3, 1.2)
    ready = asyncio.Barrier(8 + 1)  # the eight sessions, set up, and the watcher

    async def one(index):
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                               "max_output_tokens": 24})
            await until(conn, "session.updated")
            await ready.wait()
            events = []
            sender = asyncio.create_task(append_paced(conn, question, pace_s=0.05))
            done = await until(conn, "response.done", events, timeout_s=300)
            await sender
            heard = next(e.transcript for _, e in events if e.type == "conversation.item.input_audio_transcription.completed")
            return heard, done

    frontend = f"{voice_server.base_url}/metrics"
    peaks = {"triton": 0.0, "frontend": 0.0}

    async def watch():
        await ready.wait()
        while True:
            triton, admitted = await asyncio.gather(
                asyncio.to_thread(metric_value, voice_server.metrics_url, "omni_inflight_requests", model="voice"),
                asyncio.to_thread(metric_value, frontend, "omni_frontend_inflight_requests", pipeline="voice"))
            peaks["triton"], peaks["frontend"] = max(peaks["triton"], triton or 0), max(peaks["frontend"], admitted or 0)
            await asyncio.sleep(0.05)

    async def run():
        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            watcher.cancel()

    queued_before = metric_value(frontend, "omni_frontend_queue_wait_seconds_count", pipeline="voice") or 0
    before = metric_value(voice_server.metrics_url, "nv_inference_exec_count_total", model="voice_vad", version="1") or 0
    requests_before = metric_value(voice_server.metrics_url, "nv_inference_count_total", model="voice_vad", version="1") or 0
    abandoned_before = speculations(voice_server)["abandoned"]
    results = asyncio.run(run())
    abandoned = speculations(voice_server)["abandoned"] - abandoned_before
    for heard, done in results:
        assert "capital of france" in heard.lower() and done.response.status in ("completed", "incomplete")
        assert "Paris" in done.response.output[0].content[0].text
    executions = metric_value(voice_server.metrics_url, "nv_inference_exec_count_total", model="voice_vad", version="1") - before
    inferences = metric_value(voice_server.metrics_url, "nv_inference_count_total", model="voice_vad", version="1") - requests_before
    print(f"\nvoice_vad: {inferences:.0f} requests in {executions:.0f} executions")
    assert executions < inferences  # requests of different sessions shared executions
    assert inflight_back_to_zero(voice_server)
    queued = (metric_value(frontend, "omni_frontend_queue_wait_seconds_count", pipeline="voice") or 0) - queued_before
    print(f"voice: peak {peaks['triton']:g} requests in Triton, {peaks['frontend']:g} admitted; {queued:g} waited; "
          f"{abandoned:g} speculations abandoned")
    assert 1 <= peaks["frontend"] <= 4 and peaks["triton"] <= 4 + abandoned and queued >= 1
    assert metric_value(frontend, "omni_frontend_inflight_requests", pipeline="voice") == 0


def test_an_open_session_is_told_its_pipeline_sleeps_and_works_again_after_wake(voice_server):
    """With `voice` asleep (its models unloaded), an open session's response.create used to fail after ~5 s as
    an `inference_error` ("unknown model") and each append as a `vad_error`. Now both get `pipeline_sleeping`
    at once, as HTTP's 503 (the VAD once, however much audio comes), and after wake the same session's
    server VAD detects speech again (on a new VAD sequence)."""
    question = speech(voice_server, QUESTION, 0.3, 1.0)
    admin = f"{voice_server.base_url}/v1/admin/pipelines/voice"

    async def run():
        async with connect(voice_server) as conn:
            await until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                               "audio": {"input": {"turn_detection": {"create_response": False}}}})
            await until(conn, "session.updated")
            await append_paced(conn, b"\0\0" * (RATE // 2), pace_s=0)   # the VAD sequence has started
            async with httpx.AsyncClient(timeout=300) as http:
                assert (await http.post(f"{admin}/sleep")).status_code == 200
                try:
                    await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "Hi"}]})
                    await conn.response.create()
                    asked = time.perf_counter()
                    refused = await until(conn, "error")
                    done = await until(conn, "response.done")
                    took = time.perf_counter() - asked
                    await append_paced(conn, b"\0\0" * RATE, pace_s=0.02)
                    paused = await until(conn, "error", timeout_s=30)
                finally:
                    assert (await http.post(f"{admin}/wake")).status_code == 200
            await conn.input_audio_buffer.clear()
            await until(conn, "input_audio_buffer.cleared")
            events = []
            sender = asyncio.create_task(append_paced(conn, question, pace_s=0.02))
            await until(conn, "input_audio_buffer.committed", events, timeout_s=60)
            await sender
            return refused, done, took, paused, events

    refused, done, took, paused, events = asyncio.run(run())
    assert (refused.error.code, refused.error.type) == ("pipeline_sleeping", "service_unavailable")
    assert done.response.status == "failed" and done.response.status_details.error.code == "pipeline_sleeping"
    assert took < 2.0, took
    assert paused.error.code == "pipeline_sleeping"   # not vad_error
    kinds = [e.type for _, e in events]
    assert kinds[:3] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed"], kinds
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200


def test_livekit_agents_realtime_model_holds_a_text_turn(voice_server):
    """LiveKit Agents' OpenAI Realtime client (livekit-plugins-openai), pointed at our URL, parses what we
    send: a text turn through its own session.update, conversation sync and generate_reply.
    (LiveKit Agents installs with our pins, so it is in the dev extra; pipecat-ai 1.14 pins soundfile~=0.13
    against our 0.14 and pulls numba, so it would need a venv of its own.)"""
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    async def run():
        model = RealtimeModel(model="voice", base_url=f"{voice_server.base_url}/v1", api_key="unused",
                              modalities=["text"])
        session = model.session()
        errors = []
        session.on("error", errors.append)
        try:
            context = llm.ChatContext()
            context.add_message(role="user", content=QUESTION)
            await session.update_chat_ctx(context)
            generation = await asyncio.wait_for(session.generate_reply(), 60)
            text = ""
            async for message in generation.message_stream:
                async for delta in message.text_stream:
                    text += delta
            return text, errors
        finally:
            await session.aclose()
            await model.aclose()

    text, errors = asyncio.run(run())
    assert "Paris" in text and errors == []


def test_bench_realtime_workload(voice_server, tmp_path):
    """scripts/bench --workload realtime: one spoken turn and the VAD CPU phase, JSON consistent with itself."""
    from omni_bench.cli import main

    out = tmp_path / "realtime.json"
    code = main(["--workload", "realtime", "--base-url", voice_server.base_url, "--num-prompts", "1", "--num-warmups", "0",
                 "--max-tokens", "12", "--barge-ins", "0", "--vad-sessions", "1", "--vad-seconds", "3",
                 "--commit-baseline", "--result-json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0 and result["failed"] == 0 and result["config"]["workload"] == "realtime"
    turn = result["turns"][0]
    assert turn["status"] in ("completed", "incomplete") and turn["transcript"]
    assert abs(turn["speech_end_to_first_audio_s"] - turn["speech_end_to_stopped_s"] - turn["stopped_to_first_audio_s"]) < 1e-6
    assert 0.4 < turn["speech_end_to_stopped_s"] < 5  # at least most of silence_duration_ms (500 ms)
    assert result["summary"]["speech_end_to_first_audio_s"]["n"] == 1 and turn["chat_audio_ttfp_s"] > 0
    # the same turn again with the response created at the commit: no speculation; this one's was adopted
    assert turn["commit_baseline_speech_end_to_first_audio_s"] > turn["speech_end_to_stopped_s"]
    assert result["speculations"]["adopted"] == 1
    vad = result["vad_cost"]
    assert vad["sessions"] == 1 and 0 < vad["core_fraction_per_session"] < 1


def test_abandoned_vad_sequences_are_refused_at_once_and_free_their_slots(tmp_path):
    """Sequences STARTed on voice_vad and never ENDed (a crashed client) no longer wedge new ones (a new sequence
    waited unanswered for an hour, then up to the idle timeout): past the model's `max_sequences` live sequences a
    START is refused at once with 429 `too_many_sequences`, an END without audio frees a refused START's Triton
    slot, and when abandoned STARTs hold every Triton slot a new sequence is served once they idle out.
    The real config (1024 live, 16384 slots, 30 s idle) is checked against its bounds and served cut to 4 / 6 /
    3 s to keep the test cheap. The realtime session refreshes its sequence well before the idle timeout
    (VAD_REFRESH_S) so a long-silent session never loses it."""
    import re
    import shutil

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from omni_backends.voice.models import prepare_voice_models
    from omni_frontend.realtime.stages import VAD_REFRESH_S
    from tests.harness import MAIN_REPOSITORY, start_server

    repo = tmp_path / "repo"
    shutil.copytree(MAIN_REPOSITORY / "voice_vad", repo / "voice_vad")
    config = repo / "voice_vad" / "config.pbtxt"
    text = config.read_text()
    slots = int(re.search(r"max_candidate_sequences: (\d+)", text).group(1))
    live = int(re.search(r'key: "max_sequences" value \{ string_value: "(\d+)"', text).group(1))
    idle_s = int(re.search(r"max_sequence_idle_microseconds: (\d+)", text).group(1)) / 1e6
    assert live >= 1024 and slots >= 8 * live, (live, slots)   # refused STARTs must not fill Triton's slots
    assert idle_s <= 60 and VAD_REFRESH_S <= idle_s / 2, (idle_s, VAD_REFRESH_S)
    served_idle_s = 3   # the same mechanism, 10x faster to wait for
    config.write_text(text.replace(f"max_candidate_sequences: {slots}", "max_candidate_sequences: 6")
                      .replace(f'string_value: "{live}"', 'string_value: "4"')
                      .replace(f"max_sequence_idle_microseconds: {int(idle_s * 1e6)}",
                               f"max_sequence_idle_microseconds: {served_idle_s * 1_000_000}"))
    prepare_voice_models()
    (tmp_path / "server").mkdir()
    server = start_server(tmp_path / "server", "--pipelines", "", "--model-repository", str(repo), "--no-prepare",
                          "--extra-pipeline", "vad-only=transcription:voice_vad")
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def feed(corrid, start=False, end=False, timeout_s=30.0, samples=1600):
        audio = grpcclient.InferInput("AUDIO", [1, samples], "FP32")
        audio.set_data_from_numpy(np.zeros((1, samples), np.float32))
        return client.infer("voice_vad", [audio], sequence_id=corrid, sequence_start=start, sequence_end=end,
                            client_timeout=timeout_s)

    try:
        for corrid in range(9_100_001, 9_100_005):   # every live sequence the model serves, never ended
            feed(corrid, start=True)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            feed(9_100_010, start=True, timeout_s=10)
        assert time.monotonic() - started < 5 and "too_many_sequences" in refused.value.message(), refused.value
        assert feed(9_100_010, end=True, samples=0).as_numpy("PROBS").size == 0   # frees its slot, scores nothing
        for corrid in (9_100_011, 9_100_012):   # refused, never ended: now Triton's slots are all held
            with pytest.raises(InferenceServerException):
                feed(corrid, start=True, timeout_s=10)
        started = time.monotonic()
        feed(9_200_000, start=True, end=True, timeout_s=75)   # queued until the abandoned ones idle out
        waited = time.monotonic() - started
        assert served_idle_s - 1 <= waited < served_idle_s + 15, f"a new sequence waited {waited:.0f} s"
        feed(9_200_001, start=True)   # the model dropped the idle states with their slots: served at once
    finally:
        client.close()
        server.stop()
