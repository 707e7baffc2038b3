"""In-process Qwen3-Omni pipeline: thinker -> talker -> code2wav, streamed, for many requests at once.

The thinker runs on its engine thread; the caller's thread drives the talker and the code2wav streamer
as thinker tokens arrive. This is the stage wiring the Triton orchestrator reproduces across models,
and the reference the tests compare with `Qwen3OmniMoeForConditionalGeneration.generate`.
"""
from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from omni_backends.engine import SamplingParams
from omni_backends.engine.options import EngineOptions
from omni_backends.qwen3_omni.code2wav import Code2WavStreamer
from omni_backends.qwen3_omni.loading import Qwen3OmniStages
from omni_backends.qwen3_omni.talker import Talker
from omni_backends.qwen3_omni.thinker import Thinker, ThinkerToken


@dataclass
class OmniRequest:
    """One chat turn: messages and audios as `PromptBuilder.build`; per-stage sampling parameters
    (`Thinker.sampling_params`, `Talker.sampling_params`); voice: a checkpoint speaker name."""

    request_id: str
    messages: Sequence[dict]
    thinker_params: SamplingParams
    talker_params: SamplingParams
    voice: str = "ethan"
    audios: Sequence[np.ndarray] = ()


@dataclass
class OmniResult:
    """token_ids: generated thinker ids; codes: int64 [16, frames]; audio: float32 [samples] at 24 kHz
    (the streamed chunks, in `chunks`, concatenated); finish_reason of the thinker."""

    token_ids: list[int] = field(default_factory=list)
    codes: torch.Tensor | None = None
    chunks: list[np.ndarray] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def audio(self) -> np.ndarray:
        """float32 [samples] at 24 kHz: all streamed chunks concatenated."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


class LocalOmniPipeline:
    """Runs the three stages of `stages` in this process (see module doc).

    Args:
        stages: `loading.load_stages(dir)`.
        tts_embeds: float [3, H_thinker] (`loading.load_tts_embeds`).
        chunk_frames, first_chunk_frames, left_context_frames: `Code2WavStreamer` settings.
        options: the thinker's and talker's engine (`EngineOptions`; default: "dynamic").
        max_running: most requests each engine holds at once.
    """

    def __init__(self, stages: Qwen3OmniStages, tts_embeds: torch.Tensor, chunk_frames: int = 25,
                 first_chunk_frames: int = 5, left_context_frames: int = 25, options: EngineOptions | None = None,
                 max_running: int = 32):
        self.thinker = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                               max_running=max_running, options=options)
        self.talker = Talker(stages.talker, stages.config, tts_embeds, options=options, max_running=max_running)
        self.code2wav = Code2WavStreamer(stages.code2wav, chunk_frames, first_chunk_frames, left_context_frames)

    def close(self) -> None:
        """Stop the thinker's engine thread."""
        self.thinker.shutdown()

    def run(self, requests: Sequence[OmniRequest]) -> dict[str, OmniResult]:
        """Run all requests together until each has its text and audio. Raises RuntimeError with the
        thinker's error text when a request fails there."""
        tokens: queue.Queue[tuple[str, ThinkerToken]] = queue.Queue()
        results = {r.request_id: OmniResult(codes=torch.zeros(16, 0, dtype=torch.long)) for r in requests}
        by_id = {r.request_id: r for r in requests}
        for r in requests:
            self.talker.speaker_id(r.voice)   # fail fast on an unknown voice
            self.thinker.submit(r.request_id, r.messages, r.thinker_params, lambda rid, t: tokens.put((rid, t)),
                                audios=r.audios)
        text_open, audio_open = set(by_id), set(by_id)
        while audio_open:
            self._drain(tokens, by_id, results, text_open, block=bool(text_open) and not self.talker.has_ready())
            frames = self.talker.step()
            new = {rid: out.codes for rid, out in frames.items()}
            done = [rid for rid, out in frames.items() if out.finished]
            for rid, codes in new.items():
                results[rid].codes = torch.cat([results[rid].codes, codes], -1)
            pushed = {rid: codes for rid, codes in new.items() if codes.shape[-1] or rid in self.code2wav}
            ending = [rid for rid in done if rid in pushed]
            for rid, pcm in self.code2wav.step(pushed, final=ending).items():
                results[rid].chunks.append(pcm)
            audio_open -= set(done)
        return results

    def _drain(self, tokens, by_id, results, text_open: set, block: bool) -> None:
        """Hand every queued thinker token to the talker (waiting for one first when `block`)."""
        while True:
            try:
                rid, tok = tokens.get(block=block)
            except queue.Empty:
                return
            block = False
            result = results[rid]
            if tok.error is not None:
                raise RuntimeError(f"thinker failed for {rid}: {tok.error}")
            if tok.talker_prompt is not None:
                req = by_id[rid]
                self.talker.add_request(rid, tok.talker_prompt, req.voice, req.talker_params)
            if tok.token_id is not None:
                result.token_ids.append(tok.token_id)
                self.talker.push_text(rid, tok.embed, final=tok.finished)
            if tok.finished:
                result.finish_reason = tok.finish_reason
                text_open.discard(rid)
