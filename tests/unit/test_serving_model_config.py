"""Model-config helpers every stage uses at `initialize`."""
import subprocess
import sys

import pytest

from omni_backends.serving import model_config

pytestmark = pytest.mark.unit


def test_nice_lowers_the_stub_process_priority_by_the_parameter():
    """Run in a child process: a process can lower its own priority, never raise it back."""
    script = ("import os; from omni_backends.serving.model_config import apply_nice; before = os.nice(0); "
              "print(apply_nice({'nice': '7'}), os.nice(0) - before, apply_nice({}), os.nice(0) - before)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["7", "7", "0", "7"]


@pytest.mark.parametrize("value", ["-1", "20", "high"])
def test_nice_out_of_range_or_not_an_integer_is_refused(value):
    with pytest.raises(ValueError, match="nice"):
        model_config.apply_nice({"nice": value})


def test_int_parameter_names_the_bad_key():
    assert model_config.int_parameter({"threads": " 3 "}, "threads", 1) == 3
    assert model_config.int_parameter({"threads": ""}, "threads", 1) == 1
    with pytest.raises(ValueError, match="'threads'"):
        model_config.int_parameter({"threads": "two"}, "threads", 1)
