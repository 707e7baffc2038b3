"""Runs a real `tritonserver` process on a model repository.

The binary comes from the `nvidia-pytriton` wheel (tritonserver 2.51, NGC 24.10) or from a system
`tritonserver` (NGC container). Launch facts (docs/triton_runtime.md): the Python backend needs the
stub built for the running interpreter copied next to `libtriton_python.so`; the stub only sees the
virtualenv's packages when the venv's `bin/` is first on PATH; it links libpython, which must be
this interpreter's (LD_LIBRARY_PATH = sysconfig LIBDIR); numpy must be < 2.

Every server owns a name under /dev/shm (`TritonServer.shm_name`): the Python backend's shared-memory
regions (`shm-region-prefix-name`) and our side channel directory (OMNI_SIDECHANNEL_DIR) start with it,
so `stop()` removes exactly what this server left (a killed stub never removes its region) and
servers sharing a host never touch each other's files. The launcher is a child subreaper: stub
processes that died under tritonserver (which never reaps them) are reaped once it stops.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import tritonclient.grpc as grpcclient

log = logging.getLogger(__name__)
SHM_ROOT = Path("/dev/shm")
STUB_BINARY = "triton_python_backend_stub"
_PR_SET_CHILD_SUBREAPER = 36
# The Python backend runs every BLS request of a model instance (until the child's first response) and
# every decoupled response it sends on one thread pool (default 32). An orchestrator with more than 32
# children waiting (e.g. in an engine's queue) could then not even send the FINAL of a cancelled
# request, stalling its event loop until the children were served.
PYTHON_BACKEND_THREADS = 256
# Seconds tritonserver gives its models to unload after SIGTERM/SIGINT (--exit-timeout-secs) before it exits
# at once, killing the stubs still finalizing. 5 s was too short for voice,tts,asr,qwen3_omni on a slow
# machine: 6 of 11 models were still live when it expired, and a stub killed mid-finalize crashed. On 2 busy
# cores (load ~2.6) their unload took 17.3 s (voice_llm last), so 30 s leaves room for a slower host.
EXIT_TIMEOUT_S = 30
# Seconds `TritonServer.stop` waits for tritonserver to exit after SIGTERM before it SIGKILLs the process
# group: the exit timeout plus a margin for the server's own teardown after the last unload, so a server
# that unloads within its exit timeout is never killed.
STOP_WAIT_S = EXIT_TIMEOUT_S + 10
# gRPC channel options of the launcher's own Triton client. It is made before tritonserver listens (the models load
# first), and with gRPC's default reconnect backoff (1 s, growing 1.6x per failed attempt up to 120 s) its channel
# tried again only ~25 s after the server came up (qwen3_omni on 2 cores: models loaded at 48 s, seen at 72.6 s).
CONTROL_CHANNEL_ARGS = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                        ("grpc.max_reconnect_backoff_ms", 500))
# Seconds `TritonServer.stop` waits, after a stub died, for the models still unloading to make progress before it
# kills the server: a stub killed or crashed mid-request leaves requests that never end (its model version, and a
# BLS parent still reading a stream from it, can never unload), so tritonserver's own exit sat out its whole exit
# timeout and then killed every stub, also the healthy ones that were never finalized.
STUCK_UNLOAD_S = 5.0


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
    """True if something already listens on host:port (an IPv6 address when the host has a ':', as uvicorn)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (for tests and ephemeral servers)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct unused TCP ports on 127.0.0.1 (all held open while picked: separate free_port() calls can
    return the same port twice, which the launcher refuses)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


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
    http_port: int | None   # None: no HTTP endpoint (--allow-http=false)
    metrics_port: int
    log_path: Path
    host: str = "127.0.0.1"
    ready_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    _stub_models: dict[int, str] = dataclasses.field(default_factory=dict)  # stub pid -> model
    _stub_seen: dict[int, float] = dataclasses.field(default_factory=dict)  # stub pid -> monotonic time seen running
    _reported: set[int] = dataclasses.field(default_factory=set)            # dead stubs already reported
    _zombies: set[int] = dataclasses.field(default_factory=set)             # stubs seen as zombies by the last call

    @property
    def shm_name(self) -> str:
        """Prefix of every /dev/shm entry of this server (backend shm regions, side channel dir)."""
        return shm_name(os.getpid(), self.grpc_port)

    @property
    def sidechannel_dir(self) -> Path:
        return SHM_ROOT / f"{self.shm_name}-sidechannel"

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
                *([f"--http-port={self.http_port}"] if self.http_port else ["--allow-http=false"]),
                f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}", "--allow-metrics=true", "--allow-gpu-metrics=false",
                "--metrics-config=histogram_latencies=true", f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
                "--strict-readiness=true", "--log-verbose=0",
                # our configs are whole: auto-complete only cost a second stub per model load (docs/architecture.md)
                "--disable-auto-complete-config",
                f"--backend-config=python,shm-region-prefix-name={self.shm_name}-region-",
                f"--backend-config=python,thread-pool-size={PYTHON_BACKEND_THREADS}"]
        return cmd + list(self.extra_args)

    def start(self) -> "TritonServer":
        for port in (p for p in (self.grpc_port, self.http_port, self.metrics_port) if p):
            if port_in_use(self.host, port):
                raise LaunchError(f"port {self.host}:{port} is already in use (pass another --triton-*-port)")
        missing = [m for m in self.models if not any((repo / m / "config.pbtxt").exists() for repo in self.repositories)]
        if missing:
            raise LaunchError(f"model(s) {', '.join(missing)} not found in {', '.join(map(str, self.repositories))}")
        install = TritonInstallation.find()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _become_subreaper()
        env = {**install.environment(), "OMNI_SIDECHANNEL_DIR": str(self.sidechannel_dir)}
        server_log = open(self.log_path, "wb")
        # Own process group so that stop() can reach the stub processes too.
        self.process = subprocess.Popen(self.command(install), stdout=server_log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, preexec_fn=_die_with_parent)
        server_log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        client = self.control_client()
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

    def control_client(self) -> grpcclient.InferenceServerClient:
        """A gRPC client of this server that reconnects within 0.5 s (CONTROL_CHANNEL_ARGS)."""
        return grpcclient.InferenceServerClient(self.grpc_url, channel_args=list(CONTROL_CHANNEL_ARGS))

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

    def crashed_stubs(self) -> dict[int, tuple[str, float]]:
        """Stub processes that died under the running server since the last call: {pid: (model, seen)}, `seen`
        the last `time.monotonic()` at which a call saw the stub running (it existed then: a model loaded
        afresh after that time has another stub; omni_frontend.stage_monitor).

        A stub the Python backend stops (unload) is reaped by tritonserver; one that crashed or was
        killed stays a zombie (tritonserver never waits for it) while the model still reads READY
        (server issue #8604). A zombie counts once a second call still sees it: an unloaded stub is one
        for the moment before tritonserver reaps it (a sleep was logged as a stub that died). Models are
        learned from the stubs' command lines (`<repo>/<model>/<v>/model.py`) on each call, so call this
        periodically."""
        if self.process is None or self.process.poll() is not None:
            return {}
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return {}
        dead, zombies = {}, set()
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    if child.pid in self._stub_models and child.pid not in self._reported:
                        if child.pid in self._zombies:
                            self._reported.add(child.pid)
                            dead[child.pid] = (self._stub_models[child.pid], self._stub_seen[child.pid])
                        zombies.add(child.pid)
                    continue
                if child.pid not in self._stub_models:
                    args = child.cmdline()
                    if not (len(args) > 1 and args[0].endswith(STUB_BINARY)):
                        continue
                    self._stub_models[child.pid] = Path(args[1]).parent.parent.name
                self._stub_seen[child.pid] = time.monotonic()   # after the look: the stub existed by then
            except psutil.Error:
                continue
        self._zombies = zombies
        for pid in set(self._stub_models) - {child.pid for child in children}:   # reaped: the pid may be reused
            del self._stub_models[pid]
            self._stub_seen.pop(pid, None)
            self._reported.discard(pid)
        return dead

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """SIGTERM the server's process group, SIGKILL after timeout_s (default STOP_WAIT_S, longer than the
        server's EXIT_TIMEOUT_S); leaves no stub process (alive or defunct) and no /dev/shm file of this
        server behind. Takes at most timeout_s + 10 s.

        After a stub died under the server (a zombie child), the models are unloaded through gRPC first, so
        every healthy stub finalizes, and the server is killed once the rest stop making progress for
        STUCK_UNLOAD_S (see there) instead of its exit timeout."""
        if self.process is None:
            return
        pgid = self.process.pid
        if self.process.poll() is None:
            if self._has_dead_stub():
                self._unload_models(timeout_s)   # what is still loaded now cannot unload: killed below
            else:
                _signal_group(pgid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=timeout_s)
            if self.process.poll() is None:
                _signal_group(pgid, signal.SIGKILL)
                self.process.wait(timeout=5)
        # Stubs may outlive the server for a moment: reap the whole group.
        deadline = time.monotonic() + 5
        while _group_alive(pgid) and time.monotonic() < deadline:
            _reap_children()  # stubs that died under tritonserver are ours now (subreaper)
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        _reap_children()
        self.remove_shm()
        self.process = None

    def _has_dead_stub(self) -> bool:
        """Whether a stub process died under the running server (a zombie child: tritonserver never reaps it)."""
        try:
            return any(child.status() == psutil.STATUS_ZOMBIE for child in psutil.Process(self.process.pid).children())
        except psutil.Error:
            return False

    def _unload_models(self, timeout_s: float) -> None:
        """Unloads every model over gRPC and waits (at most timeout_s) until none is loading, loaded or
        unloading, or until that set has not changed for STUCK_UNLOAD_S; logs the models left."""
        busy_states = ("READY", "UNLOADING", "LOADING")
        deadline = time.monotonic() + timeout_s
        client = self.control_client()
        try:
            for model, state in self.model_states(client).items():
                if state == "READY":
                    client.unload_model(model)
            busy, changed = None, time.monotonic()
            while time.monotonic() < deadline:
                now_busy = sorted(m for m, state in self.model_states(client).items() if state in busy_states)
                if not now_busy:
                    return
                if now_busy != busy:
                    busy, changed = now_busy, time.monotonic()
                elif time.monotonic() - changed >= STUCK_UNLOAD_S:
                    break
                time.sleep(0.2)
        except Exception as exc:   # the server may already be going down: kill it as before
            log.warning("unloading the models before the stop failed: %s", exc)
            return
        finally:
            client.close()
        log.warning("a stub died while serving: models %s cannot unload (requests of the dead stub never end); "
                    "stopping tritonserver without them", ", ".join(busy or []))

    def remove_shm(self) -> list[Path]:
        """Deletes this server's /dev/shm entries (call only once the server is stopped); returns them."""
        leftovers = sorted(SHM_ROOT.glob(f"{self.shm_name}-*"))
        for path in leftovers:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if leftovers:
            log.info("removed %d /dev/shm entries left by tritonserver: %s", len(leftovers),
                     ", ".join(p.name for p in leftovers))
        return leftovers


def shm_name(launcher_pid: int, grpc_port: int) -> str:
    """The /dev/shm name prefix of the server a launcher (process id) runs on `grpc_port`."""
    return f"omni-triton-{os.getuid()}-{launcher_pid}-{grpc_port}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the launcher dies without stopping it (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _become_subreaper() -> None:
    """Makes this process adopt (and so be able to reap) orphaned descendants, e.g. the defunct stubs
    tritonserver leaves when it exits (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def _reap_children() -> None:
    """Waits for every child of this process that already exited (adopted stubs included)."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, 0)
        except (psutil.Error, ChildProcessError):
            continue


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
