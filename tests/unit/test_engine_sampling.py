"""SamplingParams validation and per-row sampling, alone and inside the engine loop."""
import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from omni_backends.engine import DecoderRunner, EngineLoop, Prompt, SamplingParams, make_generator, sample_next_token

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be an integer in \[0, max_tokens=4\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"seed": 1.5}, "seed must be an integer or None"),
        ({"stop_token_ids": (-1,)}, "non-negative token ids"),
    ],
)
def test_invalid_params_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_from_dict_rejects_unknown_keys_and_converts_lists():
    params = SamplingParams.from_dict({"temperature": 0.5, "stop_token_ids": [3, 4], "seed": 7})
    assert params.stop_token_ids == (3, 4) and params.temperature == 0.5 and params.seed == 7
    with pytest.raises(ValueError, match=r"unknown sampling parameter\(s\) \['topp'\]"):
        SamplingParams.from_dict({"topp": 0.9})


def test_greedy_modes_pick_argmax():
    logits = torch.tensor([0.1, 2.0, 1.9, -3.0])
    assert sample_next_token(logits, SamplingParams(temperature=0)) == 1
    assert sample_next_token(logits, SamplingParams(do_sample=False, temperature=5.0)) == 1
    assert sample_next_token(logits, SamplingParams(top_k=1), generator=make_generator(0)) == 1


def test_top_p_keeps_only_the_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    params = SamplingParams(top_p=0.7)  # nucleus = tokens 0 and 1 (0.5 + 0.3 >= 0.7)
    gen = make_generator(123)
    drawn = {sample_next_token(probs.log(), params, generator=gen) for _ in range(300)}
    assert drawn == {0, 1}


def test_suppress_and_min_tokens_mask_tokens():
    logits = torch.tensor([5.0, 4.0, 1.0])
    assert sample_next_token(logits, SamplingParams(temperature=0, suppress_token_ids=(0,))) == 1
    params = SamplingParams(temperature=0, stop_token_ids=(0,), min_tokens=2)
    assert sample_next_token(logits, params, num_generated=1) == 1  # stop token masked before min_tokens
    assert sample_next_token(logits, params, num_generated=2) == 0


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(0)
    logits = torch.randn(16)
    seen = torch.tensor([1, 3, 3, 7, 12])
    expected = RepetitionPenaltyLogitsProcessor(1.7)(seen[None], logits[None].clone())[0]
    assert sample_next_token(logits, SamplingParams(temperature=0, repetition_penalty=1.7), seen) == int(
        expected.argmax()
    )
    # a case where the penalty changes the greedy choice
    flat = torch.tensor([2.0, 1.9, -1.0])
    assert sample_next_token(flat, SamplingParams(temperature=0, repetition_penalty=1.2), torch.tensor([0])) == 1


def run(engine, rid, prompt, params):
    tokens, done = [], threading.Event()

    def on_output(_rid, out):
        if out.token_id is not None:
            tokens.append(out.token_id)
        if out.finished:
            done.set()

    engine.submit(rid, Prompt(input_ids=torch.tensor(prompt)), params, on_output)
    return tokens, done


def test_seeded_sampling_is_reproducible_and_independent_of_batch_mates():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    engine = EngineLoop(DecoderRunner(model))
    seeded = SamplingParams(max_tokens=24, temperature=1.5, top_k=50, top_p=0.95, seed=42)
    try:
        alone, done = run(engine, "alone", [1, 2, 3], seeded)
        assert done.wait(30)
        runs = [run(engine, "a", [1, 2, 3], seeded), run(engine, "noise", [9, 8, 7, 6], SamplingParams(max_tokens=30)),
                run(engine, "other-seed", [1, 2, 3], SamplingParams(max_tokens=24, temperature=1.5, top_k=50,
                                                                    top_p=0.95, seed=43))]
        assert all(d.wait(30) for _, d in runs)
    finally:
        engine.shutdown()
    assert len(alone) == 24
    assert runs[0][0] == alone  # same seed, different batch => same tokens
    assert runs[2][0] != alone  # a different seed draws differently
    assert len(set(alone)) > 3  # really sampled, not a greedy loop
