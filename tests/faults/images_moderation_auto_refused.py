"""Server B. /v1/images/generations refuses OpenAI's `moderation` field even at its default, inert value "auto"
(400 unsupported_parameter), and the message lists the pipeline's internal REQUEST keys (`task`, `width`,
`height`) as "its fields" — names that are not this route's request fields (the route takes `size`).

Steps: client.images.generate(model="qwen_image", prompt="a red cube", size="64x64", moderation="auto",
extra_body={"num_inference_steps": 1}).
Expected: a field at the value that changes nothing is accepted, as chat accepts tool_choice "none", logprobs false,
response_format {"type": "text"} (frontend/chat_protocol.py UNSUPPORTED_FIELDS "inert" values) and realtime accepts
tool_choice "auto" / truncation "auto"; OpenAI's ImageGenerateParams.moderation defaults to "auto". Any error should
name the route's fields.
Actual: 400 "moderation is not a request field of model qwen_image (its fields: height, n, negative_prompt, ...,
task, true_cfg_scale, width)".
"""
import os, sys
import openai

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
c = openai.OpenAI(base_url=B + "/v1", api_key="x", max_retries=0, timeout=300)
try:
    r = c.images.generate(model="qwen_image", prompt="a red cube", size="64x64", moderation="auto",
                          extra_body={"num_inference_steps": 1})
except openai.BadRequestError as exc:
    print("FAULT: moderation='auto' refused:", exc.body); sys.exit(1)
print("fixed:", r.size); sys.exit(0)
