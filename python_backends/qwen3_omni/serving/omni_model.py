"""qwen3_omni: the client-facing Qwen3-Omni orchestrator (async BLS, decoupled).

REQUEST / INPUT_AUDIO / EVENT / AUDIO follow `omni_backends.serving.events` and
`omni_frontend.chat_protocol`. Three concurrent tasks per turn, connected by queues:
  think   streams qwen3_omni_thinker: each text delta goes to the client at once; each token's
          embedding (and, with the first, the talker prompt) goes to the talker queue;
  talk    feeds qwen3_omni_talker (sequence = this turn) with every embedding queued since its last
          request — so the talker starts after the first thinker token and waits when the thinker
          lags — and queues the codec frames it streams back;
  vocode  feeds qwen3_omni_code2wav (sequence = this turn) with every frame queued since its last
          request and sends each PCM chunk (float32 24 kHz) as an "audio.delta" event at once.
With modalities ["text"] only `think` runs. Events: {"type": "text.delta", "text"},
{"type": "audio.delta", "sample_rate": 24000, "transcript"} + AUDIO (transcript: the thinker text
written since the previous audio event, which the talker speaks; the transcripts concatenate to the
thinker's whole answer, also with modalities ["audio"]: text still unsent when the audio ends comes
in a last audio.delta with empty AUDIO; a turn whose talker made no audio at all ends with 10 ms of silence,
`Turn.last_audio`), and last {"type": "done",
"finish_reason" (the thinker's: "stop" | "length"), "usage": {"prompt_tokens", "completion_tokens"
(text tokens + codec frames), "completion_tokens_details": {"text_tokens", "audio_tokens" (codec
frames, 12.5 per second)}}, "token_ids" (with "return_token_ids": true)}.

REQUEST {"action": "voices"} -> one {"type": "voices"} event: the checkpoint's speakers.
REQUEST {"action": "prompt_tokens" | "detokenize", ...} -> the thinker's one event (`token_actions`).
REQUEST `prompt` (text or token ids) instead of `messages`: a completion, prefilled without the chat template.
Extension fields of REQUEST: "talker_do_sample", "talker_temperature", "talker_top_k", "talker_top_p",
"talker_repetition_penalty" (null: transformers `generate`'s talker defaults: sampling, 0.9, 50, 1.0,
1.05), "talker_max_frames" (null: the talker's config `max_frames`), "return_token_ids"; no other key
(`turn.REQUEST_FIELDS`).
Errors (RequestError, HTTP 400): a key outside those, empty messages, max_tokens <= 0, unknown modality, unknown voice
(the message lists the checkpoint's voices).
"""
from __future__ import annotations

import asyncio
import random

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backends.qwen3_omni.code2wav import SAMPLE_RATE
from omni_backends.qwen3_omni.loading import load_config
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.serving import turn as turns
from omni_backends.qwen3_omni.serving.turn import Turn
from omni_backends.serving import bls, events, token_actions
from omni_backends.serving.fanin import FanIn
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.serving.tensors import on_gpu

THINKER, TALKER, CODE2WAV = "qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav"
_END = object()
# the keys of a token control REQUEST passed on to the thinker
TOKEN_ACTION_FIELDS = ("action", "messages", "prompt", "max_tokens", "add_generation_prompt", "add_special_tokens",
                       "return_token_ids", "tokens")
START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class _Turn(Turn):
    """State of one chat turn shared by its tasks: the turn's usage, and the open stage sequences."""

    def __init__(self, body: dict, voice: str | None):
        super().__init__(body, voice)
        self.talker_seq = self.code2wav_seq = None   # correlation ids of open sequences
        self.talker_done = self.code2wav_done = False
        # whether Triton has seen the talker sequence's END (an END-flagged request was delivered): until then it
        # holds a sequence slot, which tritonserver counts as an in-flight inference (its stop waits for it)
        self.talker_ended = False


def _sequence_id() -> int:
    return random.getrandbits(62) + 1


def _drain(q: asyncio.Queue, first) -> list:
    items = [first]
    while not q.empty():
        items.append(q.get_nowait())
    return items


class TritonPythonModel(AsyncDecoupledModel):
    request_fields, control_actions = turns.REQUEST_FIELDS, ("voices", *token_actions.ACTIONS)

    def setup(self, args: dict) -> None:
        config = load_config(p.stage_checkpoint(self.parameters, self.model_name))
        self.voices = sorted(config.talker_config.speaker_id)
        self.default_voice = self.parameters.get("default_voice") or self.voices[0]

    async def handle(self, ctx):
        body = ctx.body()
        if events.wants_voices(body):
            yield events.voices_event(self.voices, self.default_voice, body,
                                      lambda v: turns.resolve_voice(v, self.voices)), None
            return
        if body.get("action") in token_actions.ACTIONS:
            yield await self._token_action(ctx, body), None
            return
        modalities, voice = turns.validate(body, self.voices, self.default_voice, turns.media_inputs(ctx.input))
        turn = _Turn(body, voice)
        out = FanIn()
        talker_q: asyncio.Queue | None = asyncio.Queue() if voice else None
        out.spawn(self._think(ctx, turn, "text" in modalities, out, talker_q))
        if voice:
            codes_q: asyncio.Queue = asyncio.Queue()
            out.spawn(self._talk(ctx, turn, talker_q, codes_q))
            out.spawn(self._vocode(ctx, turn, codes_q, out))
        try:
            async for item in out:
                yield item
            if voice and (last := turn.last_audio(SAMPLE_RATE)) is not None:   # unspoken text, or no audio at all
                yield last
            yield turn.done_event(), None
        finally:
            await out.close()
            await self._abort_open_sequences(turn)

    @staticmethod
    async def _token_action(ctx, body: dict) -> dict:
        """The thinker's one event answering a token control REQUEST (`token_actions`), which gets the REQUEST's keys
        of TOKEN_ACTION_FIELDS. Raises its RequestError."""
        inputs = {p.REQUEST: events.json_tensor({k: body.get(k) for k in TOKEN_ACTION_FIELDS})}
        answer = None
        async for response in bls.stream(ctx, THINKER, inputs, [p.EVENT]):
            answer = events.read_json(response[p.EVENT])
        if answer is None:
            raise RuntimeError(f"{THINKER} answered the {body.get('action')} action with no event")
        return answer

    async def _think(self, ctx, turn: _Turn, send_text: bool, out: FanIn, talker_q) -> None:
        inputs = {p.REQUEST: events.json_tensor({**turn.body, "talker_inputs": talker_q is not None}),
                  **turns.media_inputs(ctx.input)}
        async for response in bls.stream(ctx, THINKER, inputs, p.THINKER_OUTPUTS):
            event = events.read_json(response[p.EVENT])
            if event["token_id"] is not None:
                turn.token_ids.append(event["token_id"])
            if event["text"] and send_text:
                out.put_nowait(({"type": "text.delta", "text": event["text"]}, None))
            if talker_q is not None:
                turn.unspoken.append(event["text"] or "")
                talker_q.put_nowait(response)
            if event["type"] == "done":
                turn.finish_reason, turn.usage = event["finish_reason"], event["usage"]
                return   # leaving the stream cancels what the thinker still runs after a stop string
        raise RuntimeError(f"{THINKER} ended the stream without a done event")

    async def _talk(self, ctx, turn: _Turn, talker_q: asyncio.Queue, codes_q: asyncio.Queue) -> None:
        """Feed the talker with every thinker output queued since the previous request, until it finishes."""
        try:
            while not turn.talker_done:
                responses = _drain(talker_q, await talker_q.get())
                inputs = self._talker_inputs(turn, responses)
                flags = (START if turn.talker_seq is None else 0)
                flags |= END if any(events.read_json(r[p.EVENT])["type"] == "done" for r in responses) else 0
                ctx.check()
                # From the moment the START may be on its way, an early end of the turn must ABORT the
                # sequence (else the talker keeps its state, and the slot, for good).
                turn.talker_seq = turn.talker_seq or _sequence_id()
                async for out in bls.stream(ctx, TALKER, inputs, [p.CODES, p.FINISH_REASON],
                                            correlation_id=turn.talker_seq, flags=flags):
                    turn.talker_ended = turn.talker_ended or bool(flags & END)   # answered: Triton took the END
                    codes = out[p.CODES][0]
                    turn.frames += codes.shape[-1]
                    codes_q.put_nowait(codes)
                    turn.talker_done = p.FINISH_REASON in out
                turn.talker_ended = turn.talker_ended or bool(flags & END)
        finally:
            codes_q.put_nowait(_END)
        # The talker may finish (codec_eos, talker_max_frames) before the thinker's text ends, so before the END:
        # Triton then kept the sequence's slot until its 120 s idle timeout, and a stop meanwhile sat out
        # tritonserver's whole exit timeout waiting for it. End it in Triton now (shielded: a turn cancelled
        # meanwhile must not leave it half sent).
        await asyncio.shield(self._end_talker_sequence(turn))

    def _talker_inputs(self, turn: _Turn, responses: list[dict]) -> dict:
        """The talker request's tensors; the thinker's hidden states stay CUDA tensors when they came as such."""
        embeds = [r[p.EMBED] for r in responses if p.EMBED in r]
        for embed in embeds:
            self.metrics.tensor(p.EMBED, "in", on_gpu(embed))
        if embeds and on_gpu(embeds[0]):
            import torch

            text = torch.cat(embeds)[None]
        else:
            text = (np.concatenate(embeds) if embeds else np.zeros((0, 1), np.float32))[None]
        if embeds:
            self.metrics.tensor(p.TEXT_EMBEDS, "out", on_gpu(text))
        inputs = {p.TEXT_EMBEDS: text}
        if turn.talker_seq is None:   # the START request
            first, body = responses[0], turn.body
            inputs.update({name: first[name][None] for name in p.PROMPT_TENSORS})
            inputs[p.TALKER_PARAMS] = events.json_tensor(turns.talker_fields(body, turn.voice))[None]
        return inputs

    async def _vocode(self, ctx, turn: _Turn, codes_q: asyncio.Queue, out: FanIn) -> None:
        """Send every frame queued since the previous request to code2wav; stream the PCM it returns."""
        while not turn.code2wav_done:
            items = _drain(codes_q, await codes_q.get())
            end = items[-1] is _END
            frames = [c for c in items if c is not _END]
            if not frames and turn.code2wav_seq is None and end:
                # the talker ended (or failed, e.g. on a bad talker_* value) before its first frame: no sequence
                # to open, and none to ABORT (an ABORT without START is an error for the sequence batcher)
                turn.code2wav_done = True
                return
            if not frames and not end:
                continue
            codes = np.concatenate(frames, axis=-1) if frames else np.zeros((16, 0), np.int64)
            flags = (START if turn.code2wav_seq is None else 0) | (END if end else 0)
            ctx.check()
            turn.code2wav_seq = turn.code2wav_seq or _sequence_id()  # from here an early end must ABORT it
            result = await bls.infer(ctx, CODE2WAV, {p.CODES: codes[None]}, [p.PCM], correlation_id=turn.code2wav_seq,
                                     flags=flags)
            turn.code2wav_done = end
            pcm = result[p.PCM][0]
            if pcm.size:
                turn.audio_sent = True
                out.put_nowait(({"type": "audio.delta", "sample_rate": SAMPLE_RATE,
                                 "transcript": turn.take_transcript()}, pcm))

    @staticmethod
    async def _end_talker_sequence(turn: _Turn) -> None:
        """ABORT (flagged END) the turn's talker sequence unless Triton has seen its END: this frees the
        sequence's Triton slot (which only an END or the 120 s idle timeout frees, and which tritonserver's stop
        waits for) and the talker's state, if any is left. Runs to its end whatever happened to the client."""
        if turn.talker_seq is None or turn.talker_ended:
            return
        turn.talker_ended = turn.talker_done = True
        await _quietly(TALKER, bls.stream(None, TALKER, {p.ABORT: np.array([[True]])}, [p.CODES],
                                          correlation_id=turn.talker_seq, flags=END))

    @classmethod
    async def _abort_open_sequences(cls, turn: _Turn) -> None:
        """A turn that ends (cancelled, failed, or done) tells the stages to forget the sequences Triton still
        holds open. These calls run to their end whatever happened to the client (ctx None)."""
        abort = np.array([[True]])
        await cls._end_talker_sequence(turn)
        if turn.code2wav_seq is not None and not turn.code2wav_done:
            turn.code2wav_done = True
            await _quietly(CODE2WAV, bls.infer(None, CODE2WAV, {p.ABORT: abort}, [p.PCM],
                                               correlation_id=turn.code2wav_seq, flags=END))


async def _quietly(model: str, call) -> None:
    """Runs a clean-up call (an awaitable or an async iterator) and only logs its failure: it must never
    mask the turn's own outcome."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except Exception as exc:  # noqa: BLE001
        pb_utils.Logger.log_error(f"qwen3_omni: aborting the {model} sequence failed: {exc}")
