"""Runs a real `tritonserver` process on a model repository.

The binary comes from the `nvidia-pytriton` wheel (tritonserver 2.51, NGC 24.10) or from a system
`tritonserver` (NGC container). Launch facts (docs/triton_runtime.md): the Python backend needs the
stub built for the running interpreter copied next to `libtriton_python.so`; the stub only sees the
virtualenv's packages when the venv's `bin/` is first on PATH; it links libpython, which must be
this interpreter's (LD_LIBRARY_PATH = sysconfig LIBDIR); numpy must be < 2.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import tritonclient.grpc as grpcclient


class LaunchError(RuntimeError):
    """A launch failure with a one-line, user-facing message."""


@dataclasses.dataclass(frozen=True)
class TritonInstallation:
    """Where the server binary, its backends and its shared libraries are."""

    binary: Path
    backend_dir: Path
    lib_dirs: tuple[Path, ...]

    @classmethod
    def find(cls) -> "TritonInstallation":
        """The pytriton wheel's server if installed, else `tritonserver` on PATH with /opt/tritonserver/backends.

        Raises LaunchError if neither exists.
        """
        try:
            import pytriton  # noqa: F401  (only used to locate the wheel's files)
            root = Path(pytriton.__file__).parent / "tritonserver"
            libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
            if (root / "bin" / "tritonserver").exists():
                _install_python_stub(root)
                return cls(root / "bin" / "tritonserver", root / "backends", (libs,))
        except ImportError:
            pass
        system = shutil.which("tritonserver")
        if system:
            return cls(Path(system), Path(os.environ.get("TRITON_BACKEND_DIR", "/opt/tritonserver/backends")), ())
        raise LaunchError("tritonserver binary not found: install nvidia-pytriton==0.7.0 (./scripts/serve does) "
                          "or put a tritonserver on PATH")

    def environment(self) -> dict[str, str]:
        """Environment for the server so that Python-backend stubs run inside this interpreter's venv."""
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env.setdefault("VIRTUAL_ENV", sys.prefix)
        lib_dirs = [str(p) for p in self.lib_dirs] + [sysconfig.get_config_var("LIBDIR") or ""]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in lib_dirs if d] + [env.get("LD_LIBRARY_PATH", "")])
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        return env


def _install_python_stub(root: Path) -> None:
    """Copies the stub for this interpreter's X.Y in place (inside site-packages keeps its RPATH valid)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    src = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    dst = root / "backends" / "python" / "triton_python_backend_stub"
    if not src.exists():
        raise LaunchError(f"no Triton Python-backend stub for Python {version} in {src.parent.parent}")
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        shutil.copy2(src, dst)


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (for tests and ephemeral servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class TritonServer:
    """One tritonserver process with explicit model control.

    repositories: model repository folders; models: names to load at start (only these load);
    ports: HTTP, gRPC and metrics on 127.0.0.1. `start()` returns once every model is READY or
    raises LaunchError naming the model that failed, with the relevant server-log lines.
    """

    repositories: list[Path]
    models: list[str]
    grpc_port: int
    http_port: int
    metrics_port: int
    log_path: Path
    host: str = "127.0.0.1"
    ready_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, install: TritonInstallation) -> list[str]:
        cmd = [str(install.binary)]
        cmd += [f"--model-repository={r}" for r in self.repositories]
        cmd += ["--model-control-mode=explicit"] + [f"--load-model={m}" for m in self.models]
        cmd += [f"--backend-directory={install.backend_dir}", f"--http-address={self.host}",
                f"--grpc-address={self.host}", f"--metrics-address={self.host}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}", "--allow-metrics=true", "--allow-gpu-metrics=false",
                "--metrics-config=histogram_latencies=true", "--exit-timeout-secs=5",
                "--strict-readiness=true", "--log-verbose=0"]
        return cmd + list(self.extra_args)

    def start(self) -> "TritonServer":
        for port in (self.grpc_port, self.http_port, self.metrics_port):
            if port_in_use(self.host, port):
                raise LaunchError(f"port {self.host}:{port} is already in use (pass another --triton-*-port)")
        missing = [m for m in self.models if not any((repo / m / "config.pbtxt").exists() for repo in self.repositories)]
        if missing:
            raise LaunchError(f"model(s) {', '.join(missing)} not found in {', '.join(map(str, self.repositories))}")
        install = TritonInstallation.find()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        # Own process group so that stop() can reach the stub processes too.
        self.process = subprocess.Popen(self.command(install), stdout=log, stderr=subprocess.STDOUT,
                                        env=install.environment(), start_new_session=True,
                                        preexec_fn=_die_with_parent)
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise LaunchError(self.failure("tritonserver exited with code "
                                                    f"{self.process.returncode} during startup"))
                try:
                    states = self.model_states(client)
                except Exception:  # noqa: BLE001 - server not listening yet
                    time.sleep(0.2)
                    continue
                failed = [m for m in self.models if states.get(m) == "UNAVAILABLE"]
                if failed:
                    raise LaunchError(self.failure(f"model {failed[0]} failed to load"))
                if all(states.get(m) == "READY" for m in self.models) and client.is_server_ready():
                    return
                time.sleep(0.2)
            pending = [m for m in self.models if states.get(m) != "READY"] if "states" in locals() else self.models
            raise LaunchError(self.failure(f"timed out after {self.ready_timeout_s:.0f}s waiting for "
                                            f"model(s) {', '.join(pending)}"))
        finally:
            client.close()

    def model_states(self, client: grpcclient.InferenceServerClient) -> dict[str, str]:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        return {m["name"]: m.get("state", "") for m in index}

    def failure(self, headline: str) -> str:
        """Headline plus the server-log lines that explain it (errors and the load table)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        keep = [ln for ln in lines if any(k in ln for k in ("E1", "E0", "Error", "error", "UNAVAILABLE",
                                                            "Traceback", "Exception", "raise"))]
        tail = "\n".join((keep or lines)[-25:])
        return f"{headline} (server log: {self.log_path})\n{tail}"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL after timeout_s; leaves no stub behind."""
        if self.process is None:
            return
        pgid = self.process.pid
        if self.process.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.process.wait(timeout=5)
        # Stubs may outlive the server for a moment: reap the whole group.
        deadline = time.monotonic() + 5
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        self.process = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the launcher dies without stopping it (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
