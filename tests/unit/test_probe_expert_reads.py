"""`scripts/probe_expert_reads.py` (issue 9's HBM floor at concurrency c) on the tiny checkpoint: the experts a
batch reads per step, and the bytes the floor counts."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from omni_backends.qwen3_omni.loading import load_config

pytestmark = pytest.mark.unit

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _probe():
    spec = importlib.util.spec_from_file_location("probe_expert_reads", SCRIPTS / "probe_expert_reads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_distinct_experts_is_the_union_over_the_first_rows():
    probe = _probe()
    # [steps=2, layers=1, rows=3, k=2]
    routes = torch.tensor([[[[0, 1], [1, 2], [5, 0]]], [[[3, 3], [3, 4], [4, 3]]]])
    assert probe.distinct_experts(routes, 1).tolist() == [[2], [1]]
    assert probe.distinct_experts(routes, 2).tolist() == [[3], [2]]
    assert probe.distinct_experts(routes, 3).tolist() == [[4], [2]]


def test_one_row_reads_the_active_bytes_and_more_experts_read_more(qwen3_omni_ckpt):
    probe = _probe()
    config = load_config(qwen3_omni_ckpt)
    text = config.thinker_config.text_config
    k, layers, expert = text.num_experts_per_tok, text.num_hidden_layers, 3 * text.hidden_size * text.moe_intermediate_size
    one = probe.thinker_step_bytes(text, [k] * layers, [10])
    assert one == probe.active_bytes(text) + probe.kv_bytes(text, 10)
    # two rows: one more embedding row, their KV, and each extra expert's three matrices
    two = probe.thinker_step_bytes(text, [k + 1] * layers, [10, 7])
    assert two - one == 2 * (layers * expert + text.hidden_size) + probe.kv_bytes(text, 7)


def test_probe_decodes_the_tiny_thinker_and_writes_floors(qwen3_omni_ckpt, tmp_path, capsys):
    probe = _probe()
    out = tmp_path / "floors.json"
    assert probe.main(["--checkpoint", str(qwen3_omni_ckpt), "--device", "cpu", "--requests", "3", "--steps", "4",
                       "--frames", "5", "--batches", "1", "3", "--peak-tbs", "1", "--json", str(out)]) == 0
    text = load_config(qwen3_omni_ckpt).thinker_config.text_config
    k, experts = text.num_experts_per_tok, text.num_experts
    one, three = json.loads(out.read_text())["results"]
    assert len(one["distinct_experts"]) == 4 and len(one["distinct_experts"][0]) == text.num_hidden_layers
    assert {n for step in one["distinct_experts"] for n in step} == {k}     # one row: exactly its top-k
    assert all(k <= n <= min(3 * k, experts) for step in three["distinct_experts"] for n in step)
    assert three["thinker_bytes_per_step_median"] > one["thinker_bytes_per_step_median"]
    floor = three["floors"]["peak"]
    assert floor["bytes_per_s"] == 1e12 and floor["thinker_s"] > 0 and floor["talker_s"] > 0
    assert floor["rtf"] == pytest.approx((floor["thinker_s"] + floor["talker_s"]) / (5 * 0.08))
    assert "| 3 |" in capsys.readouterr().out
