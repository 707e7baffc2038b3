"""Qwen3-Omni stage split (thinker -> talker -> code2wav, streamed) == transformers' monolithic generate()."""
import time

import numpy as np
import pytest
from transformers import Qwen3OmniMoeForConditionalGeneration

from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.checkpoint import write_checkpoint
from omni_backends.qwen3_omni.first_audio import PHASE_NAMES, FirstAudioTimeline, parse, summarize
from omni_backends.qwen3_omni.loading import load_stages, load_tts_embeds
from omni_backends.qwen3_omni.pipeline import LocalOmniPipeline, OmniRequest
from omni_backends.qwen3_omni.serving.turn import talker_sampling

pytestmark = pytest.mark.unit

MAX_TOKENS, MAX_FRAMES = 16, 29
PROMPTS = ["Hello, who are you?", "Tell me a story.", "What is the weather like today?", "Say hello to the world"]
VOICES = ["Ethan", "chelsie", "AIDEN", "ethan"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.getbasetemp() / "qwen3_omni_tiny")


@pytest.fixture(scope="module")
def reference(ckpt):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt).eval()


@pytest.fixture(scope="module")
def pipeline(ckpt):
    stages = load_stages(ckpt)
    # left context larger than any answer: the streamed audio must equal one full decode
    pipe = LocalOmniPipeline.from_stages(stages, load_tts_embeds(ckpt, stages.config), chunk_frames=4,
                                         first_chunk_frames=2, left_context_frames=1000)
    yield pipe
    pipe.close()


def _request(pipe, rid, messages, voice, audios=()):
    return OmniRequest(rid, messages, pipe.thinker.sampling_params(max_tokens=MAX_TOKENS, do_sample=False),
                       pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=MAX_FRAMES),
                       voice=voice, audios=audios)


def _generate(reference, pipe, request, **inputs):
    ids = inputs.pop("input_ids", None)
    if ids is None:
        ids = pipe.thinker.prompts.build(request.messages).input_ids
    seq, wav = reference.generate(
        input_ids=ids[None], return_audio=True, speaker=request.voice, thinker_max_new_tokens=MAX_TOKENS,
        thinker_do_sample=False, thinker_eos_token_id=reference.config.im_end_token_id,
        talker_max_new_tokens=MAX_FRAMES + 1, talker_do_sample=False, talker_repetition_penalty=1.0, **inputs)
    return seq[0, len(ids):].tolist(), wav[0, 0].numpy()


def _assert_same(result, expected_ids, expected_wav):
    assert result.token_ids == expected_ids
    assert result.audio.dtype == np.float32
    assert result.audio.shape == expected_wav.shape
    assert result.audio.shape[0] == result.codes.shape[-1] * 1920 - 555
    np.testing.assert_allclose(result.audio, expected_wav, atol=1e-5)


def test_single_request_matches_generate(pipeline, reference):
    request = _request(pipeline, "one", [{"role": "system", "content": "You are a helpful assistant."},
                                         {"role": "user", "content": PROMPTS[0]}], "Ethan")
    result = pipeline.run([request])["one"]
    ids, wav = _generate(reference, pipeline, request)
    _assert_same(result, ids, wav)
    assert len(result.token_ids) == MAX_TOKENS and result.finish_reason == "length"
    assert len(result.chunks) > 3                   # streamed in several chunks
    assert result.audio.std() > 0.01                 # audible, not silence


def test_four_concurrent_requests_match_generate(pipeline, reference):
    requests = [_request(pipeline, f"r{i}", [{"role": "user", "content": p}], v)
                for i, (p, v) in enumerate(zip(PROMPTS, VOICES))]
    results = pipeline.run(requests)
    frames = set()
    for request in requests:
        ids, wav = _generate(reference, pipeline, request)
        _assert_same(results[request.request_id], ids, wav)
        frames.add(results[request.request_id].codes.shape[-1])
    assert len(frames) > 1   # one answer ends by codec_eos before max frames, others by the frame limit


def test_input_audio_prompt_matches_generate(pipeline, reference):
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                                             {"type": "text", "text": "What did I say?"}]}]
    request = _request(pipeline, "audio", messages, "aiden", audios=[tone])
    inputs = pipeline.thinker.prompts.build(messages, [tone])
    assert int((inputs.input_ids == reference.config.thinker_config.audio_token_id).sum()) == 13   # 1 s of audio
    result = pipeline.run([request])["audio"]
    ids, wav = _generate(reference, pipeline, request, input_ids=inputs.input_ids,
                         input_features=inputs.input_features, feature_attention_mask=inputs.feature_attention_mask)
    _assert_same(result, ids, wav)


def test_unknown_voice_names_valid_voices(pipeline):
    with pytest.raises(RequestError, match="aiden, chelsie, ethan"):
        pipeline.run([_request(pipeline, "bad", [{"role": "user", "content": "hi"}], "nobody")])


def test_first_audio_timeline_phases_in_order_and_sum_to_ttfp(pipeline):
    request = _request(pipeline, "timed", [{"role": "user", "content": PROMPTS[1]}], "chelsie")
    started = time.monotonic()
    result = pipeline.run([request])["timed"]
    elapsed = time.monotonic() - started
    timeline = result.first_audio
    assert timeline.complete() and timeline.frames == 2   # the fixture's first chunk: 2 frames
    stamps = [timeline.marks[name] for name in timeline.order]
    assert stamps == sorted(stamps) and started <= stamps[0]   # every mark after the one it needs
    phases = timeline.phases()
    assert list(phases) == list(PHASE_NAMES) and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(timeline.ttfp(), abs=1e-9)
    assert 0 < timeline.ttfp() < elapsed
    for work in ("prompt", "thinker_prefill", "talker_prefill", "frame_1", "code2wav"):   # real work, not hand-offs
        assert phases[work] > 1e-5, work
    # the log line reads back with the same figures (milliseconds, 2 decimals)
    (row,) = parse([f'I1202 06:11:53.609617 1 colocated_model.py:190] "{timeline.line("timed#1")}"', "unrelated"])
    assert row["ttfp"] == pytest.approx(timeline.ttfp() * 1e3, abs=0.006)
    assert row["code2wav"] == pytest.approx(phases["code2wav"] * 1e3, abs=0.006)
    assert "thinker_prefill" in summarize([row, row])


def test_first_audio_timeline_rejects_unknown_and_incomplete_marks():
    timeline = FirstAudioTimeline(3, arrival=10.0)
    with pytest.raises(KeyError, match="frame_9"):
        timeline.mark("frame_9")
    timeline.frame(9, 11.0)   # past the first chunk: ignored
    timeline.mark("submitted", 10.5)
    timeline.mark("submitted", 12.0)   # the first time stays
    assert timeline.marks["submitted"] == 10.5
    with pytest.raises(ValueError, match="lacks prefill_start"):
        timeline.phases()
    with pytest.raises(ValueError, match=">= 1 frame"):
        FirstAudioTimeline(0)


def test_talker_finishing_before_the_text_keeps_serving(pipeline):
    """A request whose talker ends (max_frames) while its thinker still writes: the later tokens are not spoken,
    and neither this request nor the others fail (the talker thread used to look them up and fail every request)."""
    requests = [OmniRequest(f"short{i}", [{"role": "user", "content": p}],
                            pipeline.thinker.sampling_params(max_tokens=24, min_tokens=24, do_sample=False),
                            pipeline.talker.sampling_params(do_sample=False, repetition_penalty=1.0,
                                                            max_frames=1 + i % 2), voice="ethan")
                for i, p in enumerate(PROMPTS)]
    results = pipeline.run(requests)
    for i, request in enumerate(requests):
        result = results[request.request_id]
        assert len(result.token_ids) == 24 and result.codes.shape[-1] == 1 + i % 2
        # its first audio counts, also when it had fewer frames than a first chunk (2): it used to miss the metric
        timeline = result.first_audio
        assert timeline.complete() and [n for n in timeline.required() if n.startswith("frame_")] == \
            [f"frame_{k}" for k in range(1, 2 + i % 2)]
        assert sum(timeline.phases().values()) == pytest.approx(timeline.ttfp(), abs=1e-9)


def test_bad_talker_frame_counts_name_the_talker_fields(pipeline):
    """The talker's SamplingParams counts frames as tokens; its error used to name `min_tokens` / `max_tokens`
    and carry no param, so a client could not tell which of its fields was wrong."""
    with pytest.raises(RequestError) as info:
        talker_sampling(pipeline.talker, {"min_frames": 10, "max_frames": 3}, 4095)
    assert info.value.param == "talker_min_frames"
    assert "talker_min_frames must be an integer in [0, talker_max_frames=3], got 10" in info.value.message
    with pytest.raises(RequestError) as info:
        talker_sampling(pipeline.talker, {"temperature": -1}, 4095)
    assert info.value.param == "talker_temperature" and "temperature must be a finite number" in info.value.message

