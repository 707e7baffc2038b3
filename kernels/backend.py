"""Which implementation runs: compiled Triton on CUDA, Triton's interpreter on CPU (tests), or the reference.

Every public op in `omni_kernels` calls `select(op, *tensors)` and gets one of
  "triton"       the kernel compiled for the GPU (CUDA tensors, kernels enabled, Triton importable);
  "interpreter"  the same kernel run by Triton's interpreter on CPU tensors (kernels enabled and
                 `OMNI_KERNELS_INTERPRET=1` or `TRITON_INTERPRET=1` set when the op is called);
  "reference"    the op's PyTorch reference (kernels disabled, Triton missing, or CPU tensors otherwise).
`last_backend(op)` says which one the last call of `op` used (tests assert on it).

The switch `set_enabled(False)` is the engine's deploy option to turn the kernels off; its initial value
comes from the environment variable `OMNI_KERNELS` ("0" turns them off; default on).

Programmatic dependent launch (PDL, Hopper and later): the decode kernels are launched with Triton's
`launch_pdl` option and start with `griddepcontrol.wait` then `griddepcontrol.launch_dependents`
(`grid_dependency`), so in a CUDA graph of a decode step a kernel's launch and prologue overlap the tail of the
kernel before it, and nothing it reads or writes is touched before that kernel has finished. Only launches of at
most `PDL_MAX_ROWS` rows use it (where it measured faster). `set_pdl(False)`
(initial value from `OMNI_KERNELS_PDL`, "0" = off) launches them plainly; on CPU, in the interpreter and before
sm_90 it is a no-op (`pdl_for`). `set_prefetch(True)` (`OMNI_KERNELS_PREFETCH=1`; default off) also lets
`decode_linear` pull its weight slice into L2 before that wait, and the one-launch MoE its W2 columns right after
routing (benchmark A/B); `set_prefetch("decode_linear")` only the former.

Triton fixes its mode (compile for the GPU, or interpret) when it is first imported: its own library
functions (`tl.sum`, `tl.sigmoid`, ...) are decorated then, from `TRITON_INTERPRET`. On a machine without
CUDA only the interpreter can run, so if Triton is not imported yet this module imports it in interpreter
mode there (a process-local Triton setting; the environment is restored); with CUDA it imports it
normally. The kernels here are decorated in whichever mode Triton is in (`INTERPRETED`).
`TRITON_INTERPRET=0` keeps the compiling mode on CUDA-less machines (for compiling kernels ahead of time,
`scripts/inspect_kernels`).
"""
from __future__ import annotations

import os
import sys
import threading

import torch

BACKENDS = ("triton", "interpreter", "reference")


def _import_triton():
    """Import Triton in interpreter mode on CUDA-less machines (see the module doc); None if missing."""
    if "triton" not in sys.modules and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "0":
        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            import triton

            triton.knobs.runtime.interpret = True  # Triton reads it again later (e.g. on first launch)
        except ImportError:
            return None
        finally:
            if previous is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = previous
        return triton
    try:
        import triton
    except ImportError:
        return None
    return triton


triton = _import_triton()
HAVE_TRITON = triton is not None
if HAVE_TRITON:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    INTERPRETED = isinstance(tl.sum, InterpretedFunction)  # the mode Triton's own library was decorated in
else:  # pragma: no cover - exercised on machines without Triton
    INTERPRETED = False

    class _Unavailable:
        """Stands in for `triton.language` so kernel signatures (`X: tl.constexpr`) still evaluate."""

        def __getattr__(self, name):
            return None

    tl = _Unavailable()

_enabled = os.environ.get("OMNI_KERNELS", "1") != "0"
_pdl = os.environ.get("OMNI_KERNELS_PDL", "1") != "0"
PREFETCH_KERNELS = ("decode_linear", "fused_moe")   # the kernels with an optional L2 prefetch
_prefetch = frozenset(PREFETCH_KERNELS if os.environ.get("OMNI_KERNELS_PREFETCH", "0") == "1" else ())
_last: dict[str, str] = {}
_lock = threading.Lock()


def set_enabled(flag: bool) -> None:
    """Turn the Triton kernels on or off for the whole process (off: every op runs its PyTorch reference)."""
    global _enabled
    _enabled = bool(flag)


def enabled() -> bool:
    """Whether the Triton kernels may run (they still need Triton and CUDA tensors, or the interpreter)."""
    return _enabled


def set_pdl(flag: bool) -> None:
    """Launch the decode kernels with programmatic dependent launch (default) or plainly (module doc). Read at
    launch time: a CUDA graph keeps what it was captured with."""
    global _pdl
    _pdl = bool(flag)


def pdl() -> bool:
    """Whether programmatic dependent launch is requested (it still needs compiled kernels on sm_90+)."""
    return _pdl


def set_prefetch(flag: bool | str) -> None:
    """Let `decode_linear` prefetch its weight slice into L2 before waiting for the kernel before it, and the
    one-launch MoE its W2 columns after routing (only with PDL; default off: benchmark A/B). True: both; a name of
    PREFETCH_KERNELS: that kernel only; False: none. Raises ValueError for another name."""
    global _prefetch
    if isinstance(flag, str):
        if flag not in PREFETCH_KERNELS:
            raise ValueError(f"set_prefetch: {flag!r} is not one of {PREFETCH_KERNELS}")
        _prefetch = frozenset((flag,))
    else:
        _prefetch = frozenset(PREFETCH_KERNELS if flag else ())


def prefetch(kernel: str | None = None) -> bool:
    """Whether `kernel`'s L2 prefetch is requested (None: any kernel's)."""
    return bool(_prefetch) if kernel is None else kernel in _prefetch


_capability: dict[int, tuple[int, int]] = {}
# Rows up to which the decode kernels use PDL. H200 run 14: a one-row decode step gained (thinker 3.44 -> 3.12 ms
# under the profiler, talker frame 4.25 -> 4.02 ms) and the talker frame at 16 rows lost (5.30-5.37 -> 5.72 ms).
PDL_MAX_ROWS = 4   # run 30: with decode_linear up to 4 rows, the talker frame at 4 rows -20%, the thinker step -5%


def pdl_for(device: torch.device, rows: int) -> bool:
    """Whether a kernel launched on `device` for `rows` rows (tokens) uses programmatic dependent launch now:
    requested, at most PDL_MAX_ROWS rows, compiled (not the interpreter), a CUDA device of compute capability 9.0+."""
    if not (_pdl and rows <= PDL_MAX_ROWS and HAVE_TRITON and not INTERPRETED and device.type == "cuda"):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capability:
        _capability[index] = torch.cuda.get_device_capability(index)
    return _capability[index] >= (9, 0)


def interpret_requested() -> bool:
    """Whether CPU tensors should go through Triton's interpreter (`OMNI_KERNELS_INTERPRET=1` or
    `TRITON_INTERPRET=1`, read at call time)."""
    return os.environ.get("OMNI_KERNELS_INTERPRET") == "1" or os.environ.get("TRITON_INTERPRET") == "1"


def select(op: str, *tensors: torch.Tensor) -> str:
    """The backend for one call of `op` on `tensors` (all on one device); recorded for `last_backend`."""
    on_cuda = all(t.is_cuda for t in tensors)
    if not (_enabled and HAVE_TRITON):
        backend = "reference"
    elif on_cuda and not INTERPRETED:
        backend = "triton"
    elif INTERPRETED and (on_cuda or interpret_requested()):
        backend = "interpreter"
    else:
        backend = "reference"
    with _lock:
        _last[op] = backend
    return backend


def last_backend(op: str) -> str | None:
    """The backend ("triton", "interpreter" or "reference") of the last call of `op`; None before any call."""
    return _last.get(op)


def kernel(fn):
    """`triton.jit` for kernels, in Triton's import-time mode (see the module doc)."""
    if not HAVE_TRITON:
        return fn
    return InterpretedFunction(fn) if INTERPRETED else JITFunction(fn)


def helper(fn):
    """`triton.jit` for helpers called inside kernels. Interpreted kernels call the plain function: Triton's
    language is already patched for the running kernel, and a nested InterpretedFunction would re-patch it
    on every call (most of the interpreter's time)."""
    if not HAVE_TRITON or INTERPRETED:
        return fn
    return JITFunction(fn)


_ROUND_BF16_FIRST = tl.constexpr(INTERPRETED) if HAVE_TRITON else False

if HAVE_TRITON and not INTERPRETED:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
else:   # never called: PDL is False in the interpreter
    gdc_launch_dependents = gdc_wait = None


@helper
def grid_dependency(PDL: tl.constexpr):
    """With PDL: wait until the kernel before this one on the stream has finished and its writes are visible
    (`griddepcontrol.wait`), then let the next kernel launch (`griddepcontrol.launch_dependents`: its programs
    may start their own prologue and wait in turn). Call before the first access to memory another kernel
    writes; without PDL nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@helper
def prefetch_l2(ptrs):
    """`prefetch.global.L2` of the cache lines at `ptrs` (a tensor of valid pointers, one per line)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@helper
def round_to(x, dtype: tl.constexpr):
    """fp32 -> dtype, rounding to nearest even. Compiled, this is `x.to(dtype)`. Triton 3.6's interpreter
    truncates fp32 -> bf16, so there x is first rounded to 8 significant bits in fp32 (Veltkamp's split:
    c = x * (2**16 + 1); x = c - (c - x)), which the truncation then keeps exactly."""
    if _ROUND_BF16_FIRST:
        if dtype == tl.bfloat16:
            c = x * 65537.0
            x = c - (c - x)
    return x.to(dtype)


@helper
def rounded(x, dtype: tl.constexpr):
    """fp32 x rounded to dtype and back to fp32: where the unfused PyTorch code rounds an intermediate."""
    return round_to(x, dtype).to(tl.float32)


# Triton 3.6's interpreter multiplies bf16 tiles as raw bits (wrong results), so interpreted GEMMs upcast
# their tiles to fp32 (exact for bf16/fp16) before `tl.dot`; compiled GEMMs feed bf16 to the tensor cores.
DOT_IN_FP32 = INTERPRETED


@helper
def dot_step(a, b_ptrs, b_mask, acc, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ B for the B tile at b_ptrs (masked elements 0): one K step of the GEMM kernels (a loaded by
    the caller, shared between several B tiles; the loads feeding `tl.dot` are what Triton pipelines)."""
    b = tl.load(b_ptrs, mask=b_mask, other=0.0)
    if DOT_F32:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)
