"""WS /v1/audio/speech/stream (text in as it is written, speech out sentence by sentence) on the real `tts`
pipeline (Kokoro), driven by a raw WebSocket client: the audio transcribed back by the server's Whisper."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
import websockets.sync.client

from tests.harness import metric_value, wait_for
from tests.integration.test_realtime import transcribe

pytestmark = pytest.mark.integration


def _connect(server):
    return websockets.sync.client.connect(server.base_url.replace("http", "ws") + "/v1/audio/speech/stream",
                                          max_size=None)


def _read_utterance(ws, events: list[dict] | None = None) -> tuple[list[dict], list[bytes]]:
    """Messages up to session.done: the JSON events (after `events`, already read), and per sentence its binary
    frames joined."""
    events = list(events or [])
    audio = [b"" for e in events if e["type"] == "audio.start"]
    while not events or events[-1]["type"] != "session.done":
        message = ws.recv(timeout=120)
        if isinstance(message, bytes):
            audio[-1] += message
            continue
        events.append(json.loads(message))
        if events[-1]["type"] == "audio.start":
            audio.append(b"")
    return events, audio


def test_text_written_piece_by_piece_is_spoken_per_sentence_before_the_utterance_ends(voice_server):
    """The first sentence's audio starts before the client has sent the rest of its text (what streaming text in is
    for); every sentence's frames add up to its audio.done total; the PCM transcribes back to the words; a second
    utterance on the same connection (wav files, no streaming) follows with utterance_index 1."""
    with _connect(voice_server) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm",
                            "stream_audio": True}))
        for piece in ("The weather ", "is sunny ", "today. "):
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        first = json.loads(ws.recv(timeout=120))   # spoken before any more text is sent
        assert first == {"type": "audio.start", "utterance_index": 0, "sentence_index": 0,
                         "sentence_text": "The weather is sunny today.", "format": "pcm", "sample_rate": 24000}
        ws.send(json.dumps({"type": "input.text", "text": "We will walk to the park"}))
        ws.send(json.dumps({"type": "input.done"}))
        events, audio = _read_utterance(ws, [first])
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "wav"}))
        ws.send(json.dumps({"type": "input.text", "text": "Goodbye for now, my friend."}))
        ws.send(json.dumps({"type": "input.done"}))
        wav_events, wav_audio = _read_utterance(ws)
        ws.send(json.dumps({"type": "session.close"}))
        with pytest.raises(websockets.ConnectionClosedOK):
            ws.recv(timeout=60)
    kinds = [(e["type"], e.get("sentence_index")) for e in events]
    assert kinds == [("audio.start", 0), ("audio.done", 0), ("audio.start", 1), ("audio.done", 1), ("session.done", None)]
    assert events[2]["sentence_text"] == "We will walk to the park" and events[-1] == {
        "type": "session.done", "utterance_index": 0, "total_sentences": 2}
    done = [e for e in events if e["type"] == "audio.done"]
    assert [d["total_bytes"] for d in done] == [len(a) for a in audio] and not any(d["error"] for d in done)
    for pcm in audio:
        samples = np.frombuffer(pcm, "<i2")
        assert 0.8 < samples.size / 24000 < 6 and np.abs(samples).max() > 1000, samples.size   # speech, not silence
    heard = transcribe(voice_server, b"".join(audio)).lower()
    assert all(word in heard for word in ("weather", "sunny", "today", "walk", "park")), heard
    assert [e["type"] for e in wav_events] == ["audio.start", "audio.done", "session.done"]
    assert wav_events[0]["utterance_index"] == wav_events[-1]["utterance_index"] == 1
    data, rate = sf.read(io.BytesIO(wav_audio[0]))
    assert rate == 24000 and data.size / rate > 0.8 and wav_events[1]["total_bytes"] == len(wav_audio[0])


def test_bad_messages_get_an_error_naming_the_field_and_the_connection_goes_on(voice_server):
    """Errors are `error` events with a code and the field; after a valid session.config the connection keeps
    serving (an unknown voice, an unknown field, a config change while text is buffered, an unknown type)."""
    with _connect(voice_server) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm"}))
        refused = []
        for message in ({"type": "session.config", "voice": "nobody"},
                        {"type": "session.config", "voice": "alloy", "language": "en"},
                        {"type": "session.config", "stream_audio": True, "response_format": "mp3"},
                        {"type": "input.text", "text": 5},
                        {"type": "input.speak"}):
            ws.send(json.dumps(message))
            refused.append(json.loads(ws.recv(timeout=60)))
        ws.send(json.dumps({"type": "input.text", "text": "Still here"}))
        ws.send(json.dumps({"type": "session.config", "voice": "alloy"}))
        refused.append(json.loads(ws.recv(timeout=60)))
        ws.send("not json")
        refused.append(json.loads(ws.recv(timeout=60)))
        ws.send(json.dumps({"type": "input.done"}))
        events, audio = _read_utterance(ws)
    assert [(e["type"], e["code"], e["param"]) for e in refused] == [
        ("error", "invalid_value", "voice"), ("error", "invalid_value", "language"),
        ("error", "invalid_value", "response_format"), ("error", "invalid_value", "text"),
        ("error", "unknown_message_type", "type"), ("error", "input_buffered", None), ("error", "invalid_json", None)]
    assert "nobody" in refused[0]["message"]
    assert [e["type"] for e in events] == ["audio.start", "audio.done", "session.done"]
    assert events[0]["sentence_text"] == "Still here" and len(audio[0]) > 24000   # the kept config: pcm


@pytest.mark.parametrize("first, code", [
    ({"type": "input.text", "text": "hi"}, "session_config_required"),
    ({"type": "session.config", "model": "voice"}, "model_not_found"),   # a chat pipeline, not a speech one
    ({"type": "session.config", "speed": 9}, "invalid_value"),
])
def test_a_connection_without_a_valid_first_session_config_is_closed(voice_server, first, code):
    with _connect(voice_server) as ws:
        ws.send(json.dumps(first))
        error = json.loads(ws.recv(timeout=60))
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            ws.recv(timeout=30)
    assert error["type"] == "error" and error["code"] == code, error
    assert closed.value.rcvd.code == 1008


def test_text_sent_faster_than_it_is_spoken_is_refused_past_the_limit_and_a_leaving_client_frees_its_slot(voice_server):
    """At most --max-speech-input-chars (4096) characters wait to be spoken: an input.text past that is an
    `input_too_long` error (its text dropped) while the rest is being spoken; a client that leaves mid-sentence has
    its pipeline request cancelled and its admission slot freed."""
    words = " ".join(["word"] * 500) + ". "   # 2,502 characters: cut into 40-word pieces, spoken one by one
    with _connect(voice_server) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm"}))
        ws.send(json.dumps({"type": "input.text", "text": words}))
        ws.send(json.dumps({"type": "input.text", "text": words}))   # 5,004 would wait: refused
        error = json.loads(ws.recv(timeout=60))
        start = json.loads(ws.recv(timeout=120))
        busy = metric_value(f"{voice_server.base_url}/metrics", "omni_frontend_inflight_requests", pipeline="tts")
    assert (error["type"], error["code"], error["param"]) == ("error", "input_too_long", "text") and "4096" in error["message"]
    assert start["type"] == "audio.start" and start["sentence_text"] == " ".join(["word"] * 40) and busy == 1
    assert wait_for(lambda: metric_value(f"{voice_server.base_url}/metrics", "omni_frontend_inflight_requests",
                                         pipeline="tts") == 0, 10)


def test_a_connection_that_sends_no_session_config_is_closed_after_the_config_timeout(voice_server):
    import time

    with _connect(voice_server) as ws:
        began = time.perf_counter()
        error = json.loads(ws.recv(timeout=60))
        waited = time.perf_counter() - began
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            ws.recv(timeout=30)
    assert (error["type"], error["code"]) == ("error", "config_timeout") and 9 < waited < 20, (error, waited)
    assert closed.value.rcvd.code == 1008


def test_short_and_silent_sentences_later_configs_and_a_close_that_flushes(voice_server):
    """The ninth outside test's faults: a two-word sentence waited for more text; a sentence with nothing to say
    ("[](abc)": Markdown that strips to nothing) killed the session in mp3 (PyAV raised MemoryError on no samples,
    the speaking task died) and was a 0-byte "file" in flac; a later session.config naming one field reset the others;
    text sent without input.done before session.close was dropped."""
    import av

    with _connect(voice_server) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "mp3"}))
        ws.send(json.dumps({"type": "input.text", "text": "Sure thing! "}))
        short = json.loads(ws.recv(timeout=120))             # spoken without more text
        ws.send(json.dumps({"type": "input.done"}))
        short_events, short_audio = _read_utterance(ws, [short])
        ws.send(json.dumps({"type": "input.text", "text": "[](abc)"}))
        ws.send(json.dumps({"type": "input.done"}))
        silent_events, silent_audio = _read_utterance(ws)
        ws.send(json.dumps({"type": "session.config", "response_format": "flac"}))   # the voice stays
        ws.send(json.dumps({"type": "input.text", "text": "[](abc)"}))
        ws.send(json.dumps({"type": "input.done"}))
        flac_events, flac_audio = _read_utterance(ws)
        ws.send(json.dumps({"type": "session.config", "speed": 1.25}))                # flac stays
        ws.send(json.dumps({"type": "input.text", "text": "All done here"}))
        ws.send(json.dumps({"type": "session.close"}))      # the unfinished utterance is spoken first
        last_events, last_audio = _read_utterance(ws)
        with pytest.raises(websockets.ConnectionClosedOK):
            ws.recv(timeout=60)
    assert short == {"type": "audio.start", "utterance_index": 0, "sentence_index": 0, "sentence_text": "Sure thing!",
                     "format": "mp3", "sample_rate": 24000} and short_events[-1]["total_sentences"] == 1
    for events, data in ((silent_events, silent_audio), (flac_events, flac_audio)):
        assert [e["type"] for e in events] == ["audio.start", "audio.done", "session.done"], events
        assert not events[1]["error"] and events[1]["total_bytes"] == len(data[0]) > 0
        with av.open(io.BytesIO(data[0])) as container:   # a real (near-silent) file
            assert sum(f.samples for f in container.decode(audio=0)) > 0
    assert flac_events[0]["format"] == "flac" and last_events[0]["format"] == "flac"
    assert last_events[0]["sentence_text"] == "All done here" and last_events[-1]["utterance_index"] == 3
    spoken, rate = sf.read(io.BytesIO(last_audio[0]))
    assert rate == 24000 and spoken.size / rate > 0.5


def test_a_client_that_leaves_after_session_close_has_its_sentence_cancelled(voice_server):
    """After session.close the server went on speaking to a client that had left: its Triton request ran until a
    send failed and the garbage collector closed the stream (5-90 s). The socket is read while closing, and a
    sentence's stream is closed on any exit: the request ends within about a second."""
    metrics = voice_server.metrics_url
    with _connect(voice_server) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm",
                            "stream_audio": True}))
        ws.send(json.dumps({"type": "input.text", "text": " ".join(["word"] * 60) + "."}))
        ws.send(json.dumps({"type": "session.close"}))
        assert json.loads(ws.recv(timeout=120))["type"] == "audio.start"
        assert metric_value(metrics, "omni_inflight_requests", model="tts") == 1
    assert wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model="tts") == 0, 5)
