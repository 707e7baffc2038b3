"""Prefix cache: KV caches of prompt prefixes that later prompts start with (a chat template's fixed system
prompt; a conversation's previous turn), so a prefill computes only what follows the prefix.

A request names which leading lengths of its prompt ids are worth keeping (`Prompt.cache_prefixes`, e.g.
the chat template up to the first user text, and the whole prompt, which the conversation's next turn
starts with). After its prefill the runner stores those prefixes' keys and values here; a later prompt
that starts with the same ids (and is longer) is prefilled from the longest of them. Causal attention
makes a prefix's keys/values independent of what follows, so the result is the same computation as a
full prefill (the tokens match; logits may differ in the last float bits because the matrix shapes
differ). Entries are exact token-id sequences; least recently used ones are dropped beyond `max_entries`
or `max_tokens`. Not thread-safe: the engine thread owns it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from omni_backends.engine.kv_batch import LayerKV


class PrefixCache:
    """Token-id prefix -> per-layer (keys, values), each float [1, kv_heads, prefix_len, head_dim].

    max_entries: most prefixes kept.
    max_tokens: most prefix tokens kept in all (the memory bound: each token costs layers * 2 * kv_heads *
        head_dim floats; SmolLM2-135M: ~46 KB, so the default 8192 is ~380 MB); the newest entry is kept
        even when it alone is longer.
    Counters `hits` / `misses` count `lookup` results; `tokens` is what is kept now.
    Raises ValueError for max_entries or max_tokens < 1.
    """

    def __init__(self, max_entries: int = 8, max_tokens: int = 8192) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_entries, self.max_tokens = max_entries, max_tokens
        self.tokens = 0
        self._entries: OrderedDict[tuple[int, ...], list[LayerKV]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[tuple[int, ...], list[LayerKV]] | None:
        """The longest stored prefix of `ids` that leaves at least one token to feed, with its layers; None if none."""
        best = None
        for key in self._entries:
            if len(key) < len(ids) and (best is None or len(key) > len(best)) and tuple(ids[:len(key)]) == key:
                best = key
        if best is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(best)
        return best, self._entries[best]

    def __contains__(self, ids: Sequence[int]) -> bool:
        return tuple(ids) in self._entries

    def store(self, ids: Sequence[int], layers: list[LayerKV]) -> None:
        """Keep `layers` (copied) as the cache of prefix `ids`; drops the least recently used entries while more
        than `max_entries` or `max_tokens` are kept."""
        key = tuple(int(i) for i in ids)
        if not key:
            return
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = [(k.detach().clone(), v.detach().clone()) for k, v in layers]
        self.tokens += len(key)
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self.tokens > self.max_tokens):
            self.tokens -= len(self._entries.popitem(last=False)[0])
