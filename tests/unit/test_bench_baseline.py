"""The in-process baselines of `scripts/bench --baseline`: which kinds exist, and what the voice chain speaks
at a time (whole sentences for `inprocess`, the served chunks for `inprocess-chunked`) on the real models."""
from __future__ import annotations

import pytest

from omni_backends.voice.chunker import SentenceChunker
from omni_bench.baseline import INPROCESS, INPROCESS_CHUNKED, check_supported, run_baseline
from omni_bench.cli import parse_args
from omni_bench.records import AUDIO

pytestmark = pytest.mark.unit


def test_the_chunked_kind_is_for_voice_only():
    check_supported("voice", "chat-audio", INPROCESS_CHUNKED)
    check_supported("qwen3_omni", "chat-audio", INPROCESS)
    with pytest.raises(ValueError, match="inprocess-chunked is the voice chain"):
        check_supported("qwen3_omni", "chat-audio", INPROCESS_CHUNKED)
    with pytest.raises(ValueError, match="unknown in-process baseline 'inprocess-sentences'"):
        check_supported("voice", "chat-audio", "inprocess-sentences")


def test_cli_accepts_both_kinds_and_baseline_only_keeps_the_chunked_one(capsys):
    base = ["--workload", "chat-audio", "--model", "voice"]
    assert parse_args(base + ["--baseline", "inprocess"]).baseline == INPROCESS
    assert parse_args(base + ["--baseline", INPROCESS_CHUNKED]).baseline == INPROCESS_CHUNKED
    assert parse_args(base + ["--baseline", INPROCESS_CHUNKED, "--baseline-only"]).baseline == INPROCESS_CHUNKED
    assert parse_args(base + ["--baseline-only"]).baseline == INPROCESS
    with pytest.raises(SystemExit):
        parse_args(["--workload", "chat-audio", "--model", "qwen3_omni", "--baseline", INPROCESS_CHUNKED])
    assert "voice chain with the served chunking" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--baseline-prompts", "0"], "--baseline-prompts must be >= 1, got 0"),
    (["--baseline", "inprocess", "--baseline-prompts", "-1"], "--baseline-prompts must be >= 1, got -1"),
    (["--baseline-only", "--baseline-url", "http://127.0.0.1:9"], "--baseline-only runs no served levels"),
    (["--baseline-only", "--baseline", "pyproject.toml"], "got 'pyproject.toml'"),
    (["--baseline", ""], "an existing JSON file, got ''"),
])
def test_cli_rejects_bad_baseline_combinations(capsys, extra, message):
    with pytest.raises(SystemExit) as exited:
        parse_args(["--workload", "chat-audio", "--model", "voice"] + extra)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def _chunks(chunker: SentenceChunker, text: str) -> list[str]:
    return chunker.feed(text) + chunker.flush()


@pytest.mark.parametrize("kind, chunker", [(INPROCESS, lambda: SentenceChunker(clauses=False, min_words=1)),
                                           (INPROCESS_CHUNKED, SentenceChunker)])
def test_voice_chain_speaks_one_chunk_per_sentence_or_per_served_chunk(kind, chunker):
    prompt = "What is the capital of France? Answer in two sentences."
    records, duration = run_baseline("voice", "chat-audio", [prompt], max_tokens=40, voice=None, checkpoint=None,
                                     num_warmups=0, kind=kind)
    record = records[0]
    audio = [c for c in record.chunks if c.kind == AUDIO]
    expected = _chunks(chunker(), record.text)
    assert record.text and len(audio) == len(expected) and all(c.samples > 0 for c in audio)
    assert audio[-1].t <= duration and record.sample_rate == 24000
    sentences = _chunks(SentenceChunker(clauses=False, min_words=1), record.text)
    if kind == INPROCESS:
        assert all(s[-1] in ".!?" for s in sentences[:-1])  # every chunk but the last ends a sentence
    else:  # the served chunking starts with 2-3 words, so it speaks more, shorter pieces
        assert len(_chunks(SentenceChunker(), sentences[0])) > 1 and len(audio) > len(sentences)
