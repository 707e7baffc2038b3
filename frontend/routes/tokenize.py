"""POST /tokenize and POST /detokenize (vLLM's server routes) for chat pipelines, by the pipeline's LLM tokenizer.

Answered by the pipeline's token control REQUESTs (omni_backends.serving.token_actions: {"action": "prompt_tokens",
..., "return_token_ids": true} and {"action": "detokenize"}), so the ids are those the pipeline's LLM prefills:
  /tokenize   {"model", "prompt": str, "add_special_tokens" (default true)} (a completion's prompt, no chat
              template) or {"model", "messages" (text only), "add_generation_prompt" (default true),
              "add_special_tokens" (default false)} (the chat template's ids)
              -> {"count", "max_model_len" (the LLM's context, tokens), "tokens": [int], "token_strs": null}
  /detokenize {"model", "tokens": [int]} -> {"prompt": str}
Errors: 400 naming the field (an input_audio or other non-text part, a token id outside the vocabulary, a prompt
longer than the context: `context_length_exceeded`; `model` for a pipeline that answers no token request).
"""
from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field

from omni_frontend import pipeline_stream
from omni_frontend.chat_protocol import Message
from omni_frontend.errors import APIError, bad_request
from omni_frontend.pipelines import CHAT, Pipeline
from omni_frontend.routes.common import pipeline_for, triton
from omni_frontend.validation import RequestModel

router = APIRouter()


class TokenizeRequest(RequestModel):
    """vLLM's TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest (`messages`): exactly one of them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = Field(default=None, description="default: true for a prompt, false for messages")


class DetokenizeRequest(RequestModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[int]


def _text_messages(messages: list[Message]) -> list[dict]:
    """The pipeline REQUEST's messages of text-only chat messages (developer is system). Raises APIError 400 naming
    a tool message or a part that is not text."""
    out = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            raise bad_request("tool messages are not supported", param=f"messages[{i}].role")
        content = message.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad_request("only text is tokenized: content parts must be {\"type\": \"text\", \"text\"}",
                                      param=f"messages[{i}].content[{j}]", code="unsupported_content")
            content = [{"type": "text", "text": part["text"]} for part in content]
        out.append({"role": "system" if message.role == "developer" else message.role, "content": content or ""})
    return out


def not_tokenizing(pipeline: Pipeline, route: str) -> APIError:
    """The 400 (param "model", code `model_not_supported`) for a chat pipeline that answers no token control
    REQUEST (one that is not an LLM pipeline of this repository, e.g. a test model)."""
    return APIError(400, f"model '{pipeline.name}' does not serve {route}: its pipeline has no tokenizer to ask",
                    param="model", code="model_not_supported")


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request):
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send either prompt (text) or messages", param="prompt" if req.prompt is None else "messages")
    pipeline = pipeline_for(request, req.model, CHAT, "tokenize")
    options = {"add_special_tokens": req.add_special_tokens, "return_token_ids": True}
    if req.prompt is not None:
        options["prompt"] = req.prompt
    else:
        options["add_generation_prompt"] = req.add_generation_prompt
    messages = None if req.messages is None else _text_messages(req.messages)
    answer = await pipeline_stream.prompt_tokens(triton(request), pipeline.entry, request.state.request_id, messages,
                                                 1, **options)
    if answer is None or "token_ids" not in answer:
        raise not_tokenizing(pipeline, "tokenize")
    return {"count": answer["prompt_tokens"], "max_model_len": answer["context_length"], "tokens": answer["token_ids"],
            "token_strs": None}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request):
    pipeline = pipeline_for(request, req.model, CHAT, "detokenize")
    answer = await pipeline_stream.detokenize(triton(request), pipeline.entry, request.state.request_id, req.tokens)
    if answer is None:
        raise not_tokenizing(pipeline, "detokenize")
    return {"prompt": answer["text"]}
