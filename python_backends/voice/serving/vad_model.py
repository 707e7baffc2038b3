"""voice_vad: Silero VAD as a sequence-batched stateful stage (one sequence per realtime session).

Contract (Triton sequence batching, `oldest` strategy: every request names its sequence by correlation
id, an unsigned integer or a string; the first carries START, the last END; requests of different sequences are
batched):
  AUDIO   FP32  [1, samples]  the next chunk of the session's audio, mono 16 kHz in [-1, 1] (any length,
                              also 0; samples short of a 32 ms window wait for the next chunk)
  OPTIONS BYTES [1, 1]        optional JSON {"threshold", "prefix_padding_ms", "silence_duration_ms",
                              "pause_duration_ms"}; kept for the sequence until changed (defaults 0.5 /
                              300 / 500 / null: no pause events)
  PROBS   FP32  [1, windows]  speech probability of each 512-sample window scored by this request
  EVENTS  BYTES [1, 1]        JSON list of turn events in order: {"type": "speech_started", "audio_start",
                              "sample"} / {"type": "speech_paused", "audio_end", "sample"} / {"type":
                              "speech_resumed", "audio_start", "sample"} / {"type": "speech_stopped",
                              "audio_end", "sample"} (paused / resumed only with pause_duration_ms); sample
                              offsets count 16 kHz samples from the sequence's first sample
A request of a sequence that was never started (no START) or bad OPTIONS gets an OpenAI-envelope
error (400); a START while `max_sequences` sequences are live gets 429 `too_many_sequences` at once (Triton
would otherwise queue it behind its slots, unanswered). An END without audio for a sequence the model does
not hold (dropped, refused) is answered with nothing scored. State is dropped at END, at a new START for the
same id, and after the sequence batcher's `max_sequence_idle_microseconds` without requests (when Triton frees
the slot). Logic: omni_backends.voice.vad.
"""
from __future__ import annotations

import time
import traceback

import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError
from omni_backends.input_audio import check_audio
from omni_backends.serving import events, model_config
from omni_backends.serving.metrics import StageMetrics
from omni_backends.serving.sequences import check_room
from omni_backends.voice.vad import SileroVAD, VADOptions, VADStream


def _scalar(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.model_name, self.model_config, self.parameters = model_config.load(args)
        self.metrics = StageMetrics(self.model_name)
        self.vad = SileroVAD(threads=model_config.int_parameter(self.parameters, "threads", 1))
        # Triton frees an idle sequence's slot after max_sequence_idle_microseconds; the state goes with it
        self.idle_timeout_s = model_config.sequence_idle_seconds(self.model_config, 30.0)
        self.max_sequences = model_config.int_parameter(self.parameters, "max_sequences", 1024)
        self.streams: dict[int | str, tuple[VADStream, float]] = {}  # correlation id -> (stream, last request time)

    def finalize(self) -> None:
        self.metrics.close()

    def execute(self, requests):
        now = time.monotonic()
        self._drop_idle(now, self.idle_timeout_s)
        responses: list = [None] * len(requests)
        batch: list[tuple[int, VADStream, bool]] = []  # (request index, stream, ends)
        for index, request in enumerate(requests):
            self.metrics.started()
            try:
                batch.append((index, *self._prepare(request, now)))
            except RequestError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.envelope()))
                self.metrics.finished("rejected")
        # The oldest strategy puts at most one request of a sequence in a batch; process the rare repeat in
        # rounds anyway so that each stream sees its chunks in order.
        while batch:
            seen, this_round, later = set(), [], []
            for item in batch:
                (later if id(item[1]) in seen else this_round).append(item)
                seen.add(id(item[1]))
            self._score(this_round, responses)
            batch = later
        return responses

    def _prepare(self, request, now: float) -> tuple[VADStream, bool]:
        corrid = request.correlation_id()   # an int or a string (Triton takes both; ids of both kinds never meet)
        # NaN / inf would poison the session's recurrent state for good: refused before any state is touched
        audio = check_audio(pb_utils.get_input_tensor_by_name(request, "AUDIO").as_numpy(), "AUDIO", allow_empty=True)
        start, end = bool(_scalar(request, "START")), bool(_scalar(request, "END"))
        options = pb_utils.get_input_tensor_by_name(request, "OPTIONS")
        parsed = None
        if options is not None:
            try:
                parsed = VADOptions.from_json(events.read_json(options.as_numpy()))
            except (ValueError, TypeError, AttributeError) as exc:
                if isinstance(exc, RequestError):
                    raise
                raise RequestError(f"OPTIONS must be a JSON object: {exc}", param="OPTIONS") from None
        if start:
            if corrid not in self.streams:
                if len(self.streams) >= self.max_sequences:
                    # Triton frees idle slots on its own clock, a moment before this model looks: a START that got
                    # a freed slot lets go of the states whose slots Triton freed (or is about to)
                    self._drop_idle(now, 0.9 * self.idle_timeout_s)
                check_room(self.model_name, len(self.streams), self.max_sequences)
            stream = VADStream(parsed or VADOptions())
        elif corrid in self.streams:
            stream = self.streams[corrid][0]
            if parsed is not None:
                stream.options = parsed
        elif end and audio.size == 0:
            stream = VADStream(VADOptions())   # nothing to free: the sequence was dropped or refused
        else:
            raise RequestError(f"sequence {corrid} is not started (send START first)", code="sequence_not_started")
        stream.feed(audio)
        if end:
            self.streams.pop(corrid, None)
        else:
            self.streams[corrid] = (stream, now)
        return stream, end

    def _drop_idle(self, now: float, older_than_s: float) -> None:
        for corrid in [c for c, (_, seen) in self.streams.items() if now - seen > older_than_s]:
            del self.streams[corrid]

    def _score(self, batch: list[tuple[int, VADStream, bool]], responses: list) -> None:
        try:
            results = self.vad.process([stream for _, stream, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error, the model keeps serving
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
            for index, _, _ in batch:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{self.model_name}: {type(exc).__name__}: {exc}"))
                self.metrics.finished("error")
            return
        for (index, _, _), (probs, found) in zip(batch, results):
            responses[index] = pb_utils.InferenceResponse([
                pb_utils.Tensor("PROBS", probs[None, :]),
                pb_utils.Tensor("EVENTS", events.json_tensor(found)[None, :])])
            self.metrics.finished("ok")
