"""Sentence chunker that cuts streamed LLM text into speakable pieces for TTS."""
import pytest

from omni_backends.voice.chunker import SentenceChunker, has_words

pytestmark = pytest.mark.unit


def _run(text: str, pieces: int = 1, **options) -> list[str]:
    """Feed `text` in deltas of `pieces` characters, then flush; return every chunk."""
    chunker = SentenceChunker(**options)
    chunks = []
    for start in range(0, len(text), pieces):
        chunks += chunker.feed(text[start:start + pieces])
    return chunks + chunker.flush()


def test_first_chunk_at_first_clause_then_sentences():
    text = "The capital of France is Paris, a city on the Seine. It has many museums, parks and cafes. Enjoy!"
    assert _run(text) == [
        "The capital of",                          # chunk 0: no clause boundary within 3 words
        "France is Paris,",                        # chunk 1 (<= 6 words): its clause boundary
        "a city on the Seine.",
        "It has many museums, parks and cafes.",
        "Enjoy!",
    ]


def test_same_chunks_whatever_the_delta_size():
    text = "Hello there, my friend. How are you doing today? I am fine, thanks for asking. Bye now."
    expected = _run(text, pieces=1)
    assert _run(text, pieces=7) == expected == _run(text, pieces=len(text))
    assert " ".join(expected) == text


def test_first_chunk_waits_for_min_words():
    assert _run("Yes, of course, I can help with that.", first_min_words=3) == [
        "Yes, of course,", "I can help with that."]


def test_numbers_and_abbreviations_do_not_split():
    text = "Mr. Smith paid 3.5 dollars, or 1,000 cents, for it. Dr. Jones did not."
    assert _run(text, first_min_words=3, first_max_words=6) == ["Mr. Smith paid 3.5 dollars,", "or 1,000 cents, for it.", "Dr. Jones did not."]


def test_boundary_needs_the_next_character():
    chunker = SentenceChunker(first_max_words=6)
    assert chunker.feed("It costs three dollars.") == []  # "." might be a decimal point until a space arrives
    assert chunker.feed(" Next") == ["It costs three dollars."]
    assert chunker.flush() == ["Next"]


def test_overlong_sentence_is_cut_at_a_clause_or_word_boundary():
    words = " ".join(f"w{i}" for i in range(25))
    assert _run(f"Start here, then go. {words}", first_min_words=3, first_max_words=6, max_words=10) == [
        "Start here, then go.", " ".join(f"w{i}" for i in range(10)),
        " ".join(f"w{i}" for i in range(10, 20)), " ".join(f"w{i}" for i in range(20, 25))]


def test_line_breaks_end_chunks_and_symbols_alone_are_dropped():
    assert _run("Here is a list of things\n- apples and pears\n***\n", first_max_words=6) == [
        "Here is a list of things", "- apples and pears"]


def test_flush_resets_for_a_new_stream():
    chunker = SentenceChunker(first_min_words=3, first_max_words=6)
    chunker.feed("One two three four, five six.")
    assert chunker.flush() == ["five six."]
    assert chunker.feed("Again one two, x") == ["Again one two,"]


def test_sentence_before_a_line_break_is_cut_first():
    assert _run("Sure, here it is. Two items follow\n", first_max_words=4) == ["Sure, here it is.", "Two items follow"]


def test_long_first_sentence_is_cut_after_first_max_words():
    text = "Paris is a city that has captivated me since I was a child. It is big."
    expected = ["Paris is a city that has captivated me", "since I was a child.", "It is big."]
    assert _run(text, first_max_words=8) == expected == _run(text, pieces=len(text), first_max_words=8)


def test_chunks_grow_from_a_clause_toward_sentences():
    text = ("Well, I think so, and here is why, in a few words. Paris has many old bridges, wide "
            "avenues, quiet parks and busy cafes, and its museums hold art from many centuries. The end.")
    chunks = _run(text, first_min_words=3, first_max_words=6)
    assert chunks == [
        "Well, I think so,",                                   # chunk 0: first clause with >= 3 words
        "and here is why, in a few words.",                    # chunk 1: clauses need >= 6 words
        "Paris has many old bridges, wide avenues, quiet parks and busy cafes,",  # chunk 2: >= 12 words
        "and its museums hold art from many centuries.",       # later: sentence ends only
        "The end.",
    ]
    assert _run(text) == [                                     # the defaults: 2 words min, 3 words max at first
        "Well, I think",                                       # no boundary after >= 2 words within 3 words
        "so, and here is why,",                                # chunk 1 (<= 6 words): its last clause boundary
        "in a few words.",                                     # chunk 2: a sentence end after >= 4 words
        "Paris has many old bridges, wide avenues, quiet parks and busy cafes, and its museums hold art from many "
        "centuries.",                                          # chunk 3: clauses need >= 16 words, 24 at most
        "The end.",
    ]


def test_chunk_word_limits_grow_from_first_max_words():
    """Without boundaries chunk k holds first_max_words * growth**k words (3, 6, 12, ...), at most max_words."""
    words = [f"w{i}" for i in range(60)]
    chunks = _run(" ".join(words))
    assert [len(c.split()) for c in chunks] == [3, 6, 12, 24, 15]
    assert [len(c.split()) for c in _run(" ".join(words), max_words=10)] == [3, 6, 10, 10, 10, 10, 10, 1]
    assert _run("Once upon a time there was a cat who loved the sea.") == [
        "Once upon a", "time there was a cat who", "loved the sea."]


def test_order_and_completeness_for_any_delta_split():
    import random
    import re

    words = "alpha beta, gamma delta. epsilon zeta; eta theta! iota kappa: lambda mu? nu xi 3.5 omicron".split()
    rng = random.Random(7)
    for _ in range(200):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
        chunker, chunks = SentenceChunker(), []
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            chunks += chunker.feed(text[start:end])
        chunks += chunker.flush()
        assert all(chunk and chunk == chunk.strip() for chunk in chunks)
        assert " ".join(chunks) == re.sub(r"\s+", " ", text).strip()  # every word, in order, once
        assert chunks == _run(text)  # the split of the deltas does not matter


def test_without_clauses_chunks_are_whole_sentences():
    text = ("The capital of France is Paris, a city on the Seine. Yes. Mr. Smith paid 3.5 dollars, or 1,000 cents!"
            " Is it far?\n- a list item, with a clause\nThe end")
    expected = ["The capital of France is Paris, a city on the Seine.", "Yes.",
                "Mr. Smith paid 3.5 dollars, or 1,000 cents!", "Is it far?", "- a list item, with a clause", "The end"]
    assert _run(text, clauses=False, min_words=1) == expected
    assert _run(text, pieces=5, clauses=False, min_words=1) == expected
    # min_words still joins short sentences; an over-long one is cut at its last clause within max_words
    assert _run("Yes. I can help, of course. Bye.", clauses=False, min_words=4) == ["Yes. I can help, of course.", "Bye."]
    assert _run("one two three, four five six seven.", clauses=False, min_words=1, max_words=5) == [
        "one two three,", "four five six seven."]


def test_a_long_input_of_short_clauses_is_chunked_in_linear_time():
    """The tts orchestrator chunks a whole /v1/audio/speech input at once, on its event loop. Each boundary
    used to count the words of the whole text before it again (and each over-long chunk rescanned every
    boundary of the rest), so 6 KB of "a, a, ..." took ~15 s on a loaded 2-core host (4 KB: ~5 s), during
    which every other speech request of the stage stalled. Linear now: a few hundredths of a second."""
    import time

    text = "a, " * 2000
    started = time.process_time()
    chunks = _run(text, pieces=len(text))
    assert time.process_time() - started < 1.0
    assert " ".join(chunks) == text.strip() and len(chunks) > 40


def test_wordless_pieces_are_dropped_or_kept_as_chunks_of_their_own():
    """A piece without a word ("👍", the "🎉" after a sentence, a "---" line) is dropped by default (speech, the
    speech WebSocket); the voice chat keeps it (keep_wordless) so that its audio transcript holds the whole answer,
    and it does not count toward the growth of the next chunks."""
    text = "👍\nGreat job! 🎉\n---\nSee you soon, my friend. Bye 🎉"
    plain, kept = SentenceChunker(), SentenceChunker(keep_wordless=True)
    assert plain.feed(text) + plain.flush() == ["Great job!", "See you soon, my friend.", "Bye 🎉"]
    chunks = kept.feed(text) + kept.flush()
    assert chunks == ["👍", "Great job!", "🎉", "---", "See you soon, my friend.", "Bye 🎉"]
    assert [c for c in chunks if has_words(c)] == ["Great job!", "See you soon, my friend.", "Bye 🎉"]  # same cuts
    assert SentenceChunker(keep_wordless=True).feed("👍") == [] and SentenceChunker(keep_wordless=True).flush() == []
