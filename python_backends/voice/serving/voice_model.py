"""voice: the client-facing voice chat orchestrator (BLS, decoupled): voice_asr -> voice_llm -> voice_tts.

REQUEST/INPUT_AUDIO/EVENT/AUDIO follow omni_frontend.chat_protocol and omni_backends.serving.events.
Events: {"type": "input_audio.transcription", "text"} per input_audio part, then text deltas as the LLM
writes them ("text" modality) and, concurrently, {"type": "audio.delta", "sample_rate": 24000,
"transcript"} + AUDIO for each sentence chunk as soon as it is spoken ("audio" modality; the
transcripts concatenate to the spoken text; a chunk the voice cannot say, such as "👍", is 10 ms of silence
(`events.silence`) and an answer without text one such delta with an empty transcript: an answer with the audio
modality always has audio), then {"type": "done", "finish_reason", "usage"}. Text and
audio deltas carry "usage" too: voice_llm's {"prompt_tokens", "completion_tokens"} so far, so that a client
that cancels knows what its answer spent.
REQUEST extension `first_chunk_words` (1-40): the most words of the first spoken chunk (protocol.chunker_options).
Any key outside `REQUEST_FIELDS` (an extension this pipeline does not honour, e.g. `min_tokens`) is a 400 naming it.
REQUEST {"action": "voices"} -> one {"type": "voices"} event (the voices of voice_tts's engine, as `tts` lists them).
REQUEST {"action": "prompt_tokens", "messages" (text) | "prompt", "max_tokens", ...} -> voice_llm's one
{"type": "prompt_tokens"} event (omni_backends.serving.events.prompt_tokens_event), or its 400
`context_length_exceeded`; {"action": "detokenize", "tokens"} -> its {"type": "detokenized", "text"}
(omni_backends.serving.token_actions).
REQUEST `prompt` (text or token ids) instead of `messages`: a completion, whose prompt voice_llm reads without the
chat template (omni_frontend.completions_protocol).
"""
from __future__ import annotations

import asyncio

import numpy as np

from omni_backends.serving.fanin import FanIn
from omni_backends.serving import bls, events, token_actions
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.voice.chunker import SentenceChunker, has_words
from omni_backends.chat_request import audio_clips, check_request
from omni_backends.voice.protocol import REQUEST_FIELDS, SAMPLING_FIELDS, chunker_options, text_messages
from omni_backends.voice.serving.speech_model import speak
from omni_backends.voice import engines
from omni_backends.voice.tts import SAMPLE_RATE

INPUT_AUDIO = "INPUT_AUDIO"
_END = object()
# the keys of a token control REQUEST passed on to voice_llm
TOKEN_ACTION_FIELDS = ("action", "messages", "prompt", "max_tokens", "add_generation_prompt", "add_special_tokens",
                       "return_token_ids", "tokens")


class TritonPythonModel(AsyncDecoupledModel):
    request_fields, control_actions = REQUEST_FIELDS, ("voices", *token_actions.ACTIONS)

    def setup(self, args: dict) -> None:
        self.voices = engines.voices(engines.stage_engine(args["model_repository"]))

    async def handle(self, ctx):
        body = ctx.body()
        if events.wants_voices(body):
            yield events.voices_event(self.voices.names, self.voices.default, body, self.voices.resolve), None
            return
        if body.get("action") in token_actions.ACTIONS:
            yield await _token_action(ctx, body), None
            return
        check_request(body)  # any field of the wrong JSON type: a 400 naming it, before it is used
        modalities = body.get("modalities") or ["text", "audio"]
        voice = self.voices.resolve(body.get("voice")) if "audio" in modalities else None
        chunking = chunker_options(body)  # checked before any model work
        sampling = {k: body.get(k) for k in SAMPLING_FIELDS}
        if body.get("prompt") is not None:   # a completion: voice_llm reads the prompt without the chat template
            llm_body = {"prompt": body["prompt"], **sampling}
        else:
            messages = body["messages"]
            clips = audio_clips(messages, ctx.input(INPUT_AUDIO))  # NaN / inf samples, parts outside INPUT_AUDIO: 400
            transcripts = []
            for clip in clips:
                transcripts.append(await _transcribe(ctx, clip))
                yield {"type": "input_audio.transcription", "text": transcripts[-1]}, None
            llm_body = {"messages": text_messages(messages, transcripts), **sampling}

        out = FanIn()
        chunks: asyncio.Queue | None = asyncio.Queue() if voice else None
        usage: dict = {}  # voice_llm's counts so far (_write updates it, both tasks send it)
        chunker = SentenceChunker(**chunking, keep_wordless=True)   # "👍" too: its transcript is 10 ms of silence
        out.spawn(_write(ctx, llm_body, "text" in modalities, chunks, out, chunker, usage))
        if voice:
            out.spawn(_speak_chunks(ctx, voice, chunks, out, usage))
        done = None
        try:
            async for item in out:
                if item[0].get("type") == "done":
                    done = item
                else:
                    yield item
        finally:
            await out.close()
        if done is None:
            raise RuntimeError("voice_llm ended its stream without a done event")
        yield done


async def _token_action(ctx, body: dict) -> dict:
    """voice_llm's answer to a token control REQUEST ({"action": "prompt_tokens"} for text `messages` or a
    `prompt`, {"action": "detokenize"}: omni_backends.serving.token_actions), which gets the REQUEST's keys of
    TOKEN_ACTION_FIELDS. Raises its RequestError (400 `context_length_exceeded`, a bad message, prompt or token)."""
    request = {events.REQUEST: events.json_tensor({k: body.get(k) for k in TOKEN_ACTION_FIELDS})}
    answer = None
    async for response in bls.stream(ctx, "voice_llm", request, [events.EVENT]):
        answer = events.read_json(response[events.EVENT])
    if answer is None:
        raise RuntimeError(f"voice_llm answered the {body.get('action')} action with no event")
    return answer


async def _transcribe(ctx, clip: np.ndarray) -> str:
    options = events.json_tensor({"language": "en"})[None]
    result = await bls.infer(ctx, "voice_asr", {"AUDIO": clip[None, :].astype(np.float32), "OPTIONS": options}, ["RESULT"])
    return events.read_json(result["RESULT"])["text"]


async def _write(ctx, llm_body: dict, send_text: bool, chunks: asyncio.Queue | None, out: FanIn,
                 chunker: SentenceChunker, usage: dict) -> None:
    """Stream the LLM's text: text deltas to `out` (when asked), `chunker`'s chunks to `chunks` (when speaking);
    `usage` is kept at the LLM's counts so far."""
    request = {events.REQUEST: events.json_tensor(llm_body)}
    async for response in bls.stream(ctx, "voice_llm", request, [events.EVENT]):
        event = events.read_json(response[events.EVENT])
        usage.update(event.get("usage") or {})
        text = event.get("text", "")
        if text and send_text:
            await out.put(({"type": "text.delta", "text": text, "usage": dict(usage)}, None))
        if chunks is not None:
            for chunk in chunker.feed(text) + (chunker.flush() if event["type"] == "done" else []):
                await chunks.put(chunk)
        if event["type"] == "done":
            await out.put(({"type": "done", "finish_reason": event["finish_reason"], "usage": event["usage"]}, None))
            break
    if chunks is not None:
        await chunks.put(_END)


async def _speak_chunks(ctx, voice: str, chunks: asyncio.Queue, out: FanIn, usage: dict) -> None:
    """Speak sentence chunks in order as they arrive; each becomes one audio.delta event whose
    transcript is the chunk (after a space from the second on, so transcripts concatenate), with the LLM's
    `usage` so far. A chunk without a word (an emoji-only reply "👍": nothing to speak, as the `tts` pipeline refuses
    it) is not sent to voice_tts, and one that makes no sound there (letters the voice cannot read, "١٢٣") is
    neither: each is 10 ms of silence with its transcript; an answer with no chunk at all (no text) is one such
    delta with an empty transcript. So every audio-modality answer has audio and a transcript of all its text
    (OpenAI's `message.audio` is never null there; the speech WebSocket makes a sentence with nothing to say the
    same silence). When the request ends early this task is cancelled: queued chunks are dropped, the one being
    spoken is cancelled in voice_tts (bls.infer)."""
    separator = ""
    while (chunk := await chunks.get()) is not _END:
        audio = (await speak(ctx, chunk, voice, 1.0))[0] if has_words(chunk) else None
        if audio is None or not audio.size:
            audio = events.silence(SAMPLE_RATE)
        await out.put(({"type": "audio.delta", "sample_rate": SAMPLE_RATE, "transcript": separator + chunk,
                        "usage": dict(usage)}, audio))
        separator = " "
    if not separator:   # no text to speak: the answer's audio is still a (silent) clip
        await out.put(({"type": "audio.delta", "sample_rate": SAMPLE_RATE, "transcript": "", "usage": dict(usage)},
                       events.silence(SAMPLE_RATE)))
