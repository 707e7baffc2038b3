"""Launcher: prepare models, start tritonserver on the model repository, then the frontend.

    python -m omni_frontend.serve [--pipelines voice,tts,...] [--host 127.0.0.1] [--port 8000]
                                  [--triton-grpc-port 8001] [--api-key KEY] ...
    python -m omni_frontend.serve --deploy deploy/qwen3_omni_h200.yaml ...   (GPU stages: docs/gpu.md)
    python -m omni_frontend.serve --tts-engine piper ...   (voice and tts speak with Piper: docs/pipelines.md)

Loads only the selected pipelines' models (explicit model control), waits until every model is
ready, serves the OpenAI API with uvicorn, restarts a stage whose stub process dies (model control:
unload + load, omni_frontend.stage_monitor), and on SIGINT/SIGTERM/SIGHUP stops both, leaving no child
process (alive or defunct) and no /dev/shm file behind. Failures (port in use, missing binary, a
model that does not load) print one clear line (plus the relevant server-log lines) and exit non-zero.
Bad input (a flag's value, a deploy file, a --log-dir / --data-dir / $OMNI_MODEL_HOME that cannot be
a writable folder, a --host:--port this machine cannot listen on) is one `error: ...` line naming the
flag, file or key, before anything starts: exit 2 (1 for an address that is taken or not this machine's).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from omni_backends.paths import QWEN3_OMNI_30B_RANDOM, QWEN3_OMNI_TINY, model_home   # no model code
from omni_frontend import deploy
from omni_frontend import pipelines as registry
from omni_frontend.config import AdmissionLimits, RequestLimits
from omni_frontend.stopping import GRACEFUL_SHUTDOWN_S
from omni_frontend.tritonserver import LaunchError, TritonServer

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_PRESETS = (QWEN3_OMNI_TINY, QWEN3_OMNI_30B_RANDOM)   # python -m omni_backends.prepare NAME
TTS_STAGE = "voice_tts"
# Signals that stop the launcher cleanly: Ctrl-C, a supervisor's SIGTERM, and SIGHUP (its terminal closed: killed at
# once by default, it cut the requests in flight without an answer and left the --tts-engine run copy behind).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
log = logging.getLogger("omni_frontend.serve")


class _Parser(argparse.ArgumentParser):
    """A bad flag is ONE line, `error: argument --port: must be 1-65535, got 70000 (see --help)`, exit 2
    (argparse's own printed the 40-line usage first)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def _port(value: str) -> int:
    """argparse type of the port flags: an integer 1-65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {value!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 1-65535, got {port}")
    return port


def _host(value: str) -> str:
    """argparse type of --host: a name or address that resolves (the listen check comes before the start)."""
    try:
        socket.getaddrinfo(value, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise argparse.ArgumentTypeError(f"cannot resolve {value!r}: {reason}") from None
    return value


PORT_FLAGS = ("port", "triton_grpc_port", "triton_http_port", "triton_metrics_port")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="omni_frontend.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--pipelines", default=",".join(registry.DEFAULT),
                   help=f"comma-separated pipelines (known: {', '.join(registry.REGISTRY)}; default: %(default)s)")
    p.add_argument("--extra-pipeline", action="append", default=[], metavar="NAME=KIND:model1,model2",
                   help="serve a pipeline that is not in the registry (tests, custom repositories)")
    p.add_argument("--model-repository", action="append", type=Path, default=None,
                   help="model repository folder (repeatable; default: ./model_repository)")
    p.add_argument("--deploy", type=Path, metavar="YAML",
                   help="deploy file (deploy/*.yaml): render its pipeline's models with the file's devices and "
                        "settings into a folder of this run (var/deploy/<name>.run-*/, removed at the stop) "
                        "and serve that pipeline from there")
    p.add_argument("--host", type=_host, default="127.0.0.1",
                   help="address the frontend listens on (default: %(default)s)")
    p.add_argument("--port", type=_port, default=8000, help="frontend port, 1-65535 (default: %(default)s)")
    p.add_argument("--triton-grpc-port", type=_port, default=8001,
                   help="1-65535, on 127.0.0.1 (default: %(default)s)")
    p.add_argument("--triton-http-port", type=_port, default=None,
                   help="turns on Triton's HTTP/REST endpoint on 127.0.0.1 at this port, 1-65535 (default: off; "
                        "the frontend and perf_analyzer use gRPC, and Triton 2.51's HTTP endpoint aborts the whole "
                        "server on one request declaring a huge input shape: std::bad_alloc)")
    p.add_argument("--triton-metrics-port", type=_port, default=8003,
                   help="1-65535, on 127.0.0.1 (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("OMNI_API_KEY"),
                   help="require Authorization: Bearer KEY on every route (vLLM's /sleep, /wake_up, /is_sleeping "
                        "too) but /health, /metrics, /docs, /openapi.json, the /realtime page and image URLs")
    p.add_argument("--log-dir", type=Path, default=ROOT / "var" / "log")
    p.add_argument("--data-dir", type=Path, default=ROOT / "var" / "data",
                   help="video job store (SQLite) and generated files; kept across restarts")
    p.add_argument("--max-queued-videos", type=int, default=16, help="videos waiting to start; past it POST gets 429")
    p.add_argument("--max-running-videos", type=int, default=2,
                   help="videos generating at once (their denoising steps are batched together)")
    p.add_argument("--video-ttl", type=int, default=86400,
                   help="seconds a finished video (and its files) is kept; 0 keeps it forever")
    p.add_argument("--tts-engine", choices=registry.TTS_ENGINES,
                   help="speech engine of the voice and tts pipelines (the voice_tts stage's `engine`): kokoro "
                        "(Kokoro-82M, the repository's default) or piper (Piper's en_US joe voice, ~8x less CPU per "
                        "audio second; piper-tts is GPL-3.0 and the voice's licence terms are uncertain: "
                        "docs/pipelines.md). Serves a run copy of the repository with the parameter set")
    p.add_argument("--realtime-speculation-ms", type=int, default=64, metavar="MS",
                   help="realtime sessions with server VAD start answering a turn after this many ms of silence "
                        "(the reply is held until the turn ends, dropped if the user speaks on); used when shorter "
                        "than the session's silence_duration_ms (default: %(default)s)")
    p.add_argument("--no-realtime-speculation", action="store_true",
                   help="answer a realtime turn only once the VAD has ended it (no preemptive responses)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for every model")
    p.add_argument("--no-prepare", action="store_true", help="skip preparing the default model checkpoints")
    p.add_argument("--no-recover", action="store_true",
                   help="do not restart a stage whose stub process died (it stays 503 until a restart)")
    p.add_argument("--no-frontend", action="store_true",
                   help="serve Triton only (gRPC/HTTP clients, scripts/bench --transport triton); the frontend's "
                        "packages are then not needed")
    limits, admission = RequestLimits(), AdmissionLimits()
    g = p.add_argument_group("overload control (per pipeline; docs/reliability.md)")
    g.add_argument("--max-inflight", type=_per_pipeline, default=(None, {}), metavar="N[,PIPELINE=N...]",
                   help=f"requests running at once per pipeline; past it they queue (default: {admission.max_inflight})")
    g.add_argument("--max-queue", type=lambda v: _per_pipeline(v, minimum=0), default=(None, {}),
                   metavar="N[,PIPELINE=N...]",
                   help=f"requests waiting per pipeline; past it 429 with Retry-After (default: {admission.max_queue})")
    g.add_argument("--max-queue-wait", type=float, default=admission.max_queue_wait_s, metavar="SECONDS",
                   help="a request expected to wait longer gets 429 at once; a queued one gives up with 429 after it "
                        "(default: %(default)s)")
    g = p.add_argument_group("request limits, checked before any model work (docs/reliability.md)")
    g.add_argument("--http-head-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a connection must send each request head (request line and headers) within this; otherwise "
                        "it is closed, so silent or trickling connections cannot hold the frontend's sockets "
                        "(default: %(default)s)")
    g.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes,
                   help="request body size; larger bodies get 413 unparsed (default: %(default)s)")
    g.add_argument("--max-text-chars", type=int, default=limits.max_text_chars,
                   help="characters of chat text (messages and stop strings) per request (default: %(default)s)")
    g.add_argument("--max-messages", type=int, default=limits.max_messages,
                   help="chat messages per request (default: %(default)s)")
    g.add_argument("--max-audio-seconds", type=float, default=limits.max_audio_seconds,
                   help="seconds of input audio per request (default: %(default)s)")
    g.add_argument("--max-images", type=int, default=limits.max_images,
                   help="image parts per chat request (default: %(default)s)")
    g.add_argument("--max-image-bytes", type=int, default=limits.max_image_bytes,
                   help="bytes of one input image file, a data: URL's or a fetched http(s) URL's (default: %(default)s)")
    g.add_argument("--max-image-pixels", type=int, default=limits.max_image_pixels,
                   help="width x height of one input image, read before decoding (default: %(default)s)")
    g.add_argument("--image-fetch-timeout", type=float, default=limits.image_fetch_timeout_s, metavar="SECONDS",
                   help="time to fetch one http(s) image URL (default: %(default)s)")
    g.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="DOMAIN",
                   help="fetch http(s) media URLs only from these hosts and their subdomains (default: any public host)")
    g.add_argument("--allow-private-media-urls", action="store_true",
                   help="let clients' media URLs name private, loopback and link-local addresses (off by default: "
                        "a client could make the server fetch internal services)")
    args = p.parse_args(argv)
    if args.max_queued_videos < 0 or args.max_running_videos < 1 or args.video_ttl < 0:
        p.error("--max-queued-videos and --video-ttl must be >= 0, --max-running-videos >= 1")
    if not args.http_head_timeout > 0:
        p.error("--http-head-timeout must be > 0 seconds")
    if min(args.max_images, args.max_image_bytes, args.max_image_pixels) < 1 or not args.image_fetch_timeout > 0:
        p.error("--max-images, --max-image-bytes and --max-image-pixels must be >= 1, --image-fetch-timeout > 0")
    if not 0 <= args.realtime_speculation_ms <= 60_000:
        p.error("--realtime-speculation-ms must be in [0, 60000]")
    ports = [flag for flag in PORT_FLAGS if getattr(args, flag) is not None and not (flag == "port" and args.no_frontend)]
    for i, flag in enumerate(ports):
        twin = next((other for other in ports[:i] if getattr(args, other) == getattr(args, flag)), None)
        if twin is not None:
            p.error(f"--{twin.replace('_', '-')} and --{flag.replace('_', '-')} are both {getattr(args, flag)}; "
                    f"every port must differ")
    return args


def _per_pipeline(value: str, minimum: int = 1) -> tuple[int | None, dict[str, int]]:
    """'4' or '4,qwen3_omni=16' -> (4, {"qwen3_omni": 16}); a bare number applies to every pipeline
    not named (None when there is none)."""
    default, named = None, {}
    for item in value.split(","):
        name, _, number = item.rpartition("=")
        try:
            n = int(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not N or PIPELINE=N") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{item!r}: must be >= {minimum}")
        if name:
            named[name] = n
        else:
            default = n
    return default, named


def admission_limits(args: argparse.Namespace) -> AdmissionLimits:
    """AdmissionLimits from --max-inflight / --max-queue (PIPELINE=N entries override per pipeline)."""
    defaults = AdmissionLimits()
    (inflight, inflight_named), (queue, queue_named) = args.max_inflight, args.max_queue
    inflight = defaults.max_inflight if inflight is None else inflight
    queue = defaults.max_queue if queue is None else queue
    per = {name: (inflight_named.get(name, inflight), queue_named.get(name, queue))
           for name in {*inflight_named, *queue_named}}
    return AdmissionLimits(max_inflight=inflight, max_queue=queue, max_queue_wait_s=args.max_queue_wait, per_pipeline=per)


def _preparable(names: list[str]) -> list[str]:
    return [n for n in names if n in registry.REGISTRY or n in CHECKPOINT_PRESETS]


def _to_prepare(args: argparse.Namespace, selected) -> list[str]:
    """What prepare_models gets: the deploy file's checkpoint, else the selected pipelines."""
    prepare = getattr(args, "prepare_only", None)
    return prepare if prepare is not None else [p.name for p in selected]


def prepare_models(names: list[str]) -> None:
    """Runs model preparation in a subprocess (the frontend never imports model code). Names: pipelines and
    checkpoint presets (`qwen3_omni_30b_a3b_random`); anything else (a checkpoint directory) is skipped."""
    known = _preparable(names)
    if not known:
        return
    done = subprocess.run([sys.executable, "-m", "omni_backends.prepare", *known])
    if done.returncode != 0:
        raise LaunchError(f"model preparation failed for {', '.join(known)} (see the lines above)")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # /health polls Triton's metrics
    args = parse_args(argv)
    try:
        if args.deploy is not None:
            deployment = deploy.load(args.deploy)
            check_gpus(args.deploy, deployment)
            check_checkpoint(args.deploy, deployment)
            args.pipelines = deployment.pipeline   # rendered below, once the cheap checks passed
            args.models = deployment.models   # the co-located layout renders one model for the whole pipeline
            args.prepare_only = [deployment.checkpoint] if deployment.checkpoint else None
        extra = [registry.parse_extra(s) for s in args.extra_pipeline]
        names = [n for n in (n.strip() for n in args.pipelines.split(",")) if n] + [p.name for p in extra]
        if not names:   # `--pipelines ''` or `--pipelines ,` (an unset shell variable) served nothing
            raise ValueError(f"--pipelines names no pipeline (got {args.pipelines!r}); known: "
                             f"{', '.join(registry.REGISTRY)}")
        selected = registry.resolve(list(dict.fromkeys(names)), extra)
        if args.deploy is not None:   # the deploy's models are its pipeline's (the co-located layout: one model), so
            # /health, sleep/wake and stage recovery look at what is loaded (/health was 503 for good before)
            selected = [dataclasses.replace(p, models=tuple(deployment.models)) if p.name == deployment.pipeline
                        else p for p in selected]
        if args.tts_engine is not None:
            selected = registry.with_tts_engine(selected, args.tts_engine)
        check_folders(args, selected)
    except ValueError as exc:   # DeployError is a ValueError: one line naming the key
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = None
    stack = contextlib.ExitStack()   # the run copies of the repository (--deploy, --tts-engine), removed after the server
    # SIGTERM unwinds through `finally` from here on, also while models load (it used to kill the launcher
    # there, leaving the run copy and stub processes behind); so does SIGINT, also when it was inherited ignored
    # (`./scripts/serve &` in a script: the launcher went on loading and served, uvicorn's handler later did stop it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not args.no_frontend:   # the frontend's port only; tritonserver checks its own in start()
            check_listen_address(args.host, args.port)
        models = getattr(args, "models", None) or registry.triton_models(selected)
        if args.deploy is not None:
            args.model_repository = [render_run_copy(args.deploy, deployment, stack)]
        repositories = [r.resolve() for r in (args.model_repository or [ROOT / "model_repository"])]
        if args.tts_engine is not None:
            run_copy = stack.enter_context(tempfile.TemporaryDirectory(prefix="omni-triton-repository-"))
            repositories = [tts_engine_repository(repositories, models, args.tts_engine, Path(run_copy))]
        if not args.no_prepare:
            prepare_models(_to_prepare(args, selected))
        server = TritonServer(
            repositories=repositories, models=models, grpc_port=args.triton_grpc_port,
            http_port=args.triton_http_port, metrics_port=args.triton_metrics_port,
            log_path=args.log_dir / "tritonserver.log", ready_timeout_s=args.ready_timeout)
        started = time.monotonic()
        log.info("starting tritonserver with models: %s", ", ".join(server.models))
        server.start()
        log.info("tritonserver ready in %.1f s (log: %s)", time.monotonic() - started, server.log_path)
        if args.no_frontend:
            return _serve_triton_only(server)
        import uvicorn

        from omni_frontend.app import create_app
        from omni_frontend.http_protocol import with_head_timeout
        from omni_frontend.config import FrontendConfig

        limits = RequestLimits(max_body_bytes=args.max_body_bytes, max_text_chars=args.max_text_chars,
                               max_messages=args.max_messages, max_audio_seconds=args.max_audio_seconds,
                               max_images=args.max_images, max_image_bytes=args.max_image_bytes,
                               max_image_pixels=args.max_image_pixels, image_fetch_timeout_s=args.image_fetch_timeout,
                               allowed_media_domains=tuple(d.lower().strip(".") for d in args.allowed_media_domains),
                               allow_private_media_urls=args.allow_private_media_urls)
        app = create_app(FrontendConfig(triton_url=server.grpc_url, pipelines=selected, api_key=args.api_key,
                                        triton_metrics_url=server.metrics_url, limits=limits,
                                        admission=admission_limits(args), data_dir=args.data_dir,
                                        max_queued_videos=args.max_queued_videos,
                                        max_running_videos=args.max_running_videos, video_ttl_s=args.video_ttl,
                                        recover_stages=not args.no_recover,
                                        realtime_speculation_ms=None if args.no_realtime_speculation
                                        else args.realtime_speculation_ms),
                         crashed_stubs=server.crashed_stubs)
        # httptools: uvicorn's C HTTP parser (its pure-Python h11 fallback cost ~1 ms more per streamed
        # request in scripts/profile_ttft.py: serving overhead over the engine 9.3 vs 10.3 ms), with a deadline
        # for each request head (omni_frontend.http_protocol)
        # the stop: requests in flight get GRACEFUL_SHUTDOWN_S to end, those still running are then answered 503 /
        # an SSE error event (omni_frontend.stopping), before uvicorn would cancel them
        uv = _uvicorn_server(app.state.stopping.begin)(uvicorn.Config(
            app, host=args.host, port=args.port, log_level="warning", http=with_head_timeout(args.http_head_timeout),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        # uvicorn re-raises every signal it caught, the LAST first: exit with the FIRST one's code instead
        # (SIGTERM then Ctrl-C during the graceful shutdown is still a 143, as a supervisor expects).
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda sig, _: sys.exit(128 + (uv.first_signal or sig)))
        threading.Thread(target=_announce, args=(uv, args, server, selected), daemon=True).start()
        died = threading.Event()
        threading.Thread(target=_watch, args=(uv, server, died), daemon=True).start()
        uv.run()   # the signal that stopped uvicorn is re-raised into the handlers above, unwinding to `finally`
        return 1 if died.is_set() else 0
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except deploy.DeployError as exc:   # the deploy file's run folder could not be rendered
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short (it left the server's /dev/shm entries and
        # the run copy); server.stop() is bounded by its own timeouts.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if server is not None:
            server.stop()
            log.info("tritonserver stopped")
        stack.close()


def usable_folder(flag: str, path: Path) -> Path:
    """`path`, created if missing; ValueError (one line naming `flag`) unless it is a folder we can write in."""
    try:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{flag} {path}: not a folder")
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        action = "cannot write in it" if path.is_dir() else "cannot create it"
        raise ValueError(f"{flag} {path}: {action}: {exc.strerror or exc}") from None
    return path


def check_gpus(path: Path, deployment: deploy.Deployment) -> None:
    """Raises ValueError (one line naming the stage) when the deploy file places a stage on `cuda:N` and this
    machine has no CUDA device N visible to torch (tritonserver refused it only after loading the rest, with
    several lines of "unsupported gpu id 0. GPUs with at least the minimum required CUDA compute compatibility
    ... are:" and nothing after). Counted in a subprocess: the frontend never imports torch itself."""
    wanted = {name: max(spec.gpus) for name, spec in deployment.stages.items() if spec.gpus}
    if not wanted:
        return
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, timeout=120)
    visible = int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() else 0
    for name, gpu in wanted.items():
        if gpu >= visible:
            raise ValueError(f"{path}: stages.{name}.device: cuda:{gpu}, but this machine has "
                             f"{visible or 'no'} CUDA device{'' if visible == 1 else 's'} visible to torch "
                             f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                             "deploy/qwen3_omni_cpu.yaml places every stage on the CPU")


def check_folders(args: argparse.Namespace, selected) -> None:
    """The folders this run writes, checked before anything starts (they raised a traceback from deep inside,
    the log folder's after the port checks, the data folder's after tritonserver had loaded every model):
    --log-dir always, --data-dir when a video pipeline is served, the model home when checkpoints are prepared."""
    usable_folder("--log-dir", args.log_dir)
    if any(p.kind == registry.VIDEO for p in selected) and not args.no_frontend:
        usable_folder("--data-dir", args.data_dir)
    if not args.no_prepare and _preparable(_to_prepare(args, selected)):
        usable_folder("$OMNI_MODEL_HOME", model_home())


def check_checkpoint(path: Path, deployment: deploy.Deployment) -> None:
    """Raises ValueError (one line naming the key) when the deploy file's checkpoint is a directory, not a preset,
    that does not exist (absolute, or relative to the model home); tritonserver found it only after starting,
    one traceback per model. Presets are prepared by the launcher."""
    name = deployment.checkpoint
    if name is None or name in CHECKPOINT_PRESETS:
        return
    folder = Path(name).expanduser()
    folder = folder if folder.is_absolute() else model_home() / folder
    if not folder.is_dir():
        raise ValueError(f"{path}: checkpoint: directory {folder} does not exist (a relative one is taken under "
                         f"$OMNI_MODEL_HOME; presets: {', '.join(CHECKPOINT_PRESETS)})")


def check_listen_address(host: str, port: int) -> None:
    """LaunchError unless the frontend can listen on host:port as uvicorn will (an address of this machine, a
    port we may bind); before, uvicorn failed only after tritonserver had loaded every model."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(f"port {host}:{port} is already in use (pass --port)") from None
            raise LaunchError(f"--host {host} --port {port}: cannot listen there: {exc.strerror or exc}") from None


def render_run_copy(path: Path, deployment: deploy.Deployment, stack: contextlib.ExitStack) -> Path:
    """Render the deploy file into a folder of this run (`var/deploy/<name>.run-<random>/`, removed after the server):
    Triton reloads models from it on a wake or a stage recovery, so another render of a file with the same name (a
    render-only call, a second serve that then fails its port check) must not replace it. Raises DeployError."""
    parent = ROOT / "var" / "deploy"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{deployment.name}.run-", dir=parent)))
    except OSError as exc:
        raise deploy.DeployError(f"{parent}: cannot make the run folder of the deploy file: {exc.strerror or exc}"
                                 ) from None
    rendered = deploy.render(deployment, run_dir)
    log.info("rendered %s into %s", path, rendered)
    return rendered


def tts_engine_repository(repositories: list[Path], models: list[str], engine: str, out_dir: Path) -> Path:
    """A run copy of `models` in `out_dir` whose voice_tts speaks with `engine` (--tts-engine). Raises
    LaunchError when voice_tts is not among the models (no pipeline that speaks with it was selected)."""
    if TTS_STAGE not in models:
        raise LaunchError(f"--tts-engine needs a pipeline that speaks through {TTS_STAGE} (voice, tts); "
                          f"serving: {', '.join(models)}")
    try:
        return deploy.render_parameters(repositories, models, {TTS_STAGE: {"engine": engine}}, out_dir)
    except deploy.DeployError as exc:
        raise LaunchError(str(exc)) from None


def _uvicorn_server(on_exit=lambda: None):
    import uvicorn
    import uvicorn.server

    uvicorn.server.HANDLED_SIGNALS = STOP_SIGNALS   # its graceful shutdown on SIGHUP too (it handles INT and TERM)

    class Server(uvicorn.Server):
        """uvicorn.Server that remembers the first exit signal it handled (`first_signal`, None before) and calls
        `on_exit()` (signal-safe: `Stopping.begin`) on each."""
        first_signal: int | None = None

        def handle_exit(self, sig, frame) -> None:
            self.first_signal = self.first_signal or sig
            on_exit()
            super().handle_exit(sig, frame)

    return Server


def _serve_triton_only(server: TritonServer) -> int:
    """Wait until SIGINT/SIGTERM/SIGHUP (exit 0) or until tritonserver dies (exit 1); the caller stops the server."""
    print(f"Omni-Triton ready (Triton only): gRPC {server.grpc_url}   metrics {server.metrics_url}", flush=True)
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        if server.process is not None and server.process.poll() is not None:
            print(f"error: {server.failure(f'tritonserver exited unexpectedly with code {server.process.returncode}')}",
                  file=sys.stderr, flush=True)
            return 1
    return 0


def _watch(uv, server: TritonServer, died: threading.Event) -> None:
    """Stops the frontend (exit 1) if tritonserver dies under it: a supervisor can then restart us."""
    while not uv.should_exit:
        process = server.process
        if process is not None and process.poll() is not None:
            print(f"error: {server.failure(f'tritonserver exited unexpectedly with code {process.returncode}')}",
                  file=sys.stderr, flush=True)
            died.set()
            uv.should_exit = True
            return
        time.sleep(0.5)


def _announce(uv, args, server: TritonServer, selected) -> None:
    while not uv.started and not uv.should_exit:
        time.sleep(0.05)
    if uv.started:
        base = f"http://{args.host}:{args.port}"
        print(f"Omni-Triton ready: {base}/v1 (pipelines: {', '.join(p.name for p in selected)})\n"
              f"  health {base}/health   models {base}/v1/models   metrics {base}/metrics\n"
              f"  triton gRPC {server.grpc_url}   triton metrics {server.metrics_url}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
