"""Deterministic tiny byte-level BPE tokenizer in the Qwen layout (ChatML chat template, Qwen specials after
the BPE ranks), for the random-weight Qwen3-Omni checkpoints.

Two layouts: `tiny` (480 BPE ranks, then the 17 specials the tiny checkpoint uses) and `qwen3_omni`
(the real Qwen3-Omni id layout: 151,643 ranks with `user` / `system` / `assistant` at their real ids,
then the 33 real specials at 151643..151675, so a config with the real token ids, such as the
full-size random checkpoint, finds every special token where it expects it; the ranks beyond the tiny
BPE are filler words that no text encodes to but that decode to readable text).

The BPE is trained on a fixed built-in corpus, so the same vocabulary and ids come out on every machine.
The role words `system`, `user`, `assistant` are single tokens, as in the real Qwen vocabulary, because the
Qwen3-Omni config refers to them by id (`system_token_id`, `user_token_id`, `assistant_token_id`).
"""
from __future__ import annotations

import itertools
import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer

QWEN_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Same strings and relative order as the real Qwen3-Omni tokenizer (ids 151643..151675 there).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
# Model-specific token attributes the Qwen3-Omni processor reads from the tokenizer (tokenizer.audio_token, ...).
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}
ROLE_WORDS = ("system", "user", "assistant")
# The real Qwen3-Omni layout: vocabulary size before the specials, role-word ids, and all specials in id order.
QWEN_RANKS = 151643
QWEN_ROLE_IDS = {"user": 872, "system": 8948, "assistant": 77091}
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
LAYOUTS = ("tiny", "qwen3_omni")

# ChatML; content is a string or a list of parts ({"type": "text", "text": ...}, {"type": "audio"} or {"type": "image"}),
# rendered like the real Qwen3-Omni template: one audio part -> <|audio_start|><|audio_pad|><|audio_end|>, one image
# part -> <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_CORPUS = (
    "system: You are a helpful voice assistant. user: Hello, who are you? assistant: I am a small model.",
    "The quick brown fox jumps over the lazy dog. Say hello to the world, then tell me a story.",
    "user asks, assistant answers; the system prompt sets the tone of the assistant for every user.",
    "Omni models listen to audio, read text and speak back in a natural voice, one frame at a time.",
    "Triton serves the thinker, the talker and the code2wav stages as separate models. 0123456789",
    "What is the weather like today? It is sunny and warm, with a light breeze from the sea.",
    "system\nuser\nassistant\n" * 8,
)


def build_tokenizer(bpe_vocab_size: int = 480, layout: str = "tiny") -> Qwen2Tokenizer:
    """Train the tiny BPE (deterministic) and wrap it as a `Qwen2Tokenizer` with the ChatML template.

    layout "tiny": ids are the byte-level BPE ranks in [0, bpe_vocab_size), then `SPECIAL_TOKENS` in order.
    layout "qwen3_omni": the real id layout (module doc): 151,643 ranks, then `QWEN_SPECIAL_TOKENS`.
    Raises ValueError on an unknown layout, RuntimeError if a role word is not a single token (the
    corpus guarantees it is).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown tokenizer layout {layout!r}; known: {', '.join(LAYOUTS)}")
    tk = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(list(_CORPUS) * 20, trainer)
    specials = SPECIAL_TOKENS
    if layout == "qwen3_omni":
        tk, specials = _qwen_layout(tk), QWEN_SPECIAL_TOKENS
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = Qwen2Tokenizer(tokenizer_object=tk, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         unk_token=None, errors="replace", clean_up_tokenization_spaces=False,
                         extra_special_tokens=EXTRA_SPECIAL_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    for word in ROLE_WORDS:
        if len(tok(word)["input_ids"]) != 1:
            raise RuntimeError(f"role word {word!r} is not a single token in the tiny BPE")
    return tok


def _qwen_layout(trained: Tokenizer) -> Tokenizer:
    """The trained BPE re-numbered into the real layout: role words at `QWEN_ROLE_IDS`, the other ranks in
    order from 0, then filler words (" zab", " zac", ...) up to `QWEN_RANKS`."""
    ranks = sorted(trained.get_vocab().items(), key=lambda item: item[1])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(trained.to_str())["model"]["merges"]]
    ids: list[str | None] = [None] * QWEN_RANKS
    for word, index in QWEN_ROLE_IDS.items():
        ids[index] = word
    free = (i for i, taken in enumerate(ids) if taken is None)
    for token, _ in ranks:
        if token not in QWEN_ROLE_IDS:
            ids[next(free)] = token
    known, filler = set(ids), _filler_words()
    for index in free:
        word = next(filler)
        while word in known:
            word = next(filler)
        ids[index] = word
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(ids)}, merges=merges, fuse_unk=False,
                              byte_fallback=False))
    tk.pre_tokenizer, tk.decoder = trained.pre_tokenizer, trained.decoder
    return tk


def _filler_words():
    """' zab', ' zac', ...: byte-level strings ('Ġ' is the space byte) of three or more letters."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for length in range(2, 6):
        for combo in itertools.product(letters, repeat=length):
            yield "Ġz" + "".join(combo)
