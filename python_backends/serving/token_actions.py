"""A chat pipeline LLM's prompt ids and its answers to the token control REQUESTs (no Triton imports).

Used by the LLM stages that own a tokenizer (voice_llm, qwen3_omni_thinker, the co-located qwen3_omni):
  {"action": "prompt_tokens", "messages" | "prompt", "max_tokens", "add_generation_prompt" (default true),
   "add_special_tokens" (default false for messages, true for a prompt), "return_token_ids" (default false)}
      -> {"type": "prompt_tokens", "prompt_tokens", "context_length"[, "token_ids"]} (events.prompt_tokens_event),
         or the 400 `context_length_exceeded` a request with them would get;
  {"action": "detokenize", "tokens": [int]} -> {"type": "detokenized", "text"} (events.detokenized_event).
Messages here are text only (string content or text parts); an input_audio part is a 400 naming it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from omni_backends.chat_request import check_messages, check_prompt, check_token_ids, prompt_ids
from omni_backends.engine.limits import check_prompt_chars
from omni_backends.engine.sampling import check_context_length
from omni_backends.errors import RequestError
from omni_backends.serving import events

# (messages, add_generation_prompt) -> the chat-templated text the LLM would prefill for them
Template = Callable[[Sequence[Mapping], bool], str]
ACTIONS = ("prompt_tokens", "detokenize")


def completion_ids(tokenizer, prompt, max_tokens: int, context_length: int, longest_token: int) -> list[int]:
    """Token ids of a completion REQUEST's `prompt` (text tokenized as it is, no chat template; or token ids),
    checked to fit the context with `max_tokens`. Raises RequestError (HTTP 400, param "prompt" or "max_tokens"): a
    bad type, an empty prompt, an id outside the vocabulary, or a prompt that cannot fit (a long text is refused
    from its length before it is tokenized)."""
    ids = _checked_prompt_ids(tokenizer, prompt, max_tokens, context_length, longest_token)
    if not ids:
        raise RequestError("prompt must not be empty (it has no token)", param="prompt")
    check_context_length(len(ids), max_tokens, context_length, "prompt")
    return ids


def _checked_prompt_ids(tokenizer, prompt, max_tokens: int, context_length: int, longest_token: int,
                        add_special_tokens: bool = True) -> list[int]:
    """`prompt_ids` of a `prompt` that passes `check_prompt`, a text first refused from its length when it cannot fit
    the context with `max_tokens`. Raises RequestError (HTTP 400, param "prompt")."""
    check_prompt(prompt)
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), max_tokens, context_length, longest_token, "prompt")
    return prompt_ids(tokenizer, prompt, add_special_tokens)


def answer(body: Mapping, tokenizer, template: Template, max_tokens: int, context_length: int,
           longest_token: int) -> dict | None:
    """The event answering a token control REQUEST `body` (see the module doc), None for any other REQUEST.
    `max_tokens`: the request's (or the model's default) max_tokens, checked with the prompt against
    `context_length`. Raises RequestError (HTTP 400) naming the bad field."""
    action = body.get("action")
    if action == "detokenize":
        ids = check_token_ids(tokenizer, body.get("tokens"), "tokens")
        return events.detokenized_event(tokenizer.decode(ids))
    if action != "prompt_tokens":
        return None
    flags = {}
    for name in ("add_generation_prompt", "add_special_tokens", "return_token_ids"):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"{name} must be a boolean, got {value!r}", param=name)
        flags[name] = value
    if body.get("prompt") is not None and body.get("messages") is None:
        ids = _checked_prompt_ids(tokenizer, body["prompt"], max_tokens, context_length, longest_token,
                                  flags["add_special_tokens"] is not False)
        param = "prompt"
    else:
        messages = body.get("messages")
        check_messages(messages)
        check_prompt_chars(_text_only(messages), max_tokens, context_length, longest_token)
        text = template(messages, flags["add_generation_prompt"] is not False)
        ids = list(tokenizer(text, add_special_tokens=bool(flags["add_special_tokens"]))["input_ids"])
        param = "messages"
    check_context_length(len(ids), max_tokens, context_length, param)
    return events.prompt_tokens_event(len(ids), context_length, ids if flags["return_token_ids"] else None)


def _text_only(messages: Sequence[Mapping]) -> int:
    """Characters of text in checked `messages`; RequestError (HTTP 400, param: the part) for an input_audio part,
    which has no tokens without its audio."""
    chars = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
            continue
        for j, part in enumerate(content or []):
            if part["type"] != "text":
                raise RequestError("only text is tokenized: an input_audio part has no tokens without its audio",
                                   param=f"messages[{i}].content[{j}]", code="unsupported_content")
            chars += len(part["text"])
    return chars
