"""Short-lived in-memory store of generated image files, for `response_format: "url"`.

Each image gets an unguessable id (128 random bits); `GET /files/images/{id}` serves it until it expires
(`ttl_s`, default 10 minutes) or until `max_items` newer images pushed it out. Nothing is written to disk.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict


class ImageStore:
    def __init__(self, ttl_s: float = 600.0, max_items: int = 512):
        self.ttl_s, self.max_items = ttl_s, max_items
        self._items: OrderedDict[str, tuple[float, bytes, str]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, data: bytes, content_type: str) -> tuple[str, int]:
        """Store one file; returns (id, expiry as unix seconds)."""
        key = secrets.token_urlsafe(16)
        expires = time.time() + self.ttl_s
        with self._lock:
            self._items[key] = (expires, data, content_type)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return key, int(expires)

    def get(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, content type) of a live entry, None when unknown or expired (expired entries are dropped)."""
        now = time.time()
        with self._lock:
            for old in [k for k, (expires, _, _) in self._items.items() if expires <= now]:
                del self._items[old]
            found = self._items.get(key)
        return None if found is None else (found[1], found[2])
