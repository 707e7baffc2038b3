"""Incremental detokenizer on a real byte-level BPE (trained here, offline) and stop-string matching."""
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from omni_backends.engine import IncrementalDetokenizer, StopStringMatcher

pytestmark = pytest.mark.unit

QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
TEXT = "héllo 你好 🎉 world,  two  spaces\tand ünïcödé ✓ done"


@pytest.fixture(scope="module")
def tokenizer():
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    corpus = ["hello world, the quick brown fox", "héllo wörld", "spaces  and\ttabs"] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")


def test_streamed_deltas_equal_full_decode_without_replacement_chars(tokenizer):
    ids = tokenizer.encode(TEXT)
    # the tokenizer really splits multi-byte characters: decoding single tokens yields U+FFFD
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tokenizer.decode(ids) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas  # some tokens were held back until their character completed


def test_special_tokens_are_skipped_and_chunks_accepted(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = tokenizer.encode("ok 🎉") + [eos]
    detok = IncrementalDetokenizer(tokenizer)
    text = detok.add(ids[:2]) + detok.add(ids[2:]) + detok.flush()
    assert text == "ok 🎉"
    keep = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert keep.add(ids) + keep.flush() == "ok 🎉<|endoftext|>"


def test_flush_emits_an_incomplete_character_as_replacement(tokenizer):
    ids = tokenizer.encode("a 🎉")
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.add(i) for i in ids[:-1])
    assert "\ufffd" not in text
    assert detok.flush().endswith("\ufffd")


def test_stop_string_cut_across_deltas():
    matcher = StopStringMatcher(["</end>", "STOP"])
    emitted = []
    for delta in ["Hello </", "en", "d> ignored"]:
        text, stopped = matcher.feed(delta)
        emitted.append(text)
    assert emitted == ["Hello ", "", ""] and stopped
    assert matcher.feed("more") == ("", True)


def test_stop_string_false_alarm_is_released():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", False)
    assert matcher.feed("ART now S") == ("START now ", False)
    assert matcher.flush() == "S"


def test_text_stream_deltas_carry_the_usage_so_far(tokenizer):
    """Every delta has the request's counts so far (a realtime response cancelled mid-answer reports them);
    they used to come only with the last delta."""
    from omni_backends.engine import StepOutput, TextStream, Usage

    ids = tokenizer.encode("hello world, the quick brown fox")
    stream = TextStream(tokenizer, prompt_tokens=7)
    deltas = [stream.step(StepOutput(token_id, index)) for index, token_id in enumerate(ids)]
    sent = [(i, d) for i, d in enumerate(deltas) if d is not None]
    assert sent and all(d.usage == Usage(7, i + 1) for i, d in sent)
    final = stream.step(StepOutput(None, finished=True, finish_reason="length"))
    assert final.finished and final.usage == Usage(7, len(ids))
