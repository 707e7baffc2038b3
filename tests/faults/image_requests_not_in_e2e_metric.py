"""Completed image requests (`/v1/images/generations`, `/v1/images/edits`) never reach the per-pipeline latency
histogram `omni_frontend_e2e_seconds{pipeline}`: after 60+ images in a soak, `GET /metrics` had
`omni_frontend_e2e_seconds_count` for voice, qwen3_omni, tts and asr but no series at all for `qwen_image` or
`qwen_image_edit`, so an operator cannot see (or alert on) image latency per pipeline.

Expected (README "Operations": "`GET /metrics`: frontend request counts/latencies (Prometheus), including per
pipeline ... `omni_frontend_e2e_seconds` ..."; docs/reliability.md "Metrics (frontend GET /metrics)":
`omni_frontend_e2e_seconds` | pipeline | "arrival -> last event of a completed request", with no exception for
images): each completed image request adds one observation under its pipeline, as chat, speech and
transcription requests do.
Wrong: frontend/routes/images.py never makes an `observability.timer(request, pipeline.name)` / calls `.done()`
(chat.py, speech.py and transcriptions.py do).
Reproduce: read the count, POST one 64x64 2-step generation (and one edit), read it again.
Exit 1 while the counts do not grow by one each, 0 when they do.
"""
import base64, io, json, os, re, sys, urllib.request, uuid, zlib, struct

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:23100").rstrip("/")


def count(pipeline):
    text = urllib.request.urlopen(BASE + "/metrics", timeout=30).read().decode()
    found = re.search(rf'^omni_frontend_e2e_seconds_count{{pipeline="{pipeline}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def png(width, height):
    raw = b"".join(b"\x00" + bytes([200, 10, 10]) * width for _ in range(height))
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


before = {p: count(p) for p in ("qwen_image", "qwen_image_edit")}
body = json.dumps({"model": "qwen_image", "prompt": "a red cube", "size": "64x64", "num_inference_steps": 2}).encode()
r = urllib.request.urlopen(urllib.request.Request(BASE + "/v1/images/generations", body,
                                                  {"content-type": "application/json"}), timeout=120)
assert r.status == 200
boundary = uuid.uuid4().hex
parts = [("model", "qwen_image_edit"), ("prompt", "make it blue"), ("num_inference_steps", "2")]
form = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode() for k, v in parts)
form += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
         f"Content-Type: image/png\r\n\r\n").encode() + png(64, 64) + f"\r\n--{boundary}--\r\n".encode()
r = urllib.request.urlopen(urllib.request.Request(BASE + "/v1/images/edits", form,
                                                  {"content-type": f"multipart/form-data; boundary={boundary}"}),
                           timeout=180)
assert r.status == 200
after = {p: count(p) for p in before}
print(f"omni_frontend_e2e_seconds_count before {before}, after one completed request each {after}")
if any(after[p] != before[p] + 1 for p in before):
    print("FAULT: completed image requests are not observed in omni_frontend_e2e_seconds{pipeline} (expected +1 each)")
    sys.exit(1)
print("ok")
sys.exit(0)
