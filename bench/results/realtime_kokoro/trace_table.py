"""Per turn of a traced realtime run (trace.patch applied; its stamps in FILE[.gz]): ms after the bench's speech end of
each step of the preemptive response, then ASR, LLM (request -> first chunk) and Kokoro (first chunk) durations.
Usage: python trace_table.py rt_after_traced.trace.gz"""
import gzip
import sys

opener = gzip.open if sys.argv[1].endswith(".gz") else open
lines = sorted((float(l.split(' ', 1)[0]), l.rstrip('\n').split(' ', 1)[1]) for l in opener(sys.argv[1], "rt"))
ends = [t for t, tag in lines if tag == 'bench_speech_end']
print(f"{'pause':>6}{'stop':>6}{'asr':>6}{'vreq':>6}{'tok1':>6}{'chunk':>6}{'tts0':>6}{'tts1':>6}{'sent':>6}{'bench':>6}  asr_ms llm_ms tts_ms chunk0")
for i, t0 in enumerate(ends):
    t1 = ends[i + 1] if i + 1 < len(ends) else 1e18
    # the turn's events: last spec_start before the first audio after t0
    first_audio = next(t for t, tag in lines if tag == 'bench_first_audio' and t > t0)
    win = [(t, tag) for t, tag in lines if t0 - 3 < t <= first_audio]
    spec = [t for t, tag in win if tag == 'spec_start']
    s = spec[-1]
    def first(prefix, after=s):
        return next((t for t, tag in win if tag.startswith(prefix) and t >= after), None)
    def ms(x): return f"{(x - t0) * 1000:6.0f}" if x else "     -"
    vreq = first('voice_request'); tok = first('llm_event', vreq); ch = first('chunk', vreq)
    t0s = first('tts_row_start', vreq); t1s = first('tts_row_end', vreq); sent = first('send_audio_delta', vreq)
    asr = first('spec_asr_done'); stop = first('vad speech_stopped', t0 - 3)
    chunk = next(tag for t, tag in win if tag.startswith('chunk') and t >= vreq)[6:]
    print(ms(s) + ms(stop) + ms(asr) + ms(vreq) + ms(tok) + ms(ch) + ms(t0s) + ms(t1s) + ms(sent) + ms(first_audio),
          f" {(asr - s) * 1000:6.0f} {(ch - vreq) * 1000:6.0f} {(t1s - t0s) * 1000:6.0f} {chunk}")
