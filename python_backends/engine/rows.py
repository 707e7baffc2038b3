"""Request ids in row order with each request's cached length: the bookkeeping both KV stores share."""
from __future__ import annotations


class RequestRows:
    """Rows (KVBatch) or slots (StaticKVCache) of live requests; `_ids[i]` holds `_lengths[i]` cached tokens.
    Not thread-safe: one engine thread owns it."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._lengths: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    @property
    def request_ids(self) -> list[str]:
        """Request ids in row order (a copy)."""
        return list(self._ids)

    def length(self, request_id: str) -> int:
        """Cached tokens of a live request. Raises KeyError when it is not live."""
        return self._lengths[self._row(request_id)]

    def _row(self, request_id: str) -> int:
        try:
            return self._ids.index(request_id)
        except ValueError:
            raise KeyError(request_id) from None
