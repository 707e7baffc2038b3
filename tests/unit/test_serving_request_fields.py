"""The REQUEST field check of the client-facing pipeline models lives in one place: AsyncDecoupledModel
(omni_backends.serving.decoupled) checks every REQUEST but {"action": "fields"} and the model's `control_actions`
against the model's `request_fields` before the model's handler runs; the handlers no longer check it themselves.

Tested on the models' own classes (their `request_fields`, `field_hints`, `control_actions`) with the handler
replaced by a recorder; Triton's `triton_python_backend_utils` (importable only inside a stub process, and unused by
the check) is a stand-in module."""
import asyncio
import importlib
import sys
import types

import pytest

from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.serving import turn as omni_turn
from omni_backends.voice import protocol as voice_protocol

pytestmark = pytest.mark.unit

IMAGE_HINT = "it is the embedded guidance of guidance-distilled checkpoints"
# module, model name, the fields it reads, whether it answers {"action": "voices"}
MODELS = [
    ("omni_backends.voice.serving.voice_model", "voice", voice_protocol.REQUEST_FIELDS, True),
    ("omni_backends.voice.serving.speech_model", "tts", ("input", "voice", "speed"), True),
    ("omni_backends.qwen3_omni.serving.omni_model", "qwen3_omni", omni_turn.REQUEST_FIELDS, True),
    ("omni_backends.qwen3_omni.serving.colocated_model", "qwen3_omni_colocated", omni_turn.REQUEST_FIELDS, True),
    ("omni_backends.qwen_image.serving.image_model", "qwen_image",
     ("task", "prompt", "negative_prompt", "n", "width", "height", "num_inference_steps", "true_cfg_scale", "seed",
      "partial_images"), False),
]


class _Context:
    def __init__(self, body: dict):
        self._body = body

    def body(self) -> dict:
        return dict(self._body)


@pytest.fixture
def load_model(monkeypatch):
    """load_model(module, name) -> an instance of the module's TritonPythonModel named `name`, not initialized,
    whose handler records the bodies it is called with (`model.handled`) and yields one event."""
    stub = types.ModuleType("triton_python_backend_utils")
    stub.__getattr__ = lambda name: 0   # module-level constants the adapters read at import
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    before = set(sys.modules)

    def load(module: str, name: str):
        cls = importlib.import_module(module).TritonPythonModel
        model = cls.__new__(cls)
        model.model_name, model.handled = name, []

        async def handle(ctx):
            model.handled.append(ctx.body())
            yield {"type": "handled"}, None

        model.handle = handle
        return model

    yield load
    for name in set(sys.modules) - before:   # the Triton adapters imported with the stand-in
        if name.startswith("omni_backends.") and ".serving" in name:
            del sys.modules[name]


def _answer(model, body: dict) -> list[dict]:
    async def collect():
        return [event async for event, _ in model._answer(_Context(body))]

    return asyncio.run(collect())


@pytest.mark.parametrize("module, name, fields, speaks", MODELS, ids=[m[1] for m in MODELS])
def test_each_pipeline_refuses_a_field_it_does_not_read_before_its_handler_runs(load_model, module, name, fields,
                                                                                  speaks):
    model = load_model(module, name)
    assert sorted(model.request_fields) == sorted(fields)
    with pytest.raises(RequestError) as info:   # the first unknown key in sorted order
        _answer(model, {"zzz": 2, "bogus_field": 1, **{f: 1 for f in fields}})
    error = info.value
    assert (error.status, error.param, error.code) == (400, "bogus_field", "unsupported_parameter")
    assert error.message == f"bogus_field is not a request field of model {name} (its fields: {', '.join(sorted(fields))})"
    assert model.handled == []
    # a null key is an absent one; every field the model reads is accepted
    assert _answer(model, {"bogus_field": None, **{f: 1 for f in fields}}) == [{"type": "handled"}]
    # {"action": "fields"} is answered from the same list, whatever else the REQUEST holds
    assert _answer(model, {"action": "fields", "bogus_field": 1}) == [
        {"type": "fields", "fields": sorted(fields), "hints": model.field_hints}]
    # another action is a field like any other: refused unless the model answers it itself (voices)
    with pytest.raises(RequestError) as info:
        _answer(model, {"action": "describe"})
    assert (info.value.param, info.value.code) == ("action", "unsupported_parameter")
    voices = {"action": "voices", "voice": "alloy", "bogus_field": 1}
    if speaks:
        assert _answer(model, voices) == [{"type": "handled"}] and model.handled[-1] == voices
    else:
        with pytest.raises(RequestError) as info:
            _answer(model, voices)
        assert (info.value.param, info.value.code) == ("action", "unsupported_parameter")


def test_the_image_pipeline_refusal_carries_its_hint(load_model):
    model = load_model("omni_backends.qwen_image.serving.image_model", "qwen_image_edit")
    with pytest.raises(RequestError) as info:
        _answer(model, {"prompt": "x", "guidance_scale": 7.5})
    assert info.value.message.startswith(f"guidance_scale is not a request field of model qwen_image_edit: {IMAGE_HINT}")
    assert info.value.message.endswith(" (its fields: height, n, negative_prompt, num_inference_steps, partial_images, "
                                       "prompt, seed, task, true_cfg_scale, width)")
