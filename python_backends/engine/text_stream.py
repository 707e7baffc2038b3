"""Streams one request's engine outputs as text: incremental detokenization, stop strings, usage.

Shared by the text-producing engine stages (voice_llm, qwen3_omni_thinker).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omni_backends.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from omni_backends.engine.request import StepOutput


@dataclass(frozen=True)
class Usage:
    """Token counts of one request (OpenAI `usage`): prompt tokens and generated tokens (end-of-turn included)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    """One streamed piece of a request's answer.

    text: newly completed text (may be "" on the final delta); usage: the request's counts so far (a client
    that stops reading still knows what was spent). On the last delta of a request `finished` is True,
    `finish_reason` is "stop" (end of turn or stop string), "length" (max_tokens), "abort" or "error" (then
    `error` holds the message), and `usage` holds the counts in all.
    """

    text: str
    finished: bool = False
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None


class TextStream:
    """Per-request text state: engine StepOutputs -> detokenized, stop-string-checked TextDeltas.

    Feed every StepOutput of one request to `step` in order. After a stop string matched, `finished` is True,
    the final delta has been returned and later outputs give None (the caller should abort the request).
    """

    def __init__(self, tokenizer, prompt_tokens: int, stop: Sequence[str] = ()):
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stop = StopStringMatcher(stop)
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        self.finished = False

    def step(self, output: StepOutput) -> TextDelta | None:
        """The TextDelta to send for this output, or None when it adds no text and does not finish."""
        if self.finished:
            return None
        text, stopped = "", False
        if output.token_id is not None:
            self.generated += 1
            text, stopped = self._stop.feed(self._detokenizer.add(output.token_id))
        if stopped:
            return self._finish(text, "stop")
        if output.finished:
            if output.finish_reason in ("stop", "length"):
                tail, stopped = self._stop.feed(self._detokenizer.flush())
                text += tail + ("" if stopped else self._stop.flush())
            return self._finish(text, output.finish_reason, output.error)
        return TextDelta(text, usage=self._usage()) if text else None

    def _usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.generated)

    def _finish(self, text: str, reason: str | None, error: str | None = None) -> TextDelta:
        self.finished = True
        return TextDelta(text, finished=True, finish_reason=reason, error=error, usage=self._usage())
