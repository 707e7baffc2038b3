"""First-audio timeline: where one Qwen3-Omni request's time to its first audio packet (TTFP) goes.

The co-located pipeline (`pipeline.LocalOmniPipeline`, `serving/colocated_model.py`) marks each request's path
to its first audio with `time.monotonic()` stamps, in this causal order (each mark needs the one before):

  arrival          the request reaches the model (its coroutine starts)
  submitted        prompt built and tokenized, handed to the thinker engine
  prefill_start    the thinker engine starts the prefill that holds the request
  prefill_end      first token sampled (GPU-synchronised: sampling reads the token on the host)
  first_token      the thinker thread hands token 0 (with the talker prompt, stream synchronised) to the request
  token_read       the request coroutine reads token 0 from its mailbox
  talker_posted    token 0 detokenized and posted to the talker thread
  talker_start     the talker thread starts the request's prefill (after applying its messages)
  talker_prefill   the talker prefill forward is launched (host time: its GPU work ends within the next frame)
  frame_1 .. n     each codec frame of the first chunk is read on the host (n = code2wav's first chunk frames,
                   or fewer when the talker ended before them: max_frames, codec end; a frame also waits for
                   the thinker token it speaks)
  code2wav_start   the code2wav thread starts the decode that yields the first PCM
  code2wav_end     that PCM is on the host
  audio_read       the request coroutine reads it from its mailbox
  audio_sent       the first audio event was handed to Triton's response sender

`phases()` gives the time between consecutive marks, named by the mark that ends each: they sum to
`ttfp()` (audio_sent - arrival) exactly. Frames are reported as `frame_1` (talker prefill -> first frame) and
`frames` (first -> last frame of the first chunk). The served model exports the phases as the histogram
`omni_first_audio_phase_seconds{model, phase}` and, with `OMNI_FIRST_AUDIO_LOG=1`, logs one `line()` per request;
`summarize` turns such log lines into a per-phase table (`python -m omni_backends.qwen3_omni.first_audio LOG`).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Iterable

MARKS = ("arrival", "submitted", "prefill_start", "prefill_end", "first_token", "token_read", "talker_posted",
         "talker_start", "talker_prefill")
TAIL = ("code2wav_start", "code2wav_end", "audio_read", "audio_sent")
# (phase, the mark that ends it, what it is), in path order; "frames" ends at the first chunk's last frame
PHASES = (
    ("prompt", "submitted", "request parsing, chat template, tokenizer"),
    ("queue", "prefill_start", "waiting for the thinker engine's next iteration"),
    ("thinker_prefill", "prefill_end", "thinker prefill forward and sampling of token 0"),
    ("first_token", "first_token", "token 0 and its talker prompt handed over (stream sync)"),
    ("token_read", "token_read", "mailbox wake-up of the request coroutine"),
    ("talker_posted", "talker_posted", "detokenizing, posting to the talker thread"),
    ("talker_start", "talker_start", "talker thread wake-up and message apply"),
    ("talker_prefill", "talker_prefill", "talker prompt built, prefill launched (host)"),
    ("frame_1", "frame_1", "prefill on the GPU, code 0 sampled, code predictor"),
    ("frames", None, "first -> last frame of the first chunk (each paced by the thinker token it speaks)"),
    ("code2wav_start", "code2wav_start", "code2wav thread wake-up"),
    ("code2wav", "code2wav_end", "the first chunk's decode, PCM on the host"),
    ("audio_read", "audio_read", "mailbox wake-up of the request coroutine"),
    ("audio_sent", "audio_sent", "the first audio event encoded and sent"),
)
PHASE_NAMES = tuple(name for name, _, _ in PHASES)
LOG_PREFIX = "first_audio"


class FirstAudioTimeline:
    """Marks of one request (module doc). `mark` is called from the request coroutine and the engine threads;
    each mark keeps its first time (later calls are ignored), so callers need not track whether they marked.

    Args:
        frames: codec frames of the first audio chunk (code2wav's `first_chunk_frames`), >= 1.
        arrival: monotonic time of the request's arrival (default: now).
    """

    def __init__(self, frames: int, arrival: float | None = None):
        if frames < 1:
            raise ValueError(f"first audio needs >= 1 frame, got {frames}")
        self.frames = frames
        self.order = (*MARKS, *(f"frame_{i}" for i in range(1, frames + 1)), *TAIL)
        self.marks: dict[str, float] = {"arrival": time.monotonic() if arrival is None else arrival}

    def mark(self, name: str, at: float | None = None) -> None:
        """Record mark `name` (one of `order`) at `at` (default: now), unless it is already recorded.
        Raises KeyError for an unknown mark."""
        if name not in self.order:
            raise KeyError(f"unknown first-audio mark {name!r}")
        self.marks.setdefault(name, time.monotonic() if at is None else at)

    def frame(self, index: int, at: float | None = None) -> None:
        """Mark codec frame `index` (1-based) of the first chunk; frames past it are ignored."""
        if 1 <= index <= self.frames:
            self.mark(f"frame_{index}", at)

    def required(self) -> tuple[str, ...]:
        """The marks of a complete timeline: `order` without the first chunk's frames after the last one made,
        when the talker ended before a whole first chunk (max_frames, codec end) and the decode took what there
        was (such requests used to be left out of the histogram)."""
        made = max((i for i in range(1, self.frames + 1) if f"frame_{i}" in self.marks), default=self.frames)
        return tuple(n for n in self.order if not (n.startswith("frame_") and int(n[len("frame_"):]) > made))

    def complete(self) -> bool:
        """True when every mark of `required()` is recorded."""
        return all(name in self.marks for name in self.required())

    def ttfp(self) -> float:
        """Seconds from arrival to the first audio event sent. Raises KeyError before audio_sent."""
        return self.marks["audio_sent"] - self.marks["arrival"]

    def phases(self) -> dict[str, float]:
        """{phase (`PHASE_NAMES`): seconds}, in path order; they sum to `ttfp()`. Raises ValueError when a mark is
        missing."""
        required = self.required()
        missing = [name for name in required if name not in self.marks]
        if missing:
            raise ValueError(f"first-audio timeline lacks {', '.join(missing)}")
        out, start = {}, self.marks["arrival"]
        last_frame = [name for name in required if name.startswith("frame_")][-1]
        for phase, end, _ in PHASES:
            at = self.marks[end or last_frame]
            out[phase], start = at - start, at
        return out

    def line(self, request_id: str) -> str:
        """One log line: `first_audio id=<id> ttfp_ms=<total> <phase>=<ms> ...` (milliseconds, 2 decimals)."""
        parts = " ".join(f"{name}={seconds * 1e3:.2f}" for name, seconds in self.phases().items())
        return f"{LOG_PREFIX} id={request_id} ttfp_ms={self.ttfp() * 1e3:.2f} {parts}"


_LINE = re.compile(rf"{LOG_PREFIX} id=(\S+) ttfp_ms=([\d.]+) (.*)$")
_PHASE = re.compile(r"(\w+)=(-?[\d.]+)")


def parse(lines: Iterable[str]) -> list[dict[str, float]]:
    """{"ttfp": ms, <phase>: ms, ...} of every `FirstAudioTimeline.line` found in `lines` (log lines may carry a
    prefix and quotes such as Triton's: `I1202 ... colocated_model.py:190] "first_audio id=..."`), in order."""
    rows = []
    for text in lines:
        found = _LINE.search(text.rstrip())
        if found:
            row = {"ttfp": float(found.group(2))}
            row.update((key, float(value)) for key, value in _PHASE.findall(found.group(3)))
            rows.append(row)
    return rows


def summarize(rows: list[dict[str, float]]) -> str:
    """A table of the median, min and max of TTFP and each phase over `rows` (milliseconds)."""
    if not rows:
        return "no first_audio lines"
    lines = [f"first audio, {len(rows)} requests (ms)   median      min      max", ]
    for key in ("ttfp", *PHASE_NAMES):
        values = [row[key] for row in rows if key in row]
        if values:
            lines.append(f"  {key:<32}{statistics.median(values):9.2f}{min(values):9.2f}{max(values):9.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-phase table of the first_audio lines of a server log.")
    parser.add_argument("log", help="a log holding FirstAudioTimeline lines (e.g. tritonserver.log)")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N requests (warm-ups)")
    parser.add_argument("--count", type=int, default=0, help="take at most N requests after those (0: all)")
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as handle:
        rows = parse(handle)[args.skip:]
    print(summarize(rows[:args.count] if args.count else rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
