"""Needs the server `./scripts/serve --pipelines voice,tts,asr --port 31000 --triton-grpc-port 31001 --triton-metrics-port 31003`
running. Sleeps voice, wakes it and SIGKILLs voice_llm's stub while it loads (the wake fails: 503, voice stays asleep),
then wakes voice again. Exits 1 while that successful wake answers `recovering` (the stage monitor, still holding the
dead voice_llm down, reloads the fresh stub the wake just loaded: more seconds of 503 model_unavailable), 0 when the
second wake serves at once."""
import asyncio, httpx, time, psutil, sys, re
BASE = "http://127.0.0.1:31000"; MET = "http://127.0.0.1:31003/metrics"
def tritonserver():
    for p in psutil.process_iter(["cmdline"]):
        c = " ".join(p.info["cmdline"] or [])
        if p.name() == "tritonserver" and "31001" in c: return p
async def main():
    ts = tritonserver(); print("tritonserver", ts.pid)
    async with httpx.AsyncClient() as c:
        print("sleep", (await c.post(f"{BASE}/v1/admin/pipelines/voice/sleep", timeout=120)).json())
        t0 = time.time()
        wake = asyncio.create_task(c.post(f"{BASE}/v1/admin/pipelines/voice/wake", timeout=300))
        victim = None
        while not wake.done():
            m = (await c.get(MET)).text
            hb = re.search(r'omni_model_heartbeat_seconds\{model="voice_llm"\} (\S+)', m)
            if hb and time.time() - float(hb.group(1)) < 2:
                for p in ts.children():
                    if p.status() != psutil.STATUS_ZOMBIE and "/voice_llm/1/model.py" in " ".join(p.cmdline()):
                        victim = p
                if victim:
                    st = (await c.get(f"{BASE}/v1/admin/pipelines")).json()["data"][0]["state"]
                    print("killing voice_llm", victim.pid, "pipeline", st, round(time.time() - t0, 1)); victim.kill(); break
            await asyncio.sleep(0.2)
        w = await wake; print("wake", w.status_code, w.json().get("state"), round(time.time() - t0, 1))
        w = await c.post(f"{BASE}/v1/admin/pipelines/voice/wake", timeout=300)
        print("second wake", w.status_code, w.json().get("state"))
        r = await c.post(f"{BASE}/v1/chat/completions", json={"model": "voice", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        print("chat right after it", r.status_code, r.text[:120])
        ok = w.json().get("state") == "awake" and r.status_code == 200
        for i in range(40):
            h = await c.get(f"{BASE}/health")
            r = await c.post(f"{BASE}/v1/chat/completions", json={"model": "voice", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
            print(round(time.time() - t0, 1), "health", h.status_code, h.json().get("not_ready"), "chat", r.status_code, r.text[:100] if r.status_code != 200 else "")
            if h.status_code == 200 and r.status_code == 200: break
            await asyncio.sleep(2)
        sys.exit(0 if ok else 1)
asyncio.run(main())
