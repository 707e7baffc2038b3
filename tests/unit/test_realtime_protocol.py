"""Realtime session configuration, event codec, input/output audio and conversation logic (no server)."""
from __future__ import annotations

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
    ({"output_modalities": ["video"]}, "session.output_modalities.0"),
    ({"max_output_tokens": 0}, "session.max_output_tokens"),
    ({"audio": {"input": {"turn_detection": {"threshold": 1.5}}}}, "session.audio.input.turn_detection.threshold"),
    ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
    ({"type": "chat"}, "session.type"),
])
def test_invalid_sessions_name_the_field(update, param):
    with pytest.raises(ProtocolError) as info:
        config.validate(_session(**update))
    assert info.value.param == param


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
    user = Item("item_u", "user", [Part("input_text", text="Tell me a story.")])
    reply = Item("item_a", "assistant", [Part("output_audio", text="One two three. Four five six.",
                                              spoken=[("One two three.", 1000.0), ("Four five six.", 1000.0)])])
    conversation.add(user)
    conversation.add(reply)
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

