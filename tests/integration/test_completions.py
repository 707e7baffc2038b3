"""vLLM's text routes beside chat: POST /v1/completions (the raw prompt, without the chat template), /tokenize and
/detokenize, on one server with the voice and qwen3_omni pipelines (stage layout, and the co-located model as
"colocated"), driven with the openai SDK and httpx, compared with transformers' own `generate` and tokenizers on the
same checkpoints."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from omni_backends.paths import QWEN3_OMNI_TINY, model_home
from tests.qwen3_omni_reference import answer_text

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
MAX_TOKENS = 12
VOICE_LLM = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(omni_chat_server):
    """voice, qwen3_omni and the co-located layout as "colocated" (tests/conftest.py)."""
    return omni_chat_server


@pytest.fixture(scope="module")
def checkpoints():
    """model -> (tokenizer, greedy(prompt ids, max_new_tokens) -> answer ids) of transformers on the checkpoint."""
    llm_dir, omni_dir = model_home() / VOICE_LLM, model_home() / QWEN3_OMNI_TINY
    llm = AutoModelForCausalLM.from_pretrained(llm_dir, dtype=torch.float32).eval()
    omni = Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir).eval()

    def greedy(model, eos):
        def run(ids: list[int], max_new_tokens: int) -> list[int]:
            x = torch.tensor([ids])
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=eos)
            return out[0, len(ids):].tolist()
        return run

    voice = (AutoTokenizer.from_pretrained(llm_dir), greedy(llm, llm.generation_config.eos_token_id))
    qwen = (AutoTokenizer.from_pretrained(omni_dir), greedy(omni.thinker, omni.config.im_end_token_id))
    return {"voice": voice, "qwen3_omni": qwen, "colocated": qwen}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("model", ["voice", "qwen3_omni", "colocated"])
def test_a_greedy_completion_is_transformers_generate_on_the_raw_prompt(server, checkpoints, model):
    """The text prompt and its token ids answer transformers' greedy `generate` of the prompt without the chat
    template; usage counts the tokenizer's prompt ids and the generated tokens."""
    tokenizer, greedy = checkpoints[model]
    ids = tokenizer(PROMPT)["input_ids"]
    expected = greedy(ids, MAX_TOKENS)
    client = _client(server)
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=MAX_TOKENS, temperature=0)
    for answer in (by_text, by_ids):
        assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
        assert [(c.index, c.text, c.finish_reason, c.logprobs) for c in answer.choices] == [
            (0, answer_text(tokenizer, expected), "length" if len(expected) == MAX_TOKENS else "stop", None)]
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
            len(ids), len(expected), len(ids) + len(expected))


def test_prompts_choices_stream_echo_and_stop(server, checkpoints):
    """Several prompts: one choice each, in prompt order, each the prompt's own greedy answer; the SSE chunks of each
    index concatenate to its text, the usage chunk sums both, and the stream ends with [DONE]; echo puts the prompt
    (token ids: their text) first; a stop string ends the text before it."""
    tokenizer, greedy = checkpoints["voice"]
    prompts = [PROMPT, "Once upon a time"]
    expected = [answer_text(tokenizer, greedy(tokenizer(p)["input_ids"], MAX_TOKENS)) for p in prompts]
    client = _client(server)
    both = client.completions.create(model="voice", prompt=prompts, max_tokens=MAX_TOKENS, temperature=0)
    assert [(c.index, c.text) for c in both.choices] == list(enumerate(expected))
    prompt_ids = sum(len(tokenizer(p)["input_ids"]) for p in prompts)
    assert (both.usage.prompt_tokens, both.usage.completion_tokens) == (prompt_ids, 2 * MAX_TOKENS)

    body = {"model": "voice", "prompt": prompts, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    texts, finished = ["", ""], {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finished[choice["index"]] = choice["finish_reason"]
    assert texts == expected and finished == {0: "length", 1: "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == both.usage.model_dump(exclude_none=True)

    echoed = client.completions.create(model="voice", prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == prompts[0] + expected[0]
    ids = tokenizer(prompts[1])["input_ids"]
    echoed = client.completions.create(model="voice", prompt=[ids], max_tokens=MAX_TOKENS, temperature=0, echo=True)
    assert echoed.choices[0].text == tokenizer.decode(ids) + expected[1]
    streamed = client.completions.create(model="voice", prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0,
                                         echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == prompts[0] + expected[0]

    stop = expected[0].strip()[-3:]
    cut = client.completions.create(model="voice", prompt=prompts[0], max_tokens=MAX_TOKENS, temperature=0, stop=stop)
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (expected[0][:expected[0].index(stop)], "stop")


@pytest.mark.parametrize("model", ["voice", "qwen3_omni", "colocated"])
def test_tokenize_is_the_checkpoint_tokenizer_and_detokenize_round_trips(server, checkpoints, model):
    tokenizer, _ = checkpoints[model]
    url = server.base_url
    ids = tokenizer(PROMPT)["input_ids"]
    answer = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": PROMPT}, timeout=60).json()
    assert (answer["tokens"], answer["count"]) == (ids, len(ids)) and answer["max_model_len"] > len(ids)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    for generation in (True, False):
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True,
                                             return_dict=True)["input_ids"]
        answer = httpx.post(f"{url}/tokenize", json={"model": model, "messages": messages,
                                                     "add_generation_prompt": generation}, timeout=60).json()
        assert (answer["tokens"], answer["count"]) == (list(chat), len(chat))
    answer = httpx.post(f"{url}/detokenize", json={"model": model, "tokens": ids}, timeout=60).json()
    assert answer == {"prompt": tokenizer.decode(ids)}


REFUSED = [
    ("/v1/completions", {"n": 2}, "n", "unsupported_parameter"),
    ("/v1/completions", {"suffix": "!"}, "suffix", "unsupported_parameter"),
    ("/v1/completions", {"logprobs": 1}, "logprobs", "unsupported_parameter"),
    ("/v1/completions", {"best_of": 2}, "best_of", "unsupported_parameter"),
    ("/v1/completions", {"logit_bias": {"1": 1.0}}, "logit_bias", "unsupported_parameter"),
    ("/v1/completions", {"messages": [{"role": "user", "content": "x"}]}, "messages", "unsupported_parameter"),
    ("/v1/completions", {"not_a_field": 1}, "not_a_field", "unsupported_parameter"),
    ("/v1/completions", {"prompt": [1, 10 ** 9]}, "prompt", "invalid_token_id"),
    ("/v1/completions", {"prompt": [[5], [10 ** 9]], "echo": True}, "prompt", "invalid_token_id"),
    ("/v1/completions", {"prompt": ""}, "prompt", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "prompt": "raw"}, "prompt",
     "unsupported_parameter"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens", "invalid_token_id"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}]},
     "messages[0].content[0]", "unsupported_content"),
]


@pytest.mark.parametrize("model", ["voice", "qwen3_omni"])
def test_refused_fields_are_400s_and_the_server_serves_on(server, model):
    """Each refused field or value is a 400 envelope naming it; the next request is served."""
    for path, fields, param, code in REFUSED:
        body = {"model": model, **({"prompt": "hi"} if path == "/v1/completions" else {}), **fields}
        response = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
        error = response.json()["error"]
        assert (response.status_code, error["param"], error["code"], error["type"]) == (
            400, param, code, "invalid_request_error"), (path, fields, error)
        ok = httpx.post(f"{server.base_url}/tokenize", json={"model": model, "prompt": "hi"}, timeout=60)
        assert ok.status_code == 200 and ok.json()["count"] >= 1
    with pytest.raises(openai.BadRequestError):
        _client(server).completions.create(model=model, prompt="hi", n=2)
    served = _client(server).completions.create(model=model, prompt="hi", max_tokens=2)
    assert served.choices[0].finish_reason in ("stop", "length") and 1 <= served.usage.completion_tokens <= 2
