"""/v1/responses errors speak of the Responses fields: the pipeline's context-length refusals (the engine's own
messages) name `input` and `max_output_tokens` in their message as in their param."""
import pytest

from omni_backends.engine.limits import check_prompt_chars
from omni_backends.engine.sampling import check_context_length
from omni_backends.errors import RequestError
from omni_frontend.errors import APIError
from omni_frontend.responses_protocol import ResponsesRequest, responses_params

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("refuse, message, param", [
    (lambda: check_prompt_chars(2, 1000, 128, 4),
     "the input holds 2 characters: at least 1 tokens, which with max_output_tokens (1000) exceeds the context "
     "length 128", "max_output_tokens"),
    (lambda: check_context_length(200, 16, 128),
     "prompt (200 tokens) plus max_output_tokens (16) exceeds the context length 128", "input"),
])
def test_context_errors_name_the_responses_fields(refuse, message, param):
    with pytest.raises(RequestError) as engine:
        refuse()
    with pytest.raises(APIError) as info, responses_params(ResponsesRequest(model="qwen3_omni", input="hi")):
        raise APIError(400, engine.value.message, param=engine.value.param, code=engine.value.code)
    assert (info.value.message, info.value.param, info.value.code) == (message, param, "context_length_exceeded")
    assert info.value.body()["error"]["message"] == message


def test_a_message_quoting_a_chat_message_names_its_responses_item():
    req = ResponsesRequest(model="qwen3_omni", instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                     {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    with pytest.raises(APIError) as info, responses_params(req):
        raise APIError(400, "messages[1].content[1].image_url.url: no image; messages[0].content is text",
                       param="messages[1].content[1].image_url.url")
    assert info.value.message == "input[0].content[1].image_url: no image; instructions is text"
    assert info.value.param == "input[0].content[1].image_url"
