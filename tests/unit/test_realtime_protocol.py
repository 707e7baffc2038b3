"""Realtime session configuration, event codec, input/output audio and conversation logic (no server)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from omni_frontend.realtime import config
from omni_frontend.realtime.audio import InputDecoder, OutputEncoder
from omni_frontend.realtime.conversation import Conversation, Item, Part, truncate
from omni_frontend.realtime.protocol import ProtocolError, decode, encode

pytestmark = pytest.mark.unit


def _session(**update):
    return config.merge(config.default_session("voice", "sess_1"), update)


def test_partial_turn_detection_update_keeps_the_other_fields():
    merged = _session(audio={"input": {"turn_detection": {"silence_duration_ms": 800}}})
    detection = merged["audio"]["input"]["turn_detection"]
    assert detection == {**config.SERVER_VAD, "silence_duration_ms": 800}
    settings = config.validate(merged)
    assert settings.vad == {"threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 800}
    assert settings.create_response and settings.interrupt_response


def test_explicit_null_turns_vad_off_and_a_new_server_vad_gets_defaults():
    off = config.merge(_session(), {"audio": {"input": {"turn_detection": None}}})
    assert off["audio"]["input"]["turn_detection"] is None and config.validate(off).vad is None
    on = config.merge(off, {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.7}}}})
    assert config.validate(on).vad == {"threshold": 0.7, "prefix_padding_ms": 300, "silence_duration_ms": 500}


def test_format_type_change_replaces_the_object_and_rates_are_checked():
    pcmu = _session(audio={"input": {"format": {"type": "audio/pcmu"}}})
    assert pcmu["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert (config.validate(pcmu).input_format, config.validate(pcmu).input_rate) == ("pcmu", 8000)
    assert config.validate(_session(audio={"input": {"format": {"rate": 16000}}})).input_rate == 16000
    for bad in ({"input": {"format": {"type": "audio/pcm", "rate": 44100}}},
                {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}):
        with pytest.raises(ProtocolError) as info:
            config.validate(_session(audio=bad))
        assert info.value.code == "unsupported_audio_format" and info.value.param.startswith("session.audio.")


@pytest.mark.parametrize("update, param", [
    ({"output_modalities": ["video"]}, "session.output_modalities[0]"),
    ({"max_output_tokens": 0}, "session.max_output_tokens"),
    ({"audio": {"input": {"turn_detection": {"threshold": 1.5}}}}, "session.audio.input.turn_detection.threshold"),
    ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
    ({"type": "chat"}, "session.type"),
    # strict types: the value is used as sent (a string threshold used to fail later, as a TypeError)
    ({"audio": {"input": {"turn_detection": {"threshold": "0.5"}}}}, "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"silence_duration_ms": True}}}},
     "session.audio.input.turn_detection.silence_duration_ms"),
    ({"audio": {"input": {"turn_detection": {"create_response": "yes"}}}},
     "session.audio.input.turn_detection.create_response"),
    ({"audio": {"input": {"turn_detection": {"prefix_padding_ms": -1}}}},
     "session.audio.input.turn_detection.prefix_padding_ms"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "threshold": 0.5}}}},
     "session.audio.input.turn_detection.threshold"),                       # not a semantic_vad field
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "soon"}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"audio": {"output": {"voice": 5}}}, "session.audio.output.voice"),    # not "...voice.str" (a union branch)
    ({"audio": {"output": {"voicee": "echo"}}}, "session.audio.output.voicee"),
    ({"audio": {"output": {"voice": ""}}}, "session.audio.output.voice"),  # chat and speech refuse it too
    ({"audio": {"output": {"voice": {"id": " "}}}}, "session.audio.output.voice"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}, "session.audio.input.format.rate"),
    ({"audio": {"output": {"format": {"type": "audio/opus"}}}}, "session.audio.output.format.type"),
    ({"audio": {"input": {"transcription": {"language": "english"}}}}, "session.audio.input.transcription.language"),
    ({"audio": {"input": {"transcription": {"keywords": ["Triton"]}}}}, "session.audio.input.transcription.keywords"),
    ({"output_modalities": []}, "session.output_modalities"),
    ({"max_output_tokens": 4097}, "session.max_output_tokens"),
    # tokenized whole by every turn's transcription (an 8 MB prompt stalled voice_asr ~17 s)
    ({"audio": {"input": {"transcription": {"prompt": "x" * 131073}}}}, "session.audio.input.transcription.prompt"),
])
def test_invalid_sessions_name_the_field(update, param):
    with pytest.raises(ProtocolError) as info:
        config.validate(_session(**update))
    assert info.value.param == param


def test_vad_switched_on_without_a_type_names_the_missing_type():
    off = config.merge(_session(), {"audio": {"input": {"turn_detection": None}}})
    with pytest.raises(ProtocolError) as info:
        config.validate(config.merge(off, {"audio": {"input": {"turn_detection": {"threshold": 0.3}}}}))
    assert info.value.param == "session.audio.input.turn_detection.type"


@pytest.mark.parametrize("event, code, param, says", [
    ({"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": "5"},
     "invalid_value", "audio_end_ms", "integer"),                           # was "item" (another event's field)
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                   "content": [{"type": "input_audio", "audio": 5}]}},
     "invalid_value", "item.content[0].audio", "string"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                   "content": [{"type": "input_txt", "text": "hi"}]}},
     "invalid_value", "item.content[0].type", "input_text"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}},
     "invalid_value", "item.role", "'user'"),
    ({"type": "conversation.item.create", "item": {"type": "note", "role": "user", "content": []}},
     "invalid_value", "item.type", "'message'"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                   "content": [{"type": "input_text", "text": "hi", "lang": "en"}]}},
     "unknown_parameter", "item.content[0].lang", "unknown"),
    ({"type": "response.create", "response": {"max_output_tokens": "7"}}, "invalid_value",
     "response.max_output_tokens", "integer"),
    ({"type": "response.create", "response": {"voice": "echo"}}, "unknown_parameter", "response.voice", "unknown"),
    ({"type": "response.create", "response": {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 8000}}}}},
     "invalid_value", "response.audio.output.format.rate", "24000"),
    ({"type": "input_audio_buffer.append"}, "invalid_value", "audio", "required"),
    ({"type": "conversation.item.delete"}, "invalid_value", "item_id", "required"),
    ({"type": "session.update", "session": {}, "sesion": {}}, "unknown_parameter", "sesion", "unknown"),
])
def test_bad_client_events_name_the_field_in_their_own_notation(event, code, param, says):
    with pytest.raises(ProtocolError) as info:
        decode(json.dumps({**event, "event_id": "evt_7"}))
    error = info.value
    assert (error.code, error.param, error.event_id, error.type) == (code, param, "evt_7", "invalid_request_error")
    assert says in error.message, error.message


def test_response_settings_refuse_what_the_response_cannot_honour():
    session = config.validate(_session())
    for spec, param in [({"tools": [{"type": "function", "name": "f"}]}, "response.tools"),
                        ({"input": []}, "response.input"), ({"conversation": "conv_2"}, "response.conversation"),
                        ({"output_modalities": []}, "response.output_modalities"),
                        ({"max_output_tokens": 0}, "response.max_output_tokens"),
                        ({"audio": {"output": {"voice": ""}}}, "response.audio.output.voice"),
                        ({"instructions": "x" * 131073}, "response.instructions")]:   # over --max-text-chars
        with pytest.raises(ProtocolError) as info:
            config.response_settings(spec, session)
        assert info.value.param == param, spec
    settings = config.response_settings({"audio": {"output": {"voice": {"id": "echo"}, "format": {"type": "audio/pcmu"}}},
                                         "max_output_tokens": "inf", "conversation": "none"}, session)
    assert (settings.voice, settings.output_format, settings.output_rate) == ("echo", "pcmu", 8000)
    assert settings.max_tokens is None and not settings.in_conversation and settings.audio_out


@pytest.mark.parametrize("update, param, why", [
    ({"tool_choice": "required"}, "session.tool_choice", "do not call tools"),
    ({"tool_choice": {"type": "function", "name": "get_weather"}}, "session.tool_choice", "do not call tools"),
    ({"tool_choice": {"type": "mcp", "server_label": "s"}}, "session.tool_choice", "do not call tools"),
    ({"include": ["item.input_audio_transcription.logprobs"]}, "session.include", "log probabilities"),
    ({"type": "transcription", "include": ["item.input_audio_transcription.logprobs"]}, "session.include",
     "log probabilities"),
    ({"truncation": "disabled"}, "session.truncation", "history"),
    ({"truncation": {"type": "retention_ratio", "retention_ratio": 0.5}}, "session.truncation", "history"),
    ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "session.audio.input.noise_reduction",
     "denoised"),
])
def test_session_features_the_server_does_not_honour_are_refused_naming_the_field(update, param, why):
    """They used to be accepted and dropped (a forced tool call answered in plain speech, no logprobs in the
    transcription events), while chat refuses tool_choice and logprobs with a 400 naming the field."""
    session = _session(**update)
    if update.get("type") == "transcription":
        session = {"type": "transcription", "audio": {"input": session["audio"]["input"]}, **update}
    with pytest.raises(ProtocolError) as info:
        config.validate(session)
    error = info.value
    assert (error.code, error.param, error.type) == ("unsupported_feature", param, "invalid_request_error")
    assert param in error.message and why in error.message, error.message


@pytest.mark.parametrize("spec, param", [
    ({"tool_choice": "required"}, "response.tool_choice"),
    ({"tool_choice": {"type": "function", "name": "get_weather"}}, "response.tool_choice"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "auto"}, "response.tools"),
])
def test_response_tool_choice_is_refused_naming_the_field(spec, param):
    with pytest.raises(ProtocolError) as info:
        config.response_settings(spec, config.validate(_session()))
    assert (info.value.code, info.value.param) == ("unsupported_feature", param)
    assert "do not call tools" in info.value.message


def test_values_that_change_nothing_are_still_accepted():
    """With no tools the model calls none, so tool_choice auto (the default) and none change nothing; an empty
    include or truncation auto (the default) neither."""
    for update in ({"tool_choice": "auto"}, {"tool_choice": "none"}, {"include": []}, {"include": None},
                   {"truncation": "auto"}, {"tools": []}):
        config.validate(_session(**update))
    session = config.validate(_session())
    for spec in ({"tool_choice": "none"}, {"tool_choice": "auto", "tools": []}):
        assert config.response_settings(spec, session).audio_out


def test_semantic_vad_maps_eagerness_to_silence():
    settings = config.validate(_session(audio={"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}))
    assert settings.vad["silence_duration_ms"] == config.SEMANTIC_SILENCE_MS["high"]


def test_client_events_are_parsed_with_the_sdk_models():
    assert decode('{"type": "input_audio_buffer.commit"}')["type"] == "input_audio_buffer.commit"
    for text, code in [("[1]", "invalid_json"), ("{", "invalid_json"), ('{"type": "response.audio.delta"}', "unknown_event"),
                       ('{"type": "conversation.item.truncate", "item_id": "x"}', "invalid_value")]:
        with pytest.raises(ProtocolError) as info:
            decode(text)
        assert info.value.code == code


def test_server_events_are_checked_against_the_sdk():
    text = encode({"type": "input_audio_buffer.speech_started", "audio_start_ms": 10, "item_id": "item_1"})
    assert '"event_id": "event_' in text
    with pytest.raises(Exception):
        encode({"type": "input_audio_buffer.speech_started", "audio_start_ms": "soon", "item_id": "item_1"})


@pytest.mark.parametrize("fmt, rate", [("pcm", 24000), ("pcm", 16000), ("pcm", 8000), ("pcmu", 8000), ("pcma", 8000)])
def test_input_decoder_streams_to_16_khz(fmt, rate):
    seconds = 1.0
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(int(rate * seconds)) / rate)).astype(np.float32)
    encoded = OutputEncoder(fmt, rate).encode(tone, rate)
    decoder = InputDecoder(fmt, rate)
    step = len(encoded) // 10
    out = np.concatenate([decoder.decode(encoded[i:i + step]) for i in range(0, len(encoded), step)])
    assert abs(out.size - 16000 * seconds) <= 64
    spectrum = np.abs(np.fft.rfft(out[200:-200]))
    assert abs(np.argmax(spectrum) * 16000 / (out.size - 400) - 440) < 5  # still a 440 Hz tone


def test_odd_pcm16_payload_is_rejected():
    with pytest.raises(ProtocolError):
        InputDecoder("pcm", 24000).decode(b"\x00\x01\x02")


def test_history_and_truncate():
    conversation = Conversation()
    # the assistant speaks first, without instructions: the empty system prompt, never an empty message list
    # (the pipeline refused that: a pipeline_error and response.done failed)
    assert conversation.messages("") == [{"role": "system", "content": ""}]
    user = Item("item_u", "user", [Part("input_text", text="Tell me a story.")])
    reply = Item("item_a", "assistant", [Part("output_audio", text="One two three. Four five six.",
                                              spoken=[("One two three.", 1000.0), ("Four five six.", 1000.0)])])
    conversation.add(user)
    conversation.add(reply)
    assert conversation.messages("")[0] == {"role": "user", "content": "Tell me a story."}
    assert conversation.messages("Be brief.") == [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Tell me a story."},
                                                  {"role": "assistant", "content": "One two three. Four five six."}]
    truncate(reply, 0, 1500)
    assert reply.parts[0].text == "One two three. Four"
    with pytest.raises(ProtocolError):
        truncate(reply, 0, 5000)
    with pytest.raises(ProtocolError):
        truncate(user, 0, 10)
    first = Item("item_0", "system", [Part("input_text", text="Context.")])
    assert conversation.add(first, "root") is None and conversation.items[0] is first



def test_a_conversation_holds_bounded_items_text_and_audio_awaiting_transcription():
    """Thirteenth outside test: a session kept every item it was sent (400 items of 130 000 characters: +45 MB until
    it closed). `trim` deletes the oldest items beyond a bound on items, on text and on untranscribed audio, never
    the item just added nor an assistant item in progress; deleting drops the audio and what it counted."""
    conversation = Conversation(max_items=3, max_chars=10, max_pending_s=1)
    texts = [Item(f"t{i}", "user", [Part("input_text", text="x" * 4)]) for i in range(3)]
    for item in texts[:2]:
        conversation.add(item)
        assert conversation.trim(item) == []
    conversation.add(texts[2])
    assert conversation.trim(texts[2]) == ["t0"] and conversation.chars == 8   # 12 characters > 10
    speaking = Item("a0", "assistant", [Part("output_text")], status="in_progress")
    conversation.add(speaking, "root")
    big = Item("t3", "user", [Part("input_text", text="y" * 30)])   # alone over the bound: kept, all else goes
    conversation.add(big)
    assert conversation.trim(big) == ["t1", "t2"] and [i.id for i in conversation.items] == ["a0", "t3"]
    speaking.status = "completed"
    voice = [Item(f"v{i}", "user", [Part("input_audio", audio=np.zeros(12000, np.float32))]) for i in range(2)]
    conversation.delete("t3")
    conversation.add(voice[0])
    assert conversation.trim(voice[0]) == [] and conversation.pending == 12000
    conversation.keep_audio(voice[0].parts[0])   # transcribed: no longer pending
    assert conversation.pending == 0
    conversation.add(voice[1])
    assert conversation.trim(voice[1]) == [] and conversation.pending == 12000
    more = Item("v2", "user", [Part("input_audio", audio=np.zeros(8000, np.float32))])
    conversation.add(more)   # 4 items > 3: the oldest goes; 20 000 samples waiting > 16 000 (1 s): the oldest item
    # whose audio waits (v1), not v0 whose audio was transcribed (fourteenth outside test: text items went first)
    assert conversation.trim(more) == ["a0", "v1"] and conversation.pending == 8000
    assert voice[1].parts[0].audio is None and voice[0].parts[0].kept is not None and conversation.chars == 0
    for i in range(5):   # the count: the oldest items, whatever they hold
        conversation.add(Item(f"n{i}", "system", [Part("input_text", text="")]))
    assert conversation.trim(conversation.items[-1]) == ["v0", "v2", "n0", "n1"] and conversation.pending == 0
    # past the audio bound a text conversation keeps its text: only items whose audio waits go (fourteenth outside
    # test: 20 text items went for 9 audio items)
    talk = Conversation(max_items=100, max_chars=100, max_pending_s=1)
    for i in range(3):
        talk.add(Item(f"t{i}", "user", [Part("input_text", text="hello")]))
    for i in range(2):
        talk.add(Item(f"v{i}", "user", [Part("input_audio", audio=np.zeros(12000, np.float32))]))
    assert talk.trim(talk.items[-1]) == ["v0"] and [i.id for i in talk.items] == ["t0", "t1", "t2", "v1"]
