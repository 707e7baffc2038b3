"""POST /v1/completions request validation and its pipeline REQUESTs (omni_frontend.completions_protocol), and the
backends' check of a completion's `prompt` and the token control REQUESTs (omni_backends.chat_request,
omni_backends.serving.token_actions) with the real checkpoint tokenizers (no server)."""
import pydantic
import pytest
from transformers import AutoTokenizer

from omni_backends.chat_request import check_request
from omni_backends.engine.limits import longest_token_chars
from omni_backends.errors import RequestError
from omni_backends.paths import QWEN3_OMNI_TINY, model_home
from omni_backends.qwen3_omni.serving import turn as omni_turn
from omni_backends.serving import token_actions
from omni_frontend.chat_protocol import ROUTED_KEYS
from omni_frontend.completions_protocol import CompletionRequest, prompts, to_pipeline
from omni_frontend.config import RequestLimits
from omni_frontend.errors import APIError

pytestmark = pytest.mark.unit


def test_one_pipeline_request_per_prompt_with_the_raw_prompt_and_text_out():
    req = CompletionRequest(model="voice", prompt=["a", "bc"], max_tokens=5, stop="\n", seed=3, temperature=0,
                            first_chunk_words=2, user="u")
    bodies = to_pipeline(req)
    assert [b["prompt"] for b in bodies] == ["a", "bc"]
    assert all("messages" not in b for b in bodies)
    assert bodies[0] | {"prompt": None} == bodies[1] | {"prompt": None}
    assert (bodies[0]["modalities"], bodies[0]["max_tokens"], bodies[0]["stop"], bodies[0]["seed"],
            bodies[0]["first_chunk_words"]) == (["text"], 5, ["\n"], 3, 2)
    assert "user" not in bodies[0]
    assert CompletionRequest(model="m", prompt="x").max_tokens == 16   # OpenAI's default
    assert CompletionRequest(model="m", prompt="x", max_tokens=None).max_tokens == 16


@pytest.mark.parametrize("prompt, expected", [
    ("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]), ([[1], [2, 3]], [[1], [2, 3]])])
def test_every_prompt_shape_gives_its_prompts(prompt, expected):
    assert prompts(CompletionRequest(model="m", prompt=prompt)) == expected


@pytest.mark.parametrize("fields, param, code", [
    ({"n": 2}, "n", "unsupported_parameter"), ({"best_of": 2}, "best_of", "unsupported_parameter"),
    ({"suffix": "x"}, "suffix", "unsupported_parameter"), ({"logprobs": 0}, "logprobs", "unsupported_parameter"),
    ({"logit_bias": {"1": 5.0}}, "logit_bias", "unsupported_parameter"),
    ({"tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "unsupported_parameter"),
    ({"prompt": []}, "prompt", None), ({"prompt": ["x"] * 33}, "prompt", None),
    ({"prompt": "x" * 11}, "prompt", "text_too_long"), ({"stop": ["s"] * 17}, "stop", None),
    ({"prompt": [[1, 2], [3]]}, "prompt", "text_too_long"),   # token ids count 4 characters each: 12 > 10
])
def test_refused_fields_are_400s_naming_them(fields, param, code):
    req = CompletionRequest(**{"model": "m", "prompt": "x", **fields})
    with pytest.raises(APIError) as err:
        to_pipeline(req, RequestLimits(max_text_chars=10))
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


@pytest.mark.parametrize("fields", [{"prompt": 5}, {"prompt": [1, "a"]}, {"prompt": [True]}, {"max_tokens": 0},
                                    {"echo": "yes"}, {"max_tokens": "3"}])
def test_wrong_types_fail_validation(fields):
    with pytest.raises(pydantic.ValidationError):
        CompletionRequest(**{"model": "m", "prompt": "x", **fields})


def test_the_inert_values_of_refused_fields_pass():
    to_pipeline(CompletionRequest(model="m", prompt="x", n=1, best_of=1, logit_bias={}, suffix=None, logprobs=None))


def test_chat_routes_set_prompt_themselves():
    """A chat's extension `prompt` would bypass the chat template: it is a routed key (refused as unread)."""
    assert "prompt" in ROUTED_KEYS


@pytest.mark.parametrize("body, param", [
    ({"prompt": 5}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": [1, 2.0]}, "prompt"), ({"prompt": [False]}, "prompt"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
])
def test_the_backends_refuse_a_bad_prompt_naming_it(body, param):
    with pytest.raises(RequestError) as err:
        check_request(body)
    assert err.value.param == param


def test_the_backends_accept_a_prompt_instead_of_messages():
    check_request({"prompt": "hi", "max_tokens": 3})
    check_request({"prompt": [1, 2]}, parts=False)
    assert omni_turn.validate({"prompt": [1, 2], "modalities": ["text"]}, ["ethan"], "ethan") == (["text"], None)
    with pytest.raises(RequestError) as err:   # the talker's prompt needs the chat template's turns
        omni_turn.validate({"prompt": "hi"}, ["ethan"], "ethan")
    assert err.value.param == "modalities"


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", QWEN3_OMNI_TINY])
def tokenizer(request):
    path = model_home() / request.param
    if not path.is_dir():
        pytest.skip(f"{path} is not prepared")
    return AutoTokenizer.from_pretrained(path)


def _answer(tokenizer, body, max_tokens=16, context=2048):
    def template(messages, generation):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
    return token_actions.answer(body, tokenizer, template, max_tokens, context, longest_token_chars(tokenizer))


def test_completion_ids_are_the_tokenizers_without_template(tokenizer):
    ids = tokenizer("The capital of France is")["input_ids"]
    longest = longest_token_chars(tokenizer)
    assert token_actions.completion_ids(tokenizer, "The capital of France is", 16, 2048, longest) == ids
    assert token_actions.completion_ids(tokenizer, ids, 16, 2048, longest) == ids
    for prompt, param, code in (([len(tokenizer)], "prompt", "invalid_token_id"), ("", "prompt", None),
                                (ids * 500, "prompt", "context_length_exceeded"),
                                (ids, "max_tokens", "context_length_exceeded")):
        with pytest.raises(RequestError) as err:
            token_actions.completion_ids(tokenizer, prompt, 2048 if param == "max_tokens" else 1, 2048, longest)
        assert (err.value.param, err.value.code) == (param, code)


def test_token_actions_answer_the_tokenizers_ids_and_text(tokenizer):
    messages = [{"role": "user", "content": "Hi there"}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    answer = _answer(tokenizer, {"action": "prompt_tokens", "messages": messages, "return_token_ids": True})
    assert answer == {"type": "prompt_tokens", "prompt_tokens": len(chat["input_ids"]), "context_length": 2048,
                      "token_ids": list(chat["input_ids"])}
    bare = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=True, return_dict=True)
    assert _answer(tokenizer, {"action": "prompt_tokens", "messages": messages, "add_generation_prompt": False,
                               "return_token_ids": True})["token_ids"] == list(bare["input_ids"])
    ids = tokenizer("Hello world")["input_ids"]
    assert _answer(tokenizer, {"action": "prompt_tokens", "prompt": "Hello world"}) == {
        "type": "prompt_tokens", "prompt_tokens": len(ids), "context_length": 2048}
    assert _answer(tokenizer, {"action": "detokenize", "tokens": ids}) == {"type": "detokenized",
                                                                          "text": tokenizer.decode(ids)}
    assert _answer(tokenizer, {"action": "voices"}) is None
    for body, param in (({"action": "detokenize", "tokens": [len(tokenizer)]}, "tokens"),
                        ({"action": "detokenize", "tokens": "1"}, "tokens"),
                        ({"action": "prompt_tokens", "messages": [{"role": "user", "content": [
                            {"type": "input_audio", "samples": 5}]}]}, "messages[0].content[0]"),
                        ({"action": "prompt_tokens", "prompt": "x", "return_token_ids": "yes"}, "return_token_ids")):
        with pytest.raises(RequestError) as err:
            _answer(tokenizer, body)
        assert err.value.param == param
