"""voice_asr_stream: Whisper tiny.en transcription streamed segment by segment (decoupled), for
`stream=true` transcriptions; the dynamically batched voice_asr serves the non-streamed ones.

Contract (client-facing protocol of omni_backends.serving.events):
  REQUEST BYTES [1]        JSON {"language", "prompt", "temperature", "word_timestamps"} (all optional)
  INPUT_AUDIO FP32 [samples]  mono 16 kHz PCM
  EVENT   per Whisper segment, as soon as its 30 s window is decoded: {"type": "transcript.delta",
          "delta" (the segment text, with a leading space after the first non-empty one, so the deltas
          concatenate to the final text), "segment": {"id", "start", "end", "text"}}; then
          {"type": "done", "text", "language", "duration", "segments", "words"} (voice_asr's RESULT), FINAL.
Whisper runs on one worker thread: concurrent streams take turns window by window; a cancelled stream
stops after the window in progress.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from omni_backends.input_audio import check_audio
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.voice.asr import Transcription, join_segments
from omni_backends.voice.serving.asr_model import load_asr, result_dict, segment_dict, transcribe_options

INPUT_AUDIO = "INPUT_AUDIO"


class TritonPythonModel(AsyncDecoupledModel):
    def setup(self, args: dict) -> None:
        self.asr = load_asr(self.parameters, self.model_name)
        self._whisper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisper")

    def teardown(self) -> None:
        self._whisper.shutdown(wait=False, cancel_futures=True)

    async def handle(self, ctx):
        pcm = check_audio(ctx.input(INPUT_AUDIO), INPUT_AUDIO, param="file")  # missing, empty, NaN / inf: 400
        options = transcribe_options(ctx.body())
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(self._whisper, lambda: self.asr.stream(pcm, **options))
        found = []
        while (segment := await loop.run_in_executor(self._whisper, next, stream.segments, None)) is not None:
            ctx.check()
            delta = segment.text if not join_segments([s.text for s in found]) else f" {segment.text}"
            found.append(segment)
            if segment.text:
                yield {"type": "transcript.delta", "delta": delta, "segment": segment_dict(len(found) - 1, segment)}, None
        result = Transcription(text=join_segments([s.text for s in found]), language=stream.language,
                               duration=stream.duration, segments=tuple(found))
        yield {"type": "done", **result_dict(result)}, None
