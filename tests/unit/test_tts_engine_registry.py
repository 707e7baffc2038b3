"""`--tts-engine` in the pipeline registry (frontend.pipelines.with_tts_engine): the model ids and the GET
/v1/models descriptions of the pipelines that speak name the engine that speaks, the others are unchanged."""
from __future__ import annotations

import pytest

from omni_frontend import pipelines as registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("engine, speaks, silent", [("piper", "Piper (en_US joe)", "kokoro"),
                                                    ("kokoro", "Kokoro-82M", "piper")])
def test_served_pipelines_name_the_engine_that_speaks(engine, speaks, silent):
    served = {p.name: p for p in registry.with_tts_engine(registry.resolve(["voice", "tts", "asr"]), engine)}
    assert served["tts"].aliases == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", engine)
    assert served["tts"].description == f"{speaks} text-to-speech"
    assert served["voice"].description == (f"Whisper tiny.en -> SmolLM2-135M-Instruct -> {speaks}, text and speech "
                                            "out; /v1/realtime with Silero VAD")
    assert all(silent not in p.description.lower() and silent not in p.aliases for p in served.values())
    assert served["asr"] == registry.REGISTRY["asr"]
