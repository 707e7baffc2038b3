"""POST /v1/responses (OpenAI's Responses API) through the `openai` SDK: the same answer as the chat completion it
maps to, its stream events, a cut answer, and the fields it refuses (a 400 naming them)."""
from __future__ import annotations

import httpx
import openai
import pytest

QUESTION = "What is the capital of France?"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_response_is_the_greedy_chat_completion_of_its_input(voice_server):
    """Greedy, the Responses answer has the chat completion's text and token counts (input as a string, then as
    messages with instructions, streamed); the stream's deltas add up to the final text, numbered from 0."""
    client = _client(voice_server)
    chat = client.chat.completions.create(model="voice", messages=[{"role": "user", "content": QUESTION}],
                                          modalities=["text"], temperature=0, max_tokens=20)
    answer = client.responses.create(model="voice", input=QUESTION, temperature=0, max_output_tokens=20,
                                     metadata={"k": "v"})
    assert "Paris" in chat.choices[0].message.content
    assert (answer.status, answer.output_text, answer.metadata) == ("completed", chat.choices[0].message.content, {"k": "v"})
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.usage.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)
    assert answer.id.startswith("resp_") and answer.output[0].role == "assistant"

    system = "You are a helpful assistant."
    chat = client.chat.completions.create(model="voice", modalities=["text"], temperature=0, max_tokens=20,
                                          messages=[{"role": "system", "content": system},
                                                    {"role": "user", "content": QUESTION}])
    with client.responses.stream(model="voice", instructions=system, temperature=0, max_output_tokens=20,
                                 input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == chat.choices[0].message.content and final.instructions == system
    assert final.usage.output_tokens == chat.usage.completion_tokens


def test_a_response_cut_by_max_output_tokens_is_incomplete(voice_server):
    """Non-streamed and streamed: status incomplete, incomplete_details.reason max_output_tokens, the tokens
    counted; the stream ends with response.incomplete."""
    client = _client(voice_server)
    cut = client.responses.create(model="voice", input=QUESTION, temperature=0, max_output_tokens=3)
    assert (cut.status, cut.incomplete_details.reason, cut.usage.output_tokens) == ("incomplete", "max_output_tokens", 3)
    assert cut.output[0].status == "incomplete" and cut.output_text
    events = list(client.responses.create(model="voice", input=QUESTION, temperature=0, max_output_tokens=3,
                                          stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == cut.output_text


@pytest.mark.parametrize("fields, param, code", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools", "unsupported_parameter"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    # thirteenth outside test: chat completion fields were read (max_completion_tokens cut the answer) or dropped
    ({"max_completion_tokens": 3}, "max_completion_tokens", "unsupported_parameter"),
    ({"max_tokens": 3}, "max_tokens", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}]}, "messages", "unsupported_parameter"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
    ({"n": 2}, "n", "unsupported_parameter"),
    ({"input": []}, "input", "invalid_value"),
    # the mock pipeline takes no images (qwen3_omni does: tests/integration/test_qwen3_omni_images.py)
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type",
     "unsupported_content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0].image_url",
     None),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].type",
     "unsupported_content"),
    ({"input": [{"role": "bot", "content": "x"}]}, "input[0].role", None),
    ({"input": [{"role": "assistant", "content": "x"}]}, "input", None),   # no user message
    ({"instructions": "x" * 140_000}, "instructions", "text_too_long"),   # over --max-text-chars
    ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]}]},
     "input[0].content[0].input_audio", "invalid_audio"),
])
def test_unsupported_fields_and_bad_input_are_a_400_naming_the_responses_field(mock_server, fields, param, code):
    body = {"model": "mock", "input": "hi", **fields}
    refused = httpx.post(f"{mock_server.base_url}/v1/responses", json=body, timeout=30)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error", error
    assert code is None or error["code"] == code, error


def test_inert_fields_are_accepted_on_the_mock_pipeline(mock_server):
    """store, user, tool_choice auto, include [], stream_options and a text format of text change nothing."""
    answer = httpx.post(f"{mock_server.base_url}/v1/responses", timeout=30, json={
        "model": "mock", "input": "hi", "store": True, "user": "u", "tool_choice": "auto", "include": [],
        "stream_options": {"include_obfuscation": False}, "text": {"format": {"type": "text"}}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"][0]["content"][0]["text"] == "tok0tok1tok2"
