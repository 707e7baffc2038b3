"""How a realtime response starts and ends inside a real RealtimeSession, over the Triton double of
test_realtime_speculation.py: the pipeline's admission gate, a sleeping pipeline, and the closing events of
every ending (completed, cancelled, barge-in, failed)."""
from __future__ import annotations

import asyncio
import base64

import pytest

from omni_frontend.admission import Gate
from omni_frontend.errors import APIError
from tests.unit.test_realtime_speculation import CHUNK, STARTED, Client, until

pytestmark = pytest.mark.unit
CLOSING = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
           "response.output_item.done", "conversation.item.done", "response.done"]


async def ask(client: Client, text: str = "Where is Paris?") -> None:
    await client.session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.session.handle({"type": "response.create"})


async def three_held_turns(client: Client) -> None:
    """Server VAD without automatic responses, the ASR stage held (`asr_gate` cleared), then three spoken turns
    until all three are committed."""
    await client.session.handle({"type": "session.update", "session": {"type": "realtime", "audio": {
        "input": {"turn_detection": {"type": "server_vad", "create_response": False}}}}})
    client.triton.asr_gate.clear()
    for turn in range(3):
        base = turn * 10 * CHUNK
        await client.turn({1: [{"type": "speech_started", "audio_start": base + CHUNK}],
                           9: [{"type": "speech_stopped", "audio_end": base + 8 * CHUNK}]}, chunks=10)
    await until(lambda: client.kinds().count("input_audio_buffer.committed") == 3)


def done_events(client: Client) -> list[dict]:
    return [e for e in client.sent if e["type"] == "response.done"]


def errors(client: Client) -> list[tuple]:
    return [(e["error"]["type"], e["error"]["code"]) for e in client.sent if e["type"] == "error"]


def test_responses_hold_admission_slots_queue_for_one_and_are_refused_beyond_as_http_is():
    """One slot, one queue place: the first session's response runs, the second's waits in_progress (its
    pipeline request not sent), the third's fails with HTTP's 429 code; the queued one runs once the slot frees."""
    async def run():
        gate = Gate("voice", max_inflight=1, max_queue=1)
        first, second, third = (Client(None, gate) for _ in range(3))
        for client in (first, second, third):
            await client.start()
        first.triton.hold = True
        await ask(first)
        await until(lambda: "response.output_audio.delta" in first.kinds())
        await ask(second)
        await until(lambda: gate.waiting)
        await ask(third)
        await until(lambda: done_events(third))
        seen = (gate.running, len(gate.waiting), len(second.triton.streams), second.kinds()[-1])
        await first.session.handle({"type": "response.cancel"})
        await until(lambda: done_events(second))
        for client in (first, second, third):
            await client.session.close()
        return gate, first, second, third, seen

    gate, first, second, third, seen = asyncio.run(run())
    assert seen == (1, 1, 0, "response.created")
    assert errors(third) == [("rate_limit_error", "pipeline_overloaded")]
    refused = done_events(third)[0]["response"]
    assert refused["status"] == "failed" and refused["status_details"]["error"]["code"] == "pipeline_overloaded"
    assert not third.triton.streams
    assert done_events(first)[0]["response"]["status"] == "cancelled"
    assert done_events(second)[0]["response"]["status"] == "completed" and len(second.triton.streams) == 1
    assert (gate.running, len(gate.waiting)) == (0, 0)  # every slot and queue place given back
    assert gate.mean_run_s is not None


def test_a_response_cancelled_while_queued_gives_up_its_place():
    async def run():
        gate = Gate("voice", max_inflight=1, max_queue=1)
        first, second = Client(None, gate), Client(None, gate)
        for client in (first, second):
            await client.start()
        first.triton.hold = True
        await ask(first)
        await until(lambda: first.triton.streams)
        await ask(second)
        await until(lambda: gate.waiting)
        await second.session.handle({"type": "response.cancel"})
        queued = sum(not f.done() for f in gate.waiting)
        await first.session.close()
        await second.session.close()
        return gate, second, queued

    gate, second, queued = asyncio.run(run())
    assert queued == 0 and (gate.running, len(gate.waiting)) == (0, 0)
    assert done_events(second)[0]["response"]["status"] == "cancelled" and not second.triton.streams


@pytest.mark.parametrize("ending", ["response.cancel", "barge-in", "pipeline failure"])
def test_every_ending_closes_the_opened_part_and_item_in_order_with_the_usage_so_far(ending):
    """The item opened by the first audio is closed (`*.done` events, status incomplete) before response.done,
    which carries the pipeline's counts so far; they used to end with response.done only (usage null)."""
    async def run():
        client = Client(None)
        await client.start()
        client.triton.hold = ending != "pipeline failure"
        if ending == "pipeline failure":
            client.triton.fail = APIError(503, "stage voice_tts died", code="stage_unavailable")
        await ask(client)
        await until(lambda: client.kinds().count("response.output_audio.delta") == 2 or done_events(client))
        if ending == "response.cancel":
            await client.session.handle({"type": "response.cancel"})
        elif ending == "barge-in":
            client.triton.turns.append([STARTED])
            await client.session.handle({"type": "input_audio_buffer.append", "audio": "AAAA" * (CHUNK // 2)})
        await until(lambda: done_events(client))
        client.items = {item.id: item for item in client.session.conversation.items}   # close lets go of them
        await client.session.close()
        return client

    client = asyncio.run(run())
    added = next(e for e in client.sent if e["type"] == "response.output_item.added")
    item_id = added["item"]["id"]
    closing = [e for e in client.sent if e["type"] in CLOSING and item_id in (e.get("item_id"), e.get("item", {}).get("id"))
               or e["type"] == "response.done"]
    assert [e["type"] for e in closing] == CLOSING
    assert closing[1]["transcript"] == "Paris is the capital." == closing[2]["part"]["transcript"]
    assert closing[3]["item"]["status"] == closing[4]["item"]["status"] == "incomplete"
    response = closing[-1]["response"]
    status = {"response.cancel": "cancelled", "barge-in": "cancelled", "pipeline failure": "failed"}[ending]
    assert response["status"] == status and response["output"][0]["status"] == "incomplete"
    assert response["usage"]["input_tokens"] == 20 and response["usage"]["output_tokens"] == 6
    assert response["usage"]["total_tokens"] == 26
    if ending == "pipeline failure":
        assert errors(client) == [("service_unavailable", "stage_unavailable")]
        assert client.kinds().index("error") < client.kinds().index("response.output_audio.done")
    assert client.items[item_id].status == "incomplete"


async def _answered() -> "Client":
    """A session that asked one question and got its response.done, then closed."""
    client = Client(None)
    await client.start()
    await ask(client)
    await until(lambda: done_events(client))
    await client.session.close()
    return client


def test_a_completed_response_closes_its_item_completed_with_the_final_usage():
    client = asyncio.run(_answered())
    assert [k for k in client.kinds() if k in CLOSING][1:] == CLOSING  # after the user item's conversation.item.done
    response = done_events(client)[0]["response"]
    assert response["status"] == "completed" and response["output"][0]["status"] == "completed"
    assert (response["usage"]["input_tokens"], response["usage"]["output_tokens"]) == (20, 6)


def test_a_cancel_that_comes_while_the_response_closes_does_not_cut_its_closing_events():
    async def run():
        client = Client(None)
        await client.start()
        closing, send = asyncio.Event(), client.session._send_text

        async def slow(text):  # the client reads slowly once the response has started closing
            await send(text)
            if '"response.output_audio.done"' in text:
                await closing.wait()

        client.session._send_text = slow
        await ask(client)
        await until(lambda: "response.output_audio.done" in client.kinds())
        cancel = asyncio.create_task(client.session.handle({"type": "response.cancel"}))
        await asyncio.sleep(0.01)
        closing.set()
        await cancel
        await until(lambda: done_events(client))
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert [k for k in client.kinds() if k in CLOSING][1:] == CLOSING
    assert client.kinds().count("response.created") == 1 and "error" not in client.kinds()
    assert done_events(client)[0]["response"]["status"] == "completed"


def test_a_response_cancelled_before_it_ran_reports_zero_usage_not_null():
    async def run():
        client = Client(None)
        await client.start()
        await ask(client)
        await client.session.handle({"type": "response.cancel"})
        await until(lambda: done_events(client))
        await client.session.close()
        return client

    client = asyncio.run(run())
    response = done_events(client)[0]["response"]
    assert response["status"] == "cancelled" and response["usage"]["total_tokens"] == 0
    assert client.gate.running == 0


def test_a_sleeping_pipeline_refuses_responses_vad_and_transcription_with_pipeline_sleeping_then_wakes():
    """Asleep, the stage models are unloaded: a response used to fail after the pipeline call as an
    `inference_error` ("unknown model") and every append as a `vad_error`. Now: `pipeline_sleeping` at once (as
    HTTP's 503), no Triton call, one error for the VAD however much audio comes; after wake a new VAD sequence."""
    async def run():
        client = Client(None)
        await client.start()
        await client.append()
        await client.session.control.sleep("voice")
        await ask(client)
        await until(lambda: done_events(client))
        for _ in range(3):
            await client.session.handle({"type": "input_audio_buffer.append", "audio": "AAAA" * (CHUNK // 2)})
        await asyncio.sleep(0.05)
        await client.session.handle({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAAA" * (CHUNK // 2)}]}})
        await until(lambda: "conversation.item.input_audio_transcription.failed" in client.kinds())
        asleep = list(client.sent)
        await client.session.control.wake("voice")
        await client.session.handle({"type": "input_audio_buffer.clear"})
        await client.append([STARTED])
        await until(lambda: "input_audio_buffer.speech_started" in client.kinds())
        await client.session.close()
        return client, asleep

    client, asleep = asyncio.run(run())
    codes = [(e["error"]["code"], e["error"]["type"]) for e in asleep if e["type"] == "error"]
    assert codes == [("pipeline_sleeping", "service_unavailable")] * 2  # the response, then the VAD (once)
    response = next(e for e in asleep if e["type"] == "response.done")["response"]
    assert response["status"] == "failed" and response["status_details"]["error"]["code"] == "pipeline_sleeping"
    failed = next(e for e in asleep if e["type"] == "conversation.item.input_audio_transcription.failed")
    assert failed["error"]["code"] == "pipeline_sleeping"
    assert not client.triton.streams and not client.triton.asr_calls
    assert client.triton.vad_starts == [True, True]  # before the sleep, then a new sequence after the wake


def test_a_refused_vad_sequence_is_reported_once_ended_at_once_and_retried_with_the_next_audio():
    """voice_vad refuses a START while every live sequence it serves is taken (429 too_many_sequences). The
    session says so once (not once per append), ENDs each refused sequence at once (a refused START holds a
    Triton slot until its END or the idle timeout) and starts a new one with the next audio: served, it detects
    turns again."""
    async def run():
        client = Client(None)
        client.triton.vad_refusals = 3
        await client.start()
        for _ in range(3):
            await client.append()
        await client.append([STARTED])
        await until(lambda: "input_audio_buffer.speech_started" in client.kinds())
        await client.session.close()
        return client

    client = asyncio.run(run())
    assert errors(client) == [("rate_limit_error", "too_many_sequences")]
    message = next(e for e in client.sent if e["type"] == "error")["error"]["message"]
    assert message.startswith("turn detection refused: ") and "1024 live sequences" in message
    assert client.triton.vad_starts == [True, True, True, True]
    assert len(set(client.triton.vad_ends)) == 4   # the three refused, and the served one at close


def test_a_sessions_turns_are_transcribed_one_at_a_time_in_order():
    """One append holding many turns (or a client committing in a loop) started one ASR request per turn at once,
    so one session held the shared ASR stage and every other client's transcription waited behind it (~1 min for
    64 turns on 2 cores). A session now keeps one ASR request in flight, its turns in order."""
    async def run():
        client = Client(None)
        await client.start()
        await three_held_turns(client)
        await asyncio.sleep(0.05)
        in_flight = len(client.triton.asr_calls)
        client.triton.asr_gate.set()
        await until(lambda: client.kinds().count("conversation.item.input_audio_transcription.completed") == 3)
        await client.session.close()
        return client, in_flight

    client, in_flight = asyncio.run(run())
    assert in_flight == 1 and len(client.triton.asr_calls) == 3
    committed = [e["item_id"] for e in client.sent if e["type"] == "input_audio_buffer.committed"]
    completed = [e["item_id"] for e in client.sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed == committed


def test_a_long_append_is_scored_by_the_vad_in_pieces():
    """An append of 12 s went to the shared VAD stage as one request (up to 10 MiB, ~218 s of audio: the stage busy
    for every session meanwhile); now in pieces of at most VAD_MAX_S seconds, all of it, in order."""
    import base64

    import numpy as np

    from omni_frontend.realtime.session import VAD_MAX_S

    async def run():
        client = Client(None)
        await client.start()
        pcm = np.full(12 * 16000, 3000, "<i2").tobytes()
        await client.session.handle({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        await until(lambda: sum(client.triton.vad_samples) == 12 * 16000)
        await client.session.close()
        return client

    sizes = [n for n in asyncio.run(run()).triton.vad_samples if n]
    assert sizes == [VAD_MAX_S * 16000, VAD_MAX_S * 16000, (12 - 2 * VAD_MAX_S) * 16000], sizes


def test_turns_own_their_audio_and_a_closed_session_lets_go_of_it():
    """One 218 s append of many turns grew the frontend by 100-600 MB per session, kept after close: each turn's
    audio was a view of a copy of the whole buffer, and a closed session lives on in reference cycles (its ended
    tasks' frames) until a full garbage collection. Now a turn's audio is its own array, and close drops the
    buffer and the items."""
    async def run():
        client = Client(None)
        await client.start()
        await three_held_turns(client)   # a turn's audio is dropped once transcribed: look at it before
        audio = [part.audio for item in client.session.conversation.items for part in item.parts]
        client.triton.asr_gate.set()
        await until(lambda: client.kinds().count("conversation.item.input_audio_transcription.completed") == 3)
        await client.session.close()
        return client.session, audio

    session, audio = asyncio.run(run())
    assert len(audio) == 3 and all(a.size >= 7 * CHUNK and a.base is None for a in audio)   # speech + padding
    assert session.buffer == [] and session.vad_queue == [] and session.conversation.items == []


def test_a_pipeline_is_falling_asleep_while_its_unloads_drain_and_waking_while_it_loads():
    """ModelControl's transitions: refused (in `sleeping`, not among the awake models /health judges) from the
    moment a sleep starts until its wake has loaded every model, and reported as falling_asleep / waking
    meanwhile (the state was `sleeping` throughout, so /health and /v1/models could not tell a drain)."""
    async def run():
        control = Client(None).control
        gate = asyncio.Event()
        unload, load = control.client.unload_model, control.client.load_model

        async def gated(call, model):
            await gate.wait()
            await call(model)

        control.client.unload_model = lambda model: gated(unload, model)
        control.client.load_model = lambda model: gated(load, model)
        seen = []
        for action in (control.sleep, control.wake):
            task = asyncio.create_task(action("voice"))
            await asyncio.sleep(0.01)
            seen.append((control.state("voice"), "voice" in control.sleeping, "voice_llm" in control.awake_models()))
            gate.set()
            await task
            gate.clear()
            seen.append((control.state("voice"), "voice" in control.sleeping, "voice_llm" in control.awake_models()))
        return seen

    assert asyncio.run(run()) == [("falling_asleep", True, False), ("sleeping", True, False),
                                  ("waking", True, False), ("awake", False, True)]


@pytest.mark.parametrize(("session_tokens", "response_tokens", "sent", "echoed"), [
    ("inf", None, 4096, "inf"), ("inf", 7, 7, 7), (12, None, 12, 12), (12, "inf", 4096, "inf")])
def test_max_output_tokens_inf_sends_the_documented_maximum(session_tokens, response_tokens, sent, echoed):
    """"inf" (the default) is the documented maximum, 4096: the pipeline gets max_tokens 4096, not null (which
    meant the pipeline's own default, 256 for voice: answers were cut there and reported `incomplete` /
    `max_output_tokens` for a limit the client never set). session.updated and response.done state the value."""
    async def run():
        client = Client(None)
        await client.start()
        await client.session.handle({"type": "session.update", "session": {"type": "realtime",
                                                                           "max_output_tokens": session_tokens}})
        await client.session.handle({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "A long story."}]}})
        spec = {} if response_tokens is None else {"max_output_tokens": response_tokens}
        await client.session.handle({"type": "response.create", "response": spec})
        await until(lambda: done_events(client))
        await client.session.close()
        return client

    client = asyncio.run(run())
    updated = [e for e in client.sent if e["type"] == "session.updated"][-1]
    assert updated["session"]["max_output_tokens"] == session_tokens
    assert client.triton.streams[0]["body"]["max_tokens"] == sent
    assert done_events(client)[0]["response"]["max_output_tokens"] == echoed


def test_a_vad_sequence_idle_past_the_refresh_is_ended_and_a_new_one_started_with_continuous_offsets(monkeypatch):
    """voice_vad drops a sequence after 30 s without a request (so abandoned ones cannot hold its slots for long);
    a session that sent no audio for VAD_REFRESH_S ends its sequence and starts a new one with the next audio, and
    the events' sample offsets keep counting from the session's first sample."""
    import json

    import numpy as np

    from omni_frontend.realtime import stages

    calls = []

    class Triton:
        async def infer(self, model, inputs, sequence_id=0, sequence_start=False, sequence_end=False, timeout_s=None):
            calls.append((sequence_id, sequence_start, sequence_end, inputs["AUDIO"].size))
            found = [] if sequence_end else [{"type": "speech_started", "audio_start": 100, "sample": 612}]
            return {"EVENTS": np.array([[json.dumps(found).encode()]], dtype=np.object_)}

    now = [1000.0]
    monkeypatch.setattr(stages.time, "monotonic", lambda: now[0])
    vad = stages.VADSequence(Triton(), "voice_vad", {})

    async def run():
        first = await vad.feed(np.zeros(1600, np.float32))
        now[0] += stages.VAD_REFRESH_S - 1
        second = await vad.feed(np.zeros(1600, np.float32))        # still live: same sequence
        now[0] += stages.VAD_REFRESH_S + 1
        third = await vad.feed(np.zeros(800, np.float32))          # idle too long: END, then a new START
        return first, second, third

    first, second, third = asyncio.run(run())
    (a, start_a, _, _), (b, start_b, end_b, _), (c, _, end_c, _), (d, start_d, end_d, _) = calls
    assert start_a and a == b and not start_b and not end_b
    assert c == a and end_c and d != a and start_d and not end_d
    assert first[0]["audio_start"] == second[0]["audio_start"] == 100
    assert third[0]["audio_start"] == 3200 + 100 and third[0]["sample"] == 3200 + 612
    vad.restart()                                                     # after a failure the session counts anew
    asyncio.run(vad.feed(np.zeros(10, np.float32)))
    assert calls[-1][1] and vad.base == 0 and vad.fed == 10


def test_a_transcript_without_audio_is_kept_and_a_silent_chunk_is_sent(monkeypatch):
    """An audio.delta without samples (a pipeline's text written after its last audio, as qwen3_omni sends it) was
    dropped with its transcript, so the item's transcript lacked that text where chat's message.audio.transcript
    has it: it is now a transcript delta with no audio delta. A silent chunk (voice's 10 ms for an emoji-only
    chunk) is audio like any other, its transcript "👍"."""
    from tests.unit import test_realtime_speculation as double

    monkeypatch.setattr(double, "REPLY", [("Paris is", 0.25), ("the capital.", 0.0), ("👍", 0.01)])

    client = asyncio.run(_answered())
    transcripts = [e["delta"] for e in client.sent if e["type"] == "response.output_audio_transcript.delta"]
    assert transcripts == ["Paris is", " the capital.", " 👍"]
    audio = [len(base64.b64decode(e["delta"])) for e in client.sent if e["type"] == "response.output_audio.delta"]
    assert audio == [0.25 * 24000 * 2, 0.01 * 24000 * 2]   # PCM16 at 24 kHz: no delta for the chunk without samples
    done = [e for e in client.sent if e["type"] == "response.output_audio_transcript.done"]
    assert [e["transcript"] for e in done] == ["Paris is the capital. 👍"]
    assert done_events(client)[0]["response"]["status"] == "completed"


def test_turns_past_the_sessions_audio_bound_are_deleted_oldest_first_and_never_transcribed():
    """Thirteenth outside test (the audio side of an unbounded conversation): turns waiting for their transcription
    held their float32 audio without bound. Beyond the conversation's bound the oldest items are deleted
    (conversation.item.deleted) and a deleted turn still queued for the ASR stage is never sent to it."""
    async def run():
        client = Client(None)
        await client.start()
        client.session.conversation.max_pending = 12 * CHUNK   # one turn (~8 chunks) waits, not two
        await three_held_turns(client)
        client.triton.asr_gate.set()
        await until(lambda: client.kinds().count("conversation.item.input_audio_transcription.completed") == 1)
        await asyncio.sleep(0.05)
        await client.session.close()
        return client

    client = asyncio.run(run())
    committed = [e["item_id"] for e in client.sent if e["type"] == "input_audio_buffer.committed"]
    assert [e["item_id"] for e in client.sent if e["type"] == "conversation.item.deleted"] == committed[:2]
    completed = [e["item_id"] for e in client.sent
                 if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed == committed[2:] and len(client.triton.asr_calls) == 2   # the first was under way; not the second
    assert client.session.conversation.pending == 0


def test_audio_is_bounded_by_its_duration_before_it_is_decoded():
    """Fourteenth outside test: an append was bounded by its bytes (10 MiB: 218 s of PCM16 at 24 kHz but 1310 s of
    G.711) and the 600 s buffer only after decoding it in the event loop (2.1 s, +841 MB); an item's input_audio had
    no bound (1500 s kept, one ASR request of 78 s) and an item of 120 text parts held 15 M characters. Durations now
    come from the payload's length and are refused before any decoding; long payloads decode on a worker thread."""
    from omni_frontend.realtime.protocol import ProtocolError
    from omni_frontend.realtime.session import MAX_APPEND_S, MAX_BUFFER_S, MAX_ITEM_AUDIO_S

    def g711(seconds: float) -> str:
        return base64.b64encode(b"\xff" * int(seconds * 8000)).decode()

    async def run():
        client = Client(None)
        await client.start()
        session = client.session
        await session.handle({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}}})
        decoded = []
        decode = session.decoder.decode
        session.decoder.decode = lambda data, param="audio": decoded.append(len(data)) or decode(data, param)
        codes = []
        for seconds in (MAX_APPEND_S + 1, 200, 200, 200, 1):
            try:
                await session.handle({"type": "input_audio_buffer.append", "audio": g711(seconds)})
                codes.append(None)
            except ProtocolError as exc:
                codes.append(exc.code)
        item_codes = []
        for content in ([{"type": "input_audio", "audio": g711(MAX_ITEM_AUDIO_S / 2)}] * 2 +
                        [{"type": "input_audio", "audio": g711(1)}],
                        [{"type": "input_text", "text": "x" * 100_000}] * 2):
            try:
                await session.handle({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": content}})
                item_codes.append(None)
            except ProtocolError as exc:
                item_codes.append((exc.code, exc.param))
        await session.close()
        return codes, decoded, item_codes, session

    codes, decoded, item_codes, session = asyncio.run(run())
    assert MAX_BUFFER_S == 600 and codes == ["audio_too_large", None, None, None, "input_audio_buffer_full"]
    assert decoded == [200 * 8000] * 3   # the refused payloads were never decoded
    assert item_codes == [("audio_too_large", "item.content[2].audio"), ("invalid_value", "item.content")]
