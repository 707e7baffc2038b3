"""Mapping of chat pipeline requests (content parts, INPUT_AUDIO slices) onto the voice stages."""
import numpy as np
import pytest

from omni_backends.errors import RequestError
from omni_backends.chat_request import audio_clips
from omni_backends.voice.protocol import text_messages

pytestmark = pytest.mark.unit

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Listen:"},
                                 {"type": "input_audio", "offset": 0, "samples": 3, "sample_rate": 16000}]},
    {"role": "assistant", "content": [{"type": "text", "text": "OK."}]},
    {"role": "user", "content": [{"type": "input_audio", "offset": 3, "samples": 2, "sample_rate": 16000}]},
]


def test_audio_parts_slice_input_audio_in_order():
    clips = audio_clips(MESSAGES, np.arange(5, dtype=np.float32))
    assert [c.tolist() for c in clips] == [[0, 1, 2], [3, 4]]
    with pytest.raises(RequestError, match="INPUT_AUDIO"):
        audio_clips(MESSAGES, np.arange(4, dtype=np.float32))


def test_messages_become_plain_text_with_transcripts():
    assert text_messages(MESSAGES, ["hello there", "bye"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Listen: hello there"},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "bye"},
    ]
    with pytest.raises(RequestError, match="image_url"):
        text_messages([{"role": "user", "content": [{"type": "image_url"}]}], [])
