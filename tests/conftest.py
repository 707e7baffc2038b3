"""Session fixtures: real servers started through the launcher (see tests/harness.py).

Each shared server stops right after the last collected test that uses it (not at the session's end),
so later modules do not share the 2 cores with idle servers' stubs: test_qwen3_omni.py ran beside the
mock and image servers, whose work is done by then."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.harness import MAIN_REPOSITORY, TEST_REPOSITORY, start_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_LAST_USER: dict[str, str] = {}   # shared server fixture -> node id of the last test that uses it
_RUNNING: dict[str, object] = {}    # shared server fixture -> its running server


@pytest.hookimpl(trylast=True)   # after -k / -m deselection
def pytest_collection_modifyitems(items):
    for item in items:
        for name in set(item.fixturenames) & {"mock_server", "voice_server", "image_server", "wan_server",
                                              "audio_server", "omni_chat_server"}:
            _LAST_USER[name] = item.nodeid


def pytest_runtest_teardown(item, nextitem):
    for name in [n for n, last in _LAST_USER.items() if last == item.nodeid and n in _RUNNING]:
        _RUNNING.pop(name).stop()


def _shared(name: str, server):
    """Registers a shared server for the early stop (see the module doc) and returns it."""
    _RUNNING[name] = server
    return server


MOCK_ARGS = ("--pipelines", "", "--model-repository", str(TEST_REPOSITORY),
             "--extra-pipeline", "mock=chat:mock_stream", "--extra-pipeline", "relay=chat:mock_stream,mock_relay",
             "--extra-pipeline", "mock-speech=speech:mock_stream", "--extra-pipeline", "mock-asr=transcription:mock_asr")


def hold_load_file(server) -> Path:
    """While this file exists, a load of mock_relay on `server` (the mock server) waits in the model's setup."""
    return server.log_path.parent / "hold-load"


@pytest.fixture(scope="session")
def mock_server(tmp_path_factory):
    """Launcher with the framework test models only (mock_stream, mock_relay, mock_asr) behind chat, speech
    and transcription routes; no pipelines. mock_relay's loads wait while `hold_load_file` exists."""
    tmp_dir = tmp_path_factory.mktemp("mock_server")
    server = _shared("mock_server", start_server(tmp_dir, *MOCK_ARGS,
                                                 env={"OMNI_TEST_HOLD_LOAD": str(tmp_dir / "hold-load")}))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def voice_server(tmp_path_factory):
    """Launcher serving the real voice models: pipelines voice, tts and asr."""
    from omni_backends.voice.models import prepare_voice_models

    prepare_voice_models()
    server = _shared("voice_server", start_server(tmp_path_factory.mktemp("voice_server"), "--pipelines", "voice,tts,asr",
                                                  "--no-prepare"))
    yield server
    server.stop()


OMNI_CHAT_MAX_IMAGE_PIXELS = 100_000   # omni_chat_server's --max-image-pixels


def _whole_audio_repository(out: Path) -> Path:
    """A copy of model_repository/ whose qwen3_omni code2wav (stage and co-located) decodes every chunk with a left
    context covering all previous frames (1000), in chunks of 4 frames after a first of 2: streamed audio then equals
    one decode of all the codes, i.e. transformers' generate(return_audio=True)'s."""
    shutil.copytree(MAIN_REPOSITORY, out)
    for name, prefix in (("qwen3_omni_code2wav", ""), ("qwen3_omni_colocated", "code2wav.")):
        config = out / name / "config.pbtxt"
        text = config.read_text()
        for key, old, new in (("chunk_frames", "25", "4"), ("first_chunk_frames", "5", "2"),
                              ("left_context_frames", "25", "1000")):
            line = f'key: "{prefix}{key}" value {{ string_value: "{old}" }}'
            assert line in text
            text = text.replace(line, line.replace(f'"{old}"', f'"{new}"'))
        config.write_text(text)
    return out


@pytest.fixture(scope="session")
def omni_chat_server(tmp_path_factory):
    """Launcher serving qwen3_omni (stage layout), voice, and qwen3_omni's co-located layout as model id "colocated"
    (a repository copy whose code2wav decodes with a whole left context: `_whole_audio_repository`), with
    --max-image-pixels OMNI_CHAT_MAX_IMAGE_PIXELS and --allow-private-media-urls (image URLs of a local http.server):
    test_completions.py, test_qwen3_omni.py and test_qwen3_omni_images.py share it."""
    from omni_backends.voice.models import prepare_voice_models

    prepare_voice_models()
    repository = _whole_audio_repository(tmp_path_factory.mktemp("omni_chat_repository") / "repo")
    server = _shared("omni_chat_server", start_server(
        tmp_path_factory.mktemp("omni_chat_server"), "--pipelines", "qwen3_omni,voice",
        "--extra-pipeline", "colocated=chat:qwen3_omni_colocated", "--model-repository", str(repository),
        "--max-image-pixels", str(OMNI_CHAT_MAX_IMAGE_PIXELS), "--allow-private-media-urls"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def image_server(tmp_path_factory):
    """Launcher serving the Qwen-Image pipelines (qwen_image, qwen_image_edit) on the tiny checkpoint."""
    server = _shared("image_server", start_server(tmp_path_factory.mktemp("image_server"), "--pipelines",
                                                  "qwen_image,qwen_image_edit"))
    yield server
    server.stop()


class RestartableServer:
    """A launcher a test may stop and start again with the same arguments (`restart()`); attributes are the
    current ServerProcess's (base_url, grpc_url, metrics_url, ...)."""

    def __init__(self, tmp_dir, *args: str):
        self.tmp_dir, self.args = tmp_dir, args
        self.server = start_server(tmp_dir, *args)

    def __getattr__(self, name):
        return getattr(self.server, name)

    def restart(self) -> int:
        """Ctrl-C, wait, start again on new ports; returns the first run's exit code."""
        code = self.server.stop()
        self.server = start_server(self.tmp_dir, *self.args)
        return code


@pytest.fixture(scope="session")
def wan_server(tmp_path_factory):
    """Launcher serving the `wan` video pipeline (tiny checkpoint) with its job store in a temporary
    --data-dir; one video generates at a time and two may wait (so the queue limit is reachable)."""
    from omni_backends.paths import model_home
    from omni_backends.wan.checkpoint import write_checkpoint
    from omni_backends.wan.serving.protocol import TINY

    write_checkpoint(model_home() / TINY)
    tmp = tmp_path_factory.mktemp("wan_server")
    server = _shared("wan_server", RestartableServer(tmp, "--pipelines", "wan", "--no-prepare", "--data-dir",
                                                     str(tmp / "data"), "--max-running-videos", "1",
                                                     "--max-queued-videos", "2"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def audio_server(tmp_path_factory):
    """Launcher serving the `stable_audio` text-to-audio pipeline (tiny checkpoint, written first if missing)."""
    from omni_backends.paths import model_home
    from omni_backends.stable_audio.checkpoint import write_checkpoint
    from omni_backends.stable_audio.serving.protocol import TINY

    write_checkpoint(model_home() / TINY)
    server = _shared("audio_server", start_server(tmp_path_factory.mktemp("audio_server"), "--pipelines",
                                                  "stable_audio", "--no-prepare"))
    yield server
    server.stop()
