"""OpenAI Responses API (POST /v1/responses) request validation, its mapping onto a chat request
(`chat_protocol.ChatRequest`, then the chat pipeline's REQUEST), and the `response` object and stream events.

Stateless, as vLLM serves it without a store: text out; input is a string or a list of messages (`role` user,
assistant, system or developer; `content` a string or `input_text` / `input_audio` / `output_text` parts, or
`input_image` parts {"image_url": data: or http(s) URL} for pipelines that take images), with
`instructions` as a first system message. Fields that would need stored responses, tools, reasoning or structured
output (UNSUPPORTED_FIELDS) are refused with a 400 naming them, and so are chat completion fields the Responses API
spells its own way or lacks (`messages`, `max_tokens`, `max_completion_tokens`, `modalities`, `audio`, `n`);
`store`, `metadata`, `user` and the like are accepted and change nothing (nothing is kept: GET /v1/responses/{id} is
a 404). Errors of the chat mapping name the Responses field: `messages[k]...` becomes `input[i]...` (or
`instructions`), `max_tokens` becomes `max_output_tokens`.
"""
from __future__ import annotations

import contextlib
import re
import time
from typing import Any

from pydantic import ConfigDict, Field

from omni_frontend.chat_protocol import unsupported_parameter
from omni_frontend.errors import APIError, bad_request
from omni_frontend.validation import RequestModel, refuse_unsupported

# field -> (values that change nothing, why): anything else is a 400 naming the field
UNSUPPORTED_FIELDS: dict[str, tuple[tuple, str]] = {
    "previous_response_id": ((None,), "responses are not stored; send the conversation in `input`"),
    "conversation": ((None,), "conversations are not stored; send the conversation in `input`"),
    "background": ((None, False), "responses run in the foreground only"),
    "tools": ((None, []), "the served models do not call tools"),
    "tool_choice": ((None, "none", "auto"), "the served models do not call tools"),
    "max_tool_calls": ((None,), "the served models do not call tools"),
    "reasoning": ((None,), "no served model reasons"),
    "include": ((None, []), "no additional output data is produced"),
    "text.format": (({"type": "text"},), "structured outputs (json_object, json_schema) are not generated; only "
                                         "{\"type\": \"text\"}"),
    "text.verbosity": ((None,), "the served models take no verbosity setting"),
    "truncation": ((None, "disabled"), "the input is never truncated: one that does not fit is a 400"),
    "top_logprobs": ((None, 0), "log probabilities are not returned"),
    "prompt": ((None,), "stored prompts are not kept"),
    # chat completion fields, which the chat mapping would otherwise read (max_completion_tokens) or drop (messages,
    # overwritten by `input`): the Responses API spells them its own way or has no such field
    "messages": ((None,), "a response's conversation is `input` (with `instructions`)"),
    "max_tokens": ((None,), "a response's length limit is `max_output_tokens`"),
    "max_completion_tokens": ((None,), "a response's length limit is `max_output_tokens`"),
    "modalities": ((None, ["text"]), "responses are text only (spoken answers: /v1/chat/completions)"),
    "audio": ((None,), "responses are text only (spoken answers: /v1/chat/completions)"),
    "n": ((None, 1), "a response has one output message"),
}
INPUT_PARTS = {"input_text": "text", "output_text": "text", "input_audio": "input_audio", "input_image": "image_url"}
ROLES = ("user", "assistant", "system", "developer")


class ResponsesRequest(RequestModel):
    """The Responses fields this server reads; other fields go through the chat mapping as extension fields
    (extra_body), where the pipeline's own check refuses those it does not read."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    input: str | list[dict] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None


def _messages(req: ResponsesRequest) -> list[dict]:
    """Chat messages of `instructions` + `input` (content parts renamed to chat's). Raises APIError 400 naming
    `input[i]...` for an item or part this server cannot read."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    if isinstance(req.input, str):
        return messages + [{"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        if item.get("type", "message") != "message":
            raise bad_request(f"input item type {item.get('type')!r} is not supported (only messages: responses and "
                              "tool calls are not stored)", param=f"input[{i}].type", code="unsupported_content")
        if item.get("role") not in ROLES:
            raise bad_request(f"input[{i}].role must be one of {', '.join(ROLES)}", param=f"input[{i}].role")
        content = item.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in INPUT_PARTS:
                    raise bad_request(f"content part type {kind!r} is not supported by this server (supported: "
                                      f"{', '.join(INPUT_PARTS)})", param=f"input[{i}].content[{j}]",
                                      code="unsupported_content")
                parts.append(_image_part(part, f"input[{i}].content[{j}]") if kind == "input_image"
                             else {**part, "type": INPUT_PARTS[kind]})
            content = parts
        elif not isinstance(content, str):
            raise bad_request("content must be a string or a list of content parts", param=f"input[{i}].content")
        messages.append({"role": item["role"], "content": content})
    return messages


def _image_part(part: dict, param: str) -> dict:
    """An input_image part {"image_url": URL, "detail"} as chat's {"type": "image_url", "image_url": {"url"}}
    (`detail` has no effect). Raises APIError 400 naming `param.image_url` without a URL string (a `file_id`
    needs stored files, which this server does not keep)."""
    if not isinstance(part.get("image_url"), str):
        raise bad_request("input_image needs 'image_url': a data: URL or an http(s) URL (file_id is not supported: "
                          "files are not stored)", param=f"{param}.image_url")
    return {"type": "image_url", "image_url": {"url": part["image_url"]}}


def chat_body(req: ResponsesRequest) -> dict:
    """The /v1/chat/completions body that answers `req` (text out), its extension fields kept. Raises APIError 400
    for an unsupported field (UNSUPPORTED_FIELDS) or input item."""
    extra = dict(req.model_extra or {})
    refuse_unsupported(extra, UNSUPPORTED_FIELDS, unsupported_parameter)
    for name in {path.split(".")[0] for path in UNSUPPORTED_FIELDS} | {"stream_options"}:
        extra.pop(name, None)   # checked above; stream_options (include_obfuscation) changes nothing here
    return {**extra, "model": req.model, "messages": _messages(req), "modalities": ["text"],
            "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "stream": req.stream}


_CHAT_FIELDS = re.compile(r"\b(?:the messages hold|messages\[\d+\](?:\.\w+|\[\d+\])*|messages|max_tokens)\b")


@contextlib.contextmanager
def responses_params(req: ResponsesRequest):
    """An APIError raised inside (by the chat mapping or the pipeline) names the Responses fields, in its param and
    its message: `messages[k]...` is `instructions` or `input[i]...` (`...image_url.url` is `...image_url`),
    `messages` is `input`, `max_tokens` is `max_output_tokens`."""
    try:
        yield
    except APIError as exc:
        exc.message = _CHAT_FIELDS.sub(lambda m: "the input holds" if m.group(0) == "the messages hold"
                                       else _responses_field(req, m.group(0)), exc.message)
        if exc.param:
            exc.param = _responses_field(req, exc.param)
        raise


def _responses_field(req: ResponsesRequest, name: str) -> str:
    """The Responses field of the chat field `name` of `chat_body(req)` (`responses_params`); other names as they
    are."""
    if name == "max_tokens":
        return "max_output_tokens"
    if name == "messages":
        return "input"
    if not name.startswith("messages["):
        return name
    offset = 1 if req.instructions is not None else 0
    index, _, rest = name[len("messages["):].partition("]")
    k = int(index)
    if k < offset:
        return "instructions"
    if isinstance(req.input, str):
        return "input"
    # an input_image's URL is its `image_url` string, chat's `image_url.url`
    return f"input[{k - offset}]{rest.removesuffix('.image_url.url')}" + \
        (".image_url" if rest.endswith(".image_url.url") else "")


class ResponseObject:
    """Builds the `response` object of one request and its stream events (`event`: numbered in order)."""

    def __init__(self, req: ResponsesRequest, request_id: str):
        self.req, self.id, self.item_id = req, f"resp_{request_id}", f"msg_{request_id}"
        self.created_at = int(time.time())
        self.sequence = 0

    def item(self, text: str, status: str) -> dict:
        content = [] if status == "in_progress" else [self.part(text)]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def wire(self, status: str, text: str | None = None, usage: dict | None = None,
             error: APIError | None = None) -> dict:
        """The response object: `status` in_progress (no output yet), completed, incomplete (cut by
        max_output_tokens) or failed (`error`). usage: the chat pipeline's {prompt_tokens, completion_tokens, ...}."""
        req = self.req
        output = [] if text is None else [self.item(text, "incomplete" if status == "incomplete" else "completed")]
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None,
                "error": None if error is None else {"code": "server_error", "message": error.message},
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "metadata": req.metadata or {}, "model": req.model, "output": output,
                "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
                "previous_response_id": None, "reasoning": None, "store": False,
                "temperature": req.temperature, "top_p": req.top_p, "tool_choice": "auto", "tools": [],
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "background": False,
                "user": req.user, "usage": None if usage is None else _usage(usage)}

    def event(self, kind: str, **fields: Any) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def at(self, **fields: Any) -> dict:
        """The item / content coordinates of the one text part."""
        return {"item_id": self.item_id, "output_index": 0, **fields}


def _usage(usage: dict) -> dict:
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}
