#!/usr/bin/env python
"""Measure the voice pipeline's stages on this machine (prints, asserts nothing).

Each stage runs in its own process so its resident memory (RSS) is its own:
  tts:      Kokoro load time, RSS, real-time factor of one sentence
  asr:      Whisper load time, RSS, latency for a ~4 s clip (synthesised by Kokoro)
  llm:      SmolLM2 load time, RSS, time to first token, decode tokens/s (alone and 4 concurrent)
  pipeline: all three loaded in one process: total RSS and time to first audio
            (end of user speech -> ASR -> LLM stream -> sentence chunker -> first TTS chunk)
  wer:      SmolLM2's 64-token replies to the 24 bench prompts spoken by Kokoro (one call, and chunked as the
            pipeline chunks them) and transcribed back by Whisper: WER against the reply's words, with the
            Markdown marks dropped before speech (as served) and read aloud (as before `markup.speakable`);
            table on stdout, JSON in var/bench/voice_wer.json
  multiturn: one 8-turn conversation (the bench prompts in turn, greedy 48-token replies kept in the history):
            time to first token of each turn with the prefix cache (system part and each whole prompt kept)
            against the same LLM without one, turns alternated; JSON in var/bench/voice_multiturn.json
Usage: .venv/bin/python scripts/bench_voice.py [tts|asr|llm|pipeline ...]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
QUESTION = [{"role": "user", "content": "Can you tell me something interesting about the ocean?"}]
CLIP = os.path.join(tempfile.gettempdir(), "omni_bench_voice_clip16k.npy")


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def bench_tts() -> None:
    from omni_backends.voice.audio import resample
    from omni_backends.voice.tts import SAMPLE_RATE, KokoroTTS

    tts, load = timed(KokoroTTS)
    runs = [timed(tts.synthesize, SENTENCE) for _ in range(3)]
    seconds = len(runs[0][0]) / SAMPLE_RATE
    best = min(t for _, t in runs)
    print(f"tts  load {load:.2f} s | RSS {rss_mib():.0f} MiB | {seconds:.2f} s audio in {best:.2f} s "
          f"(RTF {best / seconds:.3f}, median {sorted(t for _, t in runs)[1] / seconds:.3f})")
    clip = tts.synthesize("Please tell me about the weather in Paris tomorrow.")
    np.save(CLIP, resample(clip, SAMPLE_RATE, 16000))


def bench_asr() -> None:
    from omni_backends.voice.asr import WhisperASR

    asr, load = timed(WhisperASR)
    clip = np.load(CLIP)
    asr.transcribe(clip)
    runs = [timed(asr.transcribe, clip) for _ in range(3)]
    print(f"asr  load {load:.2f} s | RSS {rss_mib():.0f} MiB | {len(clip) / 16000:.2f} s clip in "
          f"{min(t for _, t in runs):.2f} s (median {sorted(t for _, t in runs)[1]:.2f} s): {runs[0][0].text!r}")


def _stream_timing(llm, params):
    start, first, final = time.perf_counter(), None, None
    for delta in llm.generate(QUESTION, params):
        first = first or time.perf_counter() - start
        final = delta
    return first, time.perf_counter() - start, final.usage.completion_tokens


def bench_llm() -> None:
    from omni_backends.engine import SamplingParams
    from omni_backends.voice.llm import ChatLLM

    llm, load = timed(ChatLLM)
    params = SamplingParams(max_tokens=64, min_tokens=64, temperature=0.0)
    first, total, n = _stream_timing(llm, params)
    first, total, n = _stream_timing(llm, params)
    print(f"llm  load+warmup {load:.2f} s | RSS {rss_mib():.0f} MiB | TTFT {first:.3f} s | "
          f"{(n - 1) / (total - first):.1f} tokens/s decode alone")
    done = []
    threads = [threading.Thread(target=lambda: done.append(llm.complete(QUESTION, params))) for _ in range(4)]
    start = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    elapsed = time.perf_counter() - start
    print(f"llm  4 concurrent x {n} tokens in {elapsed:.2f} s: {4 * n / elapsed:.1f} tokens/s aggregate")
    llm.shutdown()


def bench_pipeline() -> None:
    """Served configuration (model_repository): ASR 2 threads, LLM and TTS 1 thread each, the LLM still
    writing while the first chunk is spoken. Where the time to first audio goes: ASR, LLM prefill (time to
    first token, system prompt from the prefix cache), LLM decode up to the first chunk, TTS of that chunk
    (wall and CPU seconds). Third turn reported (the first ones warm caches)."""
    from omni_backends.engine import SamplingParams
    from omni_backends.voice.asr import WhisperASR
    from omni_backends.voice.chunker import SentenceChunker
    from omni_backends.voice.llm import ChatLLM
    from omni_backends.voice.tts import KokoroTTS

    asr, llm, tts = WhisperASR(cpu_threads=2), ChatLLM(threads=1), KokoroTTS(intra_op_num_threads=1)
    clip = np.load(CLIP)
    for _ in range(3):
        start = time.perf_counter()
        heard = asr.transcribe(clip).text
        t_asr = time.perf_counter() - start
        chunker, first_text, t_first = SentenceChunker(), None, None
        deltas = llm.generate([{"role": "user", "content": heard}], SamplingParams(max_tokens=96, temperature=0.0))
        for delta in deltas:
            t_first = t_first or time.perf_counter() - start
            chunks = chunker.feed(delta.text) + (chunker.flush() if delta.finished else [])
            if chunks:
                first_text, t_chunk = chunks[0], time.perf_counter() - start
                break
        rest = threading.Thread(target=lambda: [None for _ in deltas])  # the LLM keeps writing meanwhile
        rest.start()
        cpu = time.thread_time()
        audio = next(tts.stream(first_text))
        tts_cpu = time.thread_time() - cpu
        ttfa = time.perf_counter() - start
        rest.join()
    print(f"pipe RSS {rss_mib():.0f} MiB (all three) | time to first audio {ttfa:.2f} s = asr {t_asr:.2f} + "
          f"llm prefill {t_first - t_asr:.2f} + llm decode to the first chunk {t_chunk - t_first:.2f} + "
          f"tts {ttfa - t_chunk:.2f} (CPU {tts_cpu:.2f}); chunk {first_text!r} = {len(audio) / 24000:.2f} s audio")
    llm.shutdown()


def bench_wer() -> None:
    import json
    import re
    from pathlib import Path

    import jiwer
    from omni_bench.datasets import BUILTIN_PROMPTS
    from omni_backends.engine import SamplingParams
    from omni_backends.voice import tts as tts_module
    from omni_backends.voice.asr import WhisperASR
    from omni_backends.voice.audio import resample
    from omni_backends.voice.chunker import SentenceChunker
    from omni_backends.voice.llm import ChatLLM
    from omni_backends.voice.markup import speakable

    llm = ChatLLM()
    params = SamplingParams(max_tokens=64, temperature=0.0)
    replies = [llm.complete([{"role": "user", "content": prompt}], params)[0] for prompt in BUILTIN_PROMPTS]
    llm.shutdown()
    tts, asr = tts_module.KokoroTTS(), WhisperASR()
    words = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(),
                           jiwer.Strip(), jiwer.ReduceToListOfListOfWords()])

    def heard(texts: list[str]) -> str:
        pcm = np.concatenate([tts.synthesize(text) for text in texts] or [np.zeros(1, np.float32)])
        return asr.transcribe(resample(pcm, 24000, 16000)).text

    def chunked(reply: str) -> list[str]:
        chunker = SentenceChunker()
        return [c for word in re.findall(r"\S+\s*", reply) for c in chunker.feed(word)] + chunker.flush()

    refs = [speakable(reply) for reply in replies]  # the words a listener should hear
    formatted = [i for i, reply in enumerate(replies) if refs[i] != reply]
    results = {"replies": len(replies), "formatted_replies": len(formatted)}
    print(f"{'marks':<10}{'calls':<9}{'WER all':>9}{'WER formatted':>15}")
    for marks, strip in (("read", lambda text: text), ("dropped", speakable)):
        tts_module.speakable = strip
        for calls in ("one", "chunked"):
            hyps = [heard([reply] if calls == "one" else chunked(reply)) for reply in replies]
            wer = [jiwer.wer([refs[i] for i in idx], [hyps[i] for i in idx], reference_transform=words,
                             hypothesis_transform=words) if idx else None
                   for idx in (range(len(replies)), formatted)]
            results[f"{marks}_{calls}"] = {"wer": wer[0], "wer_formatted": wer[1]}
            print(f"{marks:<10}{calls:<9}{wer[0]:>9.3f}{wer[1] if wer[1] is None else f'{wer[1]:.3f}':>15}")
    Path("var/bench").mkdir(parents=True, exist_ok=True)
    Path("var/bench/voice_wer.json").write_text(json.dumps(results, indent=1))


def bench_multiturn() -> None:
    import json
    from pathlib import Path

    from omni_bench.datasets import BUILTIN_PROMPTS
    from omni_backends.engine import SamplingParams
    from omni_backends.voice.llm import ChatLLM

    llms = {"no cache": ChatLLM(prefix_cache_entries=0), "cache": ChatLLM()}
    params, messages, rows = SamplingParams(max_tokens=48, temperature=0.0), [], []
    print(f"{'turn':>4}{'prompt tokens':>15}{'TTFT no cache':>15}{'TTFT cache':>12}")
    for turn, question in enumerate(BUILTIN_PROMPTS[:8], 1):
        messages.append({"role": "user", "content": question})
        row = {"turn": turn, "prompt_tokens": len(llms["cache"].prompt_ids(messages))}
        for name, llm in (reversed(llms.items()) if turn % 2 else llms.items()):   # alternate which goes first
            start, first, text = time.perf_counter(), None, ""
            for delta in llm.generate(messages, params):
                first = first or time.perf_counter() - start
                text += delta.text
            row[name], reply = first, text   # greedy: both write the same reply
        messages.append({"role": "assistant", "content": reply})
        rows.append(row)
        print(f"{turn:>4}{row['prompt_tokens']:>15}{row['no cache'] * 1e3:>13.1f}ms{row['cache'] * 1e3:>10.1f}ms")
    for llm in llms.values():
        llm.shutdown()
    Path("var/bench").mkdir(parents=True, exist_ok=True)
    Path("var/bench/voice_multiturn.json").write_text(json.dumps(rows, indent=1))


BENCHES = {"tts": bench_tts, "asr": bench_asr, "llm": bench_llm, "pipeline": bench_pipeline, "wer": bench_wer, "multiturn": bench_multiturn}

if __name__ == "__main__":
    names = sys.argv[1:] or list(BENCHES)
    if len(names) == 1:
        BENCHES[names[0]]()
    else:
        for name in names:  # one process per stage: separate RSS
            subprocess.run([sys.executable, __file__, name], check=True)
