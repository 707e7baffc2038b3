"""`--baseline inprocess` (or `inprocess-chunked`): the same prompts through the model libraries in this process, one
at a time.

The only module of omni_bench that imports model code (imported by the CLI only with --baseline). Each
prompt becomes a RequestRecord like a served one, so the same metric code summarises both:
  qwen3_omni  transformers `Qwen3OmniMoeForConditionalGeneration` from --checkpoint (default
              $OMNI_MODEL_HOME/qwen3_omni_tiny; the preset `qwen3_omni_30b_a3b_random` is built on --device
              with the same random weights as the served stages), greedy thinker. Text chunks: the token
              times of `model.thinker.generate(streamer=...)`; then one audio chunk at the end of
              `model.generate(return_audio=True)` (timed from its own start), which returns the audio only
              when done, so the baseline TTFP and E2E are that call's duration. Fixed lengths come from the
              request's extension fields, as the server reads them: `min_tokens` -> thinker_min_new_tokens,
              `talker_max_frames` / `talker_min_frames` F -> talker_max/min_new_tokens F + 1,
              `talker_do_sample`, `talker_repetition_penalty`, ... -> talker_* kwargs.
  qwen_image  diffusers `QwenImagePipeline` on --checkpoint (default $OMNI_MODEL_HOME/qwen_image_tiny), one
              image per prompt (seed = prompt index, no CFG, size/steps as served), encoded as PNG like the
              server's b64_json; torch's default threads.
  wan         diffusers `WanPipeline` on --checkpoint (default $OMNI_MODEL_HOME/wan_tiny), one video per prompt
              (size, frames, steps and guidance as served, seed = prompt index), its uint8 frames encoded to MP4
              with the server's encoder (omni_frontend.videos.encoding); torch's default threads.
  voice       the sequential library run of issue 14: the stage engines called directly, one prompt at a time,
              `ChatLLM.generate` (SmolLM2, greedy; its engine thread keeps writing while this thread speaks) -> whole
              sentences -> `synthesize` of each sentence, one after the other on this thread, by the `tts_engine`
              (KokoroTTS, or PiperTTS with --tts-engine piper); each engine on min(2, cores) threads, neither niced.
              A sentence is what `SentenceChunker(clauses=False, min_words=1)` cuts: text up to . ! or ?
              followed by whitespace (not after "Mr." or "e.g.", not inside "3.5"), a line, or a run of over 40
              words cut at its last clause boundary; no clause or first-words cuts. Text chunks at each LLM delta,
              an audio chunk after each synthesized sentence.
              `inprocess-chunked` (voice only): the same chain with the served pipeline's own chunking
              (`SentenceChunker()`: a first chunk of 2-3 words, then chunks growing toward sentences), so the
              difference to the served figures is the serving itself (stages, BLS hops, HTTP) and the overlap of
              LLM and TTS, not the chunking.
"""
from __future__ import annotations

import time
from pathlib import Path

from omni_bench.records import AUDIO, IMAGE, OTHER, TEXT, RequestRecord

SUPPORTED = {"qwen3_omni": ("chat", "chat-audio"), "voice": ("chat", "chat-audio"), "qwen_image": ("images",),
             "wan": ("videos",)}
INPROCESS, INPROCESS_CHUNKED = "inprocess", "inprocess-chunked"
KINDS = (INPROCESS, INPROCESS_CHUNKED)


def check_supported(model: str, workload: str, kind: str = INPROCESS) -> None:
    """Raises ValueError unless there is a baseline of this kind (KINDS) for this model and workload (inprocess:
    chat and chat-audio of qwen3_omni and voice, images of qwen_image, videos of wan; inprocess-chunked: voice)."""
    if kind not in KINDS:
        raise ValueError(f"unknown in-process baseline {kind!r}; known: {', '.join(KINDS)}")
    if kind == INPROCESS_CHUNKED and model != "voice":
        raise ValueError(f"--baseline {INPROCESS_CHUNKED} is the voice chain with the served chunking, not {model!r}")
    if workload not in SUPPORTED.get(model, ()):
        raise ValueError(f"--baseline {kind} supports chat/chat-audio of qwen3_omni and voice, images of "
                         f"qwen_image, videos of wan, not {workload} of {model!r}")


def run_baseline(model: str, workload: str, prompts: list[str], *, max_tokens: int, voice: str | None,
                 checkpoint: str | None, num_warmups: int, extra_body: dict | None = None,
                 device: str = "cpu", size: str = "64x64", steps: int = 4,
                 frames: int = 17, tts_engine: str = "kokoro", kind: str = INPROCESS) -> tuple[list[RequestRecord], float]:
    """Records of every prompt run in-process and the total duration (`tts_engine`: the voice chain's speech
    engine, omni_backends.voice.engines; `kind`: one of KINDS, see the module doc). Raises ValueError as
    `check_supported`."""
    check_supported(model, workload, kind)
    if model == "qwen_image":
        runner = _QwenImage(checkpoint, size, steps)
    elif model == "wan":
        runner = _Wan(checkpoint, size, steps, frames)
    elif model == "qwen3_omni":
        runner = _Qwen3Omni(checkpoint, max_tokens, voice, extra_body or {}, device)
    else:
        runner = _Voice(max_tokens, voice, tts_engine, sentences=kind == INPROCESS)
    speak = workload == "chat-audio"
    for prompt in prompts[:num_warmups]:
        runner.run(RequestRecord(-1, prompt), speak)
    records, start = [], time.perf_counter()
    for index, prompt in enumerate(prompts):
        record = RequestRecord(index, prompt, send_time=time.perf_counter() - start)
        runner.run(record, speak)
        records.append(record)
    return records, time.perf_counter() - start


class _Qwen3Omni:
    """transformers' own Qwen3-Omni calls on a checkpoint directory (or the random full-size preset)."""

    TALKER_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")

    def __init__(self, checkpoint: str | None, max_tokens: int, voice: str | None, extra_body: dict, device: str):
        from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        from omni_backends import prepare
        from omni_backends.paths import QWEN3_OMNI_TINY, model_home
        from omni_backends.qwen3_omni.loading import default_dtype, load_config
        from omni_backends.qwen3_omni.random_weights import build_random, is_random

        path = Path(checkpoint or QWEN3_OMNI_TINY)
        if not path.is_absolute():
            if str(path) in prepare.PREPARERS and prepare.main([str(path)]) != 0:   # a preset: make sure it exists
                raise RuntimeError(f"preparing the checkpoint preset {path} failed")
            path = model_home() / path
        if is_random(path):
            self.model = build_random(Qwen3OmniMoeForConditionalGeneration, load_config(path), "", device,
                                      default_dtype(device))
        else:
            self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_tokens, self.voice, self.device = max_tokens, voice or "ethan", device
        self.eos = self.model.config.im_end_token_id
        self.min_tokens = int(extra_body.get("min_tokens") or 0)
        self.talker_kwargs = {f"talker_{k}": extra_body[f"talker_{k}"] for k in self.TALKER_FIELDS
                              if extra_body.get(f"talker_{k}") is not None}
        self.talker_kwargs.setdefault("talker_do_sample", False)
        for field, kwarg in (("talker_max_frames", "talker_max_new_tokens"), ("talker_min_frames", "talker_min_new_tokens")):
            if extra_body.get(field) is not None:
                self.talker_kwargs[kwarg] = int(extra_body[field]) + 1

    def run(self, record: RequestRecord, speak: bool) -> None:
        import torch

        messages = [{"role": "user", "content": record.prompt}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)["input_ids"].to(self.device)
        streamer = _TokenTimes(self.tokenizer)
        with torch.inference_mode():
            start = time.perf_counter()
            self.model.thinker.generate(input_ids=ids, max_new_tokens=self.max_tokens, min_new_tokens=self.min_tokens,
                                        do_sample=False, eos_token_id=self.eos, streamer=streamer)
            for t, text in streamer.tokens:
                record.add(t - start, TEXT, len(text))
            record.text = "".join(text for _, text in streamer.tokens)
            record.completion_tokens = len(streamer.tokens)
            if speak:
                _sync(self.device)
                start = time.perf_counter()
                _, wav = self.model.generate(input_ids=ids, return_audio=True, speaker=self.voice,
                                             thinker_max_new_tokens=self.max_tokens,
                                             thinker_min_new_tokens=self.min_tokens, thinker_do_sample=False,
                                             thinker_eos_token_id=self.eos, **self.talker_kwargs)
                _sync(self.device)
                samples = 0 if wav is None else int(wav.shape[-1])
                record.sample_rate = 24000
                record.add(time.perf_counter() - start, AUDIO, samples * 2, samples)


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class _TokenTimes:
    """A `generate` streamer that keeps (arrival time, text) of each new token; the first `put` is the prompt."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self._prompt_seen = tokenizer, [], False

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.tokens += [(now, self.tokenizer.decode([int(i)])) for i in value.reshape(-1)]

    def end(self) -> None:
        """Called by generate when it finishes; nothing to flush."""


class _QwenImage:
    """diffusers' `QwenImagePipeline` on a Qwen-Image checkpoint directory; each image encoded as PNG."""

    def __init__(self, checkpoint: str | None, size: str, steps: int):
        from omni_backends.paths import model_home
        from omni_backends.qwen_image.loading import reference_pipeline
        from omni_backends.qwen_image.serving.protocol import TINY

        self.pipe = reference_pipeline(Path(checkpoint) if checkpoint else model_home() / TINY)
        width, _, height = size.partition("x")
        self.width, self.height, self.steps = int(width), int(height), steps

    def run(self, record: RequestRecord, speak: bool) -> None:
        import io

        import torch

        start = time.perf_counter()
        image = self.pipe(prompt=record.prompt, height=self.height, width=self.width, num_inference_steps=self.steps,
                          true_cfg_scale=1.0,
                          generator=torch.Generator().manual_seed(max(record.index, 0))).images[0]
        out = io.BytesIO()
        image.save(out, "PNG")
        record.add(time.perf_counter() - start, IMAGE, out.tell())
        record.images = 1


class _Wan:
    """diffusers' `WanPipeline` on a Wan checkpoint directory; each video encoded to MP4 like the server's."""

    def __init__(self, checkpoint: str | None, size: str, steps: int, frames: int):
        from omni_backends.paths import model_home
        from omni_backends.wan.loading import reference_pipeline
        from omni_backends.wan.serving.protocol import TINY
        from omni_bench.client import VIDEO_GUIDANCE

        self.pipe = reference_pipeline(Path(checkpoint) if checkpoint else model_home() / TINY)
        width, _, height = size.partition("x")
        self.call = {"width": int(width), "height": int(height), "num_frames": frames, "num_inference_steps": steps,
                     **VIDEO_GUIDANCE}

    def run(self, record: RequestRecord, speak: bool) -> None:
        import tempfile

        import torch

        from omni_frontend.videos.encoding import write_mp4

        start = time.perf_counter()
        frames = self.pipe(record.prompt, generator=torch.Generator().manual_seed(max(record.index, 0)),
                           output_type="np", **self.call).frames[0]
        with tempfile.TemporaryDirectory() as folder:
            write_mp4((frames * 255).round().astype("uint8"), 16, Path(folder) / "video.mp4")
        record.add(time.perf_counter() - start, OTHER, 100)
        record.video_frames = int(frames.shape[0])


class _Voice:
    """The voice pipeline's stage engines chained in this process: speech per whole sentence (`sentences`), or per
    chunk of the served pipeline's chunking, each synthesised in turn on the calling thread."""

    def __init__(self, max_tokens: int, voice: str | None, tts_engine: str, sentences: bool):
        from omni_backends.voice import engines
        from omni_backends.voice.llm import ChatLLM
        from omni_backends.voice.tts import SAMPLE_RATE

        # each on min(2, cores) threads, like the served stages
        self.llm, self.tts = ChatLLM(), engines.load(tts_engine)
        self.params = self.llm.sampling_params({"max_tokens": max_tokens, "temperature": 0.0})
        self.voice, self.sample_rate, self.sentences = voice, SAMPLE_RATE, sentences

    def chunker(self):
        """A new chunker for one reply: whole sentences, or the served pipeline's chunks."""
        from omni_backends.voice.chunker import SentenceChunker

        return SentenceChunker(clauses=False, min_words=1) if self.sentences else SentenceChunker()

    def run(self, record: RequestRecord, speak: bool) -> None:
        chunker, text = self.chunker(), []
        start = time.perf_counter()
        for delta in self.llm.generate([{"role": "user", "content": record.prompt}], self.params):
            if delta.text:
                record.add(time.perf_counter() - start, TEXT, len(delta.text))
                text.append(delta.text)
            if delta.finished:
                record.completion_tokens = delta.usage.completion_tokens
            if speak:
                for chunk in chunker.feed(delta.text) + (chunker.flush() if delta.finished else []):
                    audio = self.tts.synthesize(chunk, self.voice)
                    record.sample_rate = self.sample_rate
                    record.add(time.perf_counter() - start, AUDIO, audio.size * 2, audio.size)
        record.text = "".join(text)
