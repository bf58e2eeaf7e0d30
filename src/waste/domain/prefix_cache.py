"""The prefix cache's bookkeeping: which engine states are stored, under which keys, and
which to evict (docs/ENGINE.md §2 "Prefix cache").

A key is the exact sequence a state covers: one item per evaluated position, the token id,
or for a position an image expanded to, ``("image", digest)``, so that two prompts with the
same placeholder ids but different pictures never share a state. The stored value is opaque
here (the native adapter keeps a snapshot buffer, the fake engine nothing but the length);
its ``size`` in bytes is what the capacity counts. Eviction is least recently used, by
bytes. Adapters hold one per engine and call it from the engine's worker thread only.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Generic, Hashable, Sequence, TypeVar

import attrs

Key = tuple[Hashable, ...]
V = TypeVar("V")


def image_digest(rgb: bytes, width: int, height: int) -> str:
    """A digest naming one image's pixels and shape (sha256, hex)."""
    h = hashlib.sha256()
    h.update(f"{width}x{height}:".encode("ascii"))
    h.update(rgb)
    return h.hexdigest()


def prompt_key(ids: Sequence[int], placeholder: int | None, digests: Sequence[str],
               positions: Sequence[int]) -> Key:
    """The key of a prompt whose ``placeholder`` ids stand for images: each placeholder
    becomes ``positions[i]`` items ``("image", digests[i])``, as the engine expands it."""
    if not digests:
        return tuple(ids)
    out: list[Hashable] = []
    n = 0
    for token in ids:
        if token == placeholder and n < len(digests):
            out.extend([("image", digests[n])] * positions[n])
            n += 1
        else:
            out.append(token)
    return tuple(out)


@attrs.define(eq=False)
class Entry(Generic[V]):
    key: Key
    value: V
    size: int


@attrs.frozen(kw_only=True)
class PrefixCacheStats:
    """What /metrics and the ``waste`` object report about the cache."""

    capacity_bytes: int = 0
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0


@attrs.define(eq=False, kw_only=True)
class PrefixCache(Generic[V]):
    """Entries keyed by exact sequences, at most ``capacity`` bytes in all, LRU by bytes.

    ``capacity`` 0 is a cache that is off: it stores nothing and finds nothing.
    """

    capacity: int
    _entries: "collections.OrderedDict[Key, Entry[V]]" = attrs.field(
        factory=collections.OrderedDict)
    _bytes: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return tuple(key) in self._entries

    def longest_prefix(self, key: Key, *, below: int | None = None) -> Entry[V] | None:
        """The stored entry covering the longest prefix of ``key`` (at most ``below`` items
        when given: an engine must evaluate at least one token after a restore), marked as
        used; None when nothing matches."""
        limit = len(key) if below is None else min(below, len(key))
        best: Entry[V] | None = None
        for entry in self._entries.values():
            n = len(entry.key)
            if n <= limit and (best is None or n > len(best.key)) and key[:n] == entry.key:
                best = entry
        if best is not None:
            self._entries.move_to_end(best.key)
        return best

    def count_reuse(self, tokens: int) -> None:
        """A generation restored ``tokens`` positions from the cache."""
        if tokens:
            self.hits += 1
            self.reused_tokens += tokens

    def make_room(self, size: int) -> bool:
        """Evict least recently used entries until ``size`` more bytes fit; False (and
        nothing evicted) when ``size`` exceeds the whole capacity."""
        if size > self.capacity:
            return False
        while self._bytes + size > self.capacity and self._entries:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.size
            self.evictions += 1
        return True

    def put(self, key: Key, value: V, size: int) -> bool:
        """Store ``value`` under ``key`` (replacing an entry with the same key), evicting as
        needed; False when it cannot fit at all. Call ``make_room(size)`` before building a
        large value, so the old entries are gone before the new one is allocated."""
        key = tuple(key)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        if not self.make_room(size):
            return False
        self._entries[key] = Entry(key, value, size)
        self._bytes += size
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(capacity_bytes=self.capacity, entries=len(self._entries),
                                bytes=self._bytes, hits=self.hits,
                                reused_tokens=self.reused_tokens, evictions=self.evictions)


def checkpoints(start: int, end: int, interval: int) -> list[int]:
    """Where a prefill from ``start`` to ``end`` stores states: every multiple of
    ``interval`` strictly between them, and ``end`` itself when it lies beyond ``start``."""
    points = []
    if interval > 0:
        p = (start // interval + 1) * interval
        while p < end:
            points.append(p)
            p += interval
    if end > start:
        points.append(end)
    return points


__all__ = ["PrefixCache", "PrefixCacheStats", "Entry", "Key", "prompt_key", "image_digest",
           "checkpoints"]
