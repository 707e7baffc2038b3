"""Embedded-default voice pipeline: Whisper tiny.en ASR -> SmolLM2-135M-Instruct chat -> Kokoro-82M TTS
(or, opt-in, Piper's joe voice: `engines`).

Plain stage classes (testable without a server; import the submodule you need so that torch-free stages
never import torch): `asr.WhisperASR`, `llm.ChatLLM`, `tts.KokoroTTS`, `piper_tts.PiperTTS`,
`chunker.SentenceChunker`, with
`models` (checkpoint preparation; CLI `python -m omni_backends.voice.models`), `phonemize` (espeak-ng G2P),
`audio` (resampling) and `protocol` (chat request mapping). `serving` holds the Triton adapters of the
models voice_asr, voice_llm, voice_tts, voice and tts.
"""
