"""The voice, tts and asr pipelines served by tritonserver with the real default models, driven by real
clients (openai SDK, httpx, tritonclient gRPC)."""
from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from omni_backends.voice.audio import resample
from tests.sentences import ROUND_TRIP, word_error_rate
from tests.harness import (ROOT, cancel_storm, inflight, metric_value, settle_limit_s, settle_time, start_server,
                           stub_processes, triton_stream_error, wait_for)

pytestmark = pytest.mark.integration
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(voice_server):
    return openai.OpenAI(base_url=f"{voice_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def piper_server(tmp_path_factory):
    """`--pipelines tts --tts-engine piper` with an empty model home (Piper needs no prepared checkpoint) and its own
    TMPDIR (`_run_copies`); test_repeated_signals_do_not_cut_the_shutdown_short, its last user, stops it."""
    tmp = tmp_path_factory.mktemp("piper_server")
    (tmp / "tmp").mkdir()
    server = start_server(tmp, "--pipelines", "tts", "--tts-engine", "piper", "--no-prepare", ready_timeout_s=120,
                          env={"TMPDIR": str(tmp / "tmp"), "OMNI_MODEL_HOME": str(tmp / "models")})
    yield server
    server.stop()


def _run_copies(server) -> list:
    """The launcher's `--tts-engine` run copies of the repository in the piper_server's TMPDIR."""
    return [p for p in (server.log_path.parent / "tmp").iterdir() if p.name.startswith("omni-triton-repository-")]


def _asr_grpc(server, pcm16k: np.ndarray, **options) -> dict:
    """voice_asr through Triton's own gRPC client (the stage's tensor contract)."""
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        audio = grpcclient.InferInput("AUDIO", [1, pcm16k.size], "FP32")
        audio.set_data_from_numpy(pcm16k[None, :].astype(np.float32))
        opts = grpcclient.InferInput("OPTIONS", [1, 1], "BYTES")
        opts.set_data_from_numpy(np.array([[json.dumps(options).encode()]], dtype=np.object_))
        result = triton.infer("voice_asr", [audio, opts])
    return json.loads(result.as_numpy("RESULT").reshape(-1)[0])


def _wav(data: bytes) -> tuple[np.ndarray, int]:
    pcm, rate = sf.read(io.BytesIO(data), dtype="float32")
    return pcm, rate


def test_chat_answers_in_text_and_speech(voice_server, client):
    reply = client.chat.completions.create(model="voice", messages=[{"role": "user", "content": QUESTION}],
                                           modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
                                           temperature=0)
    text = reply.choices[0].message.content
    assert "Paris" in text and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    pcm, rate = _wav(base64.b64decode(reply.choices[0].message.audio.data))
    assert rate == 24000 and len(pcm) / rate > 1.0
    heard = _asr_grpc(voice_server, resample(pcm, rate, 16000))
    assert "paris" in heard["text"].lower()


def test_streamed_chat_sends_text_before_the_first_audio(client):
    start, first_text, first_audio, audio_chunks = time.perf_counter(), None, None, 0
    stream = client.chat.completions.create(model="voice", messages=[{"role": "user", "content": "Tell me about Paris."}],
                                            modalities=["text", "audio"], audio={"voice": "jf_alpha", "format": "pcm16"},
                                            max_tokens=60, temperature=0, stream=True)
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta and delta.content and first_text is None:
            first_text = time.perf_counter() - start
        audio = getattr(delta, "audio", None) if delta else None
        if audio:
            audio_chunks += 1
            first_audio = first_audio or time.perf_counter() - start
    print(f"\nstreamed voice chat: first text {first_text:.2f} s, first audio {first_audio:.2f} s, {audio_chunks} chunks")
    assert first_text is not None and first_audio is not None and first_text < first_audio
    assert audio_chunks >= 2  # sentence-chunked speech, not one clip at the end


EMOJI = [{"role": "user", "content": "Reply with only this emoji: 👍"}]   # SmolLM2 answers "👍👍👍..." greedily


def test_an_emoji_answer_cut_inside_a_character_drops_it_and_has_a_silent_clip(client):
    """SmolLM2 spells "👍" in 3 byte-level tokens. max_tokens 5 cuts the answer inside its second one: the text ends
    before it (it ended in U+FFFD, the decode of the partial tokens), completion_tokens counts all 5. The answer
    "👍" is nothing the voice can say (no word): its audio is 10 ms of silence whose transcript is the text (was
    `message.audio` null); streamed, one delta.audio carries that silence and transcript. With max_tokens 2 the
    answer has no text, and still its silent clip."""
    audio = {"voice": "jf_alpha", "format": "wav"}
    reply = client.chat.completions.create(model="voice", messages=EMOJI, modalities=["text", "audio"], audio=audio,
                                           max_tokens=5, temperature=0)
    message = reply.choices[0].message
    assert message.content == "👍" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
    assert rate == 24000 and pcm.shape == (240,) and not pcm.any() and message.audio.transcript == "👍"

    stream = client.chat.completions.create(model="voice", messages=EMOJI, modalities=["text", "audio"],
                                            audio={"voice": "jf_alpha", "format": "pcm16"}, max_tokens=5,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    text, transcripts, data, usage = [], [], b"", None
    for chunk in stream:
        usage = chunk.usage or usage
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta and delta.content:
            text.append(delta.content)
        if delta and getattr(delta, "audio", None):
            transcripts.append(delta.audio.transcript)
            data += base64.b64decode(delta.audio.data or "")
    assert "".join(text) == "👍" and not any("\ufffd" in t for t in text) and usage.completion_tokens == 5
    assert transcripts == ["👍"] and data == bytes(480)   # 240 samples of PCM16 silence

    reply = client.chat.completions.create(model="voice", messages=EMOJI, modalities=["text", "audio"], audio=audio,
                                           max_tokens=2, temperature=0)
    message = reply.choices[0].message
    assert message.content == "" and reply.usage.completion_tokens == 2 and message.audio.transcript == ""
    assert sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")[0].shape == (240,)


def test_spoken_question_is_transcribed_and_answered(client):
    question = client.audio.speech.create(model="tts-1", voice="jf_alpha", input=QUESTION, response_format="wav")
    reply = client.chat.completions.create(
        model="voice", modalities=["text"], temperature=0,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(question.content).decode(), "format": "wav"}}]}])
    assert "Paris" in reply.choices[0].message.content and reply.choices[0].message.audio is None


def test_speech_route_voices_and_speed(voice_server, client):
    text = "The weather is sunny and warm today."
    normal, rate = _wav(client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav").content)
    fast, _ = _wav(client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav",
                                              speed=2.0).content)
    assert rate == 24000 and len(fast) < 0.7 * len(normal)
    assert "sunny" in _asr_grpc(voice_server, resample(normal, rate, 16000))["text"].lower()
    voices = httpx.get(f"{voice_server.base_url}/v1/audio/voices").json()
    kokoro = {"jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"}
    for model in ("tts", "voice"):   # chat pipelines that speak list the voices their audio.voice takes
        assert {v["id"] for v in voices["voices"] if v["model"] == model} == kokoro
    assert voices["default"] == {"voice": "jf_alpha", "tts": "jf_alpha"}
    only_chat = httpx.get(f"{voice_server.base_url}/v1/audio/voices", params={"model": "voice"}).json()
    assert only_chat["default"] == {"voice": "jf_alpha"} and len(only_chat["voices"]) == 5
    assert httpx.get(f"{voice_server.base_url}/v1/audio/voices", params={"model": "asr"}).status_code == 404
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        client.audio.speech.create(model="tts-1", voice="nobody", input=text)


def test_long_speech_input_streams_several_chunks(voice_server):
    text = " ".join(f"This is sentence number {n}, spoken by the server." for n in range(1, 6))
    with httpx.stream("POST", f"{voice_server.base_url}/v1/audio/speech", timeout=120,
                      json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}) as response:
        parts = [len(part) for part in response.iter_bytes() if part]
    seconds = sum(parts) / 2 / 24000
    assert response.status_code == 200 and 8 < seconds < 30


def test_asr_stage_contract_segments_and_words(voice_server, client):
    speech, rate = _wav(client.audio.speech.create(model="tts-1", voice="jm_kumo", response_format="wav",
                                                   input="Open the window, because it is too hot in here.").content)
    result = _asr_grpc(voice_server, resample(speech, rate, 16000), word_timestamps=True)
    assert "window" in result["text"].lower() and result["language"] == "en"
    assert abs(result["duration"] - len(speech) / rate) < 0.05
    starts = [w["start"] for w in result["words"]]
    assert len(starts) >= 8 and starts == sorted(starts)
    assert all(s["end"] > s["start"] for s in result["segments"])


def test_transcriptions_route(client):
    speech = client.audio.speech.create(model="tts-1", voice="alloy", input="Please send the report before noon.",
                                        response_format="wav")
    result = client.audio.transcriptions.create(model="whisper-1", file=("q.wav", speech.content, "audio/wav"),
                                                response_format="verbose_json", timestamp_granularities=["word"])
    # OpenAI's whisper-1 names the language ("english"; the stage's code "en" was passed on: the fifth outside test)
    assert "report" in result.text.lower() and result.language == "english" and len(result.words) >= 5


def test_verbose_json_segments_carry_whispers_decoding_figures(client):
    """verbose_json segments are OpenAI's TranscriptionSegment with faster-whisper's own values (the same
    decode in process gives the same tokens and figures), so the usual client filter on no_speech_prob works."""
    from omni_backends.voice.asr import WhisperASR
    from omni_backends.voice.models import prepare_whisper
    from omni_frontend.audio import decode

    speech = client.audio.speech.create(model="tts-1", voice="alloy", response_format="wav",
                                        input="Hello from Triton, testing one two three.").content
    result = client.audio.transcriptions.create(model="whisper-1", file=("hello.wav", speech, "audio/wav"),
                                                response_format="verbose_json")
    expected = WhisperASR(prepare_whisper(), cpu_threads=1).transcribe(decode(speech, 16000), temperature=0.0).segments
    assert [s.text for s in result.segments] == [s.text for s in expected] and expected
    for i, (got, want) in enumerate(zip(result.segments, expected)):
        assert (got.id, got.seek, got.tokens, got.temperature) == (i, want.seek, list(want.tokens), 0.0)
        assert got.avg_logprob == pytest.approx(want.avg_logprob, abs=1e-4) and -1 < got.avg_logprob < 0
        assert got.compression_ratio == pytest.approx(want.compression_ratio) and got.compression_ratio > 0
        assert got.no_speech_prob == pytest.approx(want.no_speech_prob, abs=1e-4) and 0 <= got.no_speech_prob < 0.6
    assert [s.text for s in result.segments if s.no_speech_prob < 0.6] == [s.text for s in expected]


def test_missing_checkpoint_fails_to_load_naming_the_path(tmp_path):
    with pytest.raises(RuntimeError, match=f"{tmp_path}/kokoro-82m"):
        start_server(tmp_path, "--pipelines", "tts", "--no-prepare", env={"OMNI_MODEL_HOME": str(tmp_path)},
                     ready_timeout_s=120)


def test_piper_engine_serves_the_speech_route_as_joe(piper_server):
    """`--tts-engine piper`: voice_tts speaks with Piper, which needs no prepared checkpoint (an empty model
    home); /v1/audio/voices lists its one voice, OpenAI names speak with it, other names get the 400; the
    model id "piper" is served and "kokoro" is a 404."""
    from omni_backends.voice.asr import WhisperASR

    server = piper_server
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    text = "The weather is sunny and warm today."
    normal, rate = _wav(client.audio.speech.create(model="tts-1", voice="alloy", input=text,
                                                   response_format="wav").content)
    fast, _ = _wav(client.audio.speech.create(model="tts-1", voice="joe", input=text, response_format="wav",
                                              speed=2.0).content)
    assert rate == 24000 and 0.2 * 7 <= len(normal) / rate <= 0.8 * 7 and len(fast) < 0.7 * len(normal)
    # Piper samples noise: at most one word of seven misheard ("sunny" was heard as "stunning" 1 run in 4)
    heard = WhisperASR().transcribe(resample(normal, rate, 16000)).text
    assert word_error_rate(text, heard) <= 0.15, heard
    assert httpx.get(f"{server.base_url}/v1/audio/voices").json() == {
        "object": "list", "voices": [{"id": "joe", "model": "tts"}], "default": {"tts": "joe"}}
    with pytest.raises(openai.BadRequestError, match="available: joe"):
        client.audio.speech.create(model="tts-1", voice="jf_alpha", input=text)
    # the model id naming an engine names the one that speaks: "piper" here, "kokoro" is not served
    named, _ = _wav(client.audio.speech.create(model="piper", voice="alloy", input=text,
                                               response_format="wav").content)
    assert 0.2 * 7 <= len(named) / rate <= 0.8 * 7
    with pytest.raises(openai.NotFoundError, match="model 'kokoro' is not loaded"):
        client.audio.speech.create(model="kokoro", voice="alloy", input=text)


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_while_models_load_removes_the_run_copy_and_every_stub(tmp_path, stop, code):
    """SIGTERM or Ctrl-C while `--tts-engine piper` is still loading its models: exit 143 / 130, the run copy of the
    repository removed and no stub process left (on SIGTERM the launcher used to die at once there, leaving both
    behind). The launcher is started as `./scripts/serve &` starts it, SIGINT inherited ignored: it went on loading
    and served."""
    import psutil

    from omni_frontend.tritonserver import free_ports

    run_tmp = tmp_path / "tmp"
    run_tmp.mkdir()
    ports = [str(p) for p in free_ports(3)]
    cmd = [sys.executable, "-m", "omni_frontend.serve", "--pipelines", "tts", "--tts-engine", "piper", "--no-prepare",
           "--port", ports[0], "--triton-grpc-port", ports[1], "--triton-metrics-port", ports[2],
           "--log-dir", str(tmp_path)]
    with open(tmp_path / "serve.log", "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, "TMPDIR": str(run_tmp), "OMNI_MODEL_HOME": str(tmp_path / "models")},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert wait_for(lambda: stub_processes(process.pid), 60, 0.02), (tmp_path / "serve.log").read_text()
        children = psutil.Process(process.pid).children(recursive=True)
        assert any(p.name.startswith("omni-triton-repository-") for p in run_tmp.iterdir())
        assert "Omni-Triton ready" not in (tmp_path / "serve.log").read_text()   # still loading
        process.send_signal(stop)
        assert process.wait(timeout=60) == code, (tmp_path / "serve.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
    assert not any(p.name.startswith("omni-triton-repository-") for p in run_tmp.iterdir())
    assert wait_for(lambda: not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 10)


def test_voice_asr_refuses_bad_tensors_with_the_envelope(voice_server):
    """A gRPC client's empty or non-finite AUDIO and mistyped OPTIONS get a 400 envelope naming the field (they
    failed inside Whisper as internal errors), as does a language tiny.en cannot transcribe; a good request in the same server still transcribes."""
    with grpcclient.InferenceServerClient(voice_server.grpc_url) as triton:
        for pcm, options, param in ((np.zeros(0), {}, "AUDIO"), (np.full(1600, np.nan), {}, "AUDIO"),
                                    (np.zeros(1600), {"temperature": "abc"}, "temperature"),
                                    (np.zeros(1600), {"temperature": 5}, "temperature"),
                                    (np.zeros(1600), {"language": 7}, "language"), (np.zeros(1600), {"language": "fr"}, "language"),
                                    (np.zeros(1600), [1], "OPTIONS")):
            audio = grpcclient.InferInput("AUDIO", [1, pcm.size], "FP32")
            audio.set_data_from_numpy(pcm[None, :].astype(np.float32))
            opts = grpcclient.InferInput("OPTIONS", [1, 1], "BYTES")
            opts.set_data_from_numpy(np.array([[json.dumps(options).encode()]], dtype=np.object_))
            with pytest.raises(InferenceServerException) as info:
                triton.infer("voice_asr", [audio, opts])
            error = json.loads(info.value.message())["error"]
            assert (error["param"], error["status"], error["type"]) == (param, 400, "invalid_request_error"), error
    assert _asr_grpc(voice_server, np.zeros(16000, np.float32), temperature=0)["text"] == ""


def test_repeated_signals_do_not_cut_the_shutdown_short(piper_server):
    """SIGTERM, then SIGTERM and Ctrl-C again and again while the launcher cleans up: it still stops tritonserver,
    removes its /dev/shm entries and the `--tts-engine` run copy (a signal during the cleanup used to abort it)."""
    server = piper_server
    assert server.shm_entries() and _run_copies(server)
    server.process.send_signal(signal.SIGTERM)
    signals = 0
    while server.process.poll() is None and signals < 300:
        time.sleep(0.05)
        server.process.send_signal((signal.SIGTERM, signal.SIGINT)[signals % 2])
        signals += 1
    assert server.stop() == 143 and signals > 2
    assert "tritonserver stopped" in server.log()
    assert server.shm_entries() == [] and _run_copies(server) == []


def test_disconnect_cancels_the_llm_stage(voice_server):
    body = {"model": "voice", "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "modalities": ["text"], "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{voice_server.base_url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
    assert wait_for(lambda: metric_value(voice_server.metrics_url, "omni_inflight_requests", model="voice_llm") == 0, 3.0)


def test_speech_to_transcription_round_trip_word_error_rate(voice_server, client):
    """6 fixed sentences -> /v1/audio/speech/batch (wav) -> /v1/audio/transcriptions, 4 at once: WER <= 20 %
    (the engines in-process have their own round trip: test_voice_speech.py)."""
    sentences = ROUND_TRIP[:6]
    response = httpx.post(f"{voice_server.base_url}/v1/audio/speech/batch", timeout=300, json={
        "model": "tts-1", "voice": "alloy", "response_format": "wav", "items": [{"input": s} for s in sentences]})
    assert response.json()["succeeded"] == len(sentences), response.text
    wavs = [base64.b64decode(r["audio_data"]) for r in response.json()["results"]]
    with ThreadPoolExecutor(4) as pool:   # within the admission bound (--max-inflight 4)
        heard = list(pool.map(lambda wav: client.audio.transcriptions.create(
            model="whisper-1", file=("s.wav", wav, "audio/wav")).text, wavs))
    wer = word_error_rate(sentences, heard)
    print(f"\nround-trip WER over {len(sentences)} sentences: {wer:.3f}")
    assert wer <= 0.20, list(zip(sentences, heard))


def test_streamed_speech_matches_the_non_streamed_length(voice_server, client):
    text = "Streaming speech should be as long as the whole clip. Every chunk counts."
    whole, rate = _wav(client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav").content)
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"}
    with httpx.stream("POST", f"{voice_server.base_url}/v1/audio/speech", json=body, timeout=120) as response:
        raw = b"".join(response.iter_bytes())
    streamed_raw = np.frombuffer(raw[44:], "<i2")  # one streaming WAV header, then PCM16
    deltas = []
    with httpx.stream("POST", f"{voice_server.base_url}/v1/audio/speech", timeout=120,
                      json={**body, "response_format": "pcm", "stream_format": "sse"}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["total_tokens"] > 0
    chunk = max(len(d) for d in deltas) // 2
    for streamed in (streamed_raw.size, sum(len(d) for d in deltas) // 2):
        assert abs(streamed - len(whole)) <= chunk, (streamed, len(whole), chunk)
    assert raw[:4] == b"RIFF" and rate == 24000 and len(deltas) >= 2


def test_two_concurrent_streamed_chats_both_finish(client):
    import concurrent.futures

    questions = [QUESTION, "What is the capital of Japan?"]

    def ask(question):
        text, audio, finish = "", 0, None
        for chunk in client.chat.completions.create(model="voice", messages=[{"role": "user", "content": question}],
                                                    audio={"voice": "alloy", "format": "pcm16"}, temperature=0,
                                                    max_tokens=40, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                audio += len(base64.b64decode(choice.delta.audio.data)) if getattr(choice.delta, "audio", None) else 0
                finish = choice.finish_reason or finish
        return text, audio, finish

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        (paris, paris_audio, f1), (tokyo, tokyo_audio, f2) = pool.map(ask, questions)
    assert "Paris" in paris and "Tokyo" in tokyo and "Tokyo" not in paris and "Paris" not in tokyo
    assert paris_audio > 24000 and tokyo_audio > 24000 and f1 == f2 == "stop"


def test_first_audio_chunk_arrives_before_the_last_text_delta(client):
    """Some text delta comes after the first audio chunk; the stream is closed there (the rest is cancelled)."""
    events = []
    with client.chat.completions.create(
            model="voice", messages=[{"role": "user", "content": "Describe a walk through a forest in a few sentences."}],
            audio={"voice": "alloy", "format": "pcm16"}, temperature=0, max_tokens=120, stream=True) as stream:
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    events.append("text")
                if getattr(choice.delta, "audio", None):
                    events.append("audio")
            if "audio" in events and events[-1] == "text":
                break
    assert "audio" in events and events.index("audio") < len(events) - 1 - events[::-1].index("text"), events


def test_spoken_question_gets_the_same_answer_as_the_text_one(client):
    typed = client.chat.completions.create(model="voice", modalities=["text"], temperature=0,
                                           messages=[{"role": "user", "content": QUESTION}])
    question = client.audio.speech.create(model="tts-1", voice="jf_alpha", input=QUESTION, response_format="wav")
    spoken = client.chat.completions.create(model="voice", modalities=["text"], temperature=0, messages=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(question.content).decode(), "format": "wav"}}]}])
    assert spoken.choices[0].message.content == typed.choices[0].message.content


@pytest.mark.parametrize("route, kwargs, status, param", [
    ("speech", {"json": {"model": "tts-1", "voice": "alloy", "input": ""}}, 400, "input"),
    ("speech", {"json": {"model": "tts-1", "voice": "nobody", "input": "hi"}}, 400, "voice"),
    ("speech", {"json": {"model": "tts-1", "voice": "alloy", "input": "hi", "speed": 9}}, 400, "speed"),
    ("speech", {"json": {"model": "tts-1", "voice": "alloy", "input": "x" * 5000}}, 400, "input"),
    ("speech", {"json": {"model": "tts-1", "voice": "alloy", "input": "...!!!???"}}, 400, "input"),
    ("speech", {"json": {"model": "tts-1", "voice": "alloy", "input": "hi", "action": "voices"}}, 400, "action"),
    ("transcriptions", {"files": {"file": ("a.wav", b"this is not audio" * 50, "audio/wav")},
                        "data": {"model": "whisper-1"}}, 400, "file"),
    ("transcriptions", {"files": {"file": ("a.wav", b"\0" * (25 * 1024 * 1024 + 10), "audio/wav")},
                        "data": {"model": "whisper-1"}}, 413, "file"),
    ("transcriptions", {"data": {"model": "whisper-1"}}, 400, "file"),
    ("transcriptions", {"files": {"file": ("a.wav", b"x", "audio/wav")},          # was read as stream=false
                        "data": {"model": "whisper-1", "stream": "perhaps"}}, 400, "stream"),
])
def test_bad_audio_requests_get_openai_errors(voice_server, route, kwargs, status, param):
    response = httpx.post(f"{voice_server.base_url}/v1/audio/{route}", timeout=60, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200


def test_speech_of_text_the_voice_cannot_say_is_a_400_not_an_empty_file(voice_server):
    """Letters or digits the engine says nothing of (Arabic-Indic digits, a modifier letter, Markdown that strips to
    nothing) passed the "nothing speakable" check and came back as a 200 with an empty WAV (44 bytes), 10 ms of mp3 or
    an SSE stream without audio; the pipeline now refuses them as it refuses "!!!", and speaks the rest of a text
    that also has words."""
    url = f"{voice_server.base_url}/v1/audio/speech"
    for text in ("\u0661\u0662\u0663", "\u02bb\u02bb", "[](abc)"):
        for extra in ({"response_format": "wav"}, {"response_format": "mp3"},
                      {"response_format": "pcm", "stream_format": "sse"}):
            response = httpx.post(url, json={"model": "tts", "voice": "alloy", "input": text, **extra}, timeout=120)
            assert response.status_code == 400, (text, extra, response.text)
            assert response.json()["error"]["param"] == "input"
            assert response.json()["error"]["code"] == "nothing_to_speak"
    response = httpx.post(url, json={"model": "tts", "voice": "alloy", "input": "\u0661\u0662. Good morning.",
                                     "response_format": "wav"}, timeout=120)
    assert response.status_code == 200, response.text
    speech, rate = sf.read(io.BytesIO(response.content))
    assert speech.size / rate > 0.5 and np.abs(speech).max() > 0.1


def test_rejected_stage_requests_leave_no_side_channel_files(voice_server):
    """A request that a BLS child stage rejects (voice_llm: context length) is a 400, and the
    parent/child side channel (cancel flags, error files) is cleaned up."""
    flags = voice_server.sidechannel_dir  # the server's own side channel directory
    before = set(flags.glob("bls-*")) if flags.exists() else set()
    for _ in range(3):
        response = httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=60, json={
            "model": "voice", "max_tokens": 9000, "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    assert wait_for(lambda: (set(flags.glob("bls-*")) if flags.exists() else set()) <= before, 3.0)


def test_engine_stage_rejects_a_bad_seed_over_grpc_and_survives(voice_server, client):
    """Bypassing the frontend's validation: the engine stage answers with an error + FINAL (it used to
    crash tritonserver when the engine refused a request after it was registered)."""
    results = []
    triton = grpcclient.InferenceServerClient(voice_server.grpc_url)
    triton.start_stream(callback=lambda result, error: results.append((result, error)))
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    request.set_data_from_numpy(np.array([json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                      "seed": 2**70}).encode()], dtype=np.object_))
    triton.async_stream_infer("voice_llm", [request], enable_empty_final_response=True)
    assert wait_for(lambda: any(e is not None for _, e in results), 10)
    triton.stop_stream()
    assert "seed" in str(next(e for _, e in results if e is not None))
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200
    assert "Paris" in client.chat.completions.create(model="voice", modalities=["text"], temperature=0,
                                                     messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content


def test_transcription_text_and_srt_outputs(voice_server, client):
    speech = client.audio.speech.create(model="tts-1", voice="alloy", input="Please send the report before noon.",
                                        response_format="wav").content
    url, files = f"{voice_server.base_url}/v1/audio/transcriptions", {"file": ("q.wav", speech, "audio/wav")}
    text = httpx.post(url, files=files, data={"model": "whisper-1", "response_format": "text"}, timeout=60)
    assert text.headers["content-type"].startswith("text/plain") and "report" in text.text.lower()
    srt = httpx.post(url, files=files, data={"model": "whisper-1", "response_format": "srt"}, timeout=60).text
    assert srt.startswith("1\n00:00:0") and " --> " in srt and "report" in srt.lower()


def test_streamed_transcription_deltas_concatenate_to_the_text_then_done(voice_server, client):
    """One delta per Whisper segment (with its own leading space), exactly one transcript.text.done whose
    text is the deltas joined, then data: [DONE]; the same text as the non-streamed answer."""
    speech = client.audio.speech.create(model="tts-1", voice="alloy", response_format="wav",
                                        input="The quick brown fox jumps over the lazy dog. My phone number is "
                                              "five five five. Please call me back before noon tomorrow.").content
    url, files = f"{voice_server.base_url}/v1/audio/transcriptions", {"file": ("q.wav", speech, "audio/wav")}
    with httpx.stream("POST", url, files=files, data={"model": "whisper-1", "stream": "true"}, timeout=60) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * len(deltas) + ["transcript.text.done"]
    assert len(deltas) >= 2 and all(d.startswith(" ") for d in deltas[1:])
    done = events[-1]
    assert "".join(deltas) == done["text"] == client.audio.transcriptions.create(
        model="whisper-1", file=("q.wav", speech, "audio/wav")).text
    assert done["usage"]["type"] == "duration" and done["usage"]["seconds"] > 3.0


# Request values at the edges of what the API accepts (temperature 1e-40 used to kill the voice_llm engine thread).
EXTREME_SAMPLING = [{"temperature": 1e-40}, {"temperature": 2.0, "top_p": 1e-300}, {"top_k": 10**9},
                    {"top_k": -1, "temperature": 2.0}, {"presence_penalty": 2.0, "frequency_penalty": -2.0},
                    {"presence_penalty": -2.0, "frequency_penalty": 2.0}, {"repetition_penalty": 1e30},
                    {"repetition_penalty": 1e-30, "seed": -2**63}, {"seed": 2**63 - 1, "temperature": 1.0}]


def test_extreme_sampling_values_are_served_and_the_engine_survives(voice_server, client):
    def ask(values):
        return httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=120, json={
            "model": "voice", "max_tokens": 3, "modalities": ["text"], **values,
            "messages": [{"role": "user", "content": "hi"}]})

    with ThreadPoolExecutor(4) as pool:  # within the admission bound (--max-inflight 4): none gets 429
        replies = list(pool.map(ask, EXTREME_SAMPLING))
    assert [r.status_code for r in replies] == [200] * len(EXTREME_SAMPLING), [r.text for r in replies]
    assert all(0 < r.json()["usage"]["completion_tokens"] <= 3 for r in replies)
    assert metric_value(voice_server.metrics_url, "omni_worker_restarts_total", model="voice_llm") == 0
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200
    assert "Paris" in client.chat.completions.create(model="voice", modalities=["text"], temperature=0,
                                                     messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content


def test_a_huge_prompt_is_refused_by_the_engine_stage_before_tokenizing(voice_server):
    """Straight to voice_llm over gRPC (no frontend limits): a 2-million-character prompt is a 400 from its
    length alone, and the stage keeps serving."""
    body = {"messages": [{"role": "user", "content": "a " * 1_000_000}], "max_tokens": 1}
    errors = []
    triton = grpcclient.InferenceServerClient(voice_server.grpc_url)
    triton.start_stream(callback=lambda result, error: errors.append(error))
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    request.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=np.object_))
    triton.async_stream_infer("voice_llm", [request], enable_empty_final_response=True)
    assert wait_for(lambda: any(e is not None for e in errors), 60)
    triton.stop_stream()
    error = str(next(e for e in errors if e is not None))
    assert '"param": "messages"' in error and "characters: at least" in error
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200


def test_voice_cancel_storm_leaves_every_gauge_at_zero(voice_server):
    """100 streamed voice chats (text and speech) cancelled mid-way: every stage is idle within 2 s
    (stretched by the host's load: settle_limit_s)."""
    body = {"model": "voice", "max_tokens": 200, "audio": {"voice": "alloy", "format": "pcm16"},
            "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}]}
    last_close = cancel_storm(voice_server.base_url, body, n=100)
    settled = settle_time(voice_server.metrics_url, last_close)
    print(f"voice cancel storm: gauges at 0 {settled} s after the last close")
    assert settled is not None and settled <= settle_limit_s(), inflight(voice_server.metrics_url)


def test_abandoned_non_streamed_chats_leave_no_work_behind_also_when_they_queued(voice_server):
    """12 non-streamed voice chats left after 0.5 s: 4 run, 4 queue (admission) and 4 get 429. The queued
    ones are handed a slot as the running ones leave, after their own clients left too: none of them
    may reach the pipeline and run on (../shared/cases/B27_nonstream_cancel_latency.py)."""
    body = {"model": "voice", "max_tokens": 1000, "audio": {"voice": "alloy", "format": "wav"},
            "messages": [{"role": "user", "content": "Write a very long story about a dragon who cooks."}]}
    last_close = cancel_storm(voice_server.base_url, body, n=12, leave_after_s=0.5, stream=False)
    settled = settle_time(voice_server.metrics_url, last_close)
    assert settled is not None and settled <= settle_limit_s(), inflight(voice_server.metrics_url)


def test_abandoned_speech_is_dropped_and_interrupted(voice_server):
    """A long /v1/audio/speech request abandoned after its first chunk: the sentences not yet spoken are
    never synthesised (voice_tts counts them cancelled) and every stage is idle at once."""
    metrics = voice_server.metrics_url
    cancelled = metric_value(metrics, "omni_requests_total", model="voice_tts", outcome="cancelled") or 0
    spoken = metric_value(metrics, "omni_requests_total", model="voice_tts", outcome="ok") or 0
    text = " ".join(f"This is sentence number {i}, one of many in a long text." for i in range(30))
    with httpx.stream("POST", f"{voice_server.base_url}/v1/audio/speech", timeout=120,
                      json={"model": "tts", "input": text, "voice": "alloy", "response_format": "pcm"}) as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    closed = time.monotonic()
    settled = settle_time(metrics, closed)
    assert settled is not None and settled <= settle_limit_s(), inflight(metrics)
    assert (metric_value(metrics, "omni_requests_total", model="voice_tts", outcome="cancelled") or 0) > cancelled
    assert (metric_value(metrics, "omni_requests_total", model="voice_tts", outcome="ok") or 0) - spoken < 10


def test_audio_only_answer_carries_its_transcript(voice_server, client):
    """modalities ["audio"]: no text content, the spoken text in message.audio.transcript (streamed:
    delta.audio.transcript pieces that concatenate to the same text), and the audio says it."""
    kwargs = dict(model="voice", modalities=["audio"], audio={"voice": "alloy", "format": "wav"}, temperature=0,
                  max_tokens=16, messages=[{"role": "user", "content": QUESTION}])
    message = client.chat.completions.create(**kwargs).choices[0].message
    assert message.content is None and "Paris" in message.audio.transcript
    streamed, contents = [], []
    for chunk in client.chat.completions.create(**{**kwargs, "audio": {"voice": "alloy", "format": "pcm16"}}, stream=True):
        for choice in chunk.choices:
            contents.append(choice.delta.content or "")
            if getattr(choice.delta, "audio", None):
                streamed.append(choice.delta.audio.transcript)
    assert "".join(contents) == "" and "".join(streamed) == message.audio.transcript
    pcm, rate = _wav(base64.b64decode(message.audio.data))
    heard = _asr_grpc(voice_server, resample(pcm, rate, 16000))["text"].lower()
    assert "paris" in heard


def test_first_chunk_words_sets_the_first_spoken_chunk_and_a_bad_value_is_a_400(voice_server, client):
    """The REQUEST extension realtime sessions send (chat: extra_body): the first audio.delta speaks at most that many
    words, the chunks still concatenate to the answer; a value outside 1-40 is refused with the envelope."""
    kwargs = dict(model="voice", modalities=["audio"], audio={"voice": "alloy", "format": "pcm16"}, temperature=0,
                  max_tokens=16, messages=[{"role": "user", "content": QUESTION}], stream=True)
    spoken = {}
    for words in (None, 1):
        pieces = [choice.delta.audio.transcript for chunk in client.chat.completions.create(
            **kwargs, extra_body={} if words is None else {"first_chunk_words": words})
            for choice in chunk.choices if getattr(choice.delta, "audio", None) and choice.delta.audio.transcript]
        spoken[words] = pieces
    assert len(spoken[None][0].split()) in (2, 3) and spoken[1][0].split() == spoken[None][0].split()[:1]
    assert "".join(spoken[1]) == "".join(spoken[None]) and "Paris" in "".join(spoken[1])
    response = httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=60, json={
        "model": "voice", "modalities": ["audio"], "audio": {"voice": "alloy", "format": "wav"},
        "first_chunk_words": 0, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "first_chunk_words"


def test_the_custom_voice_object_is_resolved_by_speech_and_chat(voice_server):
    """openai's voice may be {"id": ...} (SpeechCreateParams.voice, ChatCompletionAudioParam.voice; realtime took
    it): speech and chat refused it as a type error ("Input should be a valid string"). A known id speaks; an
    unknown one gets the pipeline's unknown-voice 400 naming voice."""
    url = voice_server.base_url
    speech = httpx.post(f"{url}/v1/audio/speech", timeout=120, json={"model": "tts", "voice": {"id": "alloy"},
                                                                     "input": "hi", "response_format": "pcm"})
    assert speech.status_code == 200 and len(speech.content) > 0, speech.text
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "voice", "modalities": ["text", "audio"], "audio": {"voice": {"id": "alloy"}, "format": "wav"},
        "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["audio"]["data"], chat.text
    unknown = httpx.post(f"{url}/v1/audio/speech", timeout=120, json={"model": "tts", "voice": {"id": "nobody"},
                                                                      "input": "hi"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "voice", unknown.text
    assert "alloy" in unknown.json()["error"]["message"] or "af_" in unknown.json()["error"]["message"]


def test_pipelines_publish_the_request_fields_they_read(voice_server):
    """REQUEST {"action": "fields"} (what the frontend checks extension fields against before admission) answers
    each model's REQUEST_FIELDS, for any Triton client."""
    import asyncio

    from omni_backends.voice.protocol import REQUEST_FIELDS as VOICE_FIELDS
    from omni_frontend import pipeline_stream
    from omni_frontend.triton_client import TritonClient

    async def ask():
        client = TritonClient(voice_server.grpc_url, 60)
        try:
            return [await pipeline_stream.fields(client, model, "fields-test") for model in ("voice", "tts")]
        finally:
            await client.close()

    voice, tts = asyncio.run(ask())
    assert voice == {"type": "fields", "fields": sorted(VOICE_FIELDS), "hints": {}}
    assert tts == {"type": "fields", "fields": ["input", "speed", "voice"], "hints": {}}   # speech_model.REQUEST_FIELDS


def test_pipelines_refuse_an_unread_field_of_a_direct_triton_request(voice_server):
    """A Triton client that skips the frontend gets the pipeline's own refusal (AsyncDecoupledModel checks every
    REQUEST against the model's request_fields before its handler runs); {"action": "voices"} is answered whatever
    else the REQUEST holds, as before."""
    import asyncio

    from omni_backends.voice.protocol import REQUEST_FIELDS as VOICE_FIELDS
    from omni_frontend import pipeline_stream
    from omni_frontend.errors import APIError
    from omni_frontend.triton_client import TritonClient

    async def refusal(client, model, body):
        try:
            return [event async for event, _ in pipeline_stream.events(client, model, body, "fields-refusal")]
        except APIError as exc:
            return exc

    async def ask():
        client = TritonClient(voice_server.grpc_url, 60)
        try:
            return (await refusal(client, "voice", {"messages": [], "min_tokens": 2, "zz": 1}),
                    await refusal(client, "tts", {"input": "", "speaker": "x"}),
                    await refusal(client, "tts", {"action": "voices", "bogus_field": 1}))
        finally:
            await client.close()

    voice, tts, voices = asyncio.run(ask())
    assert isinstance(voice, APIError) and isinstance(tts, APIError), (voice, tts)
    assert (voice.status, voice.type, voice.param, voice.code, voice.message) == (
        400, "invalid_request_error", "min_tokens", "unsupported_parameter",
        f"min_tokens is not a request field of model voice (its fields: {', '.join(sorted(VOICE_FIELDS))})")
    assert (tts.status, tts.type, tts.param, tts.code, tts.message) == (
        400, "invalid_request_error", "speaker", "unsupported_parameter",
        "speaker is not a request field of model tts (its fields: input, speed, voice)")
    assert [event["type"] for event in voices] == ["voices"] and voices[0]["voices"], voices


def test_voice_counts_a_prompts_tokens_as_a_chat_request_prefills_them(voice_server):
    """REQUEST {"action": "prompt_tokens"} (the realtime session's check of its instructions): voice_llm's count of
    the messages equals the usage.prompt_tokens of a chat request with them, and messages past the context (alone
    or with max_tokens) are refused as that chat request would be."""
    import asyncio

    from omni_frontend import pipeline_stream
    from omni_frontend.errors import APIError
    from omni_frontend.triton_client import TritonClient

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    long = [{"role": "system", "content": "Be nice. " * 5000}]   # ~15,000 tokens: past SmolLM2's 8,192

    async def ask(body_messages, max_tokens):
        client = TritonClient(voice_server.grpc_url, 60)
        try:
            return await pipeline_stream.prompt_tokens(client, "voice", "count-test", body_messages, max_tokens)
        except APIError as exc:
            return exc
        finally:
            await client.close()

    counted = asyncio.run(ask(messages, 16))
    chat = httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=120, json={
        "model": "voice", "modalities": ["text"], "max_tokens": 1, "messages": messages})
    assert chat.status_code == 200, chat.text
    assert counted == {"type": "prompt_tokens", "prompt_tokens": chat.json()["usage"]["prompt_tokens"],
                       "context_length": 8192}
    alone, budget = asyncio.run(ask(long, 16)), asyncio.run(ask([{"role": "system", "content": "Be nice. " * 1500}], 4096))
    assert isinstance(alone, APIError) and (alone.status, alone.code, alone.param) == (
        400, "context_length_exceeded", "messages"), alone
    assert isinstance(budget, APIError) and (budget.status, budget.code, budget.param) == (
        400, "context_length_exceeded", "max_tokens"), budget


def test_unknown_chat_voice_is_a_400_before_any_model_work(voice_server):
    """The error names the chat request's field (`audio.voice`), not the pipeline REQUEST key `voice`."""
    response = httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=60, json={
        "model": "voice", "audio": {"voice": "nobody", "format": "wav"}, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "audio.voice"


@pytest.mark.parametrize("route, body, field", [
    ("audio/speech", {"model": "tts", "voice": "alloy", "input": "hi", "speaker": "vivian"}, "speaker"),  # vLLM-Omni's
    ("chat/completions", {"model": "voice", "modalities": ["text"], "max_tokens": 2, "talker_top_p": 0.5,
                          "messages": [{"role": "user", "content": "hi"}]}, "talker_top_p"),      # qwen3_omni's
    ("chat/completions", {"model": "voice", "modalities": ["text"], "max_tokens": 2, "min_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]}, "min_tokens"),
])
def test_extension_fields_the_pipeline_does_not_read_are_a_400_naming_them(voice_server, route, body, field):
    """They used to be passed on and dropped (200); a null one is an absent field (200). The route refuses them
    against the fields the pipeline publishes ({"action": "fields"}), before admission."""
    response = httpx.post(f"{voice_server.base_url}/v1/{route}", timeout=60, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    assert error["message"].startswith(f"{field} is not a request field of POST /v1/{route} with model {body['model']} "
                                       "(its fields: ")
    assert httpx.post(f"{voice_server.base_url}/v1/{route}", timeout=60, json={**body, field: None}).status_code == 200


def test_32_concurrent_streamed_chats_complete_or_get_429_at_once(voice_server):
    """Overload: the voice pipeline admits --max-inflight 4 + --max-queue 4 (defaults). Of 32 streamed
    chats started together each one completes ([DONE], with audio) or is refused with 429,
    Retry-After and the envelope: at once (before any admitted request has finished), or, for a
    queued stream whose slot did not come within --max-queue-wait on a slow machine, once that wait is
    over (`queue_timeout`; a queued stream gets its head only with its slot). The frontend's latency histograms then hold the completed requests."""
    import asyncio

    async def one(client: httpx.AsyncClient, i: int):
        body = {"model": "voice", "stream": True, "max_tokens": 4, "temperature": 0,
                "audio": {"voice": "alloy", "format": "pcm16"},
                "messages": [{"role": "user", "content": ["What is the capital of France?", "Name a color."][i % 2]}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                error = json.loads(await response.aread())
                kind = "timed out in queue" if error["error"]["code"] == "queue_timeout" else "refused"
                return kind, response, error, time.monotonic()
            events = [json.loads(line[6:]) for line in [line async for line in response.aiter_lines()]
                      if line.startswith("data: {")]
            audio = sum(len(base64.b64decode(e["choices"][0]["delta"]["audio"]["data"])) for e in events
                        if e["choices"] and (e["choices"][0]["delta"].get("audio") or {}).get("data"))
            return "completed", response, audio, time.monotonic()

    async def run():
        async with httpx.AsyncClient(base_url=voice_server.base_url, timeout=300,
                                     limits=httpx.Limits(max_connections=40)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    before = {name: _histogram_count(voice_server, name) for name in ("ttft_seconds", "ttfp_seconds", "e2e_seconds", "rtf")}
    results = asyncio.run(run())
    outcomes = {kind: [r for r in results if r[0] == kind] for kind in ("completed", "refused", "timed out in queue")}
    print(f"\n32 concurrent streamed voice chats: { {k: len(v) for k, v in outcomes.items()} }")
    assert sum(map(len, outcomes.values())) == 32 and len(outcomes["completed"]) >= 4 and outcomes["refused"]
    assert all(audio > 0 for _, _, audio, _ in outcomes["completed"])
    for _, response, body, _ in outcomes["refused"]:
        assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == "pipeline_overloaded"
    assert all(response.status_code == 429 and int(response.headers["retry-after"]) >= 1
               for _, response, _, _ in outcomes["timed out in queue"])
    assert max(r[3] for r in outcomes["refused"]) < min(r[3] for r in outcomes["completed"])
    for name, count in before.items():
        assert _histogram_count(voice_server, name) >= count + len(outcomes["completed"]), name


def _histogram_count(server, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.base_url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == f"omni_frontend_{name}_count" and s.labels.get("pipeline") == "voice")


def _wav_sizes(data: bytes) -> tuple[int, int, float]:
    """(RIFF size field, data size field, duration that Python's wave module reads) of a WAV file."""
    import struct
    import wave

    with wave.open(io.BytesIO(data)) as reader:
        seconds = reader.getnframes() / reader.getframerate()
    return struct.unpack("<I", data[4:8])[0], struct.unpack("<I", data[data.index(b"data") + 4:][:4])[0], seconds


def test_whole_wav_answers_carry_real_sizes_and_only_streams_use_unknown_sizes(voice_server, client):
    speech = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there, my friend.",
                                        response_format="wav").content
    riff, data, seconds = _wav_sizes(speech)
    assert riff == len(speech) - 8 and data == len(speech) - 44 and 0.5 < seconds < 5  # was read as 89,478 s
    reply = client.chat.completions.create(model="voice", modalities=["text", "audio"], temperature=0, max_tokens=12,
                                           audio={"voice": "alloy", "format": "wav"},
                                           messages=[{"role": "user", "content": QUESTION}])
    audio = base64.b64decode(reply.choices[0].message.audio.data)
    riff, data, seconds = _wav_sizes(audio)
    assert riff == len(audio) - 8 and data == len(audio) - 44 and seconds > 0.5
    with httpx.stream("POST", f"{voice_server.base_url}/v1/audio/speech", timeout=120, json={
            "model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "wav",
            "stream_format": "sse"}) as response:
        first = next(json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: "))
    header = base64.b64decode(first["audio"])[:44]
    assert header[:4] == b"RIFF" and header[4:8] == header[40:44] == b"\xff\xff\xff\xff"




def _envelope_400(message: str | None) -> dict:
    assert message is not None, "the bad request was answered"
    error = json.loads(message)["error"]   # not a Python exception's text (a 500)
    assert error["status"] == 400 and error["type"] == "invalid_request_error", error
    return error


def test_wrong_json_shapes_and_non_finite_audio_sent_to_the_models_are_a_400_envelope(voice_server, client):
    """Straight to the Triton models (no frontend validation): a REQUEST of well-formed JSON of the wrong shape
    (also a speech REQUEST's voice / speed) and NaN input audio are refused by voice, voice_llm, tts, voice_asr_stream
    and voice_vad with the OpenAI envelope (HTTP 400, param naming the field), not a Python exception (500); the
    models keep serving."""
    nan = np.full(16000, np.nan, np.float32)
    part = {"type": "input_audio", "offset": 0, "samples": nan.size, "sample_rate": 16000}
    text = {"modalities": ["text"], "max_tokens": 4}
    for model, body, param in (
            ("voice", {"messages": [1]}, "messages[0]"),
            ("voice", {"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
            ("voice", {"messages": [{"role": "user", "content": [{**part, "offset": "a"}]}]},
             "messages[0].content[0].offset"),
            ("voice", {"messages": [{"role": "user", "content": "hi"}], "stop": 5}, "stop"),
            ("voice", {"messages": [{"role": "user", "content": "hi"}], "voice": ["alloy"], "modalities": ["audio"]},
             "voice"),
            ("voice_llm", {"messages": [{"role": "user", "content": "hi"}], "stop": [1]}, "stop[0]"),
            ("voice_llm", {"messages": [{"role": "user", "content": [5]}]}, "messages[0].content"),
            ("tts", {"input": "hi", "speed": "fast"}, "speed"),
            ("tts", {"input": "hi", "voice": {"id": ["alloy"]}}, "voice")):
        request = body if model == "tts" else {**text, **body}   # tts reads no modalities / max_tokens
        audio = np.zeros(16000, np.float32) if model == "voice" else None   # only voice takes INPUT_AUDIO here
        error = _envelope_400(triton_stream_error(voice_server.grpc_url, model, request, audio))
        assert error["param"] == param, (model, body, error)
    for model, body in (("voice", {**text, "messages": [{"role": "user", "content": [part]}]}),
                        ("voice_asr_stream", {})):
        error = _envelope_400(triton_stream_error(voice_server.grpc_url, model, body, nan))
        assert "must hold finite mono 16 kHz samples" in error["message"], (model, error)
    with grpcclient.InferenceServerClient(voice_server.grpc_url) as triton:
        audio = grpcclient.InferInput("AUDIO", [1, nan.size], "FP32")
        audio.set_data_from_numpy(nan[None, :])
        with pytest.raises(InferenceServerException) as refused:
            triton.infer("voice_vad", [audio], sequence_id=77, sequence_start=True, sequence_end=True)
        assert _envelope_400(refused.value.message())["param"] == "AUDIO"
    assert httpx.get(f"{voice_server.base_url}/health").status_code == 200
    assert "Paris" in client.chat.completions.create(model="voice", modalities=["text"], temperature=0,
                                                     messages=[{"role": "user", "content": QUESTION}]).choices[0].message.content
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    assert triton_stream_error(voice_server.grpc_url, "voice_asr_stream", {}, tone) is None


def test_the_suites_direct_triton_requests_leave_every_model_free_to_unload_at_the_stop(tmp_path):
    """`triton_stream_error` (the test above sends NaN audio, then a tone, straight to voice_asr_stream with it) used to
    cancel its gRPC stream as soon as it read `done`, around the request's FINAL; Triton 2.51 can then keep that request
    for good (no longer in flight, but its model never unloads), so the shared voice server's stop sat out the 30 s exit
    timeout with voice_asr_stream loaded (4 of 9 clean-clone suite runs; 10 such pairs hung every stop here). It now reads
    on to the FINAL and closes the stream without cancelling: every model unloads and the stop is quick. An `asr`-only
    server keeps it cheap; the old helper fails it (voice_asr_stream never unloaded, 36 s)."""
    from omni_backends.voice.models import prepare_voice_models
    from omni_frontend.tritonserver import EXIT_TIMEOUT_S

    prepare_voice_models()
    server = start_server(tmp_path, "--pipelines", "asr", "--no-prepare")
    nan = np.full(16000, np.nan, np.float32)
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    try:
        for _ in range(6):
            assert "finite" in triton_stream_error(server.grpc_url, "voice_asr_stream", {}, nan)
            assert triton_stream_error(server.grpc_url, "voice_asr_stream", {}, tone) is None
    finally:
        started = time.monotonic()
        code = server.stop()
        stop_s = time.monotonic() - started
    log = (tmp_path / "tritonserver.log").read_text(errors="replace")
    loaded = set(re.findall(r"successfully loaded '(\w+)'", log))
    unloaded = set(re.findall(r"successfully unloaded '(\w+)'", log))
    assert code == 130 and "voice_asr_stream" in loaded and unloaded == loaded, (sorted(loaded - unloaded), log[-3000:])
    assert stop_s < EXIT_TIMEOUT_S / 2, (stop_s, log[-3000:])
