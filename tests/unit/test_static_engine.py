"""The GPU engine on CPU: static KV cache + graph-step decoders give the dynamic (transformers) engine's
tokens and codec frames; CUDA-graph wrapper falls back cleanly; chunked prefill keeps other streams going;
batched sampling equals per-row sampling; the random full-size preset's layout."""
import copy
import gc
import threading

import pytest
import torch

from omni_backends.engine import EngineLoop, Prompt, SamplingParams, make_generator, sample_next_token
from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets
from omni_backends.engine.options import EngineOptions
from omni_backends.engine.prefill_graphs import PrefillGraphs
from omni_backends.engine.sampling import sample_rows
from omni_backends.engine.static_kv import StaticKVCache
from omni_backends.engine.static_runner import StaticRunner
from omni_backends.engine.runner import cache_kwargs, text_mrope_position_ids
from omni_backends.qwen3_omni.decoder import StaticDecoder
from omni_backends.qwen3_omni.loading import load_tts_embeds
from omni_backends.qwen3_omni.pipeline import LocalOmniPipeline, OmniRequest

pytestmark = pytest.mark.unit

PROMPTS = ["Hello, who are you?", "Tell me a story about the sea and the sun, please.", "Hi"]


def _run(stages, ckpt, options, talker_sample=False, seed=None):
    pipe = LocalOmniPipeline.from_stages(stages, load_tts_embeds(ckpt, stages.config), options=options,
                                         max_running=4)
    try:
        requests = [OmniRequest(f"r{i}", [{"role": "user", "content": text}],
                                pipe.thinker.sampling_params(max_tokens=10 + 4 * i, temperature=0.0),
                                pipe.talker.sampling_params(do_sample=talker_sample, repetition_penalty=1.0,
                                                            max_frames=14, seed=seed))
                    for i, text in enumerate(PROMPTS)]
        return pipe.run(requests)
    finally:
        pipe.close()


@pytest.mark.parametrize("prefill_chunk", [5, 512])   # chunked prefill / one batched prefill of whole prompts
def test_static_engine_gives_the_dynamic_engines_tokens_and_frames(qwen3_omni_stages, qwen3_omni_ckpt, prefill_chunk):
    dynamic = _run(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions())
    static = _run(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions(engine="static", max_len=128,
                                                                     prefill_chunk=prefill_chunk))
    for rid, expected in dynamic.items():
        assert static[rid].token_ids == expected.token_ids and len(expected.token_ids) >= 10
        assert torch.equal(static[rid].codes, expected.codes) and expected.codes.shape[-1] >= 10
        assert static[rid].audio.shape == expected.audio.shape


def test_static_talker_sampling_is_reproducible_with_a_seed(qwen3_omni_stages, qwen3_omni_ckpt):
    options = EngineOptions(engine="static", max_len=128)
    first, second = (_run(qwen3_omni_stages, qwen3_omni_ckpt, options, talker_sample=True, seed=7) for _ in range(2))
    assert all(torch.equal(first[rid].codes, second[rid].codes) for rid in first)
    assert all(first[rid].codes.shape[-1] >= 1 for rid in first)


def test_step_graphs_fall_back_to_eager_on_cpu():
    calls = []

    def step(x):
        calls.append(x.shape)
        return (x * 2,)

    graphs = StepGraphs(step, name="t")
    out = graphs.run((1, 8), {"x": torch.ones(2, 3)})
    assert torch.equal(out[0], torch.full((2, 3), 2.0)) and calls == [(2, 3)]
    assert graphs.stats().eager == 1 and graphs.stats().captured == 0 and not graphs.captured((1, 8))
    disabled = StepGraphs(step, enabled=False)
    assert torch.equal(disabled.run("k", {"x": torch.zeros(1)})[0], torch.zeros(1)) and disabled.stats().eager == 1
    assert power_of_two_buckets(24) == (1, 2, 4, 8, 16, 24) and batch_bucket(5, (1, 2, 4, 8)) == 8
    with pytest.raises(ValueError, match="largest bucket"):
        batch_bucket(9, (1, 2, 4, 8))


def test_static_kv_cache_keeps_slots_compact():
    cache = StaticKVCache(layers=2, slots=3, max_len=8, kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    layers = lambda n, v: [(torch.full((1, 1, n, 2), v), torch.full((1, 1, n, 2), -v))] * 2   # noqa: E731
    for rid, n, v in (("a", 2, 1.0), ("b", 3, 2.0), ("c", 1, 3.0)):
        cache.add(rid, layers(n, v))
    with pytest.raises(ValueError, match="no free KV slot"):
        cache.add("d", layers(1, 4.0))
    cache.remove(["a"])                      # the last slot ("c") moves into the hole
    assert cache.request_ids == ["c", "b"] and cache.lengths() == [1, 3]
    assert torch.equal(cache.keys[1][0, 0, :1], torch.full((1, 2), 3.0))
    cache.advance([True, False])
    assert cache.lengths() == [2, 3] and cache.step_columns(2) == 4
    with pytest.raises(ValueError, match="exceeds the KV cache length"):
        cache.add("e", layers(9, 5.0))
    with pytest.raises(ValueError, match="already holds"):
        cache.add("b", layers(1, 5.0))


def test_chunked_prefill_lets_running_streams_decode(qwen3_omni_stages):
    model = qwen3_omni_stages.thinker
    text_model = getattr(model.model, "language_model", model.model)
    decoder = StaticDecoder(text_model, head=lambda h: (model.lm_head(h).float(),), slots=2, max_len=96)
    runner = StaticRunner(model, decoder, model.get_input_embeddings(), position_ids_fn=text_mrope_position_ids,
                          prefill_chunk=4)
    loop = EngineLoop(runner, max_running=2, name="t")
    events, long_started = [], threading.Event()

    def record(rid, out):
        events.append(rid)
        if rid == "short" and len([e for e in events if e == "short"]) == 2:
            long_started.set()

    try:
        loop.submit("short", Prompt(input_ids=torch.arange(3, 6)), SamplingParams(max_tokens=40, do_sample=False), record)
        assert long_started.wait(60)
        loop.submit("long", Prompt(input_ids=torch.arange(10, 34)), SamplingParams(max_tokens=2, do_sample=False),
                    record)
        while len(events) < 42:
            threading.Event().wait(0.05)
    finally:
        loop.shutdown(10)
    before_long = events[:events.index("long")].count("short")
    assert before_long >= 2 + 5   # the 24-token prompt took >= 6 iterations of 4 tokens; "short" decoded in each


def test_sample_rows_equals_sample_next_token_per_row():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [SamplingParams(do_sample=False, stop_token_ids=(3,), min_tokens=2, suppress_token_ids=(7, 8)),
              SamplingParams(do_sample=True, temperature=0.7, top_k=10, top_p=0.9, seed=5),
              SamplingParams(do_sample=False, repetition_penalty=1.3),
              SamplingParams(temperature=0.0)]
    # greedy rows sharing suppress / stop sets (masked together), one whose stop set is another's suppress set
    top = logits.argsort(-1, descending=True)
    params += [SamplingParams(do_sample=False, suppress_token_ids=tuple(top[0, :3].tolist())),
               SamplingParams(do_sample=False, suppress_token_ids=tuple(top[0, :3].tolist())),
               SamplingParams(do_sample=False, stop_token_ids=tuple(top[0, :3].tolist()), min_tokens=5)]
    # a row whose masks remove every token (they yield), and one with presence/frequency penalties
    params += [SamplingParams(do_sample=False, suppress_token_ids=tuple(range(50))),
               SamplingParams(do_sample=False, presence_penalty=2.0, frequency_penalty=1.0)]
    logits = torch.cat([logits, logits[:1].expand(5, -1)])
    seen = [None, None, torch.tensor([int(logits[2].argmax()), 1]), None, None, None, None, None, None]
    outputs = [None] * 8 + [top[0, :1].repeat(2)]
    expected = [sample_next_token(logits[i], p, seen[i], 1, make_generator(p.seed), outputs[i])
                for i, p in enumerate(params)]
    assert expected[4] != expected[0] and expected[7] == expected[0] and expected[8] != expected[0]
    assert sample_rows(logits, params, seen, [1] * 9, [make_generator(p.seed) for p in params], outputs) == expected


def test_engine_options_name_the_bad_parameter():
    assert EngineOptions.from_parameters({"engine": "static", "cuda_graphs": "false", "max_len": "64"}) == \
        EngineOptions(engine="static", cuda_graphs=False, max_len=64)
    with pytest.raises(ValueError, match="'max_len' must be an integer"):
        EngineOptions.from_parameters({"max_len": "many"})
    with pytest.raises(ValueError, match="'cuda_graphs' must be true or false"):
        EngineOptions.from_parameters({"cuda_graphs": "maybe"})
    with pytest.raises(ValueError, match="engine must be one of"):
        EngineOptions.from_parameters({"engine": "fast"})


def test_random_full_size_preset_layout(tmp_path):
    from omni_backends.qwen3_omni import random_weights as rw
    from omni_backends.qwen3_omni.loading import THINKER_EMBED_KEY, load_config, load_talker, load_thinker
    from omni_backends.qwen3_omni.tiny_tokenizer import build_tokenizer

    config = copy.deepcopy(rw.REAL_CONFIG)   # the real layout and token ids, shrunk sizes
    small = dict(num_hidden_layers=1, num_experts=4, hidden_size=32, moe_intermediate_size=8, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16)
    config["thinker_config"]["text_config"].update(small)
    config["talker_config"]["text_config"].update(small, shared_expert_intermediate_size=16)
    config["talker_config"].update(thinker_hidden_size=32, accept_hidden_layer=1)
    config["talker_config"]["code_predictor_config"].update(num_hidden_layers=1, hidden_size=32, intermediate_size=32,
                                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    config["thinker_config"]["audio_config"].update(encoder_layers=1, d_model=16, encoder_attention_heads=2,
                                                    encoder_ffn_dim=16, output_dim=32)
    config["thinker_config"]["vision_config"].update(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                                                     out_hidden_size=32, deepstack_visual_indexes=[0])
    path = rw.write_random_checkpoint(tmp_path / "random", config)
    assert rw.is_random(path) and not list(path.glob("*.safetensors"))
    omni = load_config(path)
    tok = build_tokenizer(layout="qwen3_omni")
    for name in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "user_token_id", "assistant_token_id"):
        assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(getattr(omni, name))) == getattr(omni, name)
    assert tok.convert_tokens_to_ids("<|audio_pad|>") == omni.thinker_config.audio_token_id == 151675
    thinker, talker = load_thinker(path, omni), load_talker(path, omni)
    assert talker.model.layers[0].mlp.gate.weight.std() > 0.01           # routers are random, not zero
    ids = [omni.tts_bos_token_id, omni.tts_eos_token_id, omni.tts_pad_token_id]
    assert torch.equal(load_tts_embeds(path, omni), thinker.get_input_embeddings().weight[ids])
    assert torch.equal(load_thinker(path, omni).lm_head.weight, thinker.lm_head.weight)    # deterministic
    assert THINKER_EMBED_KEY.startswith("thinker.")


def test_static_talker_prefills_a_burst_of_requests_in_one_forward(qwen3_omni_stages, qwen3_omni_ckpt):
    """Requests that start together go through one right-padded talker prefill forward (static engine) and
    speak exactly as when each is prefilled alone (dynamic engine)."""
    from omni_backends.qwen3_omni.prompt import PromptBuilder
    from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt

    stages = qwen3_omni_stages
    prompts = PromptBuilder(stages.tokenizer, stages.feature_extractor,
                            stages.config.thinker_config.audio_config.n_window)
    embed = stages.thinker.get_input_embeddings()
    tts = load_tts_embeds(qwen3_omni_ckpt, stages.config)

    def speak(options):
        talker = Talker(copy.deepcopy(stages.talker), stages.config, tts, options=options, max_running=4)
        forwards = []
        talker.model.register_forward_hook(lambda module, args, out: forwards.append(1))
        with torch.no_grad():
            for i, text in enumerate(PROMPTS):
                ids = prompts.build([{"role": "user", "content": text}]).input_ids
                talker.add_request(f"r{i}", TalkerPrompt(ids, embed(ids), torch.zeros(0, embed.embedding_dim)),
                                   "ethan", talker.sampling_params(do_sample=False, max_frames=6))
                talker.push_text(f"r{i}", embed(torch.arange(100 + i, 108 + 2 * i)), final=True)
            talker.step()
            prefill_forwards = len(forwards)
            codes = {rid: [] for rid in ("r0", "r1", "r2")}
            while len(talker):
                for rid, out in talker.step().items():
                    codes[rid].append(out.codes)
        return prefill_forwards, {rid: torch.cat(c, -1) for rid, c in codes.items()}

    static_forwards, static = speak(EngineOptions(engine="static", max_len=64))
    dynamic_forwards, dynamic = speak(EngineOptions())
    assert static_forwards == 1 and dynamic_forwards == 3 + 3   # one batched prefill; 3 prefills + 3 steps
    for rid, expected in dynamic.items():
        assert expected.shape[-1] >= 3 and torch.equal(static[rid], expected)


def test_static_talker_frames_with_mixed_params_and_codec_eos(qwen3_omni_stages, qwen3_omni_ckpt):
    """The static talker's frames (code 0 picked inside the frame graph for greedy requests, on the host for penalised
    and sampled ones; the next step launched before the codes are read) equal the dynamic engine's, with requests
    that stop on codec_eos at different frames in one batch: each steps once more with the others and leaves, and
    the slots left behind keep their last outputs (`TalkerDecode.remove`)."""
    from omni_backends.qwen3_omni.prompt import PromptBuilder
    from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt

    stages = qwen3_omni_stages
    prompts = PromptBuilder(stages.tokenizer, stages.feature_extractor,
                            stages.config.thinker_config.audio_config.n_window)
    embed = stages.thinker.get_input_embeddings()
    eos = stages.config.talker_config.codec_eos_token_id

    def favour_eos(module, args, out):   # codec_eos wins code 0 as soon as min_frames allows it
        out = out.clone()
        out[..., eos] += 1e4
        return out

    def speak(options):
        talker = Talker(copy.deepcopy(stages.talker), stages.config, load_tts_embeds(qwen3_omni_ckpt, stages.config),
                        options=options, max_running=4)
        talker.model.codec_head.register_forward_hook(favour_eos)
        params = [talker.sampling_params(do_sample=False, repetition_penalty=1.0, min_frames=2),
                  talker.sampling_params(do_sample=False, repetition_penalty=1.2, min_frames=4),
                  talker.sampling_params(do_sample=True, seed=3, min_frames=3),
                  talker.sampling_params(do_sample=False, repetition_penalty=1.0, min_frames=5)]
        codes, reasons = {}, {}
        with torch.no_grad():
            for i, p in enumerate(params):
                ids = prompts.build([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]).input_ids
                talker.add_request(f"r{i}", TalkerPrompt(ids, embed(ids), torch.zeros(0, embed.embedding_dim)),
                                   "ethan", p)
                talker.push_text(f"r{i}", embed(torch.arange(100 + i, 110 + i)), final=True)
            while len(talker):
                for rid, out in talker.step().items():
                    codes.setdefault(rid, []).append(out.codes)
                    if out.finished:
                        reasons[rid] = out.finish_reason
        return {rid: torch.cat(c, -1) for rid, c in codes.items()}, reasons

    static, static_reasons = speak(EngineOptions(engine="static", max_len=64))
    dynamic, dynamic_reasons = speak(EngineOptions())
    assert static_reasons == dynamic_reasons == {f"r{i}": "stop" for i in range(4)}
    assert {rid: c.shape[-1] for rid, c in static.items()} == {"r0": 2, "r1": 4, "r2": 3, "r3": 5}
    for rid in ("r0", "r1", "r3"):   # greedy (r2 samples code groups 1..15: each engine draws its own noise)
        assert torch.equal(static[rid], dynamic[rid])
    assert static["r2"][0, 0] == dynamic["r2"][0, 0]   # the sampled request's first code 0: the same first draw


def test_lean_frame_graph_gives_the_same_frames(qwen3_omni_stages, monkeypatch):
    """The frame graph with its per-step positions and RoPE rows made once and codes picked from the head's logits as
    they are (`set_lean_frame`, the default) gives the frames built step by step as before: greedy and sampled rows,
    code 0 from the device pick and from the host."""
    from omni_backends.qwen3_omni import talker_static
    from omni_backends.qwen3_omni.talker import codec_suppress

    talker = qwen3_omni_stages.talker
    tc = qwen3_omni_stages.config.talker_config
    frames = talker_static.CodePredictorFrames(talker, max_batch=4, suppress=codec_suppress(tc),
                                               stop=(tc.codec_eos_token_id,))
    hidden = torch.randn(3, tc.text_config.hidden_size, generator=torch.Generator().manual_seed(1))
    logits = torch.randn(3, tc.text_config.vocab_size, generator=torch.Generator().manual_seed(2))

    def run(lean: bool, steps: bool = True, greedy=(True, True, False)):
        monkeypatch.setattr(talker_static, "_lean_frame", lean)
        monkeypatch.setattr(talker_static, "_lean_steps", steps)
        codes, sums = frames(hidden, logits, [-1, 7, -1], [True, False, False], list(greedy),
                             [None, None, make_generator(11)])
        return codes.clone(), sums.clone()

    (lean_codes, lean_sums), (full_codes, full_sums) = run(True), run(False)
    assert torch.equal(lean_codes, full_codes) and torch.equal(lean_sums, full_sums)
    assert lean_codes[1, 0] == 7 and lean_codes.shape == (3, tc.num_code_groups)
    # the KV-only first step and the one-launch greedy pick (`set_lean_steps`): the same frames, greedy or mixed
    for greedy in ((True, True, False), (True, True, True)):
        (codes, sums), (before_codes, before_sums) = run(True, True, greedy), run(True, False, greedy)
        assert torch.equal(codes, before_codes) and torch.equal(sums, before_sums)


@pytest.mark.parametrize("linear_rows", [1, 16])
@pytest.mark.parametrize("stage", ["thinker", "talker", "code_predictor"])
def test_decode_step_kernels_equal_the_module_path(qwen3_omni_stages, monkeypatch, stage, linear_rows):
    """The decode step with the kernels (fused attention, o_proj/down_proj with the residual add + norm in one
    launch, the one-launch MoE with the next norm, the router / q/k/v / gate+up as decode_linear:
    `fused.linear`, `linear_norm`, `mlp_norm`), run by Triton's
    interpreter on CPU, gives the module path's outputs (fp32: summation order only), at 1 row (one-launch MoE)
    and 2 rows (grouped MoE + its norm; decode_linear with linear_rows 16, torch's linear with 1), and leaves every
    split-K workspace zeroed. Thinker: sparse MoE; talker: MoE with a shared expert (unfused norm); code predictor:
    dense MLP (down_proj with the norm)."""
    from transformers.cache_utils import DynamicCache

    from omni_backends.engine import fused
    from omni_backends.engine.kv_batch import cache_layers

    ok = pytest.importorskip("omni_kernels")
    if not ok.HAVE_TRITON or not ok.backend.INTERPRETED:
        pytest.skip("needs Triton's interpreter (a machine without CUDA; on the H200: tests/unit/test_kernels.py)")
    talker = qwen3_omni_stages.talker
    source = {"thinker": qwen3_omni_stages.thinker, "talker": talker, "code_predictor": talker.code_predictor}[stage]
    model = copy.deepcopy(source)   # fusing q/k/v and adding workspaces changes modules: not the shared fixture's
    text_model = getattr(model.model, "language_model", model.model)
    config = text_model.config
    torch.manual_seed(0)
    for layer in text_model.layers:   # the tiny talker's routers are zero: every expert ties (docs/kernels.md)
        if hasattr(layer.mlp, "gate"):
            torch.nn.init.normal_(layer.mlp.gate.weight, std=0.5)
    prompt = torch.randn(1, 5, config.hidden_size) * 0.5
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        positions = torch.arange(5)[None]
        if hasattr(text_model.rotary_emb, "mrope_section"):   # thinker / talker: [3, batch, positions]
            positions = positions.expand(3, 1, 5)
        text_model(inputs_embeds=prompt, position_ids=positions, use_cache=True, **cache_kwargs(text_model, cache))

    def steps(kernels: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(fused, "active", lambda x: kernels)
        decoder = StaticDecoder(text_model, head=lambda h: (h,), slots=2, max_len=32, graphs=False, fuse=True)
        outs = []
        for rows in (1, 2):
            for i in range(rows):
                decoder.add(f"r{i}", cache_layers(cache))
            embeds = torch.randn(rows, config.hidden_size, generator=torch.Generator().manual_seed(rows))
            outs.append(decoder.step(embeds, [5] * rows)[0])
            decoder.remove([f"r{i}" for i in range(rows)])
        return outs

    monkeypatch.setenv("OMNI_KERNELS_INTERPRET", "1")
    # every linear through decode_linear (the tuned table covers only the full-size shapes)
    monkeypatch.setattr(ok.linear_decode, "decode_linear_faster", lambda n, k, with_norm: True)
    was = ok.enabled()
    ok.set_enabled(True)
    fused.set_linear_rows(linear_rows)
    try:
        with torch.inference_mode():
            expected, got = steps(False), steps(True)
    finally:
        ok.set_enabled(was)
        fused.set_linear_rows(fused.LINEAR_ROWS)
    assert ok.last_backend("decode_linear") == "interpreter" and ok.last_backend("decode_attention") == "interpreter"
    for out, ref in zip(got, expected):
        assert torch.isfinite(out).all()
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    workspaces = [getattr(m, fused.WORKSPACE) for m in text_model.modules() if hasattr(m, fused.WORKSPACE)]
    assert workspaces and all(w.is_clean() for w in workspaces)


def test_direct_decode_linear_switch(monkeypatch):
    """`set_direct_decode_linear(False)` (bench_engine's on_torch_linears) keeps torch's linear for the plain decode
    linears whose tile is direct-store (one K slice); split-K ones and the norm-fused ones stay decode_linear."""
    from omni_backends.engine import fused

    ok = pytest.importorskip("omni_kernels")
    from omni_kernels.linear_decode import LinearConfig

    monkeypatch.setattr(fused, "active", lambda x: True)
    monkeypatch.setitem(ok.linear_decode.LINEAR_CONFIGS, (4, 8), LinearConfig(16, 32, 1))   # direct store
    monkeypatch.setitem(ok.linear_decode.LINEAR_CONFIGS, (6, 8), LinearConfig(16, 32, 2))   # split-K
    x, direct, split = torch.randn(1, 8), torch.randn(4, 8), torch.randn(6, 8)
    try:
        assert fused._decode_linear_for(direct, x, with_norm=False) and fused._decode_linear_for(split, x, False)
        fused.set_direct_decode_linear(False)
        assert not fused._decode_linear_for(direct, x, with_norm=False)
        assert fused._decode_linear_for(split, x, False) and fused._decode_linear_for(direct, x, with_norm=True)
    finally:
        fused.set_direct_decode_linear(True)


def test_lm_head_through_decode_linear_where_the_table_has_its_tile(monkeypatch):
    """`fused.lm_head`: a head wider than the split-K finish runs as `decode_linear` (direct store, no workspace) at
    one row when the table has a tile for its shape, equal to the module's output (fp32: summation order only);
    without the entry, or past `fused.LINEAR_ROWS` rows, the module runs."""
    from omni_backends.engine import fused

    ok = pytest.importorskip("omni_kernels")
    if not ok.HAVE_TRITON or not ok.backend.INTERPRETED:
        pytest.skip("needs Triton's interpreter (a machine without CUDA; on the H200: tests/unit/test_kernels.py)")
    from omni_kernels.linear_decode import LinearConfig

    torch.manual_seed(0)
    head = torch.nn.Linear(32, ok.linear_decode.MAX_OUT + 64, bias=False)
    x = torch.randn(fused.LINEAR_ROWS + 1, 32)
    monkeypatch.setattr(fused, "active", lambda x: True)
    monkeypatch.setenv("OMNI_KERNELS_INTERPRET", "1")
    calls = []
    real = ok.decode_linear
    monkeypatch.setattr(ok, "decode_linear", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with torch.inference_mode():
        assert torch.equal(fused.lm_head(head, x[:1]), head(x[:1])) and not calls   # no tile: the module
        monkeypatch.setitem(ok.linear_decode.LINEAR_CONFIGS, tuple(head.weight.shape), LinearConfig(1024, 32, 1))
        out = fused.lm_head(head, x[:1])
        assert calls == [None] and ok.last_backend("decode_linear") == "interpreter"   # no workspace
        assert ((out - head(x[:1])).norm() / head(x[:1]).norm()).item() < 1e-5
        assert torch.equal(fused.lm_head(head, x), head(x)) and len(calls) == 1   # past LINEAR_ROWS: the module
    assert not hasattr(head, fused.WORKSPACE)


def test_lean_step_inputs_give_the_same_outputs(qwen3_omni_stages):
    """`decoder.set_lean_inputs` (default on: a full bucket's embeddings go to the step as they are) gives the same
    logits as padding and copying every input, for a full bucket (2 rows) and a padded one (3 rows in bucket 4)."""
    from transformers.cache_utils import DynamicCache

    from omni_backends.engine.kv_batch import cache_layers
    from omni_backends.qwen3_omni import decoder as decoder_module

    model = qwen3_omni_stages.thinker
    text_model = getattr(model.model, "language_model", model.model)
    config = text_model.config
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        positions = torch.arange(4)[None].expand(3, 1, 4)
        text_model(inputs_embeds=torch.randn(1, 4, config.hidden_size) * 0.5, position_ids=positions,
                   use_cache=True, **cache_kwargs(text_model, cache))

    def step(lean: bool, rows: int) -> torch.Tensor:
        decoder_module.set_lean_inputs(lean)
        decoder = StaticDecoder(text_model, head=lambda h: (model.lm_head(h),), slots=4, max_len=16, graphs=False)
        for i in range(rows):
            decoder.add(f"r{i}", cache_layers(cache))
        embeds = torch.randn(rows, config.hidden_size, generator=torch.Generator().manual_seed(rows))
        return decoder.step(embeds, [4] * rows)[0]

    try:
        with torch.inference_mode():
            for rows in (2, 3):
                lean, full = step(True, rows), step(False, rows)
                assert lean.shape == (rows, config.vocab_size) and torch.equal(lean, full)
    finally:
        decoder_module.set_lean_inputs(True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_step_graphs_constant_inputs_are_copied_at_capture_only():
    """`StepGraphs.run(..., constant=names)`: those inputs keep their captured values; the others are copied in
    before every replay (the first call captures, then replays)."""
    graphs = StepGraphs(lambda x, c: (x + c,))
    one, two = torch.ones(4, device="cuda"), torch.full((4,), 2.0, device="cuda")
    assert torch.equal(graphs.run("k", {"x": one, "c": one}, constant=("c",))[0], two)   # captured with c = 1
    out = graphs.run("k", {"x": two, "c": two}, constant=("c",))[0]   # replayed: x copied, c kept from the capture
    assert graphs.stats().replays == 2 and torch.equal(out, torch.full((4,), 3.0, device="cuda"))


@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_prefill_graph_path_gives_the_same_tokens_frames_and_audio(qwen3_omni_stages, qwen3_omni_ckpt, monkeypatch,
                                                                   together):
    """Short prompts prefilled through `PrefillGraphs` (right-padded to their bucket, no attention mask; on CPU the
    padded forward runs eagerly, on CUDA its graph replays), one at a time or submitted together (prompts of one
    engine iteration in one padded batch), give the thinker tokens, codec frames and audio of the eager prefills
    (alone; together: the masked right-padded forward), for the thinker's and the talker's prompts."""
    rows = {}
    run_batch = PrefillGraphs.run_batch

    def counted(self, prompts):
        rows.setdefault(self.graphs.name, []).append(len(prompts))
        return run_batch(self, prompts)

    monkeypatch.setattr(PrefillGraphs, "run_batch", counted)

    def run_each(options):
        pipe = LocalOmniPipeline.from_stages(qwen3_omni_stages, load_tts_embeds(qwen3_omni_ckpt, qwen3_omni_stages.config),
                                             options=options, max_running=4)
        try:
            requests = [OmniRequest(f"r{i}", [{"role": "user", "content": text}],
                                    pipe.thinker.sampling_params(max_tokens=12, temperature=0.0),
                                    pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=14))
                        for i, text in enumerate(PROMPTS)]
            if together:
                return pipe.run(requests)
            results = {}
            for request in requests:   # one at a time: a lone prompt per prefill
                results.update(pipe.run([request]))
            return results
        finally:
            pipe.close()

    eager = run_each(EngineOptions(engine="static", max_len=128))   # CPU: no prefill graphs
    assert rows == {}
    monkeypatch.setattr(EngineOptions, "graph_prefill_tokens", lambda self, device: self.prefill_graph_tokens)
    padded = run_each(EngineOptions(engine="static", max_len=128, prefill_graph_tokens=64))
    # every thinker and talker prompt went through the padded forward
    assert {name: sum(n) for name, n in rows.items()} == {"prefill": 3, "talker-prefill": 3}
    if not together:
        assert rows == {"prefill": [1, 1, 1], "talker-prefill": [1, 1, 1]}
    for rid, expected in eager.items():
        assert padded[rid].token_ids == expected.token_ids and len(expected.token_ids) >= 10
        assert torch.equal(padded[rid].codes, expected.codes) and expected.codes.shape[-1] >= 10
        torch.testing.assert_close(padded[rid].audio, expected.audio, rtol=0, atol=1e-6)


def test_prefill_graphs_batch_equals_each_prompt_alone(qwen3_omni_stages, qwen3_omni_ckpt):
    """Prompts of different lengths in one padded batch (zero rows up to the batch bucket) give each prompt's last
    logits, hidden states and keys/values of its own padded forward (rows are independent)."""
    pipe = LocalOmniPipeline.from_stages(qwen3_omni_stages, load_tts_embeds(qwen3_omni_ckpt, qwen3_omni_stages.config),
                                         options=EngineOptions(engine="static", max_len=128), max_running=4)
    try:
        graphs = PrefillGraphs(pipe.thinker.loop.runner.padded_forward, hidden=2, max_tokens=64, max_batch=4,
                               batch_tokens=256)
        prompts = [pipe.thinker.prompts.build([{"role": "user", "content": text}]).input_ids for text in PROMPTS]
        assert graphs.fits_batch([len(p) for p in prompts]) and len({len(p) for p in prompts}) == 3
        with torch.inference_mode():
            batch = graphs.run_batch(prompts)   # 3 rows -> batch bucket 4
            layers = [(k.clone(), v.clone()) for k, v in batch.layers]
            alone = []   # each prompt's own padded prefill: its result row and its layers (copied before the next run)
            for prompt in prompts:
                single = graphs.run_batch([prompt])
                alone.append((single.rows[0], [(k.clone(), v.clone()) for k, v in single.layers]))
        assert [tuple(k.shape[:3]) for k, _ in layers[:1]] == [(3, layers[0][0].shape[1], 64)]   # 34 -> bucket 64
        # the rows into a static cache at once: each slot holds its row's real columns, as a one-by-one add does
        heads, dim = layers[0][0].shape[1], layers[0][0].shape[-1]
        at_once, one_by_one = (StaticKVCache(len(layers), 4, 96, heads, dim, torch.float32, "cpu") for _ in range(2))
        at_once.add("x", [(k[:1, :, :5], v[:1, :, :5]) for k, v in layers])   # a request already in slot 0
        one_by_one.add("x", [(k[:1, :, :5], v[:1, :, :5]) for k, v in layers])
        assert at_once.add_rows(["a", "b", "c"], [len(p) for p in prompts], layers) == [1, 2, 3]
        for row, prompt in enumerate(prompts):
            one_by_one.add("abc"[row], [(k[row:row + 1, :, :len(prompt)], v[row:row + 1, :, :len(prompt)])
                                        for k, v in layers])
        assert at_once.request_ids == one_by_one.request_ids and at_once.lengths() == one_by_one.lengths()
        for index in range(len(layers)):
            for slot, n in enumerate(at_once.lengths()):
                assert torch.equal(at_once.keys[index][slot, :, :n], one_by_one.keys[index][slot, :, :n])
                assert torch.equal(at_once.values[index][slot, :, :n], one_by_one.values[index][slot, :, :n])
        with pytest.raises(ValueError, match="already holds"):
            at_once.add_rows(["a"], [3], [(k[:1], v[:1]) for k, v in layers])
        with pytest.raises(ValueError, match="no free KV slot"):
            at_once.add_rows(["y", "z"], [3, 3], [(k[:2], v[:2]) for k, v in layers])
        with pytest.raises(ValueError, match="outside the layers"):   # 65 tokens in layers of 64 columns
            StaticKVCache(len(layers), 4, 96, heads, dim, torch.float32, "cpu").add_rows(
                ["y"], [65], [(k[:1], v[:1]) for k, v in layers])
        for row, (together, (single, single_layers), prompt) in enumerate(zip(batch.rows, alone, prompts)):
            torch.testing.assert_close(together.logits, single.logits, rtol=1e-4, atol=1e-5)
            assert [h.shape[0] for h in together.hidden] == [len(prompt)] * 2
            for a, b in zip(together.hidden, single.hidden):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            for (k, v), (k1, v1) in zip(layers, single_layers):   # the burst's row holds the prompt's own keys/values
                k, v = k[row:row + 1, :, :len(prompt)], v[row:row + 1, :, :len(prompt)]
                k1, v1 = k1[:, :, :len(prompt)], v1[:, :, :len(prompt)]
                assert k.shape == k1.shape and k.shape[0] == 1 and k.shape[2] == len(prompt)
                torch.testing.assert_close(k, k1, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(v, v1, rtol=1e-4, atol=1e-5)
    finally:
        pipe.close()
    # more rows than the largest batch bucket never fit; 4 rows of a 64-token bucket exceed 128 padded tokens
    assert not graphs.fits_batch([8] * 5) and not graphs.fits_batch([65])
    with pytest.raises(ValueError, match="do not fit"):
        graphs.run_batch([prompts[0]] * 5)
    small = PrefillGraphs(lambda inputs: None, hidden=0, max_tokens=64, max_batch=4, batch_tokens=128)
    assert [small.fits_batch(n) for n in ([40] * 3, [40] * 2, [64])] == [False, True, True]


def test_prefill_graph_buckets_and_limits():
    graphs = PrefillGraphs(lambda inputs: None, hidden=0, max_tokens=100, min_tokens=16)
    assert graphs.buckets == (16, 32, 64, 100)
    assert [graphs.bucket(n) for n in (1, 16, 17, 65, 100)] == [16, 16, 32, 100, 100]
    assert not graphs.fits(0) and not graphs.fits(101)
    with pytest.raises(ValueError, match="101 tokens"):
        graphs.bucket(101)
    with pytest.raises(ValueError, match="prefill_graph_tokens"):
        EngineOptions(prefill_graph_tokens=-1)
    assert EngineOptions(engine="static").graph_prefill_tokens(torch.device("cpu")) == 0
    assert EngineOptions.from_parameters({"prefill_graph_tokens": "64"}).prefill_graph_tokens == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the device: docs/gpu.md)")
@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_prefill_and_first_chunk_cuda_graphs_equal_eager(tmp_path, monkeypatch, together):
    """On CUDA (bf16, as served): thinker and talker prompts prefilled by replaying `PrefillGraphs` (one at a time,
    or submitted together: padded batches), code2wav's chunks and the talker's steps and frames replayed from their
    graphs (code 0 picked in the frame graph for a greedy request, on the host for a penalised and a sampled one;
    pinned-memory inputs; the codes read back after the next step was launched) give exactly the tokens, frames and
    audio of the same padded forwards, steps and decodes run eagerly (padded vs unpadded prefills: the CPU test
    above). No conftest fixtures: the device runs this file with --noconftest."""
    from omni_backends.engine import fused
    from omni_backends.qwen3_omni.checkpoint import write_checkpoint
    from omni_backends.qwen3_omni.loading import load_stages

    # decode steps on transformers' modules: the fused decode attention needs head_dim >= 32 (the tiny model has 16)
    monkeypatch.setattr(fused, "active", lambda x: False)
    ckpt = write_checkpoint(tmp_path / "qwen3_omni_tiny")
    stages = load_stages(ckpt, "cuda", torch.bfloat16)   # bf16: transformers' grouped_mm experts (capturable)
    tts = load_tts_embeds(ckpt, stages.config).to("cuda", torch.bfloat16)

    def run_each(replay: bool):
        pipe = LocalOmniPipeline.from_stages(stages, tts, first_chunk_frames=3, max_running=4,
                                             options=EngineOptions(engine="static", max_len=128, prefill_graph_tokens=64))
        graphs = [pipe.thinker.loop.runner.prefill_graphs.graphs, pipe.talker.prefill_graphs.graphs,
                  pipe.code2wav.graphs, pipe.talker.decode.decoder.graphs, pipe.talker.frames.graphs]
        for g in graphs:
            g.enabled = replay
        pipe.thinker.warmup(), pipe.talker.warmup(), pipe.code2wav.warmup()
        talker = [pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=14, min_frames=14),
                  pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.2, max_frames=14, min_frames=14),
                  pipe.talker.sampling_params(do_sample=True, seed=5, max_frames=14, min_frames=14)]
        try:
            requests = [OmniRequest(f"r{i}", [{"role": "user", "content": text}],
                                    pipe.thinker.sampling_params(max_tokens=12, min_tokens=12, temperature=0.0),
                                    talker[i]) for i, text in enumerate(PROMPTS)]
            results = {}
            for group in [requests] if together else [[r] for r in requests]:
                results.update(pipe.run(group))
            return results, [g.stats() for g in graphs]
        finally:
            pipe.close()

    # CUDA graphs of earlier pipelines (earlier tests, the eager run) are destroyed now, not by a garbage collection
    # during a capture in an engine thread: destroying a graph then invalidates that capture (torch warns "operation
    # not permitted when stream is capturing (function reset)")
    gc.collect()
    eager, none = run_each(replay=False)
    gc.collect()
    graphed, stats = run_each(replay=True)
    assert all(s.replays == 0 for s in none)
    assert all(s.failed == 0 and s.captured >= 1 and s.replays >= (1 if together else 3) for s in stats), stats
    for rid, expected in eager.items():
        assert graphed[rid].token_ids == expected.token_ids and len(expected.token_ids) == 12
        assert torch.equal(graphed[rid].codes, expected.codes) and expected.codes.shape[-1] == 14
        torch.testing.assert_close(graphed[rid].audio, expected.audio, rtol=0, atol=0)



def _talker_and_prompts(stages, ckpt, options, max_running):
    from omni_backends.qwen3_omni.prompt import PromptBuilder
    from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt

    prompts = PromptBuilder(stages.tokenizer, stages.feature_extractor,
                            stages.config.thinker_config.audio_config.n_window)
    embed = stages.thinker.get_input_embeddings()
    talker = Talker(copy.deepcopy(stages.talker), stages.config, load_tts_embeds(ckpt, stages.config),
                    options=options, max_running=max_running)

    def prompt(text):
        ids = prompts.build([{"role": "user", "content": text}]).input_ids
        return TalkerPrompt(ids, embed(ids), torch.zeros(0, embed.embedding_dim))
    return talker, prompt, embed


def test_static_talker_queues_requests_beyond_its_slots(qwen3_omni_stages, qwen3_omni_ckpt):
    """A static talker with 2 slots and 4 requests (and a 5th cancelled while it waits): the requests past the slots
    wait in arrival order with their text buffered (`has_ready` is False while the slot holders wait for text, the
    queued ones stay `ready`), take the slots as they free, and every request speaks the codes it speaks alone."""
    talker, prompt, embed = _talker_and_prompts(qwen3_omni_stages, qwen3_omni_ckpt,
                                                EngineOptions(engine="static", max_len=64), max_running=2)
    texts = {f"r{i}": embed(torch.arange(100 + 3 * i, 108 + 4 * i)) for i in range(4)}
    params = talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=12)

    def alone(rid):
        talker.add_request(rid, prompt(PROMPTS[int(rid[1]) % len(PROMPTS)]), "ethan", params)
        talker.push_text(rid, texts[rid], final=True)
        codes = []
        while rid in talker:
            codes += [out.codes for out in talker.step().values()]
        return torch.cat(codes, -1)

    with torch.no_grad():
        expected = {rid: alone(rid) for rid in texts}
        codes = {rid: [] for rid in texts}
        for rid in ("r0", "r1"):   # the slot holders get their text in two parts
            talker.add_request(rid, prompt(PROMPTS[int(rid[1])]), "ethan", params)
            talker.push_text(rid, texts[rid][:4])
        for rid in ("r2", "r4", "r3"):
            talker.add_request(rid, prompt(PROMPTS[int(rid[1]) % len(PROMPTS)]), "ethan", params)
            talker.push_text(rid, texts.get(rid, texts["r0"]), final=True)
        while talker.has_ready():
            for rid, out in talker.step().items():
                codes[rid].append(out.codes)
        assert talker.decode.decoder.cache.request_ids == ["r0", "r1"] and talker.decode.decoder.cache.free_slots == 0
        assert talker.ready("r2") and talker.ready("r3") and not talker.ready("r0") and len(talker) == 5
        talker.cancel("r4")   # a waiting request leaves without touching the slots
        assert talker.decode.decoder.cache.request_ids == ["r0", "r1"] and "r4" not in talker
        for rid in ("r0", "r1"):
            talker.push_text(rid, texts[rid][4:], final=True)
        order = []
        while len(talker):
            assert len(talker.decode.decoder.cache.request_ids) <= 2
            for rid, out in talker.step().items():
                codes[rid].append(out.codes)
                if out.finished:
                    order.append(rid)
            if "r3" in talker.decode.decoder.cache.request_ids:
                assert "r2" in talker.decode.decoder.cache.request_ids or "r2" in order   # arrival order
    assert sorted(order) == ["r0", "r1", "r2", "r3"]
    for rid, frames in expected.items():
        assert frames.shape[-1] >= 3 and torch.equal(torch.cat(codes[rid], -1), frames), rid


def test_static_talker_refuses_a_prompt_past_its_max_len(qwen3_omni_stages, qwen3_omni_ckpt):
    """A talker prompt (the user turns plus 9 positions) that leaves no frame within the static max_len is a 400
    `context_length_exceeded` naming the limit (never a request ended with no frame); one position less speaks."""
    from omni_backends.errors import RequestError

    talker, prompt, embed = _talker_and_prompts(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions(), max_running=2)
    length = int(talker._user_turns(prompt(PROMPTS[1]).prompt_ids).sum()) + 9
    assert length > 20
    for max_len, fits in ((length + 1, True), (length, False)):
        talker, prompt, embed = _talker_and_prompts(qwen3_omni_stages, qwen3_omni_ckpt,
                                                    EngineOptions(engine="static", max_len=max_len), max_running=2)
        params = talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=12)
        if not fits:
            with pytest.raises(RequestError) as refused:
                talker.add_request("r", prompt(PROMPTS[1]), "ethan", params)
            assert (refused.value.status, refused.value.code, refused.value.param) == \
                (400, "context_length_exceeded", "messages")
            assert f"({length} positions" in refused.value.message and f"max_len {max_len}" in refused.value.message
            assert "r" not in talker
            continue
        with torch.no_grad():
            talker.add_request("r", prompt(PROMPTS[1]), "ethan", params)
            talker.push_text("r", embed(torch.arange(100, 110)), final=True)
            out = talker.step()["r"]
        assert out.codes.shape == (16, 1) and out.finished and out.finish_reason == "length"


def test_an_absent_max_tokens_is_cut_at_the_room_the_prompt_leaves(qwen3_omni_stages):
    """`turn.thinker_request` on a static thinker (max_len 64, default max_tokens 40): without max_tokens a prompt that
    fits gets max_tokens = min(default, room left) (OpenAI / vLLM), one that leaves no room is a 400 naming the
    messages; a max_tokens the client sends past the room stays a 400 naming max_tokens."""
    from omni_backends.errors import RequestError
    from omni_backends.qwen3_omni.serving import turn
    from omni_backends.qwen3_omni.thinker import Thinker

    stages = qwen3_omni_stages
    thinker = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                      options=EngineOptions(engine="static", max_len=64))
    try:
        def request(words, **fields):
            return turn.thinker_request(thinker, {"messages": [{"role": "user", "content": " ".join(["word"] * words)}],
                                                  **fields}, {}, 40)

        short = len(request(1)[0].input_ids)
        inputs, params, _ = request(8)
        prompt = len(inputs.input_ids)
        assert 64 - prompt < 40 and params.max_tokens == 64 - prompt   # the default 40 would not fit
        assert short + 40 < 64 and request(1)[1].max_tokens == 40   # the default where it fits
        assert request(8, max_tokens=64 - prompt)[1].max_tokens == 64 - prompt
        assert request(8, min_tokens=3)[1].max_tokens == 64 - prompt
        for fields, words, param in (({"max_tokens": 65 - prompt}, 8, "max_tokens"), ({}, 32, "messages")):
            with pytest.raises(RequestError) as refused:
                request(words, **fields)
            assert (refused.value.code, refused.value.param) == ("context_length_exceeded", param)
    finally:
        thinker.shutdown()
