"""The talker's GPU engine: batched static-cache talker steps and the 15-step code predictor as ONE graph.

Per codec frame the talker runs one decoder step and its code predictor (an MTP-style model of 5
layers) runs 16 inner steps to produce code groups 1..15 — in transformers that is ~16 forwards with
a fresh `DynamicCache` and a host round trip per group, the measured hot spot (three quarters of the
190 ms frame on an H200). Here:

- `TalkerDecode`: all live talker requests step together in a `StaticDecoder` (one CUDA graph per
  batch bucket); a request waiting for thinker text sits the step out (`active=False`). It keeps each
  slot's last hidden state and code-0 logits on the device (`hidden`, `logits`), so a frame reads them
  as they are: no per-request tensors between the step and the next frame.
- `CodePredictorFrames`: a whole frame for B rows — the choice of code group 0 from the talker's logits
  (greedy rows on the device: `sampling.greedy_pick`; other rows' code 0 given by the host), 16 predictor
  steps over a 16-column static cache, the 15 heads, the choice of each code, the codec embeddings — is
  one function of fixed shapes, captured as one CUDA graph per (batch bucket, sampling). It also returns
  the sum of the frame's 16 codec embeddings, the talker's next input. Choices: greedy rows take the
  argmax; sampled rows use `generate()`'s code-predictor sampling (top-k 50, top-p 0.8, temperature 1)
  by the exponential race (argmax of probabilities / Exp(1) noise, a categorical draw), with the noise
  drawn from the request's own generator before the replay, so a seeded request is reproducible.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from omni_backends.engine import fused
from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets
from omni_backends.engine.sampling import greedy_pick
from omni_backends.engine.static_kv import LayerKV
from omni_backends.engine.transfer import to_device
from omni_backends.qwen3_omni.decoder import StaticDecoder

PREDICTOR_TOP_K, PREDICTOR_TOP_P = 50, 0.8   # generate()'s code-predictor sampling (temperature 1)
_lean_frame = True


def set_lean_frame(flag: bool) -> None:
    """Let the frame graph read each inner step's positions and RoPE rows from tables made once and pick a code from
    the head's logits as they are (argmax of bf16 = argmax of their exact fp32 copy): ~63 fewer launches per frame
    (default). False builds them in every step as before (benchmark A/B; read at graph capture)."""
    global _lean_frame
    _lean_frame = bool(flag)


_lean_steps = True


def set_lean_steps(flag: bool) -> None:
    """Let the frame graph's first predictor step (whose output is discarded: it only writes the talker hidden
    state's K/V) stop after the last layer's attention, and a greedy graph pick each code and look up its embedding in
    one launch (`fused.greedy_embedding`): ~20 launches fewer per frame, the same codes (default; with `set_lean_frame`).
    False runs every step whole and the pick as arg-max + embedding (as before run 29; benchmark A/B; read at graph
    capture)."""
    global _lean_steps
    _lean_steps = bool(flag)


def nucleus_race(logits: torch.Tensor, noise: torch.Tensor, top_k: int = PREDICTOR_TOP_K,
                 top_p: float = PREDICTOR_TOP_P) -> torch.Tensor:
    """Sample one id per row from top-k then top-p filtered softmax(logits) [B, V] given Exp(1) noise [B, V];
    fixed shapes, no host synchronisation. Returns int64 [B]."""
    scores = logits.float()
    kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
    scores = scores.masked_fill(scores < kth, float("-inf"))
    ordered, order = torch.sort(scores, dim=-1)
    remove = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
    remove[:, -1] = False
    scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return (scores.softmax(-1) / noise).argmax(-1)


class CodePredictorFrames:
    """Whole codec frames (code group 0 and groups 1..15) of B rows at once.

    Args:
        talker: `Qwen3OmniMoeTalkerForConditionalGeneration` (its `code_predictor` and codec embedding).
        max_batch: most frames per call. graphs: capture CUDA graphs (ignored on CPU).
        suppress, stop: code-0 ids the device pick never produces / masks while a row's `stop_rows` flag is set
            (`Talker.sampling_params`' suppress list and codec_eos).
    """

    def __init__(self, talker: torch.nn.Module, *, max_batch: int, graphs: bool = True,
                 suppress: Sequence[int] = (), stop: Sequence[int] = ()):
        self.predictor = talker.code_predictor
        self.talker_embed = talker.get_input_embeddings()
        self.groups = talker.config.num_code_groups
        self.vocab = self.predictor.config.vocab_size
        self.buckets = power_of_two_buckets(max_batch)
        self.decoder = StaticDecoder(self.predictor.model, head=lambda h: (h,), slots=max_batch,
                                     max_len=self.groups, column_bucket=self.groups, graphs=False,
                                     name="code-predictor")
        device, groups = self.decoder.device, self.groups
        self._columns = torch.arange(groups, device=device)
        # per inner step: meta [2, max_batch] (position = cache column = step) and the RoPE rows [max_batch, D/2]
        self._metas = torch.arange(groups, device=device).view(groups, 1, 1).expand(groups, 2, max_batch).contiguous()
        self._ropes = [table[:groups, None].expand(groups, max_batch, table.shape[-1]).contiguous()
                       for table in (self.decoder.cos, self.decoder.sin)]
        self._suppress = torch.tensor(list(suppress), dtype=torch.long, device=self.decoder.device)
        self._stop = torch.tensor(list(stop), dtype=torch.long, device=self.decoder.device)
        self.graphs = StepGraphs(self._frame, enabled=graphs, name="code-predictor")

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, code0: Sequence[int], stop_rows: Sequence[bool],
                 greedy: Sequence[bool], generators: Sequence[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames for n = len(code0) rows.

        Args:
            hidden: [m >= n, H] the talker's last hidden state of each row; logits: float [m >= n, V] its code-0 logits
                (rows past n are ignored; a full bucket of rows is read as it is, without a padded copy).
            code0: per row, code group 0 chosen by the host, or -1: the greedy pick on the device (`greedy_pick`
                with the constructor's suppress and stop ids; stop masked where `stop_rows`).
            greedy: per row, groups 1..15 by argmax (else sampled); generators: per row, CPU generators for the
                sampled rows' noise (None: global RNG).

        Returns:
            (codes int64 [n, 16], next_embeds [n, H]: the sum of the frame's 16 codec embeddings, the talker's next
            input before its text embedding is added), on the device; with graphs, views of graph memory valid until
            the next call of the same batch bucket (stream order: work queued on this stream before that call reads
            them as they are now).
        """
        n = len(code0)
        bucket = batch_bucket(n, self.buckets)
        sampled = not all(greedy)
        pad = bucket - n
        inputs = {"hidden": self._rows(hidden, bucket), "logits": self._rows(logits, bucket),
                  "picks": to_device([list(code0) + [-1] * pad, [int(s) for s in stop_rows] + [0] * pad], torch.long,
                                     self.decoder.device)}
        if sampled:
            noise = torch.ones(bucket, self.groups - 1, self.vocab)
            for row, (is_greedy, generator) in enumerate(zip(greedy, generators)):
                if not is_greedy:
                    noise[row].exponential_(generator=generator)
            flags = torch.tensor(list(greedy) + [True] * pad)
            inputs.update(noise=noise.to(self.decoder.device), greedy=flags.to(self.decoder.device))
        codes, embeds = self.graphs.run((bucket, sampled), inputs)
        return codes[:n], embeds[:n]

    @torch.inference_mode()
    def warmup(self) -> int:
        """Capture the greedy graph of every batch bucket before serving (CUDA only); returns graphs captured."""
        device = self.decoder.device
        if device.type != "cuda" or not self.graphs.enabled:
            return 0
        hidden_size = self.predictor.config.hidden_size
        vocab = self.talker_embed.num_embeddings
        for bucket in self.buckets:
            self.graphs.run((bucket, False), {
                "hidden": torch.zeros(bucket, hidden_size, dtype=self.decoder.dtype, device=device),
                "logits": torch.zeros(bucket, vocab, dtype=torch.float32, device=device),
                "picks": torch.zeros(2, bucket, dtype=torch.long, device=device)})
        torch.cuda.synchronize(device)
        return self.graphs.stats().captured

    @staticmethod
    def _rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
        """The first `rows` rows of `tensor`, zero-padded when it has fewer."""
        if tensor.shape[0] >= rows:
            return tensor[:rows]
        out = tensor.new_zeros(rows, *tensor.shape[1:])
        out[:tensor.shape[0]] = tensor
        return out

    def _frame(self, hidden: torch.Tensor, logits: torch.Tensor, picks: torch.Tensor, noise: torch.Tensor | None = None,
               greedy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured frame (fixed shapes): code 0 (picks [2, B]: the host's code 0 or -1, the stop-mask flag),
        16 predictor steps; codes [B, 16], embedding sum [B, H]."""
        batch = hidden.shape[0]
        tables = self.predictor.model.codec_embedding
        code0 = torch.where(picks[0] >= 0, picks[0], greedy_pick(logits, self._suppress, self._stop, picks[1] > 0))
        x, codes = hidden.to(self.decoder.dtype), [code0]
        embeds = [self.talker_embed(code0)]
        lean = _lean_frame and _lean_steps
        for step in range(self.groups):
            if _lean_frame:
                rope = (self._ropes[0][step, :batch], self._ropes[1][step, :batch])
                outs = self.decoder._step(x, self._metas[step, :, :batch], self._columns, rope,
                                          kv_only=lean and step == 0)
            else:
                meta = torch.full((2, batch), step, dtype=torch.long, device=hidden.device)
                outs = self.decoder._step(x, meta, self._columns)
            if step == 0:
                x = embeds[0]
                continue
            logits = self.predictor.lm_head[step - 1](outs[0])
            if lean and noise is None:
                code, x = fused.greedy_embedding(logits, tables[step - 1])
            else:
                code = (logits if _lean_frame else logits.float()).argmax(-1)
                if noise is not None:
                    code = torch.where(greedy, code, nucleus_race(logits, noise[:, step - 1]))
                x = tables[step - 1](code)
            codes.append(code)
            embeds.append(x)
        return torch.stack(codes, 1), torch.stack(embeds).sum(0)


class TalkerDecode:
    """Batched static-cache steps of the talker's decoder for all its live (prefilled) requests, and each live slot's
    last outputs.

    Args:
        talker: `Qwen3OmniMoeTalkerForConditionalGeneration`.
        slots: most live requests; max_len: most talker positions per request (prompt + frames).
        graphs: capture CUDA graphs (ignored on CPU).

    Attributes:
        decoder: the `StaticDecoder` (slot order: `decoder.cache.request_ids`).
        hidden: [slots, H] the last-layer hidden state and logits: float32 [slots, V] the code-0 logits after each
            live slot's last position (its prefill, or the last step in which it was active); rows past the live
            slots are stale.
    """

    def __init__(self, talker: torch.nn.Module, *, slots: int, max_len: int, graphs: bool = True):
        self.decoder = StaticDecoder(talker.model, head=lambda h: (h, talker.codec_head(h).float()), slots=slots,
                                     max_len=max_len, graphs=graphs, name="talker")
        device, dtype = self.decoder.device, self.decoder.dtype
        self.hidden = torch.zeros(slots, talker.config.text_config.hidden_size, dtype=dtype, device=device)
        self.logits = torch.zeros(slots, talker.codec_head.out_features, dtype=torch.float32, device=device)

    def add(self, request_id: str, layers: list[LayerKV], hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """A prefilled request: its KV (`StaticDecoder.add`) and its prompt's last hidden [H] and logits [V]."""
        slot = self.decoder.add(request_id, layers)
        self.hidden[slot], self.logits[slot] = hidden, logits

    def add_rows(self, request_ids: list[str], lengths: list[int], layers: list[LayerKV], hidden: torch.Tensor,
                 logits: torch.Tensor) -> None:
        """The rows of one right-padded prefill (`StaticDecoder.add_rows`) with their last hidden [k, H] and logits
        [k, V]: one copy each for the whole burst."""
        slots = self.decoder.add_rows(request_ids, lengths, layers)
        self.hidden[slots[0]:slots[-1] + 1], self.logits[slots[0]:slots[-1] + 1] = hidden, logits

    def step(self, embeds: torch.Tensor, positions: Sequence[int], active: Sequence[bool]) -> None:
        """One decoder step of every live slot (`StaticDecoder.step`); the active slots' outputs become their
        `hidden` / `logits` (one copy each when all are active)."""
        hidden, logits = self.decoder.step(embeds, positions, active=active, copy=False)
        n = len(active)
        if all(active):
            self.hidden[:n], self.logits[:n] = hidden, logits
            return
        rows = to_device([i for i, a in enumerate(active) if a], torch.long, self.decoder.device)
        self.hidden.index_copy_(0, rows, hidden.index_select(0, rows))
        self.logits.index_copy_(0, rows, logits.index_select(0, rows))

    def remove(self, request_id: str) -> None:
        """Free a request's slot (unknown ids are ignored); the last slot's outputs move into the hole with its KV."""
        cache = self.decoder.cache
        if request_id not in cache:
            return
        hole, last = cache.slot(request_id), len(cache) - 1
        if hole != last:
            self.hidden[hole], self.logits[hole] = self.hidden[last], self.logits[last]
        self.decoder.remove([request_id])
