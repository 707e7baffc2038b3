"""Realtime events as OpenAI's GA protocol defines them, in a real RealtimeSession over the Triton double of
test_realtime_speculation.py: the faults of the sixth outside test (a cancelled response lost its turn's
transcript, a cleared turn was committed later, truncation "auto" by characters only, transcription deltas with a
trailing space, both output modalities accepted, the response's audio format null, a failed response.create's
error without its event_id, speech_stopped's audio_end_ms before the silence), and its two left open then (instructions
past the LLM's context accepted by session.update; a retrieved user audio item without its audio)."""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from omni_frontend.errors import APIError
from omni_frontend.realtime.protocol import ProtocolError
from tests.unit.test_realtime_session import ask, done_events, errors
from tests.unit.test_realtime_speculation import CHUNK, PAUSED, STARTED, STOPPED, Client, until

pytestmark = pytest.mark.unit


def _events(client: Client, kind: str) -> list[dict]:
    return [e for e in client.sent if e["type"] == kind]


def test_a_cancelled_response_leaves_its_turns_transcription_to_finish():
    """The adopted speculation's ASR is the turn's transcription: cancelling the response (here the client's
    response.cancel while the ASR still runs) cancelled it too, and the item never got a transcript."""
    async def run():
        client = Client(200)
        await client.start()
        client.triton.asr_gate.clear()
        await client.turn({1: [STARTED], 9: [PAUSED]}, chunks=10)
        await client.append([STOPPED])
        await until(lambda: _events(client, "response.created"))
        await client.session.handle({"type": "response.cancel"})
        await until(lambda: done_events(client))
        client.triton.asr_gate.set()
        await until(lambda: _events(client, "conversation.item.input_audio_transcription.completed"))
        transcript = client.session.conversation.items[0].text
        await client.session.close()
        return client, transcript

    client, transcript = asyncio.run(run())
    committed = _events(client, "input_audio_buffer.committed")[0]["item_id"]
    (completed,) = _events(client, "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == committed and completed["transcript"] == transcript == f"{10 * CHUNK} samples"   # the audio to the pause
    assert done_events(client)[0]["response"]["status"] == "cancelled"


def test_clearing_the_buffer_ends_the_turn_under_way():
    """input_audio_buffer.clear after speech_started: the VAD's later speech_stopped commits nothing (the audio
    appended after the clear was committed as the cleared turn and answered)."""
    async def run():
        client = Client(None)
        await client.start()
        await client.turn({1: [STARTED]}, chunks=4)
        await client.session.handle({"type": "input_audio_buffer.clear"})
        await client.turn({}, chunks=8)
        await client.append([STOPPED])
        await asyncio.sleep(0.05)
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert "input_audio_buffer.cleared" in client.kinds()
    assert not _events(client, "input_audio_buffer.committed") and not _events(client, "response.created")


def test_speech_stopped_audio_end_ms_includes_the_silence_the_item_holds():
    """OpenAI: audio_end_ms "includes the min_silence_duration_ms"; it was where the silence began."""
    async def run():
        client = Client(None)
        await client.start()
        await client.turn({1: [STARTED]}, chunks=11)
        await client.append([STOPPED])   # the 12th chunk: the VAD's deciding window ends with it
        await until(lambda: _events(client, "conversation.item.input_audio_transcription.completed"))
        await client.session.close()
        return client

    client = asyncio.run(run())
    (stopped,) = _events(client, "input_audio_buffer.speech_stopped")
    (started,) = _events(client, "input_audio_buffer.speech_started")
    assert stopped["audio_end_ms"] == 12 * CHUNK * 1000 // 16000 == 1200 and started["audio_start_ms"] == 0
    (completed,) = _events(client, "conversation.item.input_audio_transcription.completed")
    assert completed["usage"]["seconds"] == (stopped["audio_end_ms"] - started["audio_start_ms"]) / 1000


def test_transcription_deltas_add_up_to_the_transcript():
    async def run():
        client = Client(None)
        await client.start()
        infer = client.triton.infer

        async def with_segments(model, inputs, *args, **kwargs):
            out = await infer(model, inputs, *args, **kwargs)
            if model == "voice_asr":   # stripped segment texts, joined by spaces as the ASR stage joins them
                result = {**json.loads(out["RESULT"][0]), "text": "What is it? Paris.",
                          "segments": [{"text": "What is it?"}, {"text": ""}, {"text": "Paris."}]}
                out = {"RESULT": np.array([json.dumps(result).encode()], dtype=np.object_)}
            return out

        client.triton.infer = with_segments
        await client.turn({1: [STARTED]}, chunks=11)
        await client.append([STOPPED])
        await until(lambda: _events(client, "conversation.item.input_audio_transcription.completed"))
        await client.session.close()
        return client

    client = asyncio.run(run())
    deltas = [e["delta"] for e in _events(client, "conversation.item.input_audio_transcription.delta")]
    (completed,) = _events(client, "conversation.item.input_audio_transcription.completed")
    assert deltas == ["What is it?", " Paris."] and "".join(deltas) == completed["transcript"] == "What is it? Paris."


@pytest.mark.parametrize("event", [
    {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text", "audio"]}},
    {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio", "audio"]}},
    {"type": "response.create", "response": {"output_modalities": ["text", "audio"]}},
])
def test_both_output_modalities_at_once_are_refused(event):
    """OpenAI: "It is not possible to request both text and audio at the same time" (both were served as audio)."""
    async def run():
        client = Client(None)
        await client.start()
        with pytest.raises(ProtocolError) as refused:   # the route sends it as the `error` event
            await client.session.handle({**event, "event_id": "ev1"})
        await asyncio.sleep(0.02)
        audio_out = client.session.settings.audio_out
        await client.session.close()
        return client, refused.value, audio_out

    client, error, audio_out = asyncio.run(run())
    assert error.code == "invalid_value" and error.event_id == "ev1" and error.param.endswith("output_modalities")
    assert audio_out is True and not _events(client, "response.created")
    assert len(_events(client, "session.updated")) == 1   # start()'s own update only


def test_a_response_names_the_audio_format_of_its_deltas():
    async def run():
        client = Client(None)
        await client.start()
        await ask(client)
        await until(lambda: done_events(client))
        await client.session.handle({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu"}}}}})
        await client.session.handle({"type": "response.create", "response": {
            "audio": {"output": {"format": {"type": "audio/pcma"}}}}})
        await until(lambda: len(done_events(client)) == 2)
        await client.session.handle({"type": "response.create"})
        await until(lambda: len(done_events(client)) == 3)
        await client.session.close()
        return client

    client = asyncio.run(run())
    formats = [e["response"]["audio"]["output"]["format"] for e in done_events(client)]
    assert formats == [{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcma"}, {"type": "audio/pcmu"}]
    assert [e["response"]["audio"]["output"]["format"] for e in _events(client, "response.created")] == formats


def test_a_failed_response_names_the_response_create_that_asked_for_it():
    async def run():
        client = Client(None)
        await client.start()
        client.triton.fail = APIError(503, "stage voice_tts died", code="stage_unavailable")
        await client.session.handle({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        await client.session.handle({"type": "response.create", "event_id": "rc1"})
        await until(lambda: done_events(client))
        await client.session.close()
        return client

    client = asyncio.run(run())
    (error,) = _events(client, "error")
    assert error["error"]["code"] == "stage_unavailable" and error["error"]["event_id"] == "rc1"


def test_truncation_auto_leaves_out_the_oldest_items_until_the_prompt_fits_the_context():
    """A pipeline that refuses prompts over 5,000 characters as past its context (token-dense history: digits):
    the response's prompt is cut, oldest items first, until it fits, and the response completes (every response
    of such a session failed with context_length_exceeded)."""
    async def run():
        client = Client(None)
        await client.start()
        stream = client.triton.stream
        sent = []

        def fitted(model, inputs, request_id=None, parameters=None):
            messages = json.loads(inputs["REQUEST"][0])["messages"]
            sent.append(sum(len(m["content"]) for m in messages))
            if sent[-1] > 5000:
                raise APIError(400, f"prompt ({sent[-1]} tokens) plus max_tokens (4096) exceeds the context length",
                               code="context_length_exceeded", param="messages")
            return stream(model, inputs, request_id, parameters)

        client.triton.stream = fitted
        for n in range(6):
            await client.session.handle({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"{n} " * 1000}]}})
        await ask(client, "Say OK.")
        await until(lambda: done_events(client))
        await client.session.close()
        return client, sent, json.loads(json.dumps(client.triton.streams[-1]["body"]))

    client, sent, body = asyncio.run(run())
    assert done_events(client)[0]["response"]["status"] == "completed" and not errors(client)
    assert sent[0] > 5000 >= sent[-1] and len(sent) >= 2
    assert body["messages"][-1]["content"] == "Say OK." and body["messages"][0]["role"] == "system"


def test_a_prompt_that_cannot_fit_is_refused_once_only_the_newest_item_is_left():
    """A pipeline that refuses every response's prompt as past its context (the instructions passed their own
    check): the oldest items are left out while that sends fewer, then the refusal stands (no request is sent twice with the same messages)."""
    async def run():
        client = Client(None)
        await client.start()
        sizes, stream = [], client.triton.stream

        def refuse(model, inputs, request_id=None, parameters=None):
            if json.loads(inputs["REQUEST"][0]).get("action"):   # the instructions alone fit: session.update takes them
                return stream(model, inputs, request_id, parameters)
            sizes.append(len(json.loads(inputs["REQUEST"][0])["messages"]))
            raise APIError(400, "prompt plus max_tokens exceeds the context length", code="context_length_exceeded")

        client.triton.stream = refuse
        await client.session.handle({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}})
        for n in range(4):
            await client.session.handle({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"{n} " * 2000}]}})
        await client.session.handle({"type": "response.create", "event_id": "rc2"})
        await until(lambda: done_events(client))
        await client.session.close()
        return client, sizes

    client, sizes = asyncio.run(run())
    assert sizes == sorted(set(sizes), reverse=True) and sizes[-1] == 2   # the system message and the newest item
    assert done_events(client)[0]["response"]["status"] == "failed"
    assert errors(client) == [("invalid_request_error", "context_length_exceeded")]


async def _refusal(client: Client, event: dict) -> tuple | None:
    """(event_id, code, param) of the error the route would send for `event`, or None if the session took it."""
    try:
        await client.session.handle(event)
    except ProtocolError as exc:
        return exc.event_id, exc.code, exc.param
    return None


def _update(client: Client, event_id: str, **session):
    return _refusal(client, {"type": "session.update", "event_id": event_id, "session": {"type": "realtime", **session}})


def test_instructions_that_cannot_fit_the_context_are_refused_by_the_update_that_sets_them():
    """session.update took instructions longer than the LLM's context; every response then failed with
    context_length_exceeded. The pipeline counts them (with max_output_tokens) when they are set: an error naming
    the field, with the update's event_id, and the session keeps its instructions."""
    async def run():
        client = Client(None)
        await client.start()
        refused = [await _update(client, "su1", instructions="Be brief."),
                   await _update(client, "su2", instructions="x" * 9000),                 # past 8192 alone
                   await _update(client, "su3", instructions="y" * 5000),                 # + "inf" (4096): past
                   await _update(client, "su4", instructions="z" * 5000, max_output_tokens=100)]
        kept = client.session.settings.instructions
        await ask(client)
        await until(lambda: done_events(client))
        await client.session.close()
        return client, refused, kept

    client, refused, kept = asyncio.run(run())
    assert refused == [None, ("su2", "context_length_exceeded", "session.instructions"),
                       ("su3", "context_length_exceeded", "session.max_output_tokens"), None]
    updated = [e["session"]["instructions"] for e in _events(client, "session.updated")]
    assert updated[-2:] == ["Be brief.", "z" * 5000] and "x" * 9000 not in updated and kept == "z" * 5000
    checks = client.triton.prompt_checks
    assert [(c["messages"], c["max_tokens"]) for c in checks] == [
        ([{"role": "system", "content": "Be brief."}], 4096), ([{"role": "system", "content": "x" * 9000}], 4096),
        ([{"role": "system", "content": "y" * 5000}], 4096), ([{"role": "system", "content": "z" * 5000}], 100)]
    assert done_events(client)[0]["response"]["status"] == "completed"
    assert client.triton.streams[-1]["body"]["messages"][0]["content"] == "z" * 5000


def test_response_instructions_that_cannot_fit_are_refused_before_the_response_starts():
    """response.create's own instructions (or max_output_tokens) past the context: an error with its event_id and
    no response; the session's next response runs; a response with the session's settings asks nothing more."""
    async def run():
        client = Client(None)
        await client.start()
        refused = [await _refusal(client, {"type": "response.create", "event_id": "rc1",
                                           "response": {"instructions": "x" * 9000}}),
                   await _refusal(client, {"type": "response.create", "event_id": "rc2",
                                           "response": {"instructions": "y" * 5000, "max_output_tokens": 4096}})]
        await asyncio.sleep(0.05)
        created = len(_events(client, "response.created"))
        checks = len(client.triton.prompt_checks)
        await ask(client)
        await until(lambda: done_events(client))
        await client.session.close()
        return client, refused, created, checks

    client, refused, created, checks = asyncio.run(run())
    assert created == 0 and checks == 2
    assert refused == [("rc1", "context_length_exceeded", "response.instructions"),
                       ("rc2", "context_length_exceeded", "response.max_output_tokens")]
    assert done_events(client)[0]["response"]["status"] == "completed" and len(client.triton.prompt_checks) == 2


def test_a_retrieved_user_audio_item_carries_its_audio_in_the_sessions_input_format():
    """conversation.item.retrieve of a transcribed user audio item had no `audio` (a session dropped a turn's audio
    once transcribed). OpenAI: the input_audio part's audio is base64 in the session's input format; the session
    keeps its newest RETAINED_AUDIO_S seconds of user audio for it."""
    async def run():
        client = Client(None)
        await client.start()   # input audio/pcm at 16 kHz
        await client.turn({1: [STARTED]}, chunks=11)
        await client.append([STOPPED])
        await until(lambda: _events(client, "conversation.item.input_audio_transcription.completed"))
        item_id = _events(client, "input_audio_buffer.committed")[0]["item_id"]
        await client.session.handle({"type": "conversation.item.retrieve", "item_id": item_id})
        await _update(client, "fmt", audio={"input": {"format": {"type": "audio/pcm", "rate": 24000}}})
        await client.session.handle({"type": "conversation.item.retrieve", "item_id": item_id})
        await client.session.close()
        return client, item_id

    client, item_id = asyncio.run(run())
    first, second = [e["item"] for e in _events(client, "conversation.item.retrieved")]
    assert first["id"] == second["id"] == item_id
    part = first["content"][0]
    assert part["type"] == "input_audio" and part["transcript"] == f"{12 * CHUNK} samples"
    at16 = np.frombuffer(base64.b64decode(part["audio"]), "<i2")
    assert at16.size == 12 * CHUNK and np.all(np.abs(at16.astype(int) - 3000) <= 1)   # the appended audio, 16 kHz
    at24 = np.frombuffer(base64.b64decode(second["content"][0]["audio"]), "<i2")
    assert abs(at24.size - 12 * CHUNK * 3 // 2) <= 2 and abs(np.median(at24) - 3000) <= 2   # now as 24 kHz PCM16


def test_a_session_keeps_only_its_newest_user_audio_for_retrieve(monkeypatch):
    """The kept audio is bounded (RETAINED_AUDIO_S seconds in all): older parts lose theirs first, a deleted
    item's is let go at once, and a part still being transcribed is retrieved with its audio too."""
    from omni_frontend.realtime import conversation as conv

    monkeypatch.setattr(conv, "RETAINED_AUDIO_S", 2)
    parts = [conv.Part("input_audio", audio=np.full(16000, 0.25 * (n + 1), np.float32)) for n in range(4)]
    talk = conv.Conversation()
    for n, part in enumerate(parts):
        talk.add(conv.Item(f"item_{n}", "user", [part]))
    assert parts[0].user_audio is not None and parts[0].user_audio[0] == 8191   # before its transcription
    for part in parts[:3]:
        talk.keep_audio(part)
    assert [p.kept is not None for p in parts[:3]] == [False, True, True] and all(p.audio is None for p in parts[:3])
    assert parts[2].kept.dtype == np.int16 and parts[2].kept.size == 16000 and parts[2].kept[0] == 24575
    talk.delete("item_2")
    talk.keep_audio(parts[3])
    assert [p.user_audio is not None for p in parts] == [False, True, False, True]


def test_instructions_are_taken_when_the_pipeline_cannot_count_them():
    """A pipeline that cannot answer the count (5xx: unreachable, failing) does not stop session.update: the length
    is judged when a response runs, as before the check (a refusal here would block every update of instructions)."""
    async def run():
        client = Client(None)
        await client.start()
        stream = client.triton.stream

        def failing(model, inputs, request_id=None, parameters=None):
            if json.loads(inputs["REQUEST"][0]).get("action") == "prompt_tokens":
                raise APIError(503, "Triton is unreachable", code="triton_unavailable")
            return stream(model, inputs, request_id, parameters)

        client.triton.stream = failing
        refused = await _update(client, "su1", instructions="Be brief.")
        kept = client.session.settings.instructions
        await client.session.close()
        return refused, kept

    assert asyncio.run(run()) == (None, "Be brief.")
