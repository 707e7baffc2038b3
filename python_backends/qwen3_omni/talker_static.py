"""The talker's GPU engine: batched static-cache talker steps and the 15-step code predictor as ONE graph.

Per codec frame the talker runs one decoder step and its code predictor (an MTP-style model of 5
layers) runs 16 inner steps to produce code groups 1..15 — in transformers that is ~16 forwards with
a fresh `DynamicCache` and a host round trip per group, the measured hot spot (three quarters of the
190 ms frame on an H200). Here:

- `TalkerDecode`: all live talker requests step together in a `StaticDecoder` (one CUDA graph per
  batch bucket); a request waiting for thinker text sits the step out (`active=False`).
- `CodePredictorFrames`: the whole inner loop for B rows — 16 predictor steps over a 16-column static
  cache, the 15 heads, the choice of each code, the codec embeddings — is one function of fixed
  shapes, captured as one CUDA graph per (batch bucket, sampling). It also returns the sum of the
  frame's 16 codec embeddings, the talker's next input. Choices: greedy rows take the argmax;
  sampled rows use `generate()`'s code-predictor sampling (top-k 50, top-p 0.8, temperature 1) by the
  exponential race (argmax of probabilities / Exp(1) noise, a categorical draw), with the noise drawn
  from the request's own generator before the replay, so a seeded request is reproducible.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets
from omni_backends.qwen3_omni.decoder import StaticDecoder

PREDICTOR_TOP_K, PREDICTOR_TOP_P = 50, 0.8   # generate()'s code-predictor sampling (temperature 1)


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
    """Code groups 1..15 of B frames at once.

    Args:
        talker: `Qwen3OmniMoeTalkerForConditionalGeneration` (its `code_predictor` and codec embedding).
        max_batch: most frames per call. graphs: capture CUDA graphs (ignored on CPU).
    """

    def __init__(self, talker: torch.nn.Module, *, max_batch: int, graphs: bool = True):
        self.predictor = talker.code_predictor
        self.talker_embed = talker.get_input_embeddings()
        self.groups = talker.config.num_code_groups
        self.vocab = self.predictor.config.vocab_size
        self.buckets = power_of_two_buckets(max_batch)
        self.decoder = StaticDecoder(self.predictor.model, head=lambda h: (h,), slots=max_batch,
                                     max_len=self.groups, column_bucket=self.groups, graphs=False,
                                     name="code-predictor")
        self._columns = torch.arange(self.groups, device=self.decoder.device)
        self.graphs = StepGraphs(self._frame, enabled=graphs, name="code-predictor")

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, code0: torch.Tensor, greedy: Sequence[bool],
                 generators: Sequence[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames for n rows.

        Args:
            hidden: [n, H] the talker's last hidden state of each row; code0: int64 [n] code group 0.
            greedy: per row; generators: per row, CPU generators for the sampled rows' noise (None: global RNG).

        Returns:
            (codes int64 [n, 16] on the device, next_embeds [n, H]: the sum of the frame's 16 codec
            embeddings, the talker's next input before its text embedding is added).
        """
        n = hidden.shape[0]
        bucket = batch_bucket(n, self.buckets)
        sampled = not all(greedy)
        inputs = {"hidden": self._pad(hidden, bucket), "code0": self._pad(code0.to(self.decoder.device), bucket)}
        if sampled:
            noise = torch.ones(bucket, self.groups - 1, self.vocab)
            for row, (is_greedy, generator) in enumerate(zip(greedy, generators)):
                if not is_greedy:
                    noise[row].exponential_(generator=generator)
            flags = torch.tensor(list(greedy) + [True] * (bucket - n))
            inputs.update(noise=noise.to(self.decoder.device), greedy=flags.to(self.decoder.device))
        codes, embeds = self.graphs.run((bucket, sampled), inputs)
        return codes[:n].clone(), embeds[:n].clone()

    @torch.inference_mode()
    def warmup(self) -> int:
        """Capture the greedy graph of every batch bucket before serving (CUDA only); returns graphs captured."""
        device = self.decoder.device
        if device.type != "cuda" or not self.graphs.enabled:
            return 0
        hidden_size = self.predictor.config.hidden_size
        for bucket in self.buckets:
            self.graphs.run((bucket, False), {"hidden": torch.zeros(bucket, hidden_size, dtype=self.decoder.dtype,
                                                                       device=device),
                                              "code0": torch.zeros(bucket, dtype=torch.long, device=device)})
        torch.cuda.synchronize(device)
        return self.graphs.stats().captured

    @staticmethod
    def _pad(tensor: torch.Tensor, rows: int) -> torch.Tensor:
        out = tensor.new_zeros(rows, *tensor.shape[1:])
        out[:tensor.shape[0]] = tensor
        return out

    def _frame(self, hidden: torch.Tensor, code0: torch.Tensor, noise: torch.Tensor | None = None,
               greedy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured inner loop (fixed shapes): 16 predictor steps, codes [B, 16], embedding sum [B, H]."""
        batch = hidden.shape[0]
        tables = self.predictor.model.codec_embedding
        x, codes = hidden.to(self.decoder.dtype), [code0]
        embeds = [self.talker_embed(code0)]
        for step in range(self.groups):
            meta = torch.full((2, batch), step, dtype=torch.long, device=hidden.device)
            (out,) = self.decoder._step(x, meta, self._columns)
            if step == 0:
                x = embeds[0]
                continue
            logits = self.predictor.lm_head[step - 1](out).float()
            code = logits.argmax(-1)
            if noise is not None:
                code = torch.where(greedy, code, nucleus_race(logits, noise[:, step - 1]))
            codes.append(code)
            embeds.append(tables[step - 1](code))
            x = embeds[-1]
        return torch.stack(codes, 1), torch.stack(embeds).sum(0)


class TalkerDecode:
    """Batched static-cache steps of the talker's decoder for all its live (prefilled) requests.

    Args:
        talker: `Qwen3OmniMoeTalkerForConditionalGeneration`.
        slots: most live requests; max_len: most talker positions per request (prompt + frames).
        graphs: capture CUDA graphs (ignored on CPU).
    """

    def __init__(self, talker: torch.nn.Module, *, slots: int, max_len: int, graphs: bool = True):
        self.decoder = StaticDecoder(talker.model, head=lambda h: (h, talker.codec_head(h).float()), slots=slots,
                                     max_len=max_len, graphs=graphs, name="talker")
