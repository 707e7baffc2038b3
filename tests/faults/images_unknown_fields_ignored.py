"""`/v1/images/generations` silently ignores fields it does not know, including ones that change the image,
while `/v1/videos` refuses the same with 400 ("style: Extra inputs are not permitted").

Probes (each otherwise valid, tiny and fast):
- `style: "natural"`: OpenAI's dall-e-3 field (vivid/natural), an alias of this pipeline (`dall-e-3`);
- `guidance_scale: 7.5`: the usual diffusers name; this pipeline's knob is `true_cfg_scale`;
- `num_inference_step: 50`: a typo of the documented extension `num_inference_steps` (the default 20 runs).
Expected: 400 naming the field (docs/reliability.md: a field that changes the contract of the answer is
"never silently dropped"; the videos route does this for unknown fields). Observed: 200, field dropped
(the unknown keys travel to the qwen_image model as REQUEST extensions and are never read).

Exit 1 while any probe gets 200, 0 when all are 4xx. Env: BASE_URL (default http://127.0.0.1:21000).
"""
import os
import sys

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
BASE_BODY = {"model": "qwen_image", "prompt": "a red cube", "size": "16x16", "num_inference_steps": 1, "seed": 1}
PROBES = {"style": {"style": "natural"}, "guidance_scale": {"guidance_scale": 7.5},
          "num_inference_step (typo)": {"num_inference_step": 50}}


def main() -> int:
    bad = 0
    with httpx.Client(timeout=120) as client:
        for name, extra in PROBES.items():
            body = {**BASE_BODY, **extra}
            if name.startswith("num_inference_step "):
                body.pop("num_inference_steps")
            r = client.post(BASE + "/v1/images/generations", json=body)
            refused = 400 <= r.status_code < 500
            bad += not refused
            shown = r.text[:140] if refused else f"image returned, size {r.json().get('size')}"
            print(f"{'ok ' if refused else 'BAD'} {name}: {r.status_code} {shown}")
        r = client.post(BASE + "/v1/videos", json={"model": "wan", "prompt": "a cat", "size": "32x32", "style": "x"})
        print(f"for comparison, /v1/videos with style: {r.status_code} {r.text[:120]}")
    print("expected: 400 naming each unknown field")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
