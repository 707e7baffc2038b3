"""Images in the Qwen3-Omni thinker: greedy tokens of both engines == transformers' generate() on the processor's
inputs (the tiny checkpoint's image processor, vision tower and M-RoPE positions)."""
import copy
import queue

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omni_backends.engine.options import EngineOptions
from omni_backends.engine.prefill_graphs import PrefillGraphs
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.loading import load_tts_embeds
from omni_backends.qwen3_omni.mrope import image_positions
from omni_backends.qwen3_omni.pipeline import LocalOmniPipeline, OmniRequest
from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt
from omni_backends.qwen3_omni.serving import turn
from omni_backends.qwen3_omni.thinker import Thinker
from tests.qwen3_omni_reference import greedy_text, processor

pytestmark = pytest.mark.unit

MAX_TOKENS = 12
SIZES = [(40, 70), (100, 52)]   # (h, w): different grids, (1, 2, 4) and (1, 6, 4) patches


def _image(seed: int, size: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def _messages(n_images: int) -> list[dict]:
    parts = [{"type": "text", "text": "Look"}]
    parts += [{"type": "image"} for _ in range(n_images)]
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": parts + [{"type": "text", "text": "What do you see?"}]}]


@pytest.fixture(scope="module")
def reference(qwen3_omni_ckpt):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_omni_ckpt).eval()


@pytest.fixture(scope="module")
def proc(qwen3_omni_stages):
    stages = qwen3_omni_stages
    return processor(stages.tokenizer, stages.feature_extractor, stages.image_processor)


def _expected(reference, proc, messages, images):
    return greedy_text(reference, proc, messages, images, MAX_TOKENS)


def _thinker_tokens(stages, options: EngineOptions, messages, images, audios=()) -> tuple[list[int], torch.Tensor]:
    """(greedy ids, prompt ids) of a fresh `Thinker` (its own copy of the model) on one request."""
    thinker = Thinker(copy.deepcopy(stages.thinker), stages.config, stages.tokenizer, stages.feature_extractor,
                      options=options, image_processor=stages.image_processor)
    tokens: queue.SimpleQueue = queue.SimpleQueue()
    try:
        params = thinker.sampling_params(max_tokens=MAX_TOKENS, temperature=0.0)
        inputs = thinker.submit("r", messages, params, lambda rid, token: tokens.put(token), audios=audios,
                                images=images)
        out = []
        while True:
            token = tokens.get(timeout=60)
            assert token.error is None
            if token.token_id is not None:
                out.append(token.token_id)
            if token.finished:
                return out, inputs.input_ids
    finally:
        thinker.shutdown()


@pytest.mark.parametrize("n_images", [1, 2])
@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_image_prompt_tokens_match_generate(qwen3_omni_stages, reference, proc, engine, n_images):
    images = [_image(i, SIZES[i]) for i in range(n_images)]
    messages = _messages(n_images)
    expected, expected_ids = _expected(reference, proc, messages, images)
    tokens, ids = _thinker_tokens(qwen3_omni_stages, EngineOptions(engine=engine, max_len=256), messages, images)
    assert torch.equal(ids, expected_ids)   # same placeholder expansion as the processor
    pads = int((ids == reference.config.thinker_config.image_token_id).sum())
    assert pads == [2, 2 + 6][n_images - 1]   # 32x64 -> 2 tokens, 96x64 -> 6 tokens
    assert len(expected) == MAX_TOKENS and tokens == expected


def test_audio_and_image_in_one_prompt_match_generate(qwen3_omni_stages, reference, proc):
    """Audio placeholders before an image shift its M-RoPE positions by the audio's own (get_rope_index with the
    audio lengths): the tokens still equal generate's."""
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    images = [_image(1, SIZES[1])]
    chat = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    expected, expected_ids = greedy_text(reference, proc, chat, images, MAX_TOKENS, audios=[tone])
    messages = [{**chat[0], "content": [{"type": "input_audio"}, *chat[0]["content"][1:]]}]
    tokens, ids = _thinker_tokens(qwen3_omni_stages, EngineOptions(), messages, images, audios=[tone])
    assert torch.equal(ids, expected_ids) and tokens == expected


def test_image_changes_the_answer_and_positions(qwen3_omni_stages, reference, proc):
    """The image embeddings and M-RoPE positions are used: another image gives other tokens; positions of
    text after the image continue from the image grid's largest position + 1."""
    messages = _messages(1)
    first, _ = _expected(reference, proc, messages, [_image(0, SIZES[0])])
    other, _ = _expected(reference, proc, messages, [np.full((*SIZES[0], 3), 255, np.uint8)])
    assert first != other
    inputs = Thinker(qwen3_omni_stages.thinker, qwen3_omni_stages.config, qwen3_omni_stages.tokenizer,
                     qwen3_omni_stages.feature_extractor, image_processor=qwen3_omni_stages.image_processor
                     ).prompts.build(messages, images=[_image(1, SIZES[1])])
    L = len(inputs.input_ids)
    assert inputs.position_ids.shape == (4, 1, L) and torch.equal(inputs.position_ids[0, 0], torch.arange(L))
    assert inputs.next_position == int(inputs.position_ids[1:].max()) + 1 < L   # 6 image tokens on a 3x2 grid
    assert inputs.pixel_values.shape == (6 * 4, 3 * 2 * 16 * 16) and inputs.image_grid_thw.tolist() == [[1, 6, 4]]


def test_image_part_count_must_match_images(qwen3_omni_stages):
    stages = qwen3_omni_stages
    with_images = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                          image_processor=stages.image_processor).prompts
    with pytest.raises(RequestError, match="2 image part"):
        with_images.build(_messages(2), images=[_image(0, SIZES[0])])
    without = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor).prompts
    with pytest.raises(RequestError, match="no image processor"):
        without.build(_messages(1), images=[_image(0, SIZES[0])])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the device: docs/gpu.md)")
def test_image_prompts_on_cuda_decode_alike_with_and_without_graphs(tmp_path, monkeypatch):
    """On CUDA (bf16, as served): a prompt with two images is prefilled eagerly (pixel values and M-RoPE positions
    make it a solo prompt, never a prefill graph) and its decode steps replayed from the static engine's graphs give
    exactly the tokens of the same steps run eagerly, its images expanded to their tokens. No conftest fixtures:
    the device runs this file with --noconftest."""
    from omni_backends.engine import fused
    from omni_backends.qwen3_omni.checkpoint import write_checkpoint
    from omni_backends.qwen3_omni.loading import load_stages

    monkeypatch.setattr(fused, "active", lambda x: False)   # the fused decode attention needs head_dim >= 32
    stages = load_stages(write_checkpoint(tmp_path / "qwen3_omni_tiny"), "cuda", torch.bfloat16)
    images, messages = [_image(i, SIZES[i]) for i in range(2)], _messages(2)
    runs = [_thinker_tokens(stages, EngineOptions(engine="static", max_len=256, cuda_graphs=graphs), messages, images)
            for graphs in (False, True)]
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == MAX_TOKENS
    # the processor's expansion (test_image_prompt_tokens_match_generate; transformers 5.17's processor on the device
    # needs a video processor, which needs torchvision): 2 + 6 image tokens
    assert int((runs[0][1] == stages.config.thinker_config.image_token_id).sum()) == 2 + 6


def test_turn_reads_the_image_tensors_of_a_chat_and_refuses_them_with_a_completion_prompt(qwen3_omni_stages):
    """`turn.thinker_request` (the thinker stage and the co-located model): a chat's INPUT_IMAGES reach the prompt as
    `build` makes it; a completion's `prompt` (text or ids, no chat template) takes no media tensor (400 naming it)."""
    stages = qwen3_omni_stages
    thinker = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                      image_processor=stages.image_processor)
    image = _image(0, SIZES[1])
    media = {"INPUT_IMAGES": image[None], "INPUT_IMAGE_SIZES": np.array([SIZES[1]], np.int32)}
    try:
        inputs, _, _ = turn.thinker_request(thinker, {"messages": _messages(1)}, media, MAX_TOKENS)
        assert torch.equal(inputs.input_ids, thinker.prompts.build(_messages(1), images=[image]).input_ids)
        assert inputs.image_grid_thw.tolist() == [[1, 6, 4]]
        ids = stages.tokenizer("Look at")["input_ids"]
        inputs, _, _ = turn.thinker_request(thinker, {"prompt": ids}, {}, MAX_TOKENS)
        assert inputs.input_ids.tolist() == ids and inputs.pixel_values is None
        for name in ("INPUT_IMAGES", "INPUT_AUDIO"):
            with pytest.raises(RequestError) as err:
                turn.thinker_request(thinker, {"prompt": "Look at"}, {name: media.get(name, np.zeros(5, np.float32))},
                                     MAX_TOKENS)
            assert err.value.param == name
    finally:
        thinker.shutdown()


def test_an_image_the_processor_refuses_is_a_400_naming_the_image_tensor(qwen3_omni_stages):
    """A direct Triton client's image of aspect ratio >= 200 (the frontend refuses it first): the image processor's
    ValueError was a 500; now a RequestError naming INPUT_IMAGES and the image."""
    stages = qwen3_omni_stages
    thinker = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                      image_processor=stages.image_processor)
    try:
        with pytest.raises(RequestError) as err:
            thinker.prompts.build(_messages(2), images=[_image(0, SIZES[0]), _image(1, (1, 250))])
        assert err.value.param == "INPUT_IMAGES" and err.value.message.startswith("image 1 (250x1)"), err.value.message
        # an image 3 pixels tall is channels last too (the processor guessed channels first: a 3-channel 60x3 image)
        short = _image(2, (3, 60))
        grid = stages.image_processor(images=[short], return_tensors="pt", input_data_format="channels_last")
        assert torch.equal(thinker.prompts.build(_messages(1), images=[short]).image_grid_thw, grid["image_grid_thw"])
    finally:
        thinker.shutdown()


TALKER_TOKENS, TALKER_FRAMES = 16, 29
TONE = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
# (messages, images, audios): two images (the second's merged grid has 3 rows), and audio before a 3-row image
SPOKEN = {"two_images": (_messages(2), [_image(0, SIZES[0]), _image(1, SIZES[1])], []),
          "audio_and_image": ([{"role": "user", "content": [{"type": "input_audio"}, {"type": "text", "text": "and"},
                                                            {"type": "image"}]}], [_image(1, SIZES[1])], [TONE])}


def _with_talker_audio_config(reference, monkeypatch):
    """transformers 5.24's talker `get_rope_index` reads `config.audio_config.n_window` for audio placeholders, which
    the talker's config lacks (an AttributeError in `generate(return_audio=True)` for a prompt with audio and images):
    give it the thinker's, the audio encoder whose lengths placed those placeholders."""
    monkeypatch.setattr(reference.talker.config, "audio_config", reference.config.thinker_config.audio_config,
                        raising=False)


def _spoken(stages, ckpt, options, requests, setup=lambda pipe: None):
    """{request id: OmniResult} of a fresh `LocalOmniPipeline` (greedy thinker and talker; `setup(pipe)` first) on
    [(request id, (messages, images, audios))]."""
    pipe = LocalOmniPipeline.from_stages(stages, load_tts_embeds(ckpt, stages.config), options=options, max_running=4)
    setup(pipe)
    try:
        return pipe.run([OmniRequest(rid, messages, pipe.thinker.sampling_params(max_tokens=TALKER_TOKENS,
                                                                                  temperature=0.0),
                                     pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0,
                                                                 max_frames=TALKER_FRAMES),
                                     images=images, audios=audios) for rid, (messages, images, audios) in requests])
    finally:
        pipe.close()


@pytest.mark.parametrize("case", list(SPOKEN))
@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_spoken_answer_about_images_matches_generate(qwen3_omni_stages, qwen3_omni_ckpt, reference, monkeypatch,
                                                     engine, case):
    """The talker's codec codes (and so the audio) of a prompt with images equal `generate(return_audio=True)`'s:
    its prefill takes the M-RoPE positions of its own input ids (image placeholders on their grid) and every frame the
    text position plus the rope delta. Before, plain 0, 1, 2, ... positions gave other codes."""
    messages, images, audios = SPOKEN[case]
    result = _spoken(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions(engine=engine, max_len=256),
                     [(case, SPOKEN[case])])[case]
    inputs = Thinker(qwen3_omni_stages.thinker, qwen3_omni_stages.config, qwen3_omni_stages.tokenizer,
                     qwen3_omni_stages.feature_extractor, image_processor=qwen3_omni_stages.image_processor
                     ).prompts.build(messages, audios, images)
    kwargs = {"pixel_values": inputs.pixel_values, "image_grid_thw": inputs.image_grid_thw}
    if audios:
        kwargs.update(input_features=inputs.input_features, feature_attention_mask=inputs.feature_attention_mask)
        _with_talker_audio_config(reference, monkeypatch)
    decoded = []
    decode = reference.code2wav.chunked_decode
    monkeypatch.setattr(reference.code2wav, "chunked_decode", lambda codes, **kw: decoded.append(codes) or decode(
        codes, **kw))
    with torch.no_grad():
        seq, wav = reference.generate(
            input_ids=inputs.input_ids[None], return_audio=True, speaker="ethan", thinker_max_new_tokens=TALKER_TOKENS,
            thinker_do_sample=False, thinker_eos_token_id=reference.config.im_end_token_id,
            talker_max_new_tokens=TALKER_FRAMES + 1, talker_do_sample=False, talker_repetition_penalty=1.0, **kwargs)
    assert result.token_ids == seq[0, len(inputs.input_ids):].tolist() and len(result.token_ids) == TALKER_TOKENS
    (codes,) = decoded
    assert codes.shape[-1] >= 10 and torch.equal(result.codes, codes[0])
    np.testing.assert_allclose(result.audio, wav[0, 0].numpy(), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the device: docs/gpu.md)")
def test_spoken_answer_about_images_on_cuda_alike_with_and_without_graphs(tmp_path, monkeypatch):
    """On CUDA (bf16, as served): a spoken answer about two images (the second's grid 3 rows) from the static engine
    with its graphs (talker steps at position + rope delta, code-predictor frames) has exactly the codec codes of the
    same engine run eagerly; the image prompt's talker prefill is the eager forward with its M-RoPE positions in both.
    No conftest fixtures: the device runs this file with --noconftest."""
    from omni_backends.engine import fused
    from omni_backends.qwen3_omni.checkpoint import write_checkpoint
    from omni_backends.qwen3_omni.loading import load_stages

    monkeypatch.setattr(fused, "active", lambda x: False)   # the fused decode attention needs head_dim >= 32
    ckpt = write_checkpoint(tmp_path / "qwen3_omni_tiny")
    stages = load_stages(ckpt, "cuda", torch.bfloat16)
    runs = [_spoken(stages, ckpt, EngineOptions(engine="static", max_len=256, cuda_graphs=graphs),
                    [("two_images", SPOKEN["two_images"])])["two_images"] for graphs in (False, True)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == TALKER_TOKENS
    assert runs[0].codes.shape[-1] >= 10 and torch.equal(runs[0].codes, runs[1].codes)


def test_talker_image_positions_equal_transformers_get_rope_index(qwen3_omni_stages, reference, monkeypatch):
    """`mrope.image_positions` over talker ids (audio, text and two images, one of 3 rows) == the talker's own
    `get_rope_index` (positions and delta)."""
    _with_talker_audio_config(reference, monkeypatch)
    stages, tc = qwen3_omni_stages, reference.config.talker_config
    chat = [{"role": "user", "content": [{"type": "input_audio"}, *_messages(2)[1]["content"]]}]
    images = [_image(0, SIZES[0]), _image(1, SIZES[1])]
    inputs = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                     image_processor=stages.image_processor).prompts.build(chat, [TONE], images)
    ids = torch.cat([inputs.input_ids, torch.full((9,), reference.config.tts_pad_token_id)])
    expected, delta = reference.talker.get_rope_index(ids[None], inputs.image_grid_thw, None,
                                                      torch.ones_like(ids)[None], False,
                                                      inputs.feature_attention_mask.sum(-1))
    positions, rope_delta = image_positions(ids, inputs.image_grid_thw, image_token_id=tc.image_token_id,
                                            merge_size=tc.spatial_merge_size,
                                            position_id_per_seconds=tc.position_id_per_seconds)
    assert torch.equal(positions, expected[:, 0].long()) and rope_delta == int(delta) < 0
    assert not torch.equal(positions[1], positions[2])   # 2-D image positions, not text ones


def test_static_talker_burst_of_image_and_text_prompts_with_prefill_graphs(qwen3_omni_stages, qwen3_omni_ckpt):
    """With prefill graphs (their padded forward, eager on CPU), a text prompt goes through them and an image prompt
    through the eager forward with its M-RoPE positions: both speak as the dynamic engine does."""
    requests = [("text", ([{"role": "user", "content": "Tell me a story."}], [], [])), ("image", SPOKEN["two_images"])]
    dynamic = _spoken(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions(), requests)
    taken = []

    def with_prefill_graphs(pipe):
        graphs = PrefillGraphs(pipe.talker._padded_forward, hidden=1, max_tokens=64, name="talker-prefill")
        run_batch = graphs.run_batch
        graphs.run_batch = lambda prompts: taken.append(len(prompts)) or run_batch(prompts)
        pipe.talker.prefill_graphs = graphs

    static = _spoken(qwen3_omni_stages, qwen3_omni_ckpt, EngineOptions(engine="static", max_len=256), requests,
                     with_prefill_graphs)
    assert sum(taken) == 1   # the text prompt; the image prompt's M-RoPE positions take the eager forward
    for rid, expected in dynamic.items():
        assert expected.codes.shape[-1] >= 10 and torch.equal(static[rid].codes, expected.codes)


def test_talker_refuses_image_grids_that_do_not_fit_the_prompt(qwen3_omni_stages, qwen3_omni_ckpt):
    """Image grids that do not fit the prompt's image placeholders (a direct client's IMAGE_GRID_THW) are a
    RequestError naming the tensor when the request is added, not a failure of the talker's step."""
    stages = qwen3_omni_stages
    talker = Talker(stages.talker, stages.config, load_tts_embeds(qwen3_omni_ckpt, stages.config))
    ids = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                  image_processor=stages.image_processor).prompts.build(_messages(1), images=[_image(1, SIZES[1])]
                                                                        ).input_ids
    hidden = torch.zeros(len(ids), stages.config.thinker_config.text_config.hidden_size)
    params = talker.sampling_params(do_sample=False)
    for grids, message in (([[1, 6, 4], [1, 2, 4]], "of shape (2, 3) for 1 images"),
                           ([[1, 2, 4]], "a run of 6 tokens for a grid of 1x1x2")):
        with pytest.raises(RequestError) as err:
            talker.add_request("r", TalkerPrompt(ids, hidden, hidden[:6], torch.tensor(grids)), "ethan", params)
        assert err.value.param == "IMAGE_GRID_THW" and message in err.value.message, err.value.message
    talker.add_request("r", TalkerPrompt(ids, hidden, hidden[:6], torch.tensor([[1, 6, 4]])), "ethan", params)
    assert "r" in talker
