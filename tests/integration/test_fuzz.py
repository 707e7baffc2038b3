"""Schemathesis against the frontend's own /openapi.json: every operation gets generated valid and
invalid requests; none may answer 5xx. Runs on the mock server, whose chat, speech and transcription
pipelines are framework test models, so fuzzed requests that pass validation go through Triton and
back (audio encoding included) without model work."""
from __future__ import annotations

import collections

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

pytestmark = pytest.mark.integration

EXAMPLES = 15   # per operation and generation mode (27 operations: ~810 requests)
# Valid requests name a loaded pipeline for their route half of the time, so they reach Triton.
LOADED = {"/v1/chat/completions": "mock", "/v1/chat/completions/batch": "mock", "/v1/audio/speech": "mock-speech",
          "/v1/audio/speech/batch": "mock-speech",
          "/v1/audio/transcriptions": "mock-asr", "/v1/completions": "mock", "/tokenize": "mock", "/detokenize": "mock"}


def test_openapi_fuzzing_finds_no_server_error(mock_server):
    schema = schemathesis.openapi.from_url(f"{mock_server.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {*LOADED, "/v1/audio/voices", "/v1/models/{model_id}", "/health"}
    sent: collections.Counter = collections.Counter()
    failures: list[str] = []

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            def fuzz(case):
                if (mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and operation.path in LOADED
                        and sent[operation.path] % 2):
                    case.body["model"] = LOADED[operation.path]
                response = case.call(base_url=mock_server.base_url, timeout=60)
                sent[operation.path] += 1
                sent["status " + str(response.status_code // 100) + "xx"] += 1
                if response.status_code >= 500:
                    failures.append(f"{response.status_code} {case.method} {case.path} "
                                    f"{str(case.body)[:300]!r}: {response.text[:300]}")

            try:
                fuzz()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE   # an operation without inputs has no invalid request

    total = sum(v for k, v in sent.items() if k.startswith("/"))
    print(f"\nschemathesis: {total} requests over {len(operations)} operations, by status class "
          f"{ {k: v for k, v in sent.items() if k.startswith('status')} }; 5xx: {len(failures)}")
    assert not failures, "\n".join(failures)
    assert sent["status 2xx"] > 0 and sent["status 4xx"] > 0
