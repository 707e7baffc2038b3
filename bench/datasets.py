"""Prompts for a benchmark run: built-in English prompts or a JSONL file of {"prompt": str} lines."""
from __future__ import annotations

import json
import random
from pathlib import Path

BUILTIN = "builtin"
# Short conversational questions, the kind a voice assistant gets; answers run a few sentences.
BUILTIN_PROMPTS = (
    "What is the capital of France?",
    "Tell me a short story about a cat who learns to swim.",
    "Can you explain how a rainbow forms?",
    "What are three tips for sleeping better?",
    "Describe the taste of a fresh orange.",
    "Why is the sky blue during the day?",
    "How do bees make honey?",
    "Give me a simple recipe for pancakes.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a black hole is in simple words.",
    "How does a bicycle stay upright when it moves?",
    "What is the difference between weather and climate?",
    "Suggest a name for a friendly robot and explain why.",
    "How can I learn a new language quickly?",
    "What happens when water boils?",
    "Tell me something interesting about the ocean.",
    "Why do leaves change colour in autumn?",
    "How does a plane fly?",
    "What is a good way to start the morning?",
    "Describe a busy market in a few sentences.",
    "What is photosynthesis?",
    "How do I make a paper airplane?",
    "Why do cats purr?",
    "What is the tallest mountain in the world?",
)


def load_prompts(dataset: str, num_prompts: int, seed: int) -> list[str]:
    """`num_prompts` prompts from `dataset` ("builtin" or a JSONL path), shuffled with `seed`.

    The pool is shuffled once and then taken in order, cycling when more prompts are asked than it
    holds, so the same seed always gives the same list. Raises ValueError for an empty or malformed file.
    """
    pool = list(BUILTIN_PROMPTS) if dataset == BUILTIN else _read_jsonl(Path(dataset))
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(num_prompts)]


def _read_jsonl(path: Path) -> list[str]:
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'prompt' string") from exc
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}:{number}: 'prompt' must be a non-empty string")
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
