"""OpenAI-style chat messages -> Qwen3-Omni thinker inputs (token ids + audio features).

Does what transformers' `Qwen3OmniMoeProcessor` does for text and audio: render the chat template (one
`<|audio_start|><|audio_pad|><|audio_end|>` per audio part), expand each `<|audio_pad|>` to as many
placeholder tokens as the audio encoder outputs for that clip, tokenize, and run the feature extractor.
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
        input_ids: int64 [L] prompt ids (audio placeholders expanded).
        input_features: float32 [n_audio, mel_bins, frames] log-mel features (100 frames/s), or None.
        feature_attention_mask: int64 [n_audio, frames], 1 on real frames, or None.
    """

    input_ids: torch.Tensor
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None


class PromptBuilder:
    """Builds `ThinkerInputs` with a checkpoint's tokenizer (ChatML template) and `WhisperFeatureExtractor`.

    Args:
        tokenizer: the checkpoint's tokenizer; must define `audio_token` (`<|audio_pad|>`).
        feature_extractor: the checkpoint's `WhisperFeatureExtractor` (16 kHz input).
        n_window: the audio encoder's `audio_config.n_window` (50 in real checkpoints).
    """

    def __init__(self, tokenizer, feature_extractor, n_window: int):
        self.tokenizer, self.feature_extractor, self.n_window = tokenizer, feature_extractor, n_window
        self.audio_token = tokenizer.audio_token

    def build(self, messages: Sequence[dict], audios: Sequence[np.ndarray] = ()) -> ThinkerInputs:
        """Prompt for the assistant's next turn.

        Args:
            messages: OpenAI chat messages: {"role": "system"|"user"|"assistant", "content": str | parts};
                parts are {"type": "text", "text": str} or {"type": "input_audio", ...}. The payload of
                an input_audio part is not read here: the k-th input_audio part takes `audios[k]`.
            audios: float32 mono waveforms at 16 kHz, one per input_audio part, in order.

        Raises:
            RequestError: on an unknown role or part type, or when the number of input_audio parts is
                not len(audios).
        """
        chat = [self._message(i, m) for i, m in enumerate(messages)]
        n_parts = sum(p["type"] == "audio" for m in chat if not isinstance(m["content"], str) for p in m["content"])
        if n_parts != len(audios):
            raise RequestError(f"{n_parts} input_audio part(s) but {len(audios)} audio tensor(s)", param="messages")
        text = self.text(messages)
        if not audios:
            return ThinkerInputs(input_ids=self._tokenize(text))
        features = self.feature_extractor([np.asarray(a, dtype=np.float32) for a in audios],
                                          sampling_rate=AUDIO_SAMPLE_RATE, padding=True, truncation=False,
                                          return_attention_mask=True, return_tensors="pt")
        mask = features["attention_mask"].long()
        counts = _get_feat_extract_output_lengths(mask.sum(-1), self.n_window).tolist()
        pieces = text.split(self.audio_token)
        text = pieces[0] + "".join(self.audio_token * n + rest for n, rest in zip(counts, pieces[1:]))
        return ThinkerInputs(input_ids=self._tokenize(text), input_features=features["input_features"],
                             feature_attention_mask=mask)

    def text(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The chat-templated text of messages (as `build` renders them, audio placeholders not expanded), ending
        with the assistant turn's header when `add_generation_prompt` (omni_backends.serving.token_actions.Template).
        Raises RequestError as `build`."""
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
            else:
                raise RequestError(f"messages[{index}]: unsupported content part type {kind!r}", param="messages")
        return {"role": role, "content": parts}
