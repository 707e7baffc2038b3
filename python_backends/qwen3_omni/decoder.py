"""Static-cache, CUDA-graph decode steps for the Qwen3 decoders of Qwen3-Omni (thinker, talker, code predictor).

transformers' forward is written for flexibility, not for decode: every step builds masks and
position tensors on the host, concatenates the `DynamicCache`, and the MoE experts loop over
`nonzero()` (a host synchronisation). `StaticDecoder` runs ONE new token per live request through the
same transformers modules (their weights, norms, projections, MoE blocks) but keeps the KV in a
preallocated `StaticKVCache` and reads RoPE from a precomputed table, so a step has fixed shapes per
(batch bucket, attended columns) and is captured once as a CUDA graph (`StepGraphs`).

The prefill stays transformers' own forward into a `DynamicCache`, whose keys/values are then copied
into the request's slot (`StaticDecoder.add`): a prompt is run once, multimodal inputs and mRoPE
positions are the library's. Decode tokens of Qwen3-Omni are text tokens, whose mRoPE sections all carry
the same position, so the table of `rotary_emb` at positions 0..P-1 is exact for them.

Limits: full attention only (the three decoders have no sliding window); q/k RMSNorm per head (Qwen3).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from omni_backends.engine import fused
from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets
from omni_backends.engine.static_kv import LayerKV, StaticKVCache
from omni_backends.engine.transfer import to_device

HeadFn = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
_lean_inputs = True


def set_lean_inputs(flag: bool) -> None:
    """Let `StaticDecoder.step` hand a full bucket's embeddings to the graph as they are and skip re-copying the
    attended-column range (which the graph key fixes) before each replay: two or three launches of host work less
    per step (default). False pads and copies every input each step, as before (benchmark A/B)."""
    global _lean_inputs
    _lean_inputs = bool(flag)



def rope_table(rotary_emb: torch.nn.Module, positions: int, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] of a transformers rotary module at text positions 0..positions-1
    (all mRoPE sections equal), in `dtype` as the module returns them."""
    probe = torch.zeros(1, dtype=dtype, device=device)
    ids = torch.arange(positions, device=device)[None]
    if hasattr(rotary_emb, "mrope_section"):   # mRoPE modules of transformers 5.1x want [3, batch, positions]
        ids = ids.expand(3, 1, positions)
    cos, sin = rotary_emb(probe, ids)
    return cos[0], sin[0]


class StaticDecoder:
    """One-token-per-request decode steps of a transformers Qwen3 decoder over a `StaticKVCache`.

    Args:
        text_model: the decoder (`layers`, `norm`, `rotary_emb`; Qwen3-Omni thinker text model, talker
            model or code-predictor model).
        head: maps the final normed hidden [B, H] to the step's outputs (e.g. logits); runs inside the graph.
        slots: most live requests. max_len: most cached tokens per request.
        batch_buckets: graph batch sizes (default 1, 2, 4, ... up to slots).
        column_bucket: attended cache columns are rounded up to a multiple of this (one graph per
            (batch bucket, columns)); smaller = less KV read per step, more graphs.
        graphs: capture CUDA graphs (ignored on CPU). name: for logs.
        fuse: concatenate q/k/v (and dense gate/up) weights for one GEMM each (`fused.fuse_linears`;
            the modules keep views, so memory is unchanged). Default: on CUDA. On CPU the modules run as
            they are, which keeps the arithmetic transformers' own.
    """

    def __init__(self, text_model: torch.nn.Module, head: HeadFn, *, slots: int, max_len: int,
                 batch_buckets: Sequence[int] | None = None, column_bucket: int = 256, graphs: bool = True,
                 name: str = "decoder", fuse: bool | None = None):
        self.model, self.head = text_model, head
        self.layers = list(text_model.layers)
        attn = self.layers[0].self_attn
        self.heads, self.kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        weight = next(text_model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.cache = StaticKVCache(len(self.layers), slots, max_len, self.kv_heads, self.head_dim, self.dtype,
                                   self.device)
        positions = attn.config.max_position_embeddings
        cos, sin = rope_table(text_model.rotary_emb, positions, self.dtype, self.device)
        half = cos.shape[-1] // 2   # transformers' tables repeat each frequency over both halves
        self.cos, self.sin = cos[:, :half].contiguous(), sin[:, :half].contiguous()
        self.fused_qkv = False
        if self.device.type == "cuda" if fuse is None else fuse:
            self.fused_qkv = all([fused.fuse_linears(layer.self_attn, [layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                                       layer.self_attn.v_proj]) for layer in self.layers])
            for mlp in [layer.mlp for layer in self.layers] + [getattr(l.mlp, "shared_expert", None) for l in self.layers]:
                if mlp is not None and hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj"):
                    fused.fuse_linears(mlp, [mlp.gate_proj, mlp.up_proj])
        self.buckets = tuple(batch_buckets or power_of_two_buckets(slots))
        self.column_bucket = max(1, column_bucket)
        self._columns = torch.arange(max_len, device=self.device)
        self.graphs = StepGraphs(self._step, enabled=graphs, name=name)

    # ---- membership ----------------------------------------------------------------------------
    def add(self, request_id: str, layers: list[LayerKV]) -> int:
        """Copy a prefilled request's per-layer (keys, values) [1, kv_heads, L, head_dim] into a free slot."""
        return self.cache.add(request_id, layers)

    def add_rows(self, request_ids: list[str], lengths: list[int], layers: list[LayerKV]) -> list[int]:
        """Copy the rows of one right-padded prefill, per layer (keys, values) [rows, kv_heads, W, head_dim], into
        free slots at once (`StaticKVCache.add_rows`)."""
        return self.cache.add_rows(request_ids, lengths, layers)

    def remove(self, request_ids: Sequence[str]) -> None:
        self.cache.remove(list(request_ids))

    @torch.inference_mode()
    def warmup(self, columns: int | None = None) -> int:
        """Capture the graphs of every batch bucket for `columns` attended columns (default: the first
        column bucket) before serving, so first requests do not pay for captures. Only at start: it
        writes garbage into the cache of free slots (never read: a slot is overwritten when taken).
        Returns the number of graphs captured (0 on CPU)."""
        if self.device.type != "cuda" or not self.graphs.enabled or len(self.cache):
            return 0
        columns = columns or min(self.column_bucket, self.cache.max_len)
        for bucket in self.buckets:
            x = torch.zeros(bucket, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
            meta = torch.zeros(2, bucket, dtype=torch.long, device=self.device)
            self.graphs.run((bucket, columns), {"x": x, "meta": meta, "columns": self._columns[:columns]})
        torch.cuda.synchronize(self.device)
        return self.graphs.stats().captured

    # ---- decode --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, embeds: torch.Tensor, rope_positions: Sequence[int],
             active: Sequence[bool] | None = None, copy: bool = True) -> tuple[torch.Tensor, ...]:
        """Feed one token per live slot (slot order) and return `head`'s outputs for those rows.

        Args:
            embeds: [n, hidden] input embeddings, n = live slots, slot order.
            rope_positions: n text positions (RoPE) of these tokens.
            active: per slot; False rows are computed but their cache length does not advance (their
                outputs are meaningless). None: all active.
            copy: False: return views of the graph's outputs, which the next step of the same bucket overwrites
                (work queued on this stream before that step still reads them as they are now).

        Returns:
            `head(hidden)` with each tensor cut to n rows (copies, unless `copy` is False).

        Raises:
            ValueError: when n is not the number of live slots.
        """
        n = len(self.cache)
        if embeds.shape[0] != n or len(rope_positions) != n:
            raise ValueError(f"step() needs one token per live slot ({n}), got {embeds.shape[0]}")
        bucket = batch_bucket(n, self.buckets)
        lengths = self.cache.lengths()
        columns = min(-(-self.cache.step_columns(n) // self.column_bucket) * self.column_bucket, self.cache.max_len)
        if _lean_inputs and n == bucket and embeds.device == self.device and embeds.dtype == self.dtype:
            x = embeds   # the graph copies it into its own buffer: no padded copy first
        else:
            x = embeds.new_zeros(bucket, embeds.shape[-1]).to(self.device, self.dtype)
            x[:n] = embeds.to(self.device, self.dtype)
        pad = [0] * (bucket - n)
        meta = to_device([list(rope_positions) + pad, lengths + pad], torch.long, self.device)
        outputs = self.graphs.run((bucket, columns), {"x": x, "meta": meta, "columns": self._columns[:columns]},
                                  constant=("columns",) if _lean_inputs else ())
        self.cache.advance(None if active is None else list(active))
        return tuple(out[:n].clone() if copy else out[:n] for out in outputs)

    def _step(self, x: torch.Tensor, meta: torch.Tensor, columns: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor] | None = None, kv_only: bool = False) -> tuple[torch.Tensor, ...]:
        """The captured step: x [B, H] embeddings, meta int64 [2, B] (RoPE position, cache column), columns [C];
        rope: the rows' (cos, sin) [B, D/2] when the caller has them (else gathered from the table by position).
        kv_only: only write the step's keys and values into the cache (the last layer stops after its attention) and
        return () (a step whose output is not used, e.g. the code predictor's first)."""
        positions, written = meta[0], meta[1]
        # the fused attention kernel masks by `written` itself; the module path needs the boolean mask and row ids
        mask = rows = None
        if not fused.attention_active(x):
            mask = (columns[None, :] <= written[:, None])[:, None, None, :]
            rows = torch.arange(x.shape[0], device=x.device)
        cos, sin = rope if rope is not None else (self.cos[positions], self.sin[positions])
        h, residual = fused.rms_norm(self.layers[0].input_layernorm, x), x
        # each norm after a residual add runs with the op before it (`fused.linear_norm` / `fused.mlp_norm`: one
        # launch at decode sizes); the feed-forward block ends with the next layer's input norm (the final norm
        # after the last layer)
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.model.norm]
        for index, (layer, next_norm) in enumerate(zip(self.layers, norms)):
            attn = layer.self_attn
            out = self._attention(attn, h, index, rows, written, cos, sin, mask, len(columns))
            if kv_only and index == len(self.layers) - 1:
                return ()
            h, residual = fused.linear_norm(attn.o_proj, out, layer.post_attention_layernorm, residual)
            h, residual = fused.mlp_norm(layer.mlp, h, next_norm, residual)
        return self.head(h)

    def _attention(self, attn, h, index, rows, written, cos, sin, mask, columns: int) -> torch.Tensor:
        """Self-attention of one decode token per row up to o_proj: [B, heads * head_dim] (o_proj's input)."""
        batch = h.shape[0]
        if self.fused_qkv:
            q, k, v = fused.linear(attn, h, getattr(attn, fused.FUSED)).split(
                [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        else:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        keys, values = self.cache.keys[index], self.cache.values[index]
        if mask is None:   # kernels: q/k norms, RoPE, the cache write and the attention in one launch
            out = fused.decode_attention(attn, q.view(batch, self.heads, self.head_dim),
                                         k.view(batch, self.kv_heads, self.head_dim),
                                         v.view(batch, self.kv_heads, self.head_dim), cos, sin, keys, values,
                                         written, columns)
            return out.reshape(batch, self.heads * self.head_dim)
        q = fused.rms_norm(attn.q_norm, q.reshape(batch, self.heads, self.head_dim))
        k = fused.rms_norm(attn.k_norm, k.reshape(batch, self.kv_heads, self.head_dim))
        v = v.reshape(batch, self.kv_heads, self.head_dim)
        q, k = fused.rope(q, k, cos, sin)
        StaticKVCache.write(keys, rows, written, k)
        StaticKVCache.write(values, rows, written, v)
        # grouped-query attention as plain attention: the G query heads of a kv head are G query rows
        q = q.reshape(batch, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, keys[:batch, :, :columns], values[:batch, :, :columns], attn_mask=mask, scale=self.scaling)
        return out.reshape(batch, self.heads * self.head_dim)
