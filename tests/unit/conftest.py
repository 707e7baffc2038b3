"""Unit-test fixtures shared across modules: the tiny Qwen3-Omni checkpoint and its loaded stages."""
import pytest

from omni_backends.qwen3_omni.checkpoint import write_checkpoint
from omni_backends.qwen3_omni.loading import load_stages


@pytest.fixture(scope="session")
def qwen3_omni_ckpt(tmp_path_factory):
    """The deterministic tiny checkpoint, written once per session."""
    return write_checkpoint(tmp_path_factory.getbasetemp() / "qwen3_omni_tiny")


@pytest.fixture(scope="session")
def qwen3_omni_stages(qwen3_omni_ckpt):
    """`load_stages` of the tiny checkpoint (CPU, float32); tests must not modify the models."""
    return load_stages(qwen3_omni_ckpt)
