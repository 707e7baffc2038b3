"""The video job store: one SQLite database (stdlib `sqlite3`, WAL journal) plus a folder of files per
job under the data directory.

    <data_dir>/videos.db                 table `videos`: one row per job
    <data_dir>/videos/<id>/video.mp4     the encoded video (H.264, yuv420p)
    <data_dir>/videos/<id>/thumbnail.webp, spritesheet.jpg, input_reference.png (when given)

Rows hold the OpenAI video object's fields (`id`, `status`, `progress`, `created_at`, `completed_at`,
`expires_at`, `model`, `prompt`, `seconds`, `size`, `error`) plus `params` (the generation request
as JSON, so a queued job can run after a restart) and `inference_time_s`. Times are unix seconds.
Jobs are listed newest first by creation order (`seq`, SQLite's rowid). Every method commits at once;
the store is used from the event loop's thread only (sub-millisecond statements under WAL with
`synchronous=NORMAL`).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import time
from pathlib import Path

QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS videos (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    seconds TEXT NOT NULL,
    size TEXT NOT NULL,
    params TEXT NOT NULL,
    error TEXT,
    completed_at INTEGER,
    expires_at INTEGER,
    inference_time_s REAL
);
CREATE INDEX IF NOT EXISTS videos_status ON videos (status);
CREATE INDEX IF NOT EXISTS videos_expires ON videos (expires_at);
"""


@dataclasses.dataclass
class VideoJob:
    """One row of the store. `params` is the generation request (pipeline REQUEST fields)."""

    seq: int
    id: str
    created_at: int
    status: str
    progress: int
    model: str
    prompt: str
    seconds: str
    size: str
    params: dict
    error: dict | None = None
    completed_at: int | None = None
    expires_at: int | None = None
    inference_time_s: float | None = None

    def to_object(self) -> dict:
        """The OpenAI video object (`openai.types.Video`), plus extension fields (`seed`, `fps`,
        `num_frames`, `num_inference_steps`, `inference_time_s`)."""
        return {"id": self.id, "object": "video", "status": self.status, "progress": self.progress,
                "created_at": self.created_at, "completed_at": self.completed_at, "expires_at": self.expires_at,
                "model": self.model, "prompt": self.prompt, "seconds": self.seconds, "size": self.size,
                "remixed_from_video_id": None, "error": self.error,
                **{k: self.params.get(k) for k in ("seed", "fps", "num_frames", "num_inference_steps")},
                "inference_time_s": self.inference_time_s}


class VideoStore:
    """Jobs and their files under `data_dir` (created if missing)."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        (self.data_dir / "videos").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.data_dir / "videos.db", isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- files ------------------------------------------------------------------------------------
    def job_dir(self, video_id: str) -> Path:
        return self.data_dir / "videos" / video_id

    def _remove_files(self, video_id: str) -> None:
        shutil.rmtree(self.job_dir(video_id), ignore_errors=True)

    # -- rows -------------------------------------------------------------------------------------
    @staticmethod
    def _job(row: sqlite3.Row | None) -> VideoJob | None:
        if row is None:
            return None
        fields = dict(row)
        fields["params"] = json.loads(fields["params"])
        fields["error"] = json.loads(fields["error"]) if fields["error"] else None
        return VideoJob(**fields)

    def create(self, video_id: str, *, model: str, prompt: str, seconds: str, size: str, params: dict,
               created_at: int | None = None) -> VideoJob:
        """Inserts a queued job (progress 0) and makes its folder."""
        self.job_dir(video_id).mkdir(parents=True, exist_ok=True)
        self._db.execute("INSERT INTO videos (id, created_at, status, model, prompt, seconds, size, params) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (video_id, int(created_at or time.time()), QUEUED, model, prompt, seconds, size,
                          json.dumps(params)))
        return self.get(video_id)

    def get(self, video_id: str) -> VideoJob | None:
        return self._job(self._db.execute("SELECT * FROM videos WHERE id = ?", (video_id,)).fetchone())

    def list(self, *, limit: int, after: str | None = None, order: str = "desc") -> tuple[list[VideoJob], bool]:
        """A page of jobs newest first (`order="asc"`: oldest first), starting after job id `after`;
        returns (jobs, has_more). Raises KeyError if `after` names no job."""
        newest_first = order != "asc"
        where, args = "", []
        if after is not None:
            row = self._db.execute("SELECT seq FROM videos WHERE id = ?", (after,)).fetchone()
            if row is None:
                raise KeyError(after)
            where, args = ("WHERE seq < ?" if newest_first else "WHERE seq > ?"), [row["seq"]]
        rows = self._db.execute(f"SELECT * FROM videos {where} ORDER BY seq {'DESC' if newest_first else 'ASC'} "
                                f"LIMIT ?", (*args, limit + 1)).fetchall()
        return [self._job(r) for r in rows[:limit]], len(rows) > limit

    def count(self, status: str) -> int:
        return self._db.execute("SELECT COUNT(*) FROM videos WHERE status = ?", (status,)).fetchone()[0]

    def ids(self, status: str) -> list[str]:
        """Ids of the jobs in `status`, oldest first."""
        return [r[0] for r in self._db.execute("SELECT id FROM videos WHERE status = ? ORDER BY seq", (status,))]

    def start(self, video_id: str) -> bool:
        """queued -> in_progress; False if the job is gone or no longer queued."""
        return self._move(video_id, QUEUED, IN_PROGRESS)

    def requeue(self, video_id: str) -> bool:
        """in_progress -> queued (progress 0), for a job that did not get to run; False if it is not in progress."""
        return self._move(video_id, IN_PROGRESS, QUEUED)

    def _move(self, video_id: str, was: str, becomes: str) -> bool:
        """Status `was` -> `becomes` with progress 0; False if the job is gone or not in `was`."""
        return self._db.execute("UPDATE videos SET status = ?, progress = 0 WHERE id = ? AND status = ?",
                                (becomes, video_id, was)).rowcount == 1

    def set_progress(self, video_id: str, progress: int) -> None:
        self._db.execute("UPDATE videos SET progress = ? WHERE id = ? AND status = ?",
                         (int(progress), video_id, IN_PROGRESS))

    def complete(self, video_id: str, *, inference_time_s: float, ttl_s: int | None) -> None:
        """in_progress -> completed, progress 100, expiring `ttl_s` seconds from now (None: never)."""
        now = int(time.time())
        self._db.execute("UPDATE videos SET status = ?, progress = 100, completed_at = ?, expires_at = ?, "
                         "inference_time_s = ? WHERE id = ?",
                         (COMPLETED, now, now + ttl_s if ttl_s else None, inference_time_s, video_id))

    def fail(self, video_id: str, code: str, message: str, *, ttl_s: int | None) -> None:
        """-> failed with error {code, message}; the job (and its files) expire like completed ones."""
        now = int(time.time())
        self._db.execute("UPDATE videos SET status = ?, error = ?, completed_at = ?, expires_at = ? WHERE id = ?",
                         (FAILED, json.dumps({"code": code, "message": message}), now,
                          now + ttl_s if ttl_s else None, video_id))

    def delete(self, video_id: str) -> bool:
        """Removes the job and its files; False if there was no such job."""
        gone = self._db.execute("DELETE FROM videos WHERE id = ?", (video_id,)).rowcount == 1
        self._remove_files(video_id)
        return gone

    def delete_expired(self, now: float | None = None) -> list[str]:
        """Deletes every job whose `expires_at` has passed (rows and files); returns their ids."""
        cutoff = int(now if now is not None else time.time())
        expired = [r[0] for r in self._db.execute("SELECT id FROM videos WHERE expires_at IS NOT NULL "
                                                  "AND expires_at <= ?", (cutoff,))]
        for video_id in expired:
            self.delete(video_id)
        return expired
