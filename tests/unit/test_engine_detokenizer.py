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


def test_flush_drops_an_incomplete_character_instead_of_a_replacement(tokenizer):
    """A stream cut inside a multi-byte character (max_tokens) ends without it: its bytes decode to U+FFFD, which
    OpenAI never sends; the text before it (the space too) is kept. The old flush returned " \ufffd"."""
    ids = tokenizer.encode("a 🎉")
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.add(i) for i in ids[:-1])
    assert "\ufffd" not in text
    assert text + detok.flush() == "a "
    assert tokenizer.decode(ids[:-1]) == "a \ufffd"  # what the old flush emitted


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """The tokenizer of the voice pipeline's LLM (SmolLM2-135M-Instruct, prepared as voice_llm loads it)."""
    from transformers import AutoTokenizer

    from omni_backends.paths import model_home
    from omni_backends.voice.models import prepare_llm

    return AutoTokenizer.from_pretrained(prepare_llm(model_home()))


@pytest.mark.parametrize("answer, cut, expected", [
    ("👍", 1, ""), ("👍", 2, ""), ("Great 👍", 2, "Great "), ("Great 👍", 3, "Great "), ("🎉🎉", 4, "🎉"),
    ("🎉🎉", 5, "🎉"), ("你好", 1, ""), ("你好", 3, "你"), ("ok 👍", None, "ok 👍"),
])
def test_a_stream_cut_inside_a_character_drops_it_with_the_voice_llm_tokenizer(smollm2_tokenizer, answer, cut,
                                                                                expected):
    """SmolLM2's byte-level BPE spells "👍" as 3 tokens (ðŁ ĳ į) and "你" as 2: a max_tokens cut after `cut` of
    them gives the text before the character, in the deltas and in all (the old flush ended in "\ufffd")."""
    ids = smollm2_tokenizer.encode(answer, add_special_tokens=False)[:cut]
    assert cut is None or smollm2_tokenizer.decode(ids).endswith("\ufffd")  # the cut really is inside a character
    detok = IncrementalDetokenizer(smollm2_tokenizer)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == expected
    assert not any("\ufffd" in d for d in deltas)


def test_a_real_replacement_character_is_kept_and_not_held_back(smollm2_tokenizer):
    """U+FFFD the model writes whole (its 3 bytes EF BF BD, one SmolLM2 token) is text of the answer: it is sent
    with its token and kept at the end, unlike an incomplete character's U+FFFD."""
    tok = smollm2_tokenizer
    ids = tok.encode("a\ufffd", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids] == ["a", "\ufffd"]
    assert detok.flush() == ""
    # a real one followed by a cut inside "👍", then the end-of-turn token: the real one stays
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("x\ufffd 👍", add_special_tokens=False)[:-1] + [eos]
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add(i) for i in ids) + detok.flush() == "x\ufffd "


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_text_stream_ends_without_the_incomplete_character_and_counts_its_tokens(smollm2_tokenizer, reason):
    """voice_llm's / the thinker's TextStream: cut by max_tokens ("length") inside "👍", or ended by the end-of-turn
    token right after a partial character ("stop"): no delta holds U+FFFD, the text is what came before the
    character, and completion_tokens counts every generated token (the partial ones and the end-of-turn one)."""
    from omni_backends.engine import StepOutput, TextStream

    tok = smollm2_tokenizer
    ids = tok.encode("Sure 👍", add_special_tokens=False)[:-1]
    if reason == "stop":
        ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    stream = TextStream(tok, prompt_tokens=5)
    deltas = [stream.step(StepOutput(t, i, finished=i == len(ids) - 1, finish_reason=reason if i == len(ids) - 1
                                     else None)) for i, t in enumerate(ids)]
    sent = [d for d in deltas if d is not None]
    assert "".join(d.text for d in sent) == "Sure "
    assert not any("\ufffd" in d.text for d in sent)
    assert sent[-1].finished and sent[-1].finish_reason == reason
    assert sent[-1].usage.completion_tokens == len(ids)


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


def test_the_qwen3_omni_thinker_tokenizer_drops_a_cut_character_and_keeps_a_real_replacement():
    """qwen3_omni's thinker streams through the same TextStream with its own byte-level BPE (the tiny Qwen-layout
    one spells "👍" in 4 single-byte tokens): every cut inside it ends at "ok ", the whole one is kept, and so is
    a real U+FFFD (3 tokens ï ¿ ½, held back only until its last byte came)."""
    from omni_backends.qwen3_omni.tiny_tokenizer import build_tokenizer

    tok = build_tokenizer()
    ids = tok.encode("ok 👍", add_special_tokens=False)
    for cut in range(len(ids) - 3, len(ids)):
        detok = IncrementalDetokenizer(tok)
        assert "".join(detok.add(i) for i in ids[:cut]) + detok.flush() == "ok "
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add(i) for i in ids) + detok.flush() == "ok 👍"
    ids = tok.encode("a\ufffd", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids][-1] == "\ufffd" and detok.flush() == ""
