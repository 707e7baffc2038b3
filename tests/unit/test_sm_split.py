"""sm_split: the setting's parsing and validation, and what it does off CUDA (the green contexts themselves need a
GPU: measured on the H200, docs/gpu.md runs 24-25)."""
import pytest
import torch

from omni_backends.engine import sm_split
from omni_backends.engine.graphs import StepGraphs


def test_parse_keeps_the_split_order_and_counts():
    assert sm_split.parse("talker:36, thinker:96") == {"talker": 36, "thinker": 96}
    assert list(sm_split.parse("talker:36,thinker:96")) == ["talker", "thinker"]
    assert sm_split.parse(" thinker : 104 ,") == {"thinker": 104}
    assert sm_split.parse("code2wav:8") == {"code2wav": 8}


@pytest.mark.parametrize("text", [None, "", "  ", "off", "OFF", ","])
def test_blank_or_off_is_no_partition(text):
    assert sm_split.parse(text) == {}
    assert sm_split.from_setting(text, "cuda:0") == {}


@pytest.mark.parametrize("text, message", [
    ("thinker96", "expected <engine>:<SMs>"),
    ("vocoder:8", "expected <engine>:<SMs>"),
    ("thinker:96,thinker:8", "thinker given twice"),
    ("thinker:0", "positive integer, got '0'"),
    ("thinker:-8", "positive integer, got '-8'"),
    ("talker:3.5", "positive integer, got '3.5'"),
    ("talker:", "positive integer, got ''"),
])
def test_bad_settings_name_the_problem(text, message):
    with pytest.raises(ValueError, match="sm_split") as err:
        sm_split.parse(text)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="sm_split"):
        sm_split.from_setting(text, "cpu")   # validated on the CPU too


def test_cpu_validates_then_ignores(caplog):
    with caplog.at_level("WARNING"):
        assert sm_split.from_setting("thinker:96,talker:36", "cpu") == {}
    assert "ignored" in caplog.text
    with pytest.raises(ValueError, match="needs a CUDA device"):
        sm_split.partition({"thinker": 96}, "cpu")


def test_within_sets_the_thread_partition_and_restores_it():
    part = sm_split.Partition("talker", 36, torch.device("cuda", 0), handle=1)
    assert sm_split.current() is None
    with sm_split.within(part):
        assert sm_split.current() is part
        with sm_split.within(None):
            assert sm_split.current() is None
        assert sm_split.current() is part
    assert sm_split.current() is None


def test_step_graphs_run_eagerly_on_the_cpu_inside_a_partition():
    part = sm_split.Partition("thinker", 96, torch.device("cuda", 0), handle=1)
    graphs = StepGraphs(lambda x: (x * 2 + 1,), name="cpu")
    with sm_split.within(part):
        (out,) = graphs.run(4, {"x": torch.arange(4.0)})
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0]
    assert graphs.stats().eager == 1 and graphs.stats().captured == 0
