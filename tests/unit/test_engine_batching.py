"""EngineLoop + DecoderRunner: continuous batching must reproduce each prompt's own greedy generate()."""
import threading

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from omni_backends.engine import (
    DecoderRunner,
    EngineLoop,
    KVBatch,
    Prompt,
    SamplingParams,
    cache_layers,
    text_mrope_position_ids,
)

pytestmark = pytest.mark.unit

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
N_NEW = 8
EOS = 251  # never produced by the tiny models below within N_NEW greedy steps, checked by the reference


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen3():
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Qwen3ForCausalLM(cfg).eval()


def tiny_thinker():
    """The thinker of the tiny Qwen3-Omni recipe (models.md section 1)."""
    torch.manual_seed(2)
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "interleaved": True}
    cfg = Qwen3OmniMoeThinkerConfig(
        text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=2048, rope_parameters=rope),
        audio_config=dict(d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64, encoder_layers=1,
                          num_mel_bins=32, output_dim=64, downsample_hidden_size=32, n_window=50, n_window_infer=100),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16,
                           spatial_merge_size=2, out_hidden_size=64, deepstack_visual_indexes=[0],
                           num_position_embeddings=64),
        audio_token_id=245, image_token_id=246, video_token_id=247, audio_start_token_id=248, user_token_id=241,
        vision_start_token_id=249,
    )
    return Qwen3OmniMoeThinkerForConditionalGeneration(cfg).eval()


def reference(model, prompt, **kwargs):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, do_sample=False,
                             eos_token_id=EOS, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def run_staggered(engine, prompts, params, join_after=2):
    """Submit prompt 0, then prompt i+1 from the callback once prompt i has produced `join_after` tokens
    (or finished), so the requests join the batch at different steps. Returns {rid: [StepOutput]}."""
    outputs = {str(i): [] for i in range(len(prompts))}
    done = threading.Event()

    submitted = set()

    def submit(i):
        submitted.add(i)
        engine.submit(str(i), Prompt(input_ids=torch.tensor(prompts[i])), params, on_output)

    def on_output(rid, out):
        outputs[rid].append(out)
        nxt = int(rid) + 1
        if nxt < len(prompts) and nxt not in submitted and (len(outputs[rid]) == join_after or out.finished):
            submit(nxt)
        if all(o and o[-1].finished for o in outputs.values()):
            done.set()

    submit(0)
    assert done.wait(30), "engine did not finish"
    return outputs


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen3], ids=["llama", "qwen3"])
def test_staggered_batched_greedy_equals_generate(build):
    model = build()
    refs = [reference(model, p) for p in PROMPTS]
    engine = EngineLoop(DecoderRunner(model))
    try:
        outputs = run_staggered(engine, PROMPTS, SamplingParams(max_tokens=N_NEW, temperature=0, stop_token_ids=(EOS,)))
        for i, ref in enumerate(refs):
            assert [o.token_id for o in outputs[str(i)]] == ref
            assert outputs[str(i)][-1].finish_reason == ("stop" if ref[-1] == EOS else "length")
        stats = engine.stats()
        # staggered joins => batched decode steps: far fewer forwards than one per token per request
        assert stats.generated_tokens == sum(len(r) for r in refs)
        assert stats.steps < stats.generated_tokens - len(PROMPTS)
        assert stats.in_flight == 0 and stats.running == 0
        assert len(engine.runner.kv) == 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("prefill_chunk", [0, 3], ids=["whole", "chunked"])
def test_thinker_text_only_with_mrope_positions_and_hidden_states(prefill_chunk):
    thinker = tiny_thinker()
    refs = [reference(thinker, p) for p in PROMPTS]
    accept_layer = 2
    runner = DecoderRunner(thinker, hidden_layers=(0, accept_layer), position_ids_fn=text_mrope_position_ids,
                           prefill_chunk=prefill_chunk)
    engine = EngineLoop(runner)
    try:
        outputs = run_staggered(engine, PROMPTS, SamplingParams(max_tokens=N_NEW, do_sample=False, stop_token_ids=(EOS,)))
    finally:
        engine.shutdown()
    for i, (prompt, ref) in enumerate(zip(PROMPTS, refs)):
        outs = outputs[str(i)]
        assert [o.token_id for o in outs] == ref
        # hidden states of every fed token (prompt, then each generated token but the last) equal
        # one unbatched forward over the whole sequence
        fed = torch.tensor([prompt + ref[:-1]])
        with torch.no_grad():
            full = thinker(input_ids=fed, position_ids=text_mrope_position_ids(torch.arange(fed.shape[1])[None]),
                           output_hidden_states=True)
        assert outs[0].hidden_states[0].shape == (len(prompt), 64)
        for layer in (0, accept_layer):
            got = torch.cat([o.hidden_states[layer] for o in outs])
            torch.testing.assert_close(got, full.hidden_states[layer][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen3], ids=["llama", "qwen3"])
def test_chunked_prefill_equals_generate(build):
    model = build()
    refs = [reference(model, p) for p in PROMPTS]
    engine = EngineLoop(DecoderRunner(model, prefill_chunk=3))
    try:
        outputs = run_staggered(engine, PROMPTS, SamplingParams(max_tokens=N_NEW, temperature=0, stop_token_ids=(EOS,)))
        assert [[o.token_id for o in outputs[str(i)]] for i in range(len(PROMPTS))] == refs
        assert engine.stats().in_flight == 0 and len(engine.runner.kv) == 0
    finally:
        engine.shutdown()


def test_a_long_prefill_interleaves_with_running_decodes():
    """A long prompt is prefilled 3 tokens per step while the running request keeps decoding."""
    model = tiny_llama()
    engine = EngineLoop(DecoderRunner(model, prefill_chunk=3))
    order, long_tokens, done = [], [], threading.Event()
    long_prompt = list(range(10, 40))  # 30 tokens: 10 prefill steps
    params = SamplingParams(max_tokens=2, temperature=0)

    def on_output(rid, out):
        order.append(rid)
        if rid == "short" and len(order) == 1:
            engine.submit("long", Prompt(input_ids=torch.tensor(long_prompt)), params, on_output)
        if rid == "long" and out.token_id is not None:
            long_tokens.append(out.token_id)
        if rid == "long" and out.finished:
            done.set()

    try:
        engine.submit("short", Prompt(input_ids=torch.tensor([1, 2])), SamplingParams(max_tokens=40, temperature=0),
                      on_output)
        assert done.wait(30)
    finally:
        engine.shutdown()
    assert order[:order.index("long")].count("short") >= 10  # a decode step between prefill chunks
    ids = torch.tensor([long_prompt])
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                             do_sample=False, pad_token_id=0)[0, len(long_prompt):].tolist()
    assert long_tokens == ref


def test_prompts_arriving_together_are_prefilled_in_one_forward():
    model = tiny_llama()
    refs = [reference(model, p) for p in PROMPTS]
    runner = DecoderRunner(model)
    calls = []
    original = runner.prefill
    runner.prefill = lambda requests: calls.append(len(requests)) or original(requests)
    engine = EngineLoop(runner)
    results = {str(i): [] for i in range(len(PROMPTS))}
    done = threading.Event()
    first = threading.Event()
    gate = threading.Event()

    def on_output(rid, out):
        first.set()
        gate.wait()
        results[rid].append(out.token_id)
        if engine.num_in_flight == 0:
            done.set()

    params = SamplingParams(max_tokens=N_NEW, temperature=0, stop_token_ids=(EOS,))
    try:
        # hold the engine thread inside the first callback so the other three arrive together
        engine.submit("0", Prompt(input_ids=torch.tensor(PROMPTS[0])), params, on_output)
        assert first.wait(10)
        for i in (1, 2, 3):
            engine.submit(str(i), Prompt(input_ids=torch.tensor(PROMPTS[i])), params, on_output)
        gate.set()
        assert done.wait(30)
    finally:
        engine.shutdown()
    assert calls == [1, 3]
    assert [results[str(i)] for i in range(4)] == refs


def test_abort_frees_request_and_leaves_others_unchanged():
    model = tiny_llama()
    long_params = SamplingParams(max_tokens=40, temperature=0)
    refs = {"a": None, "c": None}
    with torch.no_grad():
        for rid, p in (("a", PROMPTS[1]), ("c", PROMPTS[3])):
            refs[rid] = model.generate(torch.tensor([p]), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                                       pad_token_id=0)[0, len(p):].tolist()
    engine = EngineLoop(DecoderRunner(model))
    outputs = {"a": [], "b": [], "c": []}
    done = threading.Event()

    def on_output(rid, out):
        outputs[rid].append(out)
        if rid == "b" and len(outputs["b"]) == 3:
            assert engine.abort("b")
        if all(o and o[-1].finished for o in outputs.values()):
            done.set()

    try:
        engine.submit("a", Prompt(input_ids=torch.tensor(PROMPTS[1])), long_params, on_output)
        engine.submit("b", Prompt(input_ids=torch.tensor(PROMPTS[2])), long_params, on_output)
        engine.submit("c", Prompt(input_ids=torch.tensor(PROMPTS[3])), long_params, on_output)
        assert done.wait(30)
        assert engine.num_in_flight == 0
        assert len(engine.runner.kv) == 0
        assert engine.abort("b") is False  # already finished
    finally:
        engine.shutdown()
    b = outputs["b"]
    assert [o.finished for o in b] == [False, False, False, True]  # no token after the abort took effect
    assert b[-1].finish_reason == "abort" and b[-1].token_id is None
    assert [o.token_id for o in outputs["a"]] == refs["a"]
    assert [o.token_id for o in outputs["c"]] == refs["c"]


def test_shutdown_aborts_in_flight_requests_and_rejects_new_ones():
    engine = EngineLoop(DecoderRunner(tiny_llama()))
    finals = []
    engine.submit("x", Prompt(input_ids=torch.tensor(PROMPTS[0])), SamplingParams(max_tokens=10_000, temperature=0),
                  lambda rid, out: out.finished and finals.append(out.finish_reason))
    engine.shutdown(timeout=10)
    assert finals == ["abort"]
    assert engine.num_in_flight == 0
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit("y", Prompt(input_ids=torch.tensor([1])), SamplingParams(), lambda rid, out: None)


def test_duplicate_request_id_is_rejected():
    engine = EngineLoop(DecoderRunner(tiny_llama()))
    gate = threading.Event()
    try:
        engine.submit("x", Prompt(input_ids=torch.tensor([1, 2])), SamplingParams(max_tokens=2),
                      lambda rid, out: gate.wait(10))
        with pytest.raises(ValueError, match="already in flight"):
            engine.submit("x", Prompt(input_ids=torch.tensor([1])), SamplingParams(), lambda rid, out: None)
    finally:
        gate.set()
        engine.shutdown()


def test_kv_batch_left_pads_masks_and_trims():
    def layers(length, fill):
        return [(torch.full((1, 2, length, 4), fill), torch.full((1, 2, length, 4), -fill))] * 3

    kv = KVBatch()
    kv.add([("a", layers(2, 1.0)), ("b", layers(5, 2.0))])
    cache, mask = kv.step_inputs(1)
    assert kv.width == 5 and kv.request_ids == ["a", "b"]
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    keys = cache.layers[0].keys
    assert keys.shape == (2, 2, 5, 4)
    assert keys[0, 0, :, 0].tolist() == [0, 0, 0, 1, 1]  # zero left padding
    kv.remove(["b"])
    assert kv.width == 2 and kv.length("a") == 2
    assert kv.step_inputs(1)[0].layers[0].keys.shape == (1, 2, 2, 4)  # leading padding trimmed
    with pytest.raises(ValueError, match="already in the KV batch"):
        kv.add([("a", layers(1, 3.0))])


def test_sliding_window_caches_are_refused():
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         use_sliding_window=True, sliding_window=4, max_window_layers=0))
    from transformers.cache_utils import DynamicCache
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]]), cache=DynamicCache(config=model.config), use_cache=True)
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        cache_layers(out.cache)


class _FailingRunner(DecoderRunner):
    """Breaks the loop itself: after `arm()`, a decode fails and so does releasing its requests."""

    armed = False

    def arm(self):
        self.armed = True

    def decode(self, requests, token_ids):
        if self.armed:
            raise RuntimeError("decode exploded")
        return super().decode(requests, token_ids)

    def release(self, request_ids):
        if self.armed:
            self.armed = False
            raise RuntimeError("release exploded")
        super().release(request_ids)


def test_a_crashed_loop_fails_its_requests_as_unavailable_and_restarts_fresh():
    model = tiny_llama()
    health = []
    runner = _FailingRunner(model)
    engine = EngineLoop(runner, on_health=health.append)
    finals, first = [], threading.Event()

    def on_output(rid, out):
        first.set()
        if out.finished:
            finals.append(out)

    try:
        engine.submit("victim", Prompt(input_ids=torch.tensor(PROMPTS[1])), SamplingParams(max_tokens=10_000, temperature=0),
                      on_output)
        assert first.wait(10)
        runner.arm()
        for _ in range(200):
            if finals:
                break
            threading.Event().wait(0.02)
        assert [(f.finish_reason, f.unavailable) for f in finals] == [("error", True)]
        assert "engine-loop failed" in finals[0].error and "release exploded" in finals[0].error
        assert not engine.healthy
        from omni_backends.engine import EngineUnavailable
        with pytest.raises(EngineUnavailable):
            engine.submit("early", Prompt(input_ids=torch.tensor([1])), SamplingParams(), lambda rid, out: None)
        for _ in range(500):
            if engine.healthy:
                break
            threading.Event().wait(0.02)
        assert engine.healthy and health == [False, True] and engine.stats().restarts == 1
        assert len(runner.kv) == 0 and engine.stats().in_flight == 0  # fresh state
        outputs = run_staggered(engine, PROMPTS, SamplingParams(max_tokens=N_NEW, temperature=0, stop_token_ids=(EOS,)))
        assert [[o.token_id for o in outputs[str(i)]] for i in range(len(PROMPTS))] == [reference(model, p) for p in PROMPTS]
    finally:
        engine.shutdown()


def test_prefix_cache_drops_least_recently_used_entries_beyond_its_token_budget():
    from omni_backends.engine import PrefixCache

    def layers(n):
        return [(torch.full((1, 1, n, 2), float(n)), torch.zeros(1, 1, n, 2))]

    cache = PrefixCache(max_entries=8, max_tokens=10)
    cache.store([1, 2, 3], layers(3))
    cache.store([7, 8, 9, 10], layers(4))
    assert cache.lookup([1, 2, 3, 4])[0] == (1, 2, 3)   # used: now the most recent
    cache.store([5, 6, 7, 8], layers(4))   # 11 tokens > 10: the least recently used entry goes
    assert [7, 8, 9, 10] not in cache and [1, 2, 3] in cache and [5, 6, 7, 8] in cache and cache.tokens == 7
    cache.store(list(range(100, 120)), layers(20))   # alone over the budget: kept, everything older dropped
    assert len(cache) == 1 and cache.tokens == 20
    assert cache.lookup(list(range(100, 121)))[1][0][0].shape == (1, 1, 20, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(max_tokens=0)
    with pytest.raises(ValueError, match=r"cache_prefixes must each be in \[1, 3\]"):
        Prompt(input_ids=[1, 2, 3], cache_prefixes=(4,))
