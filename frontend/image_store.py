"""Short-lived in-memory store of generated image files, for `response_format: "url"`.

Each image gets an unguessable id (128 random bits); `GET /files/images/{id}` serves it until it expires
(`ttl_s`, default 10 minutes) or until newer images pushed it out: the store keeps at most `max_items`
images of at most `max_bytes` together (default 256 MiB; 512 full-size 1024x1024 PNGs of ~1.5-3 MB each
were up to 1.5 GB of the frontend's memory). Nothing is written to disk.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict


class ImageStore:
    def __init__(self, ttl_s: float = 600.0, max_items: int = 512, max_bytes: int = 256 * 1024 * 1024):
        self.ttl_s, self.max_items, self.max_bytes = ttl_s, max_items, max_bytes
        self._items: OrderedDict[str, tuple[float, bytes, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, data: bytes, content_type: str) -> tuple[str, int]:
        """Store one file; returns (id, expiry as unix seconds)."""
        key = secrets.token_urlsafe(16)
        expires = time.time() + self.ttl_s
        with self._lock:
            self._items[key] = (expires, data, content_type)
            self._bytes += len(data)
            while len(self._items) > self.max_items or (self._bytes > self.max_bytes and len(self._items) > 1):
                self._bytes -= len(self._items.popitem(last=False)[1][1])
        return key, int(expires)

    def get(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, content type) of a live entry, None when unknown or expired (expired entries are dropped)."""
        now = time.time()
        with self._lock:
            for old in [k for k, (expires, _, _) in self._items.items() if expires <= now]:
                self._bytes -= len(self._items.pop(old)[1])
            found = self._items.get(key)
        return None if found is None else (found[1], found[2])
