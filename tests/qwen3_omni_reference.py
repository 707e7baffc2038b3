"""transformers' side of the Qwen3-Omni comparisons (unit and integration tests): its own processor over a
checkpoint's tokenizer, feature extractor and image processor, its greedy text tokens, and an answer's text."""
from __future__ import annotations

import codecs

import pytest
import torch
from transformers import Qwen3OmniMoeProcessor
from transformers.processing_utils import ProcessorMixin


def processor(tokenizer, feature_extractor, image_processor) -> Qwen3OmniMoeProcessor:
    """transformers' `Qwen3OmniMoeProcessor` of the checkpoint's parts. Its video processor needs torchvision,
    which is not installed: the constructor's class check, which requires one, is skipped."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
        return Qwen3OmniMoeProcessor(image_processor=image_processor, feature_extractor=feature_extractor,
                                     tokenizer=tokenizer)


def greedy_text(model, proc: Qwen3OmniMoeProcessor, messages: list[dict], images: list,
                max_tokens: int, audios: list = ()) -> tuple[list[int], torch.Tensor]:
    """(generated ids, prompt ids int64 [L]) of `model.generate` (a `Qwen3OmniMoeForConditionalGeneration`, text
    only, greedy, stopping at <|im_end|>) on the processor's inputs of chat `messages` ({"type": "image"} and
    {"type": "audio"} parts), `images` (uint8 [H, W, 3] each) and `audios` (float32 16 kHz each)."""
    text = proc.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=[text], images=images or None, audio=list(audios) or None, return_tensors="pt")
    with torch.no_grad():
        seq = model.generate(**inputs, return_audio=False, thinker_max_new_tokens=max_tokens, thinker_do_sample=False,
                             thinker_eos_token_id=model.config.im_end_token_id)
    ids = inputs["input_ids"][0]
    return seq[0, len(ids):].tolist(), ids


def answer_text(tokenizer, ids) -> str:
    """The text of the answer `ids`: their decode, less its trailing U+FFFD when the last tokens leave a multi-byte
    character incomplete (the random-weight thinker cut by max_tokens: the answer ends before that character, as
    OpenAI's do). The bytes come from GPT-2's byte-level alphabet (printable Latin-1 for themselves, the other
    bytes from U+0100 on), which the Qwen tokenizer spells its tokens in."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    byte_of = {chr(b): b for b in printable} | {chr(0x100 + i): b for i, b in enumerate(others)}
    special = set(tokenizer.all_special_ids)
    data = b"".join(bytes(byte_of[c] for c in token) for i, token in zip(ids, tokenizer.convert_ids_to_tokens(ids))
                    if i not in special)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data, final=False)   # keeps back the bytes of an incomplete last character
    return text[:-1] if decoder.getstate()[0] and text.endswith("\ufffd") else text
