"""Qwen3-Omni talker stage: thinker text embeddings -> codec frames (16 codes per 80 ms frame).

Reproduces `Qwen3OmniMoeForConditionalGeneration.generate` (transformers 5.24) with the talker fed in a
stream: the prefill is the user turns (text positions: `text_projection(thinker layer-0 embedding)`,
multimodal placeholders: `hidden_projection(thinker accept-layer hidden)`) plus the 9-position assistant
prefill (`<|im_start|>assistant\\n`, 4 x tts_pad, tts_bos, first generated token, each summed with the
codec specials nothink / think_bos / think_eos / speaker / pad / bos). Every frame then consumes ONE thinker
text embedding (generated token k+1 at frame k), then tts_eos after the text, then tts_pad. A request
whose next text embedding has not arrived yet waits (it is never padded). Per frame the talker head picks
code group 0 and the code predictor (an MTP-style inner loop) the other 15 groups. Positions: 0, 1, 2, ... in all
three M-RoPE sections, except for a prompt whose user turns hold images: its prefill takes `generate`'s M-RoPE
positions over the talker's ids (`mrope.image_positions`) and each later position is the cache column plus the
prompt's rope delta.

Two engines (`EngineOptions.engine`):
- "dynamic" (the CPU default): the code predictor runs batched over all requests that advance in a
  step; the talker's own forward runs per request (each request keeps its own `DynamicCache`).
- "static" (GPU serving): all requests step together through a static KV cache, and a frame — code 0
  picked on the device for greedy requests, the code predictor's 15-step inner loop, the codec embeddings —
  runs as one CUDA graph (`talker_static`); same codes as "dynamic" for greedy requests (tested on CPU).
  Requests beyond its `max_running` KV slots queue in arrival order (their text buffers) until a slot frees.
  A step's host work overlaps the GPU's: the next talker step is launched before the frame's codes are
  read, and that read (one per step) waits for the frame alone; greedy requests without penalties need no
  other host synchronisation (sampled or penalised ones read their code-0 logits first).
  A prompt with images is prefilled by the eager forward with its positions (the prefill graphs take 0..W-1).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from omni_backends.engine.kv_batch import cache_layers
from omni_backends.engine.options import EngineOptions
from omni_backends.engine.prefill_graphs import MAX_BATCH as PREFILL_GRAPH_BATCH, PrefillGraphs
from omni_backends.engine.runner import cache_kwargs
from omni_backends.engine.sampling import SamplingParams, make_generator, sample_next_token, sample_rows
from omni_backends.engine.transfer import HostCopy
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.mrope import image_positions
from omni_backends.qwen3_omni.talker_static import CodePredictorFrames, TalkerDecode

CODE_PREDICTOR_SAMPLING = SamplingParams(do_sample=True, top_k=50, top_p=0.8)   # generate()'s, when sampling
ASSISTANT_PREFILL = 9   # talker prompt positions after the user turns (`_prefill_embeds`)


def codec_suppress(talker_config) -> tuple[int, ...]:
    """Code-0 ids `generate` never lets the talker produce: the last 1,024 of the codec vocabulary (its specials)
    except codec_eos."""
    vocab = talker_config.text_config.vocab_size
    return tuple(i for i in range(vocab - 1024, vocab) if i != talker_config.codec_eos_token_id)


@dataclass
class TalkerPrompt:
    """What the thinker hands the talker once per request.

    Fields:
        prompt_ids: int64 [P] the thinker prompt ids (ChatML, placeholders expanded).
        prompt_embeds: float [P, H_thinker] thinker layer-0 hidden states of the prompt.
        mm_hidden: float [M, H_thinker] thinker hidden states at layer `accept_hidden_layer` for the
            M audio/image/video placeholder positions of the prompt, in prompt order (M may be 0).
        image_grid_thw: int64 [K, 3] the (t, h, w) patch grid of each image of the prompt, in order; None (or K = 0)
            without images. The talker's M-RoPE positions of the images' placeholders come from it.
    """

    prompt_ids: torch.Tensor
    prompt_embeds: torch.Tensor
    mm_hidden: torch.Tensor
    image_grid_thw: torch.Tensor | None = None


@dataclass
class TalkerOutput:
    """One step's output of one request: `codes` int64 [16, n] (n = 0 or 1 frame at 12.5 Hz, layout of
    transformers `Qwen3OmniMoeCode2Wav` input); `finished` with `finish_reason` "stop" (codec_eos or the
    text ended before a frame), "length" (max_frames) or "abort"."""

    codes: torch.Tensor
    finished: bool = False
    finish_reason: str | None = None


@dataclass
class _Request:
    prompt: TalkerPrompt
    speaker_id: int
    max_frames: int
    params: SamplingParams
    generator: torch.Generator | None
    first_text: torch.Tensor | None = None          # projected embedding of generated token 0 [H]
    trailing: list[torch.Tensor] = field(default_factory=list)   # projected text per frame [H] each
    text_ended: bool = False
    cache: DynamicCache | None = None               # "dynamic" engine: the request's own KV
    prefilled: bool = False
    position: int = 0                                # cached talker positions (the next one's cache column)
    prompt_positions: torch.Tensor | None = None     # M-RoPE [3, n] of a prompt with images (None: 0..n-1)
    rope_delta: int = 0                              # RoPE position - cache column after the prompt (<= 0)
    logits: torch.Tensor | None = None               # "dynamic": [V] next code-0 logits ("static": TalkerDecode's)
    hidden: torch.Tensor | None = None               # "dynamic": [H] talker last-layer hidden of the last position
    code0_ids: list[int] = field(default_factory=list)

    def text_ready(self) -> bool:
        """True when the text embedding of the next frame exists (or the text ended: tts_pad)."""
        return self.text_ended or len(self.trailing) > len(self.code0_ids)

    def can_step(self) -> bool:
        """True when `Talker.step` would advance this request (prefill, a frame, or finish)."""
        if not self.prefilled:
            return self.first_text is not None or self.text_ended
        return self.text_ready()


class Talker:
    """Streaming talker over live requests; not thread-safe (one engine thread drives `step`).

    Args:
        model: `Qwen3OmniMoeTalkerForConditionalGeneration` (eval mode).
        config: the checkpoint's `Qwen3OmniMoeConfig` (top level: token ids of the thinker vocabulary).
        tts_embeds: float [3, H_thinker] thinker layer-0 embeddings of [tts_bos, tts_eos, tts_pad]
            (`loading.load_tts_embeds`).
        options: engine choice (module doc); `max_len` bounds a request's talker positions (prompt + frames)
            with the "static" engine. max_running: the "static" engine's KV slots (requests beyond them queue).
    """

    def __init__(self, model, config, tts_embeds: torch.Tensor, options: EngineOptions | None = None,
                 max_running: int = 32):
        self.model, self.config, self.tc = model, config, config.talker_config
        self.device = next(model.parameters()).device
        self.options = options or EngineOptions()
        self.decode: TalkerDecode | None = None
        self.frames: CodePredictorFrames | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.groups = self.tc.num_code_groups
        self.suppress = codec_suppress(self.tc)
        if self.options.engine == "static":
            self.decode = TalkerDecode(model, slots=max_running, max_len=self.options.max_len,
                                       graphs=self.options.cuda_graphs)
            self.frames = CodePredictorFrames(model, max_batch=max_running, graphs=self.options.cuda_graphs,
                                              suppress=self.suppress, stop=(self.tc.codec_eos_token_id,))
            if tokens := min(self.options.graph_prefill_tokens(self.device), self.options.max_len - 1):
                self.prefill_graphs = PrefillGraphs(self._padded_forward, hidden=1, max_tokens=tokens,
                                                    max_batch=min(max_running, PREFILL_GRAPH_BATCH),
                                                    name="talker-prefill")
        self.mm_ids = torch.tensor([config.thinker_config.audio_token_id, config.thinker_config.image_token_id,
                                    config.thinker_config.video_token_id])
        with torch.no_grad():
            self.tts_bos, self.tts_eos, self.tts_pad = self._project_text(tts_embeds)
        self._requests: dict[str, _Request] = {}

    def warmup(self) -> int:
        """Capture the static engine's graphs before serving (CUDA only); returns graphs captured."""
        if self.decode is None:
            return 0
        captured = self.decode.decoder.warmup() + self.frames.warmup()
        if self.prefill_graphs is not None:
            with torch.inference_mode():
                example = torch.zeros(1, self.tc.text_config.hidden_size, dtype=self.model.dtype, device=self.device)
                captured += self.prefill_graphs.warmup(example)
        return captured

    @property
    def voices(self) -> list[str]:
        """Speaker names of the checkpoint (`talker_config.speaker_id` keys), sorted."""
        return sorted(self.tc.speaker_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def has_ready(self) -> bool:
        """True when `step` would advance at least one request (else it must wait for thinker text, or for a
        static slot)."""
        free = self._free_slots()
        return any(req.can_step() and (req.prefilled or req.first_text is None or free > 0)
                   for req in self._requests.values())

    def ready(self, request_id: str) -> bool:
        """True when `step` would advance this request once it holds a slot (a request queued for a static slot is
        ready: it needs no more text); False while it waits for thinker text (or is unknown)."""
        req = self._requests.get(request_id)
        return req is not None and req.can_step()

    def _free_slots(self) -> int:
        """Static KV slots free for the prefill of queued requests (unbounded with the "dynamic" engine)."""
        return self.decode.decoder.cache.free_slots if self.decode is not None else len(self._requests)

    def speaker_id(self, voice: str) -> int:
        """Codec id of a voice, case-insensitive. Raises RequestError (a ValueError) naming the valid voices."""
        speaker = self.tc.speaker_id.get(voice.lower())
        if speaker is None:
            raise RequestError(f"unknown voice {voice!r}; valid voices: {', '.join(self.voices)}", param="voice")
        return speaker

    def sampling_params(self, *, do_sample: bool = True, temperature: float = 0.9, top_k: int = 50,
                        top_p: float = 1.0, repetition_penalty: float = 1.05, seed: int | None = None,
                        max_frames: int = 4095, min_frames: int = 0) -> SamplingParams:
        """Code-group-0 sampling with `generate()`'s talker defaults; codec specials other than codec_eos
        are suppressed and codec_eos stops (not before `min_frames` frames, `generate`'s
        `talker_min_new_tokens - 1`). `repetition_penalty` applies to the generated code-0 ids."""
        return SamplingParams(max_tokens=max_frames, min_tokens=min_frames, do_sample=do_sample,
                              temperature=temperature, top_k=top_k, top_p=top_p,
                              repetition_penalty=repetition_penalty, seed=seed,
                              stop_token_ids=(self.tc.codec_eos_token_id,), suppress_token_ids=self.suppress)

    def add_request(self, request_id: str, prompt: TalkerPrompt, voice: str, params: SamplingParams) -> None:
        """Start a request; it prefills once its first text token arrives (`push_text`) and, with the "static"
        engine, a KV slot is free: requests beyond the `max_running` slots wait in arrival order (their text
        buffers meanwhile) and are prefilled as slots free.

        `params.max_tokens` is the most frames (generate's `talker_max_new_tokens - 1`).
        Raises RequestError on an unknown voice, image grids that do not fit the prompt's image placeholders, or
        (400 `context_length_exceeded`, param "messages") a talker prompt (the user turns plus 9 positions) that
        leaves no frame within the static engine's `max_len`; ValueError on a duplicate request id.
        """
        if request_id in self._requests:
            raise ValueError(f"talker request {request_id!r} already exists")
        if self.decode is not None:
            length = int(self._user_turns(prompt.prompt_ids.to(torch.long)).sum()) + ASSISTANT_PREFILL
            if length >= self.options.max_len:
                raise RequestError(f"the talker's prompt ({length} positions: the user turns of the messages plus "
                                   f"{ASSISTANT_PREFILL}) leaves no room for speech within the talker's max_len "
                                   f"{self.options.max_len}", param="messages", code="context_length_exceeded")
        req = _Request(prompt=prompt, speaker_id=self.speaker_id(voice), max_frames=params.max_tokens, params=params,
                       generator=make_generator(params.seed))
        try:
            self._set_positions(req)
        except ValueError as exc:
            raise RequestError(f"the talker prompt's image grids: {exc}", param="IMAGE_GRID_THW") from None
        self._requests[request_id] = req

    def push_text(self, request_id: str, embeds: torch.Tensor, final: bool = False) -> None:
        """Thinker layer-0 embeddings of newly generated tokens, in order (generated token 0 first).

        embeds: float [n, H_thinker] (n >= 0). final: the last of these tokens is the thinker's last one
        (its EOS, or the token that hit max_tokens); like `generate`, it is not spoken and tts_eos follows.
        Raises KeyError for an unknown request, RuntimeError when text arrives after `final`.
        """
        self.push_texts([(request_id, embeds, final)])

    @torch.no_grad()
    def push_texts(self, items: Sequence[tuple[str, torch.Tensor, bool]]) -> None:
        """`push_text(request_id, embeds, final)` for each item, in order, with ONE text projection for all
        of them (16 streams cost one projection per step instead of 16). Raises as `push_text`; items before
        a bad one are applied."""
        parts = []
        for request_id, embeds, final in items:
            req = self._requests[request_id]
            if req.text_ended:
                raise RuntimeError(f"talker request {request_id!r}: text pushed after the final token")
            parts.append((embeds[:-1] if final else embeds).to(self.device, self.model.dtype))
        lengths = [len(part) for part in parts]
        projected = self._project_text(torch.cat(parts)) if sum(lengths) else None
        start = 0
        for (request_id, _, final), n in zip(items, lengths):
            req = self._requests[request_id]
            rows = list(projected[start:start + n]) if n else []
            start += n
            if req.first_text is None and rows:
                req.first_text = rows.pop(0)
            req.trailing += rows
            if final:
                req.text_ended = True
                if req.first_text is not None:
                    req.trailing.append(self.tts_eos)

    def cancel(self, request_id: str) -> None:
        """Forget a request (no error when it is unknown)."""
        self._requests.pop(request_id, None)
        if self.decode is not None:
            self.decode.remove(request_id)

    def reset(self) -> None:
        """Forget every request (after a failure of the stage's worker)."""
        for request_id in list(self._requests):
            self.cancel(request_id)

    @torch.no_grad()
    def step(self, on_prefill: Callable[[list[str], float], None] | None = None) -> dict[str, TalkerOutput]:
        """Advance every request that can: prefill new ones, then one codec frame each for those whose
        next text embedding exists. Returns request id -> TalkerOutput for requests that produced a frame
        or finished; finished requests are forgotten. on_prefill(request ids, started): called once the
        prefill of new requests is launched (started: its `time.monotonic()` start; the device may still run it)."""
        out: dict[str, TalkerOutput] = {}
        new = [rid for rid, req in self._requests.items() if not req.prefilled and req.first_text is not None]
        new = new[:self._free_slots()]   # arrival order: the others wait for a static slot
        if new:
            started = time.monotonic()
            self._prefill(new)
            if on_prefill is not None:
                on_prefill([rid for rid in new if self._requests[rid].prefilled], started)
        for rid, req in self._requests.items():
            if not req.prefilled and req.first_text is None and req.text_ended:
                out[rid] = TalkerOutput(self._no_codes(), True, "stop")   # the thinker said nothing to speak
        ready = [rid for rid, req in self._requests.items() if req.prefilled and req.text_ready() and rid not in out]
        if ready:
            (self._dynamic_frames if self.decode is None else self._static_frames)(ready, out)
        for rid, result in out.items():
            if result.finished:
                self.cancel(rid)
        return out

    def _dynamic_frames(self, ready: list[str], out: dict[str, TalkerOutput]) -> None:
        """One frame of each ready request into `out` ("dynamic" engine): code 0 of all at once, the code predictor
        batched over those that go on, then each one's talker forward on its next input."""
        reqs = [self._requests[rid] for rid in ready]
        frame_rids = []
        for rid, req, code0 in zip(ready, reqs, self._pick_code0(reqs, torch.stack([r.logits for r in reqs]))):
            if code0 == self.tc.codec_eos_token_id:
                out[rid] = TalkerOutput(self._no_codes(), True, "stop")
                continue
            req.code0_ids.append(code0)
            frame_rids.append(rid)
        for rid, codes in zip(frame_rids, self._predict_residual_codes(frame_rids)):
            req = self._requests[rid]
            done = len(req.code0_ids) >= req.max_frames
            out[rid] = TalkerOutput(codes[:, None], done, "length" if done else None)
            if not done:
                self._forward(req, (self._codec_sum(codes) + self._text(req, len(req.code0_ids) - 1))[None])

    def _static_frames(self, ready: list[str], out: dict[str, TalkerOutput]) -> None:
        """One frame of each ready request into `out` ("static" engine), over the live slots in slot order: code 0
        (greedy requests without penalties: picked inside the frame's graph; others: `_pick_code0` on their logits
        first), the frame graph, then the next talker step of the requests that go on, launched BEFORE the frame's
        codes are read back, so the GPU runs it while the host reads the codes and does the step's bookkeeping. A
        request whose code 0 turns out to be codec_eos is stepped with the others and then removed (rows of a step
        are independent: the others' results are those of a step without it)."""
        eos = self.tc.codec_eos_token_id
        order = self.decode.decoder.cache.request_ids
        reqs = [self._requests[rid] for rid in order]
        framing = set(ready)
        framed = [rid in framing for rid in order]
        code0 = [-1] * len(order)   # -1: picked on the device
        host = [row for row, (req, f) in enumerate(zip(reqs, framed)) if f and not self._picks_on_device(req.params)]
        if host:
            for row, code in zip(host, self._pick_code0([reqs[row] for row in host], self.decode.logits[host])):
                code0[row] = code
        codes, sums = self.frames(self.decode.hidden, self.decode.logits, code0,
                                  [len(req.code0_ids) < req.params.min_tokens for req in reqs],
                                  [req.params.greedy or not f or c == eos for req, f, c in zip(reqs, framed, code0)],
                                  [req.generator for req in reqs])
        read = HostCopy(codes)
        active = [f and c != eos and len(req.code0_ids) + 1 < req.max_frames for req, f, c in zip(reqs, framed, code0)]
        if any(active):
            texts = torch.stack([self._text(req, len(req.code0_ids)) for req in reqs])
            self.decode.step(sums + texts, [req.position + req.rope_delta for req in reqs], active)
            for req, a in zip(reqs, active):
                req.position += int(a)
        frames = read.result().clone()   # off the pinned buffer: the rows live on in the code2wav thread
        for rid, req, f, frame in zip(order, reqs, framed, frames):
            if not f:
                continue
            if int(frame[0]) == eos:
                out[rid] = TalkerOutput(self._no_codes(), True, "stop")
                continue
            req.code0_ids.append(int(frame[0]))
            done = len(req.code0_ids) >= req.max_frames
            out[rid] = TalkerOutput(frame[:, None], done, "length" if done else None)

    def _picks_on_device(self, params: SamplingParams) -> bool:
        """True when the frame graph's greedy pick gives `sample_rows`' code 0 for these params: greedy, no
        penalties, this talker's suppress list and codec_eos as the only stop id (`sampling_params`' defaults)."""
        return (params.greedy and params.repetition_penalty == 1.0 and not params.needs_output_ids
                and params.suppress_token_ids == self.suppress
                and params.stop_token_ids == (self.tc.codec_eos_token_id,))

    def _pick_code0(self, reqs: list[_Request], logits: torch.Tensor) -> list[int]:
        """Code group 0 of the next frame of each request from its logits [n, V], with one host synchronisation."""
        return sample_rows(logits, [r.params for r in reqs],
                           [torch.tensor(r.code0_ids, dtype=torch.long) if r.params.repetition_penalty != 1.0
                            else None for r in reqs],
                           [len(r.code0_ids) for r in reqs], [r.generator for r in reqs])

    def _text(self, req: _Request, frame: int) -> torch.Tensor:
        """[H_talker] the text embedding frame `frame` of a request consumes (tts_pad once its text has ended)."""
        return req.trailing[frame] if frame < len(req.trailing) else self.tts_pad

    def _no_codes(self) -> torch.Tensor:
        return torch.zeros(self.groups, 0, dtype=torch.long)

    def _project_text(self, embeds: torch.Tensor) -> torch.Tensor:
        """text_projection of thinker layer-0 embeddings [n, H_thinker] -> [n, H_talker]."""
        return self.model.text_projection(embeds.to(self.device, self.model.dtype))

    def _user_turns(self, ids: torch.Tensor) -> torch.Tensor:
        """bool [P]: the positions of prompt ids int64 [P] that lie in user turns (their `<|im_start|>user`
        included), the talker's prompt as `generate` selects it."""
        cfg = self.config
        im_start = torch.where(ids == cfg.im_start_token_id, torch.arange(len(ids)), -1).cummax(0).values.clamp_min(0)
        return ids[(im_start + 1).clamp_max(len(ids) - 1)] == cfg.user_token_id

    def _prefill_embeds(self, req: _Request) -> torch.Tensor:
        """[U + 9, H_talker]: the user-turn positions, then the assistant prefill (as `generate` builds it)."""
        prompt, cfg = req.prompt, self.config
        ids = prompt.prompt_ids.to(torch.long)
        user = self._user_turns(ids)
        mm = torch.isin(ids, self.mm_ids)
        user_embeds = torch.empty(int(user.sum()), self.tc.text_config.hidden_size, dtype=self.model.dtype,
                                  device=self.device)
        user_mm = mm[user]
        if user_mm.any():
            mm_rows = mm.cumsum(0)[user & mm] - 1          # rank of each user mm position among all mm positions
            user_embeds[user_mm.to(self.device)] = self.model.hidden_projection(
                prompt.mm_hidden[mm_rows].to(self.device, self.model.dtype))
        user_embeds[~user_mm.to(self.device)] = self._project_text(prompt.prompt_embeds[user & ~mm])
        starts = ((ids[:-1] == cfg.im_start_token_id) & (ids[1:] == cfg.assistant_token_id)).nonzero().flatten()
        if not len(starts):
            raise RequestError("the thinker prompt has no '<|im_start|>assistant' turn", param="messages")
        head = self._project_text(prompt.prompt_embeds[int(starts[-1]):int(starts[-1]) + 3])
        text = torch.cat([head, self.tts_pad.expand(4, -1), self.tts_bos[None], req.first_text[None]])
        specials = torch.tensor([self.tc.codec_nothink_id, self.tc.codec_think_bos_id, self.tc.codec_think_eos_id,
                                 req.speaker_id, self.tc.codec_pad_id, self.tc.codec_bos_id], device=self.device)
        codec = torch.cat([text.new_zeros(3, text.shape[-1]), self.model.get_input_embeddings()(specials)])
        return torch.cat([user_embeds, text + codec])

    def _set_positions(self, req: _Request) -> None:
        """The talker's M-RoPE positions (`mrope.image_positions`) over its input ids as `generate` builds them (the
        user-turn ids, then 9 assistant ids) when the user turns hold images: `generate`'s talker computes them from
        those ids and the image grids. Prompts without images keep positions 0, 1, 2, ... (prompt_positions None,
        rope delta 0). Raises ValueError when the grids do not fit the prompt's image placeholders."""
        ids, grids = req.prompt.prompt_ids.to(torch.long), req.prompt.image_grid_thw
        image = ids == self.tc.image_token_id
        if grids is None or not len(grids) or not image.any():
            return
        user = self._user_turns(ids)
        runs = image & ~torch.cat([image.new_zeros(1), image[:-1]])   # the first placeholder of each image
        if grids.shape != (int(runs.sum()), 3):
            raise ValueError(f"image_grid_thw of shape {tuple(grids.shape)} for {int(runs.sum())} images")
        if not (image & user).any():
            return
        talker_ids = torch.cat([ids[user], ids.new_full((9,), self.config.tts_pad_token_id)])
        req.prompt_positions, req.rope_delta = image_positions(
            talker_ids, grids[user[runs]], image_token_id=self.tc.image_token_id,
            merge_size=self.tc.spatial_merge_size, position_id_per_seconds=self.tc.position_id_per_seconds)

    def _prefill(self, rids: list[str]) -> None:
        """Run the talker prompts of new requests: per request into its own `DynamicCache` ("dynamic"), or, with
        the "static" engine, all in one right-padded forward whose rows' KV go to decoder slots (a burst of
        requests costs one forward, not one each); `add_request` has checked that each prompt fits the static cache
        and `step` that each gets a free slot."""
        embeds = {rid: self._prefill_embeds(self._requests[rid]) for rid in rids}
        if self.decode is None:
            for rid in rids:
                req = self._requests[rid]
                req.cache = DynamicCache(config=self.tc.text_config)
                self._forward(req, embeds[rid], req.prompt_positions)
                req.prefilled = True
            return
        # prompts with M-RoPE image positions run eagerly with their position ids (the graphs take 0..W-1)
        plain = [rid for rid in rids if self._requests[rid].prompt_positions is None]
        lengths = [embeds[rid].shape[0] for rid in plain]
        if self.prefill_graphs is not None and self.prefill_graphs.fits_batch(lengths):
            batch = self.prefill_graphs.run_batch([embeds[rid] for rid in plain])
            # one copy per layer (and for the last hidden states and logits) for the whole burst
            self.decode.add_rows(plain, lengths, batch.layers, torch.stack([r.hidden[0][-1] for r in batch.rows]),
                                 torch.stack([r.logits for r in batch.rows]))
            for rid, n in zip(plain, lengths):
                self._prefilled(rid, n)
            rids = [rid for rid in rids if rid not in plain]
            if not rids:
                return
        self._prefill_eager(rids, embeds)

    def _prefill_eager(self, fits: list[str], embeds: dict[str, torch.Tensor]) -> None:
        """One right-padded eager forward over the talker prompts `fits` ("static" engine), each row with its own
        positions (M-RoPE for a prompt with images, else 0..n-1); each row's KV goes to a decoder slot."""
        lengths = [embeds[rid].shape[0] for rid in fits]
        width = max(lengths)
        data = embeds[fits[0]].new_zeros(len(fits), width, embeds[fits[0]].shape[-1])
        for row, rid in enumerate(fits):
            data[row, :lengths[row]] = embeds[rid]
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long, device=self.device)
        positions = torch.arange(width).view(1, 1, width).repeat(3, len(fits), 1)
        for row, rid in enumerate(fits):
            if self._requests[rid].prompt_positions is not None:
                positions[:, row, :lengths[row]] = self._requests[rid].prompt_positions
        cache = DynamicCache(config=self.tc.text_config)
        out = self.model(inputs_embeds=data, attention_mask=mask, position_ids=positions.to(self.device),
                         **cache_kwargs(self.model, cache), use_cache=True, output_hidden_states=True,
                         generation_step=0)
        for row, (rid, n) in enumerate(zip(fits, lengths)):
            self.decode.add(rid, cache_layers(cache, row, n), out.hidden_states[0][-1][row, n - 1],
                            out.logits[row, n - 1])
            self._prefilled(rid, n)

    def _prefilled(self, rid: str, length: int) -> None:
        """A static-engine request's prompt of `length` positions ran (its KV, last hidden and logits are in its
        `TalkerDecode` slot)."""
        req = self._requests[rid]
        req.position, req.prefilled = length, True
        req.max_frames = min(req.max_frames, self.options.max_len - req.position)

    def _padded_forward(self, embeds: torch.Tensor):
        """The talker prefill `PrefillGraphs` captures: embeds [B, W, H] (right-padded) -> (codec logits [B, W, V],
        [last-layer hidden [B, W, H]], the DynamicCache); pure causal attention, positions 0..W-1."""
        batch, width = embeds.shape[:2]
        positions = torch.arange(width, device=embeds.device).view(1, 1, width).expand(3, batch, width)
        cache = DynamicCache(config=self.tc.text_config)
        out = self.model(inputs_embeds=embeds, position_ids=positions, **cache_kwargs(self.model, cache),
                         use_cache=True, output_hidden_states=True, generation_step=0)
        return out.logits, [out.hidden_states[0][-1]], cache

    def _forward(self, req: _Request, embeds: torch.Tensor, positions: torch.Tensor | None = None) -> None:
        """Append embeds [n, H_talker] to the request's cache; keep the last logits and last hidden. positions: int64
        [3, n] M-RoPE positions (None: the cache columns' text positions plus the request's rope delta)."""
        n = embeds.shape[0]
        if positions is None:
            start = req.position + req.rope_delta
            positions = torch.arange(start, start + n, device=self.device).expand(3, n)
        out = self.model(inputs_embeds=embeds[None], attention_mask=torch.ones(1, req.position + n, dtype=torch.long,
                                                                                device=self.device),
                         position_ids=positions[:, None].to(self.device), **cache_kwargs(self.model, req.cache),
                         use_cache=True, output_hidden_states=True, generation_step=0)
        req.position += n
        req.logits, req.hidden = out.logits[0, -1], out.hidden_states[0][-1][0, -1]

    def _predict_residual_codes(self, rids: list[str]) -> list[torch.Tensor]:
        """Code predictor inner loop ("dynamic" engine), batched over `rids`: code groups 1..15 from the talker
        hidden and code 0. Returns one int64 [16] frame per request (on CPU)."""
        if not rids:
            return []
        reqs = [self._requests[rid] for rid in rids]
        predictor = self.model.code_predictor
        code0 = torch.tensor([r.code0_ids[-1] for r in reqs], device=self.device)
        embeds = torch.stack([torch.stack([r.hidden for r in reqs]), self.model.get_input_embeddings()(code0)], 1)
        cache = DynamicCache(config=predictor.config)
        codes = [code0]
        for group in range(1, self.groups):
            hidden = predictor.model(inputs_embeds=embeds, **cache_kwargs(predictor.model, cache),
                                     use_cache=True).last_hidden_state[:, -1]
            logits = predictor.lm_head[group - 1](hidden)
            codes.append(torch.tensor([self._pick_residual(row, req) for row, req in zip(logits, reqs)],
                                      device=self.device))
            embeds = predictor.get_input_embeddings()[group - 1](codes[-1])[:, None]
        return list(torch.stack(codes, 1).cpu())

    def _pick_residual(self, logits: torch.Tensor, req: _Request) -> int:
        if req.params.greedy:
            return int(logits.argmax())
        return sample_next_token(logits.cpu(), CODE_PREDICTOR_SAMPLING, generator=req.generator)

    def _codec_sum(self, codes: torch.Tensor) -> torch.Tensor:
        """[H_talker]: the sum of one frame's 16 codec embeddings (codes int64 [16]), as `generate` feeds it."""
        codes = codes.to(self.device)
        residual_tables = self.model.code_predictor.get_input_embeddings()
        embeds = [self.model.get_input_embeddings()(codes[:1])]
        embeds += [residual_tables[group - 1](codes[group:group + 1]) for group in range(1, self.groups)]
        return torch.cat(embeds).sum(0)
