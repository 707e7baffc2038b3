"""Triton Python-backend adapters of the voice pipeline's models (imported only inside Triton stubs):
voice_asr, voice_llm, voice_tts (stages) and the `voice` and `tts` orchestrators."""
