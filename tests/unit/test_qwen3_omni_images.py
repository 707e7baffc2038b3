"""Images in the Qwen3-Omni thinker: greedy tokens of both engines == transformers' generate() on the processor's
inputs (the tiny checkpoint's image processor, vision tower and M-RoPE positions)."""
import copy
import queue

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omni_backends.engine.options import EngineOptions
from omni_backends.errors import RequestError
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
