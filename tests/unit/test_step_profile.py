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


def test_summary_reads_the_graph_replays_device_time():
    """Records with the replays' device time (`gpu_ms`, `gpu_<graph>`; CUDA only) get a GPU column and a per-graph
    line; records without it (CPU) show '-'."""
    lines = [f"step stage=talker t={1 + i * 0.01:.6f} wall_ms=12.000 wait_ms=0.010 apply_ms=1.000 work_ms=10.990 "
             f"cpu_ms=9.000 gpu_ms={5 + i:.3f} gpu_talker=1.500 gpu_code_predictor={3.5 + i:.3f} rows=16 live=16"
             for i in range(3)]
    lines += [f"step stage=thinker_decode t={1.005 + i * 0.01:.6f} wall_ms=9.000 cpu_ms=8.000 rows=16 live=16"
              for i in range(3)]
    table = summarize(lines, 16)
    assert "| GPU ms |" in table
    talker = next(line for line in table.splitlines() if line.startswith("| talker |"))
    assert talker.split(" | ")[-2] == "6.00 / 7.00"   # GPU ms median / p90
    thinker = next(line for line in table.splitlines() if line.startswith("| thinker_decode |"))
    assert thinker.split(" | ")[-2] == "-"
    assert "talker: code_predictor 4.50, talker 1.50" in table


def test_graph_times_drain_only_completed_replays(monkeypatch):
    """`GraphTimes` sums each thread's replays whose end event completed and keeps the others for a later drain."""
    from omni_backends.qwen3_omni import step_profile

    class Event:
        def __init__(self, enable_timing=False):
            self.done, self.at = False, None

        def record(self):
            self.at = len(clock)
            clock.append(self)

        def query(self):
            return self.done

        def elapsed_time(self, end):
            return float(end.at - self.at)

    clock = []
    monkeypatch.setattr(step_profile.torch.cuda, "Event", Event)
    times = step_profile.GraphTimes()
    with times("code-predictor"):
        pass
    with times("talker"):
        pass
    assert times.drain() == {}
    clock[1].done = True   # the first replay's end event
    assert times.drain() == {"code_predictor": 1.0}
    clock[3].done = True
    assert times.drain() == {"talker": 1.0} and times.drain() == {}
