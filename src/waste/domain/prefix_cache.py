"""The prefix cache's bookkeeping: which engine states are stored, under which keys, and
which to evict (docs/ENGINE.md §2 "Prefix cache").

A key is the exact sequence a state covers: one item per evaluated position, the token id,
or for a position an image expanded to, ``("image", digest)``, so that two prompts with the
same placeholder ids but different pictures never share a state. The stored value is opaque
here (the native adapter keeps a snapshot segment, the fake engine nothing but the length);
its ``size`` in bytes, plus what the key's own positions cost in the process
(``position_bytes`` each), is what the capacity counts. An entry may extend a parent entry and
hold only the positions after it (the native adapter's segments share MLA latents this
way), each byte counted once. Eviction is least recently used by bytes, leaf first.
Adapters hold one per engine and call it from the engine's worker thread only.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Generic, Hashable, Iterator, Sequence, TypeVar

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


@attrs.define(eq=False, kw_only=True)
class Entry(Generic[V]):
    """One stored state: the ``length`` positions of its key, of which it holds ``tail``
    (the positions after its parent's) and ``size`` bytes of value; its ``parent`` holds the
    rest. ``counted`` is what the cache counts for it: ``size`` and its tail's key bytes.

    An entry without a parent holds its whole key. ``children`` counts live entries whose
    parent it is: such an entry is not evicted (they would lose their prefix)."""

    tail: Key
    value: V
    size: int
    parent: "Entry[V] | None" = None
    children: int = 0
    counted: int = 0
    length: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.length = len(self.tail) + (self.parent.length if self.parent is not None else 0)

    @property
    def key(self) -> Key:
        """The whole key (built from the chain: for callers and tests, not for lookups)."""
        return tuple(item for link in self.chain() for item in link.tail)

    def chain(self) -> "list[Entry[V]]":
        """The entries whose values restore this one's state, root first."""
        out: list[Entry[V]] = []
        entry: Entry[V] | None = self
        while entry is not None:
            out.append(entry)
            entry = entry.parent
        return out[::-1]


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

    An entry may extend a ``parent`` entry (its key starts with the parent's): it then holds
    only what the parent does not, and each byte is counted once, by the entry holding it.
    Eviction takes the least recently used entry that no other entry extends (leaf first);
    using an entry uses its parents too. ``capacity`` 0 is a cache that is off: it stores
    nothing and finds nothing.

    ``position_bytes`` is what one stored key position costs the process that holds the
    cache (an adapter measures it: a tuple slot and an id object in CPython); each entry
    counts it for its tail, so the keys live inside the capacity too.
    """

    capacity: int
    position_bytes: int = 0
    _lru: "collections.OrderedDict[Entry[V], None]" = attrs.field(
        factory=collections.OrderedDict)
    _bytes: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: Key) -> bool:
        return self.find(tuple(key)) is not None

    def __iter__(self) -> "Iterator[Entry[V]]":
        """The live entries, least recently used first."""
        return iter(list(self._lru))

    def holds(self, entry: Entry[V]) -> bool:
        """Whether ``entry`` is still stored (not evicted)."""
        return entry in self._lru

    def find(self, key: Key) -> Entry[V] | None:
        """The entry stored under exactly ``key`` (not marked as used), or None."""
        matches: dict[int, bool] = {}
        for entry in self._lru:
            if entry.length == len(key) and self._matches(entry, key, matches):
                return entry
        return None

    @staticmethod
    def _matches(entry: Entry[V], key: Key, memo: dict[int, bool]) -> bool:
        """Whether ``key`` starts with ``entry``'s key: its tail, then its parents', each
        entry compared once per lookup (``memo``), so that a lookup is linear in the
        positions stored, not in entries times key length."""
        pending: list[Entry[V]] = []
        link: Entry[V] | None = entry
        ok = True
        while link is not None:
            known = memo.get(id(link))
            if known is not None:
                ok = known
                break
            pending.append(link)
            link = link.parent
        for link in reversed(pending):  # root side first: a mismatch there settles the rest
            if ok:
                start = link.length - len(link.tail)
                ok = key[start:link.length] == link.tail
            memo[id(link)] = ok
        return ok

    def longest_prefix(self, key: Key, *, below: int | None = None) -> Entry[V] | None:
        """The stored entry covering the longest prefix of ``key`` (at most ``below`` items
        when given: an engine must evaluate at least one token after a restore), marked as
        used with its parents; None when nothing matches."""
        limit = len(key) if below is None else min(below, len(key))
        best: Entry[V] | None = None
        memo: dict[int, bool] = {}
        for entry in self._lru:
            n = entry.length
            if n <= limit and (best is None or n > best.length) and self._matches(entry, key, memo):
                best = entry
        if best is not None:
            self._touch(best)
        return best

    def _touch(self, entry: Entry[V]) -> None:
        """Mark ``entry`` and its parents as the most recently used, the root last: of one
        chain the leaf is evicted first, then its parent, once that is a leaf."""
        for link in entry.chain()[::-1]:
            self._lru.move_to_end(link)

    def key_bytes(self, positions: int) -> int:
        """What an entry's tail of ``positions`` key items costs besides its value."""
        return positions * self.position_bytes

    def count_reuse(self, tokens: int) -> None:
        """A generation restored ``tokens`` positions from the cache."""
        if tokens:
            self.hits += 1
            self.reused_tokens += tokens

    def make_room(self, size: int, *, keep: Entry[V] | None = None) -> bool:
        """Evict least recently used leaf entries until ``size`` more bytes fit, never
        ``keep`` or its parents; False (and nothing evicted) when ``size`` cannot fit even
        then."""
        kept = sum(e.counted for e in keep.chain()) if keep is not None and self.holds(keep) else 0
        if size > self.capacity - kept:
            return False
        protected = set(keep.chain()) if keep is not None else set()
        while self._bytes + size > self.capacity:
            victim = next(e for e in self._lru if e.children == 0 and e not in protected)
            self._remove(victim)
            self.evictions += 1
        return True

    def _remove(self, entry: Entry[V]) -> None:
        del self._lru[entry]
        self._bytes -= entry.counted
        if entry.parent is not None:
            entry.parent.children -= 1

    def put(self, key: Key, value: V, size: int, *,
            parent: Entry[V] | None = None) -> Entry[V] | None:
        """Store ``value`` under ``key``, evicting as needed; ``parent`` (a stored entry
        whose key starts ``key``) holds the first ``parent.length`` positions, so ``value``
        holds only the rest. None when ``key`` is already stored or cannot fit at all. Call
        ``make_room(size + key_bytes(positions), keep=parent)`` before building a large
        value, so the old entries are gone before the new one is allocated.

        Raises:
            ValueError: ``parent`` is not stored, or ``key`` does not start with its key.
        """
        key = tuple(key)
        if parent is not None and (not self.holds(parent) or len(key) < parent.length
                                   or not self._matches(parent, key, {})):
            raise ValueError("the parent entry is not stored or is not a prefix of the key")
        start = parent.length if parent is not None else 0
        counted = size + self.key_bytes(len(key) - start)
        if self.find(key) is not None or not self.make_room(counted, keep=parent):
            return None
        entry = Entry(tail=key[start:], value=value, size=size, parent=parent, counted=counted)
        if parent is not None:
            parent.children += 1
        self._lru[entry] = None
        self._bytes += counted
        self._touch(entry)
        return entry

    def clear(self) -> None:
        self._lru.clear()
        self._bytes = 0

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(capacity_bytes=self.capacity, entries=len(self._lru),
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
