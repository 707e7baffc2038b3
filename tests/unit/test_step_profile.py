"""The step profile of the co-located pipeline's engine threads (qwen3_omni.step_profile): a profiled pipeline
gives the unprofiled one's tokens, frames and audio, and its records account for every frame and chunk."""
import numpy as np
import pytest

from omni_backends.qwen3_omni.checkpoint import write_checkpoint
from omni_backends.qwen3_omni.loading import load_stages, load_tts_embeds
from omni_backends.qwen3_omni.pipeline import LocalOmniPipeline, OmniRequest
from omni_backends.qwen3_omni.step_profile import StepProfile, _records, main, summarize

pytestmark = pytest.mark.unit

PROMPTS = ["Hello, who are you?", "Tell me a story.", "What is the weather like today?", "Say hello to the world"]
TOKENS, FRAMES = 12, 9


def _run(ckpt, profile):
    stages = load_stages(ckpt)
    # left context over every frame: the audio is exact whichever chunks the code2wav thread decodes together
    pipe = LocalOmniPipeline.from_stages(stages, load_tts_embeds(ckpt, stages.config), chunk_frames=3,
                                         first_chunk_frames=2, left_context_frames=64, profile=profile)
    try:
        requests = [OmniRequest(f"r{i}", [{"role": "user", "content": p}],
                                pipe.thinker.sampling_params(max_tokens=TOKENS, min_tokens=TOKENS, do_sample=False),
                                pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=FRAMES,
                                                            min_frames=FRAMES), voice="ethan")
                    for i, p in enumerate(PROMPTS)]
        return pipe.run(requests)
    finally:
        pipe.close()


def test_profiled_pipeline_records_every_frame_and_chunk(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "qwen3_omni_tiny")
    log = tmp_path / "steps.log"
    profiled = _run(ckpt, StepProfile(str(log)))
    plain = _run(ckpt, None)
    for rid, result in plain.items():
        assert profiled[rid].token_ids == result.token_ids
        assert profiled[rid].codes.equal(result.codes) and result.codes.shape[-1] == FRAMES
        # chunks of several requests decode in one batch or apart depending on timing: equal up to rounding
        np.testing.assert_allclose(profiled[rid].audio, result.audio, atol=1e-5)
    records = list(_records(log.read_text().splitlines()))
    steps = [f for kind, f in records if kind == "step"]
    by_stage = {}
    for f in steps:
        by_stage.setdefault(f["stage"], []).append(f)
    # every frame of every request is one row of a talker step; chunks: the first (2 frames), then 3 + 3 + the last
    # 1, fewer when frames of two chunks were pending at once (one decode)
    assert sum(int(f["rows"]) for f in by_stage["talker"]) == len(PROMPTS) * FRAMES
    assert len(PROMPTS) * 2 <= sum(int(f["rows"]) for f in by_stage["code2wav"]) <= len(PROMPTS) * 4
    decode_rows = sum(int(f["rows"]) for f in by_stage["thinker_decode"])
    # rows of a thinker forward: the requests still running after it (the last step's finished ones are gone)
    assert len(PROMPTS) * (TOKENS - 2) <= decode_rows <= len(PROMPTS) * TOKENS
    for f in by_stage["talker"]:
        parts = float(f["wait_ms"]) + float(f["apply_ms"]) + float(f["work_ms"])
        assert parts == pytest.approx(float(f["wall_ms"]), abs=0.01) and float(f["cpu_ms"]) >= 0
        assert 0 <= int(f["live"]) <= len(PROMPTS)
    assert max(int(f["live"]) for f in steps) == len(PROMPTS)
    assert any(kind == "gil" for kind, _ in records)
    assert set(by_stage) == {"thinker_prefill", "thinker_decode", "talker", "code2wav"}
    table = summarize(log.read_text().splitlines(), len(PROMPTS))
    assert "| talker |" in table and "| thinker_decode |" in table and "GIL probe" in table
    assert main([str(log), "--live", str(len(PROMPTS)), "99"]) == 0
    out = capsys.readouterr().out
    assert "| talker |" in out and "no step records with live = 99" in out
