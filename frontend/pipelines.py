"""Registry of pipelines: the OpenAI model id a client names, the client-facing Triton model that
serves it, and every Triton model (stages first) the launcher must load for it. No model code."""
from __future__ import annotations

import dataclasses

CHAT, SPEECH, TRANSCRIPTION, IMAGE, VIDEO, AUDIO = "chat", "speech", "transcription", "image", "video", "audio"


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """name: OpenAI model id; kind: chat | speech | transcription | image | video | audio (which routes accept
    it; audio: /v1/audio/generate);
    entry: client-facing Triton model; models: all Triton models to load; aliases: extra ids;
    tasks: for image pipelines, "generate" (/v1/images/generations) and/or "edit" (/v1/images/edits);
    vad / asr: the stage models a `/v1/realtime` session calls directly (voice-activity stream and
    transcription of committed audio); a chat pipeline with a `vad` serves realtime sessions;
    stream_entry: a decoupled twin of `entry` for streamed results (transcription), if any;
    content: the chat content part types its messages may carry (others: a 400 naming the part's type)."""

    name: str
    kind: str
    entry: str
    models: tuple[str, ...]
    description: str = ""
    aliases: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    vad: str | None = None
    asr: str | None = None
    stream_entry: str | None = None
    content: tuple[str, ...] = ("text", "input_audio")


_KOKORO = "Kokoro-82M (or Piper: --tts-engine)"   # how a description names the speech engine; with_tts_engine
_SPEAKS = {"kokoro": "Kokoro-82M", "piper": "Piper (en_US joe)"}   # ...names the one that speaks

_QWEN_IMAGE_STAGES = ("qwen_image_text_encoder", "qwen_image_dit", "qwen_image_vae")

REGISTRY: dict[str, Pipeline] = {p.name: p for p in (
    Pipeline("qwen3_omni", CHAT, "qwen3_omni",
             ("qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav", "qwen3_omni"),
             "Qwen3-Omni thinker -> talker -> code2wav, text, audio and images in; text and speech out",
             content=("text", "input_audio", "image_url")),
    Pipeline("voice", CHAT, "voice", ("voice_asr", "voice_llm", "voice_tts", "voice_vad", "voice"),
             f"Whisper tiny.en -> SmolLM2-135M-Instruct -> {_KOKORO}, text and speech out; "
             "/v1/realtime with Silero VAD",
             vad="voice_vad", asr="voice_asr"),
    Pipeline("tts", SPEECH, "tts", ("voice_tts", "tts"), f"{_KOKORO} text-to-speech",
             aliases=("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "kokoro")),   # "kokoro": TTS_ENGINES
    Pipeline("asr", TRANSCRIPTION, "voice_asr", ("voice_asr", "voice_asr_stream"), "Whisper tiny.en speech recognition",
             aliases=("whisper-1", "whisper-tiny.en", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"),
             stream_entry="voice_asr_stream"),
    Pipeline("qwen_image", IMAGE, "qwen_image", _QWEN_IMAGE_STAGES + ("qwen_image",),
             "Qwen-Image text-to-image: text encoder -> step-batched DiT -> VAE", aliases=("gpt-image-1", "dall-e-3"),
             tasks=("generate",)),
    Pipeline("qwen_image_edit", IMAGE, "qwen_image_edit", _QWEN_IMAGE_STAGES + ("qwen_image_edit",),
             "Qwen-Image-Edit image editing: text+image encoder, VAE encode -> step-batched DiT -> VAE",
             tasks=("edit",)),
    Pipeline("wan", VIDEO, "wan", ("wan_text_encoder", "wan_dit", "wan_vae", "wan"),
             "Wan2.2 text-to-video: UMT5 text encoder -> DiT denoiser (step-batched) -> VAE decode",
             aliases=("sora-2", "sora-2-pro")),
    Pipeline("stable_audio", AUDIO, "stable_audio",
             ("stable_audio_text_encoder", "stable_audio_dit", "stable_audio_vae", "stable_audio"),
             "Stable Audio Open text-to-audio: T5 text encoder + seconds projection -> DiT denoiser (step-batched) "
             "-> Oobleck VAE decode", aliases=("stable-audio-open-1.0",)),
)}

DEFAULT = ("voice", "tts", "asr", "qwen3_omni", "qwen_image", "qwen_image_edit", "wan")
TTS_ENGINES = ("kokoro", "piper")   # voice_tts engines (omni_backends.voice.engines), also tts model ids


def with_tts_engine(pipelines: list[Pipeline], engine: str) -> list[Pipeline]:
    """The pipelines as served when voice_tts speaks with `engine` (one of TTS_ENGINES, --tts-engine): a model
    id that names an engine names the one that speaks, so with `--tts-engine piper` the `tts` pipeline answers to
    "piper" and no longer to "kokoro" (a request naming "kokoro" gets the 404 of an unknown model), and the
    descriptions (GET /v1/models) name the engine that speaks."""
    return [dataclasses.replace(p, aliases=tuple(engine if a in TTS_ENGINES else a for a in p.aliases),
                                description=p.description.replace(_KOKORO, _SPEAKS[engine]))
            for p in pipelines]


def parse_extra(spec: str) -> Pipeline:
    """`NAME=KIND:model1,model2,...` (the last model is the entry) -> Pipeline; for tests and custom
    repositories. Raises ValueError on a malformed spec."""
    try:
        name, rest = spec.split("=", 1)
        kind, models = rest.split(":", 1)
        names = tuple(m for m in models.split(",") if m)
    except ValueError as exc:
        raise ValueError(f"bad pipeline spec {spec!r}: expected NAME=KIND:model1,model2") from exc
    if kind not in (CHAT, SPEECH, TRANSCRIPTION, IMAGE, VIDEO, AUDIO) or not names:
        raise ValueError(f"bad pipeline spec {spec!r}: kind must be chat|speech|transcription|image|video|audio")
    return Pipeline(name, kind, names[-1], names)


def resolve(names: list[str], extra: list[Pipeline] = ()) -> list[Pipeline]:
    """Pipelines by name (registry plus extras); raises ValueError naming unknown ones."""
    known = {**REGISTRY, **{p.name: p for p in extra}}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown pipeline(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [known[n] for n in names]


def triton_models(pipelines: list[Pipeline]) -> list[str]:
    """Every Triton model the pipelines need, each once, in load order."""
    seen: dict[str, None] = {}
    for p in pipelines:
        seen.update(dict.fromkeys(p.models))
    return list(seen)
