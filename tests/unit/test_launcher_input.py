"""Launcher input (omni_frontend.serve): a bad flag value is ONE `error:` line naming the flag and a non-zero exit
before anything starts (the third outside test found tracebacks for ports, hosts and log folders, and an empty
--pipelines that served nothing)."""
import signal
import socket

import pytest

from omni_frontend import serve
from omni_frontend.tritonserver import LaunchError, port_in_use

pytestmark = pytest.mark.unit
PORT_FLAGS = ["--port", "--triton-grpc-port", "--triton-http-port", "--triton-metrics-port"]


def _refused(capsys, argv) -> str:
    """parse_args(argv) must exit 2 with one `error: ...` line (not argparse's usage block); returns it."""
    with pytest.raises(SystemExit) as info:
        serve.parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("flag", PORT_FLAGS)
@pytest.mark.parametrize("value", ["70000", "-5", "0", "65536", "eighty", "80.5"])
def test_every_port_flag_takes_1_to_65535(capsys, flag, value):
    err = _refused(capsys, [flag, value])
    assert f"argument {flag}: must be" in err and "1-65535" in err and value in err


def test_port_edges_are_accepted_and_ports_must_differ(capsys):
    args = serve.parse_args(["--port", "1", "--triton-grpc-port", "65535"])
    assert (args.port, args.triton_grpc_port, args.triton_http_port) == (1, 65535, None)
    err = _refused(capsys, ["--port", "8002", "--triton-http-port", "8002"])
    assert "--port and --triton-http-port are both 8002" in err
    assert serve.parse_args(["--port", "8002"]).port == 8002   # Triton's HTTP endpoint is off: 8002 is free
    assert serve.parse_args(["--port", "8002", "--triton-http-port", "8004", "--no-frontend"]).port == 8002
    assert serve.parse_args(["--port", "8001", "--no-frontend"]).port == 8001   # --port unused without a frontend


@pytest.mark.parametrize("host", ["no-such-host.invalid", "", "bad host name"])
def test_an_unresolvable_host_is_one_line(capsys, host):
    assert f"argument --host: cannot resolve {host!r}" in _refused(capsys, ["--host", host])


def test_host_names_and_addresses_that_resolve_are_accepted():
    for host in ("127.0.0.1", "localhost", "0.0.0.0", "::1"):
        assert serve.parse_args(["--host", host]).host == host


def test_the_frontend_address_is_checked_before_tritonserver_starts():
    """A host that is not this machine's, or a port already taken, failed only when uvicorn bound it: after
    tritonserver had loaded every model."""
    with pytest.raises(LaunchError, match=r"^--host 192\.0\.2\.1 --port \d+: cannot listen there: "):
        serve.check_listen_address("192.0.2.1", 24431)   # TEST-NET-1, never an address of this machine
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port 127.0.0.1:{port} is already in use"):
            serve.check_listen_address("127.0.0.1", port)
        assert port_in_use("127.0.0.1", port) and not port_in_use("::1", port)
    serve.check_listen_address("127.0.0.1", port)   # free again: no error


def test_no_frontend_does_not_check_the_frontend_port(tmp_path):
    """`--no-frontend` serves Triton alone: a busy --port is none of its business (it was refused before)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        argv = ["--no-frontend", "--no-prepare", "--pipelines", "asr", "--log-dir", str(tmp_path),
                "--port", str(busy.getsockname()[1])]
        with pytest.raises(AssertionError, match="went on to prepare or start"):
            serve.main(argv)


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch):
    """main() must refuse before it prepares or starts anything: both fail the test here (instead of serving),
    and the signal handlers main() installs once it got that far are put back."""
    def started(*args, **kwargs):
        raise AssertionError("the launcher went on to prepare or start a server")

    monkeypatch.setattr(serve, "TritonServer", started)
    monkeypatch.setattr(serve, "prepare_models", started)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _main_refuses(capsys, argv) -> str:
    """serve.main(argv) must return 2 with one `error: ...` line before anything starts; returns the line."""
    ports = ["--port", "24431", "--triton-grpc-port", "24432", "--triton-http-port", "24433",
             "--triton-metrics-port", "24434"]
    assert serve.main(ports + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("make, reason", [
    (lambda tmp: "/proc/omni-nope", "cannot create it: No such file or directory"),   # the outside test's
    (lambda tmp: "/etc/hostname/logs", "cannot create it: Not a directory"),
    (lambda tmp: str((tmp / "file").write_text("x") and tmp / "file"), "not a folder"),
])
def test_an_unusable_log_dir_is_one_line(tmp_path, capsys, make, reason):
    log_dir = make(tmp_path)
    err = _main_refuses(capsys, ["--pipelines", "asr", "--no-prepare", "--log-dir", log_dir])
    assert err == f"error: --log-dir {log_dir}: {reason}"


def test_an_unusable_data_dir_or_model_home_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    log = ["--log-dir", str(tmp_path / "log")]
    bad_data = tmp_path / "file" / "d"
    err = _main_refuses(capsys, ["--pipelines", "wan", "--no-prepare", "--data-dir", str(bad_data), *log])
    assert err == f"error: --data-dir {bad_data}: cannot create it: Not a directory"
    monkeypatch.setenv("OMNI_MODEL_HOME", str(tmp_path / "file"))
    err = _main_refuses(capsys, ["--pipelines", "asr", *log])
    assert err == f"error: $OMNI_MODEL_HOME {tmp_path / 'file'}: not a folder"
    # nothing to prepare (an --extra-pipeline only): the model home is not needed, so not checked
    monkeypatch.setattr(serve, "usable_folder",
                        lambda flag, path: pytest.fail(f"checked {flag}") if flag[0] == "$" else path)
    with pytest.raises(AssertionError, match="went on to prepare or start"):
        serve.main(["--pipelines", "", "--extra-pipeline", "x=chat:m", "--port", "24431", "--triton-grpc-port",
                    "24432", "--triton-http-port", "24433", "--triton-metrics-port", "24434", *log])
    assert not (tmp_path / "log" / "tritonserver.log").exists()


@pytest.mark.parametrize("value", ["", ",", " , ,"])
def test_pipelines_that_name_no_pipeline_are_refused(tmp_path, capsys, value):
    """`--pipelines "$UNSET"` started tritonserver with no model and served an empty /v1/models."""
    err = _main_refuses(capsys, ["--pipelines", value, "--no-prepare", "--log-dir", str(tmp_path)])
    assert err.startswith(f"error: --pipelines names no pipeline (got {value!r}); known: ")
    assert not list(tmp_path.iterdir())   # nothing started: no tritonserver.log


def test_tritons_http_endpoint_is_off_unless_a_port_is_given():
    """Triton 2.51's HTTP endpoint aborts the whole server (std::bad_alloc) on one request declaring a huge input
    shape (third outside test); the frontend and perf_analyzer use gRPC, so HTTP is opt-in."""
    from pathlib import Path

    from omni_frontend.tritonserver import TritonInstallation, TritonServer

    def command(http_port):
        server = TritonServer(repositories=[Path("repo")], models=["voice"], grpc_port=1, http_port=http_port,
                              metrics_port=3, log_path=Path("tritonserver.log"))
        return server.command(TritonInstallation(Path("tritonserver"), Path("backends"), ()))

    assert "--allow-http=false" in command(None) and not any(a.startswith("--http-port") for a in command(None))
    assert "--http-port=2" in command(2) and "--allow-http=false" not in command(2)
    assert serve.parse_args(["--triton-http-port", "8002"]).triton_http_port == 8002


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_the_request_head_timeout_must_be_positive(capsys, value):
    assert "--http-head-timeout must be > 0 seconds" in _refused(capsys, ["--http-head-timeout", value])
    assert serve.parse_args(["--http-head-timeout", "2.5"]).http_head_timeout == 2.5
