"""`POST /v1/videos` with both `seconds` and `num_frames` silently uses `num_frames` and still reports the
requested `seconds`: the job object says `"seconds": "1"` for a 5-frame video at 16 fps (~0.3 s).

docs/pipelines.md: `num_frames` (4k+1) is an extension "instead of `seconds`". Expected: either a 400
naming one of the two fields when both are given (they contradict each other), or a video object whose
`seconds` matches what was generated (num_frames / fps). Observed: 200, `seconds: "1"`, `num_frames: 5`.

Exit 1 while the returned seconds disagree with the frames, 0 when fixed (4xx or consistent).
Env: BASE_URL (default http://127.0.0.1:21000). Needs the `wan` pipeline.
"""
import os
import sys
import time

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")


def main() -> int:
    with httpx.Client(timeout=60) as client:
        r = client.post(BASE + "/v1/videos", json={"model": "wan", "prompt": "a cat", "size": "32x32", "seconds": "1",
                                                   "num_frames": 5, "num_inference_steps": 1, "seed": 1})
        if 400 <= r.status_code < 500:
            print("refused:", r.status_code, r.text[:160])
            return 0
        video = r.json()
        end = time.monotonic() + 120
        while video.get("status") not in ("completed", "failed") and time.monotonic() < end:
            time.sleep(1)
            video = client.get(f"{BASE}/v1/videos/{video['id']}").json()
        client.delete(f"{BASE}/v1/videos/{video['id']}")
    frames, fps, seconds = video.get("num_frames"), video.get("fps"), float(video.get("seconds"))
    actual = frames / fps if frames and fps else None
    print(f"observed: status {video.get('status')}, seconds {video.get('seconds')!r}, num_frames {frames}, fps {fps} "
          f"(actual length ~{actual:.2f} s)")
    print("expected: 400 for the contradictory pair, or seconds matching num_frames / fps")
    return 1 if actual is not None and abs(seconds - actual) > 0.25 else 0


if __name__ == "__main__":
    sys.exit(main())
