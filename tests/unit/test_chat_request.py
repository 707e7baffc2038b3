"""The one type check of a chat REQUEST body (omni_backends.chat_request) and of input audio
(omni_backends.input_audio), shared by every model that parses chat messages or takes input audio: any JSON
of the wrong shape, and any NaN / infinite sample, is a RequestError (HTTP 400) naming the field."""
import numpy as np
import pytest

from omni_backends.chat_request import audio_clips, check_request, input_images
from omni_backends.errors import RequestError
from omni_backends.input_audio import check_audio
from omni_backends.qwen3_omni.serving import turn
from omni_backends.voice.protocol import text_messages
from omni_backends.voice.tts import check_speed, resolve_voice

pytestmark = pytest.mark.unit

AUDIO_PART = {"type": "input_audio", "offset": 0, "samples": 10, "sample_rate": 16000}
GOOD = {"messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Listen:"}, AUDIO_PART]},
                     {"role": "assistant", "content": None}],
        "modalities": ["text", "audio"], "voice": "af_heart", "stop": ["\n"], "temperature": 0, "top_p": 0.9,
        "top_k": 5, "max_tokens": 4, "seed": 1, "presence_penalty": 0.5, "frequency_penalty": 0.0,
        "repetition_penalty": 1.1}


def _user(*parts) -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}]}


# (body, param of the 400): every field of the wrong JSON shape, wherever it sits
BAD_SHAPES = [
    ({}, "messages"),
    ({"messages": None}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": {"role": "user"}}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [1]}, "messages[0]"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [None]}, "messages[0]"),
    ({"messages": [[{"role": "user", "content": "hi"}]]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "hi"}, 2]}, "messages[1]"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": True}]}, "messages[0].content"),
    (_user(5), "messages[0].content[0]"),
    (_user("hi"), "messages[0].content[0]"),
    (_user(None), "messages[0].content[0]"),
    (_user({"type": "text", "text": "a"}, [1]), "messages[0].content[1]"),
    (_user({"text": "hi"}), "messages[0].content[0].type"),
    (_user({"type": 3}), "messages[0].content[0].type"),
    (_user({"type": ["text"]}), "messages[0].content[0].type"),
    (_user({"type": "image_url", "image_url": {"url": "x"}}), "messages[0].content[0].type"),
    (_user({"type": "text"}), "messages[0].content[0].text"),
    (_user({"type": "text", "text": 5}), "messages[0].content[0].text"),
    (_user({"type": "text", "text": ["a"]}), "messages[0].content[0].text"),
    (_user({"type": "text", "text": None}), "messages[0].content[0].text"),
    (_user({**AUDIO_PART, "offset": "a"}), "messages[0].content[0].offset"),
    (_user({**AUDIO_PART, "offset": 1.5}), "messages[0].content[0].offset"),
    (_user({**AUDIO_PART, "offset": True}), "messages[0].content[0].offset"),
    (_user({**AUDIO_PART, "offset": -1}), "messages[0].content[0].offset"),
    (_user({**AUDIO_PART, "offset": [0]}), "messages[0].content[0].offset"),
    (_user({"type": "text", "text": "a"}, {"type": "input_audio", "offset": 0}), "messages[0].content[1].samples"),
    (_user({**AUDIO_PART, "samples": "10"}), "messages[0].content[0].samples"),
    (_user({**AUDIO_PART, "samples": 10.0}), "messages[0].content[0].samples"),
    (_user({**AUDIO_PART, "samples": 0}), "messages[0].content[0].samples"),
    (_user({**AUDIO_PART, "samples": {"n": 1}}), "messages[0].content[0].samples"),
    (_user({**AUDIO_PART, "sample_rate": "16000"}), "messages[0].content[0].sample_rate"),
    (_user({**AUDIO_PART, "sample_rate": 24000}), "messages[0].content[0].sample_rate"),
    (_user({**AUDIO_PART, "samples": None}), "messages[0].content[0].samples"),
    ({**GOOD, "modalities": "text"}, "modalities"),
    ({**GOOD, "modalities": [1]}, "modalities"),
    ({**GOOD, "modalities": ["video"]}, "modalities"),
    ({**GOOD, "modalities": []}, "modalities"),
    ({**GOOD, "modalities": {"text": True}}, "modalities"),
    ({**GOOD, "voice": 5}, "voice"),
    ({**GOOD, "voice": ["alloy"]}, "voice"),
    ({**GOOD, "voice": {"id": "alloy"}}, "voice"),
    ({**GOOD, "stop": 5}, "stop"),
    ({**GOOD, "stop": {"s": 1}}, "stop"),
    ({**GOOD, "stop": ["a", 1]}, "stop[1]"),
    ({**GOOD, "stop": [None]}, "stop[0]"),
    *[({**GOOD, name: value}, name) for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty",
                                                  "repetition_penalty") for value in ("0.5", True, [1], {"v": 1})],
    *[({**GOOD, name: value}, name) for name in ("max_tokens", "top_k", "seed", "min_tokens")
      for value in ("4", 4.0, 1.5, True, [4], {"v": 4})],
    ({**GOOD, "return_token_ids": "yes"}, "return_token_ids"),
    ({**GOOD, "return_token_ids": 1}, "return_token_ids"),
    ({**GOOD, "talker_inputs": "false"}, "talker_inputs"),
]


@pytest.mark.parametrize("body, param", BAD_SHAPES, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD_SHAPES)])
def test_every_wrong_json_shape_is_a_400_naming_the_field(body, param):
    with pytest.raises(RequestError) as err:
        check_request(body)
    assert (err.value.status, err.value.param) == (400, param), err.value.message
    assert err.value.message


def test_good_bodies_pass_and_nulls_are_absent_fields():
    check_request(GOOD)
    check_request({"messages": [{"role": "user", "content": "hi"}], **{k: None for k in GOOD if k != "messages"}})
    check_request({**GOOD, "stop": "\n", "temperature": 1, "return_token_ids": True})
    check_request(_user({"type": "input_audio", "samples": 3}))   # offset 0 and 16 kHz by default
    check_request(_user({"type": "input_audio", "offset": None, "samples": 3, "sample_rate": None}))


@pytest.mark.parametrize("content, param", [(None, "messages[0].content"), ([{"type": "text", "text": "hi"}],
                                                                            "messages[0].content"),
                                            (5, "messages[0].content")])
def test_the_llm_stage_takes_string_content_only(content, param):
    """voice_llm's messages carry strings (the voice orchestrator replaced the parts): anything else is a 400."""
    check_request({"messages": [{"role": "user", "content": "hi"}]}, parts=False)
    with pytest.raises(RequestError) as err:
        check_request({"messages": [{"role": "user", "content": content}]}, parts=False)
    assert err.value.param == param


@pytest.mark.parametrize("body, param", BAD_SHAPES[:30], ids=[p for _, p in BAD_SHAPES[:30]])
def test_the_qwen3_omni_turn_validation_uses_the_shared_check(body, param):
    with pytest.raises(RequestError) as err:
        turn.validate({"max_tokens": 4, **body}, ["ethan"], "ethan", {"INPUT_AUDIO": np.zeros(10, np.float32)})
    assert err.value.param == param


def test_parsers_after_the_check_read_every_checked_body():
    """What the check lets through, the voice pipeline's parsers read without a Python exception."""
    clips = audio_clips(GOOD["messages"], np.arange(10, dtype=np.float32))
    assert [c.tolist() for c in clips] == [list(range(10))]
    assert text_messages(GOOD["messages"], ["heard"])[1] == {"role": "user", "content": "Listen: heard"}


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_input_audio_is_a_400_from_every_audio_entry(value):
    pcm = np.zeros(16000, np.float32)
    pcm[123] = value
    with pytest.raises(RequestError, match="INPUT_AUDIO must hold finite mono 16 kHz samples") as err:
        audio_clips(GOOD["messages"], pcm)    # voice, qwen3_omni, qwen3_omni_thinker, the co-located qwen3_omni
    assert (err.value.status, err.value.param) == (400, "INPUT_AUDIO")
    with pytest.raises(RequestError) as err:
        turn.validate({**GOOD, "voice": None}, ["ethan"], "ethan", {"INPUT_AUDIO": pcm})
    assert err.value.param == "INPUT_AUDIO"
    for kwargs in ({}, {"allow_empty": True}, {"param": "file"}):   # voice_asr, voice_vad, voice_asr_stream
        with pytest.raises(RequestError, match="AUDIO must hold finite mono 16 kHz samples"):
            check_audio(pcm[None, :], "AUDIO", **kwargs)


def test_the_audio_check_passes_finite_audio_and_refuses_missing_or_empty_audio():
    pcm = np.linspace(-1, 1, 32, dtype=np.float32)
    assert check_audio(pcm[None, :], "AUDIO").shape == (32,)
    assert check_audio(np.zeros(0, np.float32), "AUDIO", allow_empty=True).size == 0
    for missing in (None, np.zeros(0, np.float32)):
        with pytest.raises(RequestError) as err:
            check_audio(missing, "INPUT_AUDIO", param="file")
        assert err.value.param == "file"
    with pytest.raises(RequestError, match="must lie inside INPUT_AUDIO") as err:
        audio_clips(GOOD["messages"], np.zeros(9, np.float32))
    assert err.value.param == "messages[1].content[1]"


@pytest.mark.parametrize("voice", [["alloy"], {"id": "alloy"}, 5, True])
def test_a_voice_that_is_not_a_name_is_a_400(voice):
    """The voice pipeline's and the speech route's voice check (tts.resolve_voice): a list or an object used to
    fail as an unhashable key (a 500)."""
    with pytest.raises(RequestError) as err:
        resolve_voice(voice, ["af_heart"], "af_heart", {"alloy": "af_heart"})
    assert err.value.param == "voice"
    assert resolve_voice("alloy", ["af_heart"], "af_heart", {"alloy": "af_heart"}) == "af_heart"


@pytest.mark.parametrize("speed", ["fast", "1.0", [1], True, None, 0, 5.0])
def test_a_speed_that_is_not_a_number_in_range_is_a_400(speed):
    with pytest.raises(RequestError) as err:
        check_speed(speed)
    assert err.value.param == "speed"
    assert check_speed(1) == 1 and check_speed(0.25) == 0.25


IMAGES = _user({"type": "text", "text": "Two:"}, {"type": "image"}, {"type": "image"})


def test_image_parts_are_qwen3_omni_only_and_cut_from_the_padded_tensor():
    """{"type": "image"} parts pass the check only where images are taken (qwen3_omni); image k is INPUT_IMAGES[k]
    cut to INPUT_IMAGE_SIZES[k]."""
    with pytest.raises(RequestError) as err:
        check_request(IMAGES)   # voice
    assert (err.value.param, err.value.code) == ("messages[0].content[1].type", "unsupported_content")
    check_request(IMAGES, images=True)
    pixels = np.arange(2 * 5 * 7 * 3, dtype=np.uint8).reshape(2, 5, 7, 3)
    out = input_images(IMAGES["messages"], pixels, np.array([[5, 7], [2, 3]], np.int32))
    assert [o.shape for o in out] == [(5, 7, 3), (2, 3, 3)]
    assert np.array_equal(out[1], pixels[1, :2, :3])
    assert input_images(_user({"type": "text", "text": "none"})["messages"], None, None) == []


@pytest.mark.parametrize("pixels, sizes, param", [
    (None, None, "messages"),                                                         # parts without tensors
    (np.zeros((1, 4, 4, 3), np.uint8), np.array([[4, 4]], np.int32), "messages"),     # K != image parts
    (np.zeros((2, 4, 4, 3), np.uint8), None, "INPUT_IMAGE_SIZES"),
    (np.zeros((2, 4, 4, 3), np.float32), np.array([[4, 4]] * 2, np.int32), "INPUT_IMAGES"),
    (np.zeros((2, 4, 4), np.uint8), np.array([[4, 4]] * 2, np.int32), "INPUT_IMAGES"),
    (np.zeros((2, 4, 4, 3), np.uint8), np.array([[4, 4]] * 2, np.int64), "INPUT_IMAGE_SIZES"),
    (np.zeros((2, 4, 4, 3), np.uint8), np.array([[4, 4]], np.int32), "INPUT_IMAGE_SIZES"),
    (np.zeros((2, 4, 4, 3), np.uint8), np.array([[4, 4], [5, 4]], np.int32), "INPUT_IMAGE_SIZES"),
    (np.zeros((2, 4, 4, 3), np.uint8), np.array([[4, 4], [4, 0]], np.int32), "INPUT_IMAGE_SIZES"),
])
def test_image_tensors_that_do_not_fit_the_parts_are_a_400(pixels, sizes, param):
    media = {k: v for k, v in (("INPUT_IMAGES", pixels), ("INPUT_IMAGE_SIZES", sizes)) if v is not None}
    with pytest.raises(RequestError) as err:
        turn.validate({**IMAGES, "modalities": ["text"]}, ["ethan"], "ethan", media)
    assert (err.value.status, err.value.param) == (400, param)
