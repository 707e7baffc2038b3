"""Kernel cases at the Qwen3-Omni-30B-A3B shapes, shared by scripts/bench_kernels and scripts/inspect_kernels.

Each `Case` is one omni_kernels op on inputs of one token count, with its PyTorch reference, the fewest
bytes it must move (each input read once, each output written once) and its FLOPs. Inputs rotate among
several sets so that repeated timing runs do not read a cache-resident copy (METHOD.md: "rotate among
several input sets"); MoE sets route to different experts.
Sizes from shared/notes/qwen3_omni_30b.md: thinker hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8,
moe_intermediate 768, mrope_section [24, 20, 20] interleaved; talker hidden 1024, 128 experts top-6,
moe_intermediate 384; code predictor hidden 1024, intermediate 3072.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
ROTATE_BYTES = 256 << 20  # rotate input sets until they span this much (several times the H200's L2)
MAX_SETS = 8


def import_omni_kernels():
    """`import omni_kernels`; where the project is not installed (the GPU machine), load it from kernels/."""
    try:
        import omni_kernels
    except ImportError:
        spec = importlib.util.spec_from_file_location("omni_kernels", ROOT / "kernels" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "kernels")])
        omni_kernels = importlib.util.module_from_spec(spec)
        sys.modules["omni_kernels"] = omni_kernels
        spec.loader.exec_module(omni_kernels)
    return omni_kernels


@dataclasses.dataclass(frozen=True)
class MoeModel:
    name: str
    experts: int
    hidden: int
    inter: int
    top_k: int


MOE_MODELS = (MoeModel("thinker", 128, 2048, 768, 8), MoeModel("talker", 128, 1024, 384, 6))
THINKER_HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MROPE_SECTION = 2048, 32, 4, 128, (24, 20, 20)
CODE_PREDICTOR_INTER = 3072
# decode_linear: (name, in features, out features, with the residual add + norm epilogue) of the decoders' linears:
# o_proj / down_proj (the norm follows them), q/k/v, the routers, the code predictor's gate/up
LINEAR_SHAPES = (("thinker o_proj", HEADS * HEAD_DIM, THINKER_HIDDEN, True),
                 ("thinker q/k/v", THINKER_HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, False),
                 ("thinker router", THINKER_HIDDEN, 128, False),
                 ("talker o_proj", 16 * HEAD_DIM, 1024, True),   # the code predictor's o_proj too
                 ("talker q/k/v", 1024, (16 + 2 * 2) * HEAD_DIM, False),
                 ("talker router", 1024, 128, False),
                 ("code predictor q/k/v", 1024, (16 + 2 * 8) * HEAD_DIM, False),
                 ("code predictor gate/up", 1024, 2 * CODE_PREDICTOR_INTER, False),
                 ("code predictor down_proj", CODE_PREDICTOR_INTER, 1024, True))
# the thinker's output projection (vocab x hidden, 0.62 GB in bf16): tuned at one row (direct store only), not a case
HEAD_SHAPES = (("thinker lm_head", THINKER_HIDDEN, 152064),)
LINEAR_MAX_TOKENS = 4   # decode_linear's cases (the engine uses it up to this many rows)
ATTENTION_COLUMNS, ATTENTION_MAX_ROWS = 1024, 64   # decode attention: cached columns, most rows timed


@dataclasses.dataclass
class Case:
    """fn(*inputs) is the omni_kernels op, reference(*inputs) its PyTorch reference, for each inputs in sets."""
    op: str
    name: str
    tokens: int
    fn: Callable
    reference: Callable
    sets: list[tuple]
    bytes: Callable[[], int]
    flops: int = 0

    def rotating(self, fn: Callable) -> Callable[[], object]:
        """A callable running fn on the next input set each call."""
        cycle = itertools.cycle(self.sets)
        return lambda: fn(*next(cycle))

    def all_sets(self, fn: Callable) -> Callable[[], None]:
        """A callable running fn once on every input set (for graph capture)."""
        return lambda: [fn(*inputs) for inputs in self.sets]


def _rotating(make: Callable[[], tuple], set_bytes: int, random: bool) -> list[tuple]:
    """Several input sets spanning ROTATE_BYTES (one set when the data is not random)."""
    n = 1 if not random else max(1, min(MAX_SETS, -(-ROTATE_BYTES // max(set_bytes, 1))))
    return [make() for _ in range(n)]


def _tensor(shape, dtype, device, random: bool, scale: float = 1.0):
    if not random:
        return torch.empty(shape, dtype=dtype, device=device)
    return (torch.randn(shape, device=device) * scale).to(dtype)


def distinct_logits(T: int, E: int, dtype, device) -> torch.Tensor:
    """Router logits without ties: a random order of evenly spaced values (exact in bf16)."""
    ranks = torch.argsort(torch.rand(T, E, device=device), dim=1).float()
    return ((ranks - E / 2) / 16).to(dtype)


def cases(ok, tokens: list[int], device: str, dtype=torch.bfloat16, random: bool = True,
          ops: tuple[str, ...] = ("rms_norm", "silu_and_mul", "apply_mrope", "fused_moe", "decode_attention",
                                  "decode_linear"),
          ) -> list[Case]:
    """Every op at every token count. `random=False` allocates without filling (compile-only use)."""
    out: list[Case] = []
    es = torch.tensor([], dtype=dtype).element_size()
    weights = {}
    if "fused_moe" in ops:
        for m in MOE_MODELS:
            weights[m.name] = (_tensor((m.experts, 2 * m.inter, m.hidden), dtype, device, random, m.hidden ** -0.5),
                               _tensor((m.experts, m.hidden, m.inter), dtype, device, random, m.inter ** -0.5))
    for T in tokens:
        if "rms_norm" in ops:
            H = THINKER_HIDDEN
            w = _tensor((H,), dtype, device, random)
            sets = _rotating(lambda: (_tensor((T, H), dtype, device, random), w, 1e-6,
                                      _tensor((T, H), dtype, device, random)), 2 * T * H * es, random)
            out.append(Case("rms_norm", f"rms_norm+residual H={H}", T, ok.rms_norm, ok.rms_norm_reference, sets,
                            lambda T=T, H=H: (4 * T * H + H) * es))
            wq = _tensor((HEAD_DIM,), dtype, device, random)
            sets = _rotating(lambda: (_tensor((T, HEADS, HEAD_DIM), dtype, device, random), wq, 1e-6),
                             T * HEADS * HEAD_DIM * es, random)
            out.append(Case("rms_norm", f"rms_norm q_norm {HEADS}x{HEAD_DIM}", T, ok.rms_norm, ok.rms_norm_reference,
                            sets, lambda T=T: (2 * T * HEADS * HEAD_DIM + HEAD_DIM) * es))
        if "silu_and_mul" in ops:
            D = CODE_PREDICTOR_INTER
            sets = _rotating(lambda: (_tensor((T, 2 * D), dtype, device, random),), 2 * T * D * es, random)
            out.append(Case("silu_and_mul", f"silu_and_mul d={D}", T, ok.silu_and_mul, ok.silu_and_mul_reference,
                            sets, lambda T=T, D=D: 3 * T * D * es))
        if "apply_mrope" in ops:
            def make_rope(T=T):
                qkv = _tensor((T, (HEADS + 2 * KV_HEADS) * HEAD_DIM), dtype, device, random)
                q = qkv[:, :HEADS * HEAD_DIM].view(T, HEADS, HEAD_DIM)
                k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].view(T, KV_HEADS, HEAD_DIM)
                pos = torch.arange(T, device=device).expand(3, T)
                inv = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
                cos, sin = ok.rotary_cos_sin(pos, inv)
                return q, k, cos, sin, MROPE_SECTION, True
            sets = _rotating(make_rope, T * (HEADS + KV_HEADS) * HEAD_DIM * es, random)
            out.append(Case("apply_mrope", f"apply_mrope {HEADS}/{KV_HEADS} heads", T, ok.apply_mrope,
                            ok.apply_mrope_reference, sets,
                            lambda T=T: 2 * T * (HEADS + KV_HEADS) * HEAD_DIM * es + 2 * 3 * T * HEAD_DIM // 2 * 4))
        if "decode_attention" in ops and T <= ATTENTION_MAX_ROWS:
            out.append(_attention_case(ok, T, dtype, device, random, es))
        if "fused_moe" in ops:
            for m in MOE_MODELS:
                w13, w2 = weights[m.name]
                expert_bytes = 3 * m.hidden * m.inter * es
                sets = _rotating(lambda m=m, T=T, w13=w13, w2=w2: (
                    _tensor((T, m.hidden), dtype, device, random),
                    distinct_logits(T, m.experts, dtype, device) if random else
                    torch.empty((T, m.experts), dtype=dtype, device=device), w13, w2, m.top_k),
                    min(T * m.top_k, m.experts) * expert_bytes, random)

                def moe_bytes(sets=sets, m=m, T=T, expert_bytes=expert_bytes):
                    # experts actually hit (mean over the rotating sets) + hidden in, logits in, output out
                    hit = sum(int(torch.unique(torch.topk(lg.float(), m.top_k, dim=-1).indices).numel())
                              for _, lg, *_ in sets) / len(sets)
                    return int(hit * expert_bytes + 2 * T * m.hidden * es + T * m.experts * es)

                name = f"fused_moe {m.name} E{m.experts} top{m.top_k}"
                flops = 6 * T * m.top_k * m.hidden * m.inter
                if T <= ok.moe_configs.decode_tokens(m.hidden, m.inter):
                    # the one-launch path with a kept workspace (as the engine runs it), and the grouped path's
                    # four launches on the same inputs: the same-run before/after
                    workspace = ok.SplitKWorkspace(T, m.hidden, device)
                    grouped = ok.moe_configs.moe_config(T, m.hidden, m.inter, one_launch=False)
                    out.append(Case("fused_moe", name, T, lambda *a, w=workspace: ok.fused_moe(*a, workspace=w),
                                    ok.fused_moe_reference, sets, moe_bytes, flops=flops))
                    out.append(Case("fused_moe", f"{name} L2 prefetch", T,
                                    lambda *a, w=workspace: _with_prefetch(ok, lambda: ok.fused_moe(*a, workspace=w)),
                                    ok.fused_moe_reference, sets, moe_bytes, flops=flops))
                    out.append(Case("fused_moe", f"{name} 4 launches", T,
                                    lambda *a, c=grouped: ok.fused_moe(*a, config=c), ok.fused_moe_reference, sets,
                                    moe_bytes, flops=flops))
                    out.extend(_router_moe_cases(ok, m, T, w13, w2, name, grouped, dtype, device, random, es, flops))
                else:
                    out.append(Case("fused_moe", name, T, ok.fused_moe, ok.fused_moe_reference, sets, moe_bytes,
                                    flops=flops))
        if "decode_linear" in ops and T <= LINEAR_MAX_TOKENS:
            out.extend(_linear_cases(ok, T, dtype, device, random, es))
    return out


def _with_prefetch(ok, fn):
    """fn() with the decode kernels' L2 prefetch on (`omni_kernels.set_prefetch`), restored afterwards."""
    was = ok.prefetch()
    ok.set_prefetch(True)
    try:
        return fn()
    finally:
        ok.set_prefetch(was)


def _router_moe_cases(ok, m: MoeModel, T: int, w13, w2, name: str, grouped, dtype, device: str, random: bool,
                      es: int, flops: int) -> list[Case]:
    """The router GEMM and the experts at a decode token count, as the engine runs them (the router as
    decode_linear where the table says it is faster, the one-launch MoE) and as it ran them before (torch's router
    GEMM, the grouped path's four launches), on the same inputs. Bytes: the experts hit, the router weight,
    hidden in, output out."""
    import torch.nn.functional as F

    expert_bytes = 3 * m.hidden * m.inter * es
    sets = _rotating(lambda: (_tensor((T, m.hidden), dtype, device, random),
                              _tensor((m.experts, m.hidden), dtype, device, random, m.hidden ** -0.5 * 4), w13, w2,
                              m.top_k), min(T * m.top_k, m.experts) * expert_bytes, random)

    def moved(sets=sets):
        hit = sum(int(torch.unique(torch.topk(F.linear(x, wg).float(), m.top_k, dim=-1).indices).numel())
                  for x, wg, *_ in sets) / len(sets)
        return int(hit * expert_bytes + m.experts * m.hidden * es + 2 * T * m.hidden * es)
    router_ws, moe_ws = ok.SplitKWorkspace(T, m.experts, device), ok.SplitKWorkspace(T, m.hidden, device)
    faster = ok.linear_decode.decode_linear_faster(m.experts, m.hidden, with_norm=False)
    router = (lambda x, wg: ok.decode_linear(x, wg, router_ws)) if faster else F.linear
    reference = lambda x, wg, a, b, k: ok.fused_moe_reference(x, F.linear(x, wg), a, b, k)
    return [Case("fused_moe", f"router+{name} (engine)", T,
                 lambda x, wg, a, b, k: ok.fused_moe(x, router(x, wg), a, b, k, workspace=moe_ws), reference, sets,
                 moved, flops=flops),
            Case("fused_moe", f"router+{name} (before: torch router, 4 launches)", T,
                 lambda x, wg, a, b, k: ok.fused_moe(x, F.linear(x, wg), a, b, k, config=grouped), reference, sets,
                 moved, flops=flops)]


def _linear_cases(ok, T: int, dtype, device: str, random: bool, es: int) -> list[Case]:
    """decode_linear at the decoders' linear shapes (with the residual add + RMSNorm epilogue where a norm follows),
    and what it replaces on the same inputs: torch's linear (then the rms_norm kernel: two launches)."""
    import torch.nn.functional as F

    out = []
    for name, K, N, norm in LINEAR_SHAPES:
        def make(K=K, N=N):
            return (_tensor((T, K), dtype, device, random), _tensor((N, K), dtype, device, random, K ** -0.5),
                    _tensor((T, N), dtype, device, random), _tensor((N,), dtype, device, random))
        sets = _rotating(make, N * K * es, random)
        # weight and x in, output out; with the norm also the residual and norm weight in, the sum out
        moved = lambda T=T, K=K, N=N, norm=norm: (N * K + T * K + (3 * T * N + N if norm else T * N)) * es
        workspace = ok.SplitKWorkspace(T, N, device)
        if norm:
            fused = lambda x, w, r, nw, ws=workspace: ok.decode_linear(x, w, ws, r, nw, 1e-6)
            reference = lambda x, w, r, nw: ok.decode_linear_reference(x, w, r, nw, 1e-6)
            unfused = lambda x, w, r, nw: ok.rms_norm(F.linear(x, w), nw, 1e-6, r)
            labels = (f"decode_linear+norm {name}", f"linear, rms_norm {name}")
        else:
            fused = lambda x, w, r, nw, ws=workspace: ok.decode_linear(x, w, ws)
            reference = unfused = lambda x, w, r, nw: F.linear(x, w)
            labels = (f"decode_linear {name}", f"torch linear {name}")
        out.append(Case("decode_linear", labels[0], T, fused, reference, sets, moved))
        out.append(Case("decode_linear", labels[1], T, unfused, reference, sets, moved))
    return out


def _attention_case(ok, T: int, dtype, device, random: bool, es: int) -> Case:
    """decode_attention at the thinker's heads: T rows (one new token each) over ATTENTION_COLUMNS cached
    columns; bytes = the cached keys and values read + q/k/v in + the output and new key/value out."""
    def make():
        qkv = _tensor((T, (HEADS + 2 * KV_HEADS) * HEAD_DIM), dtype, device, random)
        q, k, v = (t.view(T, -1, HEAD_DIM) for t in qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                               KV_HEADS * HEAD_DIM], -1))
        caches = [_tensor((T, KV_HEADS, ATTENTION_COLUMNS, HEAD_DIM), dtype, device, random) for _ in range(2)]
        angles = torch.rand(T, HEAD_DIM // 2, device=device) * 100
        weight = _tensor((HEAD_DIM,), dtype, device, random)
        written = torch.full((T,), ATTENTION_COLUMNS - 1, dtype=torch.long, device=device)
        return (q, k, v, weight, weight, 1e-6, angles.cos().to(dtype), angles.sin().to(dtype), *caches, written,
                ATTENTION_COLUMNS, HEAD_DIM ** -0.5)
    kv_bytes = 2 * T * KV_HEADS * ATTENTION_COLUMNS * HEAD_DIM * es
    sets = _rotating(make, kv_bytes, random)
    return Case("decode_attention", f"decode_attention {HEADS}/{KV_HEADS} heads {ATTENTION_COLUMNS} cols", T,
                ok.decode_attention, ok.decode_attention_reference, sets,
                lambda: kv_bytes + (2 * HEADS + 4 * KV_HEADS) * T * HEAD_DIM * es)
