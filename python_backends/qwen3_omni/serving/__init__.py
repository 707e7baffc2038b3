"""Triton Python-backend adapters of the Qwen3-Omni stages (only imported inside Triton stubs).

`protocol` (tensor names and stage settings shared by the models), `thinker_model` (engine stage),
`talker_model` (stateful streaming stage, sequence-batched), `code2wav_model` (stateful streaming
vocoder, sequence-batched), `omni_model` (the client-facing BLS orchestrator). The contracts are in
docs/qwen3_omni.md.
"""
