"""Qwen3-Omni tiny checkpoint, prompt building, talker streaming rules and the code2wav streamer."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.checkpoint import COMPLETE_MARKER, write_checkpoint
from omni_backends.qwen3_omni.code2wav import Code2WavStreamer
from omni_backends.qwen3_omni.loading import load_tts_embeds
from omni_backends.qwen3_omni.prompt import PromptBuilder
from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ckpt(qwen3_omni_ckpt):
    return qwen3_omni_ckpt


@pytest.fixture(scope="module")
def stages(qwen3_omni_stages):
    return qwen3_omni_stages


def test_checkpoint_layout_ids_and_idempotence(ckpt, stages):
    names = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "preprocessor_config.json", COMPLETE_MARKER} <= names
    cfg, tok = stages.config, stages.tokenizer
    expected = {"im_start_token_id": "<|im_start|>", "im_end_token_id": "<|im_end|>", "tts_pad_token_id": "<tts_pad>",
                "tts_bos_token_id": "<tts_text_bos>", "tts_eos_token_id": "<tts_text_eod>", "system_token_id": "system",
                "user_token_id": "user", "assistant_token_id": "assistant"}
    for field, token in expected.items():
        assert getattr(cfg, field) == tok.convert_tokens_to_ids(token), field
    tc = cfg.thinker_config
    assert (tc.audio_token_id, tc.audio_start_token_id) == tuple(tok.convert_tokens_to_ids(["<|audio_pad|>", "<|audio_start|>"]))
    assert tc.text_config.vocab_size == len(tok)
    assert stages.feature_extractor.feature_size == tc.audio_config.num_mel_bins
    assert json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"] == [cfg.im_end_token_id]
    before = (ckpt / "model.safetensors").stat().st_mtime_ns
    assert write_checkpoint(ckpt) == ckpt and (ckpt / "model.safetensors").stat().st_mtime_ns == before


def test_checkpoint_is_deterministic(ckpt, tmp_path):
    again = load_file(write_checkpoint(tmp_path / "again") / "model.safetensors")
    first = load_file(ckpt / "model.safetensors")
    assert again.keys() == first.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()


def test_prompt_builder_expands_audio_and_rejects_bad_input(stages):
    cfg = stages.config
    builder = PromptBuilder(stages.tokenizer, stages.feature_extractor, cfg.thinker_config.audio_config.n_window)
    text = builder.build([{"role": "user", "content": "Hello"}])
    assert text.input_features is None
    assert stages.tokenizer.decode(text.input_ids) == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    clips = [np.zeros(16000, np.float32), np.ones(8000, np.float32) * 0.1]
    parts = [{"type": "input_audio", "input_audio": {}}, {"type": "text", "text": "and"},
             {"type": "input_audio", "input_audio": {}}]
    audio = builder.build([{"role": "user", "content": parts}], clips)
    assert audio.input_features.shape == (2, cfg.thinker_config.audio_config.num_mel_bins, 100)
    assert audio.feature_attention_mask.sum(-1).tolist() == [100, 50]
    assert int((audio.input_ids == cfg.thinker_config.audio_token_id).sum()) == 13 + 7
    with pytest.raises(RequestError, match="1 input_audio part"):
        builder.build([{"role": "user", "content": parts[:1]}])
    with pytest.raises(RequestError, match="role"):
        builder.build([{"role": "robot", "content": "hi"}])
    with pytest.raises(RequestError, match="image_url"):
        builder.build([{"role": "user", "content": [{"type": "image_url"}]}])


def _talker_frames(talker, prompt, embeds, lazily):
    """Codes of one request, its text pushed all at once or one token per talker step."""
    talker.add_request("t", prompt, "ethan", talker.sampling_params(do_sample=False, max_frames=12))
    frames, pushed = [], 0
    while "t" in talker:
        if pushed < len(embeds):
            n = 1 if lazily else len(embeds)
            talker.push_text("t", embeds[pushed:pushed + n], final=pushed + n == len(embeds))
            pushed += n
        out = talker.step().get("t")
        if out is not None:
            frames.append(out.codes)
    return torch.cat(frames, -1)


def _talker_and_prompt(ckpt, stages, text_ids: list[int]):
    """A fresh Talker, the TalkerPrompt of a one-message chat ("Hi") and thinker embeddings of `text_ids`."""
    talker = Talker(stages.talker, stages.config, load_tts_embeds(ckpt, stages.config))
    ids = stages.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                               return_dict=True, return_tensors="pt")["input_ids"][0]
    embed = stages.thinker.get_input_embeddings()
    with torch.no_grad():
        prompt = TalkerPrompt(ids, embed(ids), torch.zeros(0, stages.config.thinker_config.text_config.hidden_size))
        return talker, prompt, embed(torch.tensor(text_ids))


def test_talker_waits_for_text_instead_of_padding(ckpt, stages):
    talker, prompt, text = _talker_and_prompt(ckpt, stages, [300, 301, 302, 303, 304, 305])
    eager = _talker_frames(talker, prompt, text, lazily=False)
    lazy = _talker_frames(talker, prompt, text, lazily=True)
    assert eager.shape == (16, 12) and torch.equal(eager, lazy)
    with pytest.raises(RequestError, match="aiden, chelsie, ethan"):
        talker.add_request("x", prompt, "Nobody", talker.sampling_params())


@pytest.fixture(scope="module")
def codes():
    return torch.randint(0, 64, (16, 25), generator=torch.Generator().manual_seed(0))


def test_code2wav_stream_equals_full_decode(stages, codes):
    with torch.no_grad():
        full = stages.code2wav(codes[None])[0, 0].numpy()
    assert full.shape == (25 * 1920 - 555,)
    for chunk, first in [(4, 2), (7, 1)]:
        streamer = Code2WavStreamer(stages.code2wav, chunk, first, left_context_frames=64)
        assert streamer.trim == 555
        chunks = [streamer.push("a", codes[:, i:i + 3]) for i in range(0, 25, 3)] + [streamer.flush("a")]
        assert sum(len(c) > 0 for c in chunks) > 3
        np.testing.assert_allclose(np.concatenate(chunks), full, atol=1e-5)
        assert "a" not in streamer


def test_code2wav_short_context_keeps_length_and_batches(stages, codes):
    streamer = Code2WavStreamer(stages.code2wav, 4, 2, left_context_frames=1)
    short = np.concatenate([streamer.push("a", codes), streamer.flush("a")])
    assert short.shape == (25 * 1920 - 555,)
    together = Code2WavStreamer(stages.code2wav, 4, 2, 8).step({"a": codes[:, :10], "b": codes[:, 5:15]})
    alone = Code2WavStreamer(stages.code2wav, 4, 2, 8).push("b", codes[:, 5:15])
    assert together["a"].shape == together["b"].shape == (10 * 1920 - 555,)   # every full first-size chunk at once
    np.testing.assert_allclose(together["b"], alone, atol=1e-6)
    with pytest.raises(ValueError, match="left_context_frames must be >= 1"):
        Code2WavStreamer(stages.code2wav, 4, 2, left_context_frames=0)
    with pytest.raises(ValueError, match=r"codes \[16, n\]"):
        streamer.push("c", codes[:8])


def test_code2wav_padded_windows_equal_unpadded(stages, codes):
    """With `pad_windows` (CUDA graphs: windows right-padded to the first chunk or context + chunk frames, here run
    eagerly on CPU) several requests streamed in uneven pieces get the unpadded decodes' PCM (the vocoder is
    causal): same lengths, equal up to rounding; every decode ran at one of the two padded lengths."""
    plain = Code2WavStreamer(stages.code2wav, 4, 3, left_context_frames=5)
    padded = Code2WavStreamer(stages.code2wav, 4, 3, left_context_frames=5)
    padded.pad_windows = True
    lengths = []
    hook = stages.code2wav.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[-1]))
    try:
        with torch.no_grad():
            outs = []
            for streamer in (plain, padded):
                lengths.clear()
                pieces = {rid: [] for rid in "abc"}
                for i in range(0, 25, 3):   # a: 3 frames a step, b: 2 (from frame 5), c: 1 (from frame 12)
                    out = streamer.step({"a": codes[:, i:i + 3], "b": codes[:, 5 + i // 3 * 2:7 + i // 3 * 2],
                                         **({"c": codes[:, 12 + i // 3:13 + i // 3]} if i >= 3 else {})})
                    for rid, pcm in out.items():
                        pieces[rid].append(pcm)
                for rid, pcm in streamer.step({}, final=list(pieces)).items():
                    pieces[rid].append(pcm)
                outs.append({rid: np.concatenate(p) for rid, p in pieces.items()})
            seen = sorted(set(lengths))
    finally:
        hook.remove()
    assert seen == [3, 9]   # first chunks at 3 frames, every later window padded to 5 + 4
    for rid in "abc":
        assert outs[1][rid].shape == outs[0][rid].shape and outs[0][rid].size
        np.testing.assert_allclose(outs[1][rid], outs[0][rid], atol=1e-6)


TALKER_EXTREMES = [{"temperature": 1e-40}, {"temperature": 2.0, "top_p": 1e-300}, {"top_k": 10**9}, {"top_k": 1},
                   {"repetition_penalty": 1e-30}, {"repetition_penalty": 1e30}, {"seed": -2**63},
                   {"seed": 2**63 - 1}, {"do_sample": False, "temperature": 1e-40}]


def test_talker_and_code_predictor_sample_at_extremes(ckpt, stages):
    """Code group 0 (talker head) and groups 1-15 (code predictor, sampled when do_sample) never raise,
    with every extreme request batched in the same talker steps."""
    talker, prompt, text = _talker_and_prompt(ckpt, stages, [300, 301, 302])
    for i, values in enumerate(TALKER_EXTREMES):
        talker.add_request(str(i), prompt, "ethan", talker.sampling_params(max_frames=4, **values))
        talker.push_text(str(i), text, final=True)
    frames = {str(i): [] for i in range(len(TALKER_EXTREMES))}
    while len(talker):
        for rid, out in talker.step().items():
            frames[rid].append(out.codes)
    vocab = stages.config.talker_config.text_config.vocab_size
    for rid, chunks in frames.items():
        codes = torch.cat(chunks, -1)
        assert codes.shape[0] == 16 and codes.shape[1] <= 4, rid
        assert codes.numel() == 0 or (int(codes.min()) >= 0 and int(codes.max()) < vocab), rid
