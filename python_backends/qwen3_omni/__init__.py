"""Qwen3-Omni stages (thinker -> talker -> code2wav) on transformers' `Qwen3OmniMoe*` classes.

Modules: `checkpoint` (tiny random checkpoint + CLI), `tiny_tokenizer`, `loading` (per-stage loading from
one tiny or real checkpoint directory), `prompt` (chat messages + audio -> thinker inputs), `thinker`,
`talker`, `code2wav` (streaming vocoder), `pipeline` (the three stages wired in one process).
"""
