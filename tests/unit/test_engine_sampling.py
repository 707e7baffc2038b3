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
        ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number > 0"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"do_sample": "yes"}, "do_sample must be a boolean"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be an integer in \[0, max_tokens=4\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
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


# Every value SamplingParams accepts, at its extremes, alone and combined (the request values that used to
# kill the engine thread: temperature 1e-40 overflowed logits / temperature to inf and softmax gave NaN).
EXTREMES = [
    {"temperature": 1e-40}, {"temperature": 5e-324}, {"temperature": 1e-6}, {"temperature": 2.0},
    {"temperature": 2.0, "top_p": 5e-324}, {"top_p": 1e-300}, {"top_k": 10**9}, {"top_k": 1},
    {"repetition_penalty": 1e-30}, {"repetition_penalty": 1e30}, {"repetition_penalty": 5e-324},
    {"presence_penalty": 2.0}, {"presence_penalty": -2.0}, {"frequency_penalty": 2.0}, {"frequency_penalty": -2.0},
    {"seed": -2**63}, {"seed": 2**63 - 1}, {"max_tokens": 1}, {"min_tokens": 3, "max_tokens": 3},
    {"temperature": 1e-40, "top_p": 1e-300, "top_k": 10**9, "repetition_penalty": 1e30, "presence_penalty": 2.0,
     "frequency_penalty": -2.0, "seed": 0},
    {"temperature": 2.0, "repetition_penalty": 1e-30, "presence_penalty": -2.0, "frequency_penalty": 2.0},
]
HOSTILE_LOGITS = {
    "normal": torch.randn(256, generator=torch.Generator().manual_seed(0)) * 5,
    "huge": torch.tensor([3e38, -3e38, 1e38, 0.0] * 64),
    "with_inf_nan": torch.tensor([float("inf"), float("nan"), float("-inf"), 1.0] * 64),
    "flat": torch.zeros(256),
}


@pytest.mark.parametrize("values", EXTREMES, ids=lambda v: ",".join(f"{k}={v[k]:g}" for k in v))
@pytest.mark.parametrize("logits", HOSTILE_LOGITS.values(), ids=HOSTILE_LOGITS.keys())
def test_sampling_at_extremes_never_raises_and_stays_in_the_vocabulary(values, logits):
    params = SamplingParams(**{"stop_token_ids": (3,), **values})
    history = torch.tensor([0, 1, 1, 2, 3, 200])
    prompt = torch.tensor([5, 6, 0])
    for output_ids in (None, history):
        seen = prompt if output_ids is None else torch.cat([prompt, output_ids])
        generated = 0 if output_ids is None else output_ids.numel()
        token = sample_next_token(logits, params, seen, generated, make_generator(params.seed), output_ids)
        assert 0 <= token < logits.numel()
        assert not torch.isnan(logits[token]), "a NaN logit was picked"


def test_tiny_temperature_is_greedy_and_masks_yield_when_they_would_empty_the_vocabulary():
    logits = torch.tensor([0.1, 2.0, 1.9, -3.0])
    assert sample_next_token(logits, SamplingParams(temperature=1e-40)) == 1
    everything = SamplingParams(temperature=0, suppress_token_ids=(0, 1, 2, 3))
    assert sample_next_token(logits, everything) == 1
    with pytest.raises(ValueError, match="no finite logit"):
        sample_next_token(torch.full((4,), float("nan")), SamplingParams())


def test_presence_and_frequency_penalties_follow_openai():
    logits = torch.tensor([2.0, 1.5, 1.0])
    generated = torch.tensor([0, 0, 0])
    # frequency: 2.0 - 3 * 0.2 = 1.4 < 1.5; presence alone: 2.0 - 0.4 = 1.6 > 1.5
    assert sample_next_token(logits, SamplingParams(temperature=0, frequency_penalty=0.2), output_ids=generated) == 1
    assert sample_next_token(logits, SamplingParams(temperature=0, presence_penalty=0.4), output_ids=generated) == 0
    assert sample_next_token(logits, SamplingParams(temperature=0, presence_penalty=0.6), output_ids=generated) == 1
    # the prompt does not count for presence/frequency (OpenAI: "in the text so far" = the completion)
    assert sample_next_token(logits, SamplingParams(temperature=0, presence_penalty=2.0), seen_token_ids=torch.tensor([0])) == 0


def test_engine_serves_every_extreme_request_batched_with_a_normal_one():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    engine = EngineLoop(DecoderRunner(model), max_running=len(EXTREMES) + 1)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    try:
        alone, done = run(engine, "alone", [1, 2, 3], greedy)
        assert done.wait(30)
        extreme = [run(engine, f"x{i}", [4, 5, 6, 7], SamplingParams(**{"max_tokens": 6, **v}))
                   for i, v in enumerate(EXTREMES)]
        normal = run(engine, "normal", [1, 2, 3], greedy)
        assert all(d.wait(30) for _, d in extreme + [normal])
        assert normal[0] == alone  # the batch mate is unaffected
        assert [len(tokens) for tokens, _ in extreme] == [min(6, v.get("max_tokens", 6)) for v in EXTREMES]
        assert engine.healthy and engine.stats().restarts == 0 and engine.stats().in_flight == 0
    finally:
        engine.shutdown()


def test_greedy_pick_equals_sample_rows_without_synchronising():
    """The fixed-shape device pick (`greedy_pick`, inside the talker's frame graph) gives `sample_rows`' ids for
    greedy rows sharing a suppress and a stop set, the stop masked in some rows: NaN / +-inf logits, a row whose
    masks remove every finite token (it yields), a row of NaN only, empty suppress and stop sets."""
    from omni_backends.engine.sampling import greedy_pick, sample_rows

    torch.manual_seed(3)
    logits = torch.randn(6, 40)
    logits[1, 5], logits[1, 9], logits[2, 0] = float("nan"), float("inf"), float("-inf")
    top = int(logits[0].argmax())
    logits[3] = float("-inf")
    logits[3, 30:33] = torch.tensor([1.0, 2.0, 3.0])   # finite only at suppressed / stop ids: the masks yield
    logits[4] = float("nan")
    for suppress, stop in [((30, 31, top), (32,)), ((), ()), ((), (top,))]:
        banned = [n < 2 for n in (0, 2, 1, 0, 0, 5)]   # rows with 0 or 1 generated tokens of min_tokens=2 mask stop
        params = [SamplingParams(do_sample=False, suppress_token_ids=suppress, stop_token_ids=stop, min_tokens=2)
                  for _ in banned]
        expected = sample_rows(logits, params, [None] * 6, [0, 2, 1, 0, 0, 5], [None] * 6)
        got = greedy_pick(logits, torch.tensor(suppress, dtype=torch.long), torch.tensor(stop, dtype=torch.long),
                          torch.tensor(banned))
        assert got.tolist() == expected
    assert expected[0] != top and got.dtype == torch.long   # the last set: the top id is a stop id of row 0


def test_to_device_and_host_copy_on_cpu():
    from omni_backends.engine.transfer import HostCopy, to_device

    values = to_device([[1, 2], [3, 4]], torch.long, torch.device("cpu"))
    assert values.tolist() == [[1, 2], [3, 4]] and values.dtype == torch.long
    assert HostCopy(values * 2).result().tolist() == [[2, 4], [6, 8]]
