"""SmolLM2-135M-Instruct chat stage on the engine core (real model, CPU, greedy)."""
import threading

import pytest
import torch

from omni_backends.engine import SamplingParams
from omni_backends.errors import RequestError
from omni_backends.voice.llm import ChatLLM

pytestmark = pytest.mark.unit

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
JAPANESE = [{"role": "user", "content": "Say hello in Japanese."}]


@pytest.fixture(scope="session")
def llm():
    model = ChatLLM(max_running=4)
    yield model
    model.shutdown()


def _hf_greedy(llm, messages, max_new_tokens):
    """Reference: transformers' own generate() on the same weights, decoded at once."""
    ids = torch.tensor([llm.prompt_ids(messages)])
    out = llm.engine.runner.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                           do_sample=False, eos_token_id=list(llm.end_token_ids))
    return llm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_greedy_answer_names_paris(llm):
    text, final = llm.complete(FRANCE, GREEDY)
    assert "Paris" in text
    assert final.finish_reason == "stop"  # ended by the end-of-turn token, before max_tokens
    assert final.usage.prompt_tokens == len(llm.prompt_ids(FRANCE))
    assert 0 < final.usage.completion_tokens < GREEDY.max_tokens


def test_streamed_text_equals_transformers_generate(llm):
    deltas = [d.text for d in llm.generate(JAPANESE, GREEDY)]
    text = "".join(deltas)
    assert text == _hf_greedy(llm, JAPANESE, GREEDY.max_tokens)
    assert any(ord(ch) > 0x3000 for ch in text)  # multi-byte characters over several byte-level tokens
    assert all("\ufffd" not in d for d in deltas)


def test_concurrent_requests_are_batched_and_match_solo_answers(llm):
    chat = [{"role": "user", "content": "Name three colors."}]
    alone = {name: llm.complete(msgs, GREEDY)[0] for name, msgs in (("france", FRANCE), ("colors", chat))}
    together, start = {}, threading.Barrier(2)

    def run(name, msgs):
        start.wait()
        together[name] = llm.complete(msgs, GREEDY)[0]

    steps_before = llm.engine.stats().steps
    threads = [threading.Thread(target=run, args=item) for item in (("france", FRANCE), ("colors", chat))]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert together == alone
    solo_steps = sum(len(llm.tokenizer(t).input_ids) for t in alone.values())
    assert llm.engine.stats().steps - steps_before < solo_steps  # shared decode steps


def test_max_tokens_and_stop_strings(llm):
    text, final = llm.complete(FRANCE, SamplingParams(max_tokens=3, temperature=0.0))
    assert final.finish_reason == "length" and final.usage.completion_tokens == 3
    text, final = llm.complete(FRANCE, GREEDY, stop=[" Paris"])
    assert final.finish_reason == "stop" and "Paris" not in text and text.startswith("The capital")


EMOJI = [{"role": "user", "content": "Reply with only this emoji: 👍"}]


@pytest.mark.parametrize("max_tokens, expected", [(2, ""), (4, "👍"), (5, "👍"), (7, "👍👍"), (9, "👍👍👍")])
def test_an_answer_cut_inside_an_emoji_ends_before_it(llm, max_tokens, expected):
    """SmolLM2 answers EMOJI with "👍👍👍..." greedily, each "👍" 3 byte-level tokens: a max_tokens cut inside one
    ends the answer before it, in the deltas and in all (was a trailing U+FFFD, the decode of the partial tokens),
    and completion_tokens still counts every generated token."""
    deltas = list(llm.generate(EMOJI, SamplingParams(max_tokens=max_tokens, temperature=0.0)))
    assert "".join(d.text for d in deltas) == expected
    assert not any("\ufffd" in d.text for d in deltas)
    assert deltas[-1].finish_reason == "length" and deltas[-1].usage.completion_tokens == max_tokens


def test_closing_the_stream_aborts_the_request(llm):
    stream = llm.generate(FRANCE, SamplingParams(max_tokens=200, temperature=0.0))
    next(stream)
    stream.close()
    for _ in range(100):
        if llm.engine.stats().in_flight == 0:
            break
        threading.Event().wait(0.05)
    assert llm.engine.stats().in_flight == 0


def test_bad_requests_raise_request_errors(llm):
    with pytest.raises(RequestError, match="messages"):
        llm.complete([], GREEDY)
    with pytest.raises(RequestError, match="context length"):
        llm.complete(FRANCE, SamplingParams(max_tokens=llm.context_length, temperature=0.0))


def test_sampling_params_from_openai_fields(llm):
    params = llm.sampling_params({"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 5, "seed": 3,
                                  "stop": ["x"], "messages": []})
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (0.7, 0.9, 0, 5, 3)
    assert llm.sampling_params({"temperature": None}) == llm.sampling_params({})
    with pytest.raises(RequestError) as info:
        llm.sampling_params({"max_tokens": 0})
    assert info.value.param == "max_tokens"


def test_a_huge_prompt_is_rejected_from_its_length_before_tokenizing(llm):
    huge = [{"role": "user", "content": "a " * (10 * 1024 * 1024)}]
    with pytest.raises(RequestError, match="characters: at least") as info:
        llm.prepare(huge, SamplingParams(max_tokens=1, temperature=0.0))
    assert info.value.param == "messages"
    # the largest prompt the check lets through still fails the exact (tokenized) check when it is too long
    assert llm.longest_token * llm.context_length < 10 * 1024 * 1024


def test_extreme_openai_sampling_fields_are_served(llm):
    body = {"temperature": 1e-40, "top_p": 1e-300, "top_k": 10**9, "presence_penalty": 2.0, "frequency_penalty": -2.0,
            "repetition_penalty": 1e30, "seed": -2**63, "max_tokens": 4}
    text, final = llm.complete(FRANCE, llm.sampling_params(body))
    assert final.finish_reason in ("stop", "length") and 0 < final.usage.completion_tokens <= 4
    text2, _ = llm.complete(FRANCE, llm.sampling_params({**body, "temperature": 0}))
    assert text == text2  # a temperature below 1e-5 is greedy
    with pytest.raises(RequestError) as info:
        llm.sampling_params({"presence_penalty": 3})
    assert info.value.param == "presence_penalty"

def test_prefix_cache_reuses_the_system_prompt_and_gives_the_same_tokens(llm):
    """The template's system part is prefilled once per system prompt and reused; answers stay the tokens
    of transformers' generate() over the full prompt (no cache)."""
    cache, params = llm.prefix_cache, SamplingParams(max_tokens=12, temperature=0.0)
    pirate = [{"role": "system", "content": "You are a pirate. Answer briefly."},
              {"role": "user", "content": "Where is the treasure?"}]
    conversations = {"france": FRANCE, "japanese": JAPANESE, "pirate": pirate}
    expected = {name: _hf_greedy(llm, messages, params.max_tokens) for name, messages in conversations.items()}
    france_ids = llm.prompt_ids(FRANCE)
    head = llm.shared_prefix_length(FRANCE, france_ids)
    assert 10 < head < len(france_ids) and france_ids[:head] in cache  # the default system prompt, stored at warm-up
    hits = cache.hits
    for name in ("pirate", "pirate", "japanese"):  # pirate: first a miss that stores its prefix, then a hit
        assert llm.complete(conversations[name], params)[0] == expected[name]
    assert cache.hits == hits + 2
    pirate_ids = llm.prompt_ids(pirate)
    assert pirate_ids[:llm.shared_prefix_length(pirate, pirate_ids)] in cache
    answers = {}  # submitted together: prefilled in groups that share a cached prefix
    threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, llm.complete(conversations[n], params)[0]))
               for n in conversations]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert answers == expected


def test_a_conversations_next_turn_is_prefilled_after_its_previous_prompt(llm):
    """Each prompt is kept whole, so the next turn of its conversation prefills only the reply and the new
    user text, also when the prompts are longer than one prefill chunk (128 tokens: chunked prefill); the
    answers stay the tokens of transformers' generate() over the full prompt."""
    params = SamplingParams(max_tokens=12, temperature=0.0)
    notes = "Here are my notes. " + " ".join(f"Box {i} holds {n} red apples." for i, n in enumerate(range(3, 30)))
    turn1 = [{"role": "user", "content": notes + " How many apples are in box 2?"}]
    ids1 = llm.prompt_ids(turn1)
    assert len(ids1) > llm.engine.runner.prefill_chunk   # prefilled in chunks
    text1, _ = llm.complete(turn1, params)
    assert text1 == _hf_greedy(llm, turn1, params.max_tokens) and ids1 in llm.prefix_cache
    turn2 = [*turn1, {"role": "assistant", "content": text1}, {"role": "user", "content": "And in box 5?"}]
    ids2 = llm.prompt_ids(turn2)
    assert ids2[:len(ids1)] == ids1
    fed = []   # tokens each forward of the engine feeds
    hook = llm.engine.runner.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        text2, final = llm.complete(turn2, params)
    finally:
        hook.remove()
    assert text2 == _hf_greedy(llm, turn2, params.max_tokens)
    # the prefill fed what follows the first turn's prompt (plus one token per decode step), not the whole prompt
    assert sum(fed) == len(ids2) - len(ids1) + final.usage.completion_tokens - 1 < len(ids2)
