"""OpenAI-style chat messages -> Qwen3-Omni thinker inputs (token ids + audio features + image patches).

Does what transformers' `Qwen3OmniMoeProcessor` does for text, audio and images: render the chat template (one
`<|audio_start|><|audio_pad|><|audio_end|>` per audio part, one `<|vision_start|><|image_pad|><|vision_end|>` per
image part), expand each `<|audio_pad|>` to as many placeholder tokens as the audio encoder outputs for that clip and
each `<|image_pad|>` to its image's grid t*h*w / merge_size**2, tokenize, and run the feature extractor and the
image processor. A prompt with images gets the model's M-RoPE positions (`get_rope_index`, as `generate` computes).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from omni_backends.errors import RequestError

AUDIO_SAMPLE_RATE = 16000   # Hz, what the Whisper feature extractor expects
ROLES = ("system", "user", "assistant")


@dataclass
class ThinkerInputs:
    """Inputs of one thinker request.

    Fields:
        input_ids: int64 [L] prompt ids (audio and image placeholders expanded).
        input_features: float32 [n_audio, mel_bins, frames] log-mel features (100 frames/s), or None.
        feature_attention_mask: int64 [n_audio, frames], 1 on real frames, or None.
        pixel_values: float32 [patches, 3 * temporal_patch * patch**2] normalised image patches (all images), or None.
        image_grid_thw: int64 [n_image, 3] each image's (t, h, w) patch grid, or None.
        position_ids: int64 [4, 1, L] (text, t, h, w) positions of a prompt with images (row 0: 0..L-1, rows 1-3:
            `get_rope_index`), or None (text positions 0..L-1 in every row).
        next_position: the M-RoPE position of the first generated token (max of rows 1-3 + 1), with position_ids.
    """

    input_ids: torch.Tensor
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    next_position: int | None = None


class PromptBuilder:
    """Builds `ThinkerInputs` with a checkpoint's tokenizer (ChatML template), `WhisperFeatureExtractor` and image
    processor.

    Args:
        tokenizer: the checkpoint's tokenizer; must define `audio_token` (`<|audio_pad|>`) and `image_token`.
        feature_extractor: the checkpoint's `WhisperFeatureExtractor` (16 kHz input).
        n_window: the audio encoder's `audio_config.n_window` (50 in real checkpoints).
        image_processor: the checkpoint's `Qwen2VLImageProcessor` (`loading.load_image_processor`); None: image
            parts are refused.
        rope_index: the thinker's `get_rope_index` (input_ids [1, L], image_grid_thw, None, attention_mask [1, L],
            False, audio_seqlens [n_audio] -> (positions [3, 1, L], deltas)); needed with image_processor.
    """

    def __init__(self, tokenizer, feature_extractor, n_window: int, image_processor=None, rope_index=None):
        self.tokenizer, self.feature_extractor, self.n_window = tokenizer, feature_extractor, n_window
        self.image_processor, self.rope_index = image_processor, rope_index
        self.audio_token, self.image_token = tokenizer.audio_token, tokenizer.image_token

    def build(self, messages: Sequence[dict], audios: Sequence[np.ndarray] = (),
              images: Sequence[np.ndarray] = ()) -> ThinkerInputs:
        """Prompt for the assistant's next turn.

        Args:
            messages: OpenAI chat messages: {"role": "system"|"user"|"assistant", "content": str | parts};
                parts are {"type": "text", "text": str}, {"type": "input_audio", ...} or {"type": "image"}. The
                payload of an input_audio part is not read here: the k-th input_audio part takes `audios[k]`, the
                k-th image part `images[k]`.
            audios: float32 mono waveforms at 16 kHz, one per input_audio part, in order.
            images: uint8 RGB [H, W, 3] pixels, one per image part, in order.

        Raises:
            RequestError: on an unknown role or part type, when the number of input_audio parts is not
                len(audios) or of image parts not len(images), or on an image part without an image processor.
        """
        chat = [self._message(i, m) for i, m in enumerate(messages)]
        for kind, given, name in (("audio", audios, "input_audio"), ("image", images, "image")):
            n_parts = sum(p["type"] == kind for m in chat if not isinstance(m["content"], str) for p in m["content"])
            if n_parts != len(given):
                raise RequestError(f"{n_parts} {name} part(s) but {len(given)} {kind}(s)", param="messages")
        if images and self.image_processor is None:
            raise RequestError("this checkpoint has no image processor: image parts are not accepted",
                               param="messages")
        text = self.text(messages)
        inputs = ThinkerInputs(input_ids=torch.zeros(0, dtype=torch.long))   # input_ids: set once expanded
        if audios:
            features = self.feature_extractor([np.asarray(a, dtype=np.float32) for a in audios],
                                              sampling_rate=AUDIO_SAMPLE_RATE, padding=True, truncation=False,
                                              return_attention_mask=True, return_tensors="pt")
            inputs.input_features = features["input_features"]
            inputs.feature_attention_mask = features["attention_mask"].long()
            audio_lengths = inputs.feature_attention_mask.sum(-1)
            text = _expand(text, self.audio_token, _get_feat_extract_output_lengths(audio_lengths, self.n_window))
        if images:
            pixels = self._pixels(images)
            inputs.pixel_values, inputs.image_grid_thw = pixels["pixel_values"], pixels["image_grid_thw"]
            text = _expand(text, self.image_token, inputs.image_grid_thw.prod(-1) // self.image_processor.merge_size**2)
        inputs.input_ids = self._tokenize(text)
        if images:   # M-RoPE positions as `generate` computes them (audio lengths place audio placeholders)
            ids = inputs.input_ids[None]
            rope, _ = self.rope_index(ids, inputs.image_grid_thw, None, torch.ones_like(ids), False,
                                      audio_lengths if audios else None)
            inputs.position_ids = torch.cat([torch.arange(ids.shape[1])[None, None], rope.long()])
            inputs.next_position = int(rope.max()) + 1
        return inputs

    def _pixels(self, images: Sequence[np.ndarray]) -> dict:
        """The image processor's pixel_values and image_grid_thw of uint8 [H, W, 3] images. Raises RequestError
        (param INPUT_IMAGES) naming the first image it refuses (e.g. an aspect ratio of 200 or more) with its words."""
        arrays = [np.asarray(image, dtype=np.uint8) for image in images]
        # channels last, said: the processor guesses otherwise, and takes an image 1 or 3 pixels tall for channels first
        try:
            return self.image_processor(images=arrays, return_tensors="pt", input_data_format="channels_last")
        except ValueError:
            for k, image in enumerate(arrays):
                try:
                    self.image_processor(images=[image], return_tensors="pt", input_data_format="channels_last")
                except ValueError as exc:
                    raise RequestError(f"image {k} ({image.shape[1]}x{image.shape[0]}): {exc}",
                                       param="INPUT_IMAGES") from None
            raise

    def text(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The chat-templated text of messages (as `build` renders them, audio and image placeholders not expanded),
        ending with the assistant turn's header when `add_generation_prompt`
        (omni_backends.serving.token_actions.Template). Raises RequestError as `build`."""
        return self.tokenizer.apply_chat_template([self._message(i, m) for i, m in enumerate(messages)],
                                                  add_generation_prompt=add_generation_prompt, tokenize=False)

    def _tokenize(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    @staticmethod
    def _message(index: int, message: dict) -> dict:
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RequestError(f"messages[{index}].role must be one of {ROLES}, got {role!r}", param="messages")
        if isinstance(content, str):
            return {"role": role, "content": content}
        parts = []
        for part in content or []:
            kind = part.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind == "input_audio":
                parts.append({"type": "audio"})
            elif kind == "image":
                parts.append({"type": "image"})
            else:
                raise RequestError(f"messages[{index}]: unsupported content part type {kind!r}", param="messages")
        return {"role": role, "content": parts}


def _expand(text: str, token: str, counts: torch.Tensor) -> str:
    """`text` with its k-th `token` repeated counts[k] times (the processor's placeholder expansion)."""
    pieces = text.split(token)
    return pieces[0] + "".join(token * int(n) + rest for n, rest in zip(counts.tolist(), pieces[1:]))
