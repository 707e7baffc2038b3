"""Deterministic tiny byte-level BPE tokenizer in the Qwen layout (ChatML chat template, Qwen specials after
the BPE ranks), for the tiny random-weight Qwen3-Omni checkpoint.

The BPE is trained on a fixed built-in corpus, so the same vocabulary and ids come out on every machine.
The role words `system`, `user`, `assistant` are single tokens, as in the real Qwen vocabulary, because the
Qwen3-Omni config refers to them by id (`system_token_id`, `user_token_id`, `assistant_token_id`).
"""
from __future__ import annotations

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

# ChatML; content is a string or a list of parts ({"type": "text", "text": ...} or {"type": "audio"}),
# rendered like the real Qwen3-Omni template: one audio part -> <|audio_start|><|audio_pad|><|audio_end|>.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
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


def build_tokenizer(bpe_vocab_size: int = 480) -> Qwen2Tokenizer:
    """Train the tiny BPE (deterministic) and wrap it as a `Qwen2Tokenizer` with the ChatML template.

    Returns a tokenizer whose ids are: byte-level BPE ranks in [0, bpe_vocab_size), then `SPECIAL_TOKENS`
    in order. Raises RuntimeError if a role word is not a single token (the corpus guarantees it is).
    """
    tk = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(list(_CORPUS) * 20, trainer)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok = Qwen2Tokenizer(tokenizer_object=tk, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         unk_token=None, errors="replace", clean_up_tokenization_spaces=False,
                         extra_special_tokens=EXTRA_SPECIAL_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    for word in ROLE_WORDS:
        if len(tok(word)["input_ids"]) != 1:
            raise RuntimeError(f"role word {word!r} is not a single token in the tiny BPE")
    return tok
