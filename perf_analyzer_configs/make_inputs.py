#!/usr/bin/env python
"""Writes the perf_analyzer input-data files of this folder (`<triton model>.json`); run it again after a
pipeline's REQUEST shape changes: `.venv/bin/python perf_analyzer_configs/make_inputs.py`.

Each file is perf_analyzer's `--input-data` format: {"data": [{INPUT: value, ...}, ...]}; perf_analyzer
sends the entries in turn. Shapes follow the client-facing contracts:
  chat pipelines (voice, qwen3_omni) and mock_stream: REQUEST BYTES [1] = the pipeline request JSON that
      omni_frontend.chat_protocol.to_pipeline builds from an OpenAI chat request
  tts: REQUEST BYTES [1] = {"input", "voice", "speed", "instructions"} (omni_frontend/routes/speech.py)
  qwen_image: REQUEST BYTES [1] = {"task": "generate", "prompt", "width", "height", "num_inference_steps",
      "seed"} (omni_frontend/routes/images.py; 64x64, 4 steps: the benchmark setting)
  voice_asr: AUDIO FP32 [samples] 16 kHz mono (batch dim added by perf_analyzer) + OPTIONS BYTES [1]
      (omni_frontend/routes/transcriptions.py); the clip is Kokoro speaking ASR_TEXT, resampled to 16 kHz
      (the only part that loads a model).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROMPTS = ("What is the capital of France?", "Tell me something interesting about the ocean.",
           "How do bees make honey?", "Give me a simple recipe for pancakes.")
ASR_TEXT = "Please tell me about the weather in Paris tomorrow."


def chat_request(prompt: str, voice: str | None, max_tokens: int = 64) -> dict:
    """The pipeline REQUEST body of a one-turn streamed chat with text and audio out, greedy."""
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            "modalities": ["text", "audio"], "voice": voice, "temperature": 0.0, "top_p": None, "top_k": None,
            "max_tokens": max_tokens, "seed": None, "stop": []}


def _requests(bodies) -> dict:
    return {"data": [{"REQUEST": [json.dumps(body)]} for body in bodies]}


def asr_clip() -> np.ndarray:
    """float32 16 kHz mono speech of ASR_TEXT (Kokoro, resampled)."""
    from omni_backends.voice.audio import resample
    from omni_backends.voice.tts import SAMPLE_RATE, KokoroTTS

    return resample(KokoroTTS().synthesize(ASR_TEXT), SAMPLE_RATE, 16000).astype(np.float32)


def main() -> None:
    files = {
        "mock_stream": _requests([{"text": "t", "repeat": 8, "delay_ms": 5, "voice": "x"}]),
        "voice": _requests(chat_request(p, "alloy") for p in PROMPTS),
        "qwen3_omni": _requests(chat_request(p, "ethan") for p in PROMPTS),
        "tts": _requests({"input": p, "voice": "alloy", "speed": 1.0, "instructions": None} for p in PROMPTS),
        "qwen_image": _requests({"task": "generate", "prompt": p, "width": 64, "height": 64, "num_inference_steps": 4,
                                 "seed": i} for i, p in enumerate(PROMPTS)),
    }
    clip = asr_clip()
    options = json.dumps({"language": "en", "prompt": None, "temperature": 0.0, "word_timestamps": False})
    files["voice_asr"] = {"data": [{"AUDIO": {"content": [round(float(x), 4) for x in clip], "shape": [clip.size]},
                                    "OPTIONS": [options]}]}
    for name, data in files.items():
        (HERE / f"{name}.json").write_text(json.dumps(data, indent=None if name == "voice_asr" else 1) + "\n")
        print(f"wrote {HERE / name}.json")


if __name__ == "__main__":
    main()
