"""Mapping of chat pipeline requests (content parts, INPUT_AUDIO slices) onto the voice stages."""
import numpy as np
import pytest

from omni_backends.errors import RequestError
from omni_backends.chat_request import audio_clips
from omni_backends.voice.chunker import SentenceChunker
from omni_backends.voice.protocol import chunker_options, text_messages

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


def test_first_chunk_words_sets_the_first_chunk_and_is_validated():
    assert chunker_options({}) == chunker_options({"first_chunk_words": None}) == {}
    assert chunker_options({"first_chunk_words": 1}) == {"first_max_words": 1, "first_min_words": 1}
    chunker = SentenceChunker(**chunker_options({"first_chunk_words": 2}))
    assert chunker.feed("The capital of France is Paris, a city. ") + chunker.flush() == [
        "The capital", "of France is Paris,", "a city."]
    for bad in (0, 41, 2.5, "2", True):
        with pytest.raises(RequestError, match="first_chunk_words must be an integer from 1 to 40") as err:
            chunker_options({"first_chunk_words": bad})
        assert err.value.param == "first_chunk_words"
