"""The prefix cache's bookkeeping (waste.domain.prefix_cache) and the FakeEngine's prefix
reuse, which follows the native adapter's rules (docs/ENGINE.md §2 "Prefix cache")."""

from __future__ import annotations

import pytest

from waste.adapters.fake import FakeEngine, load_script
from waste.domain.ports import Prompt, PromptImage, SamplingParams
from waste.domain.prefix_cache import PrefixCache, checkpoints, image_digest, prompt_key
from waste.domain.xtml.markers import MEDIA_PAD


def test_longest_prefix_wins_and_leaves_a_position_to_evaluate():
    cache: PrefixCache[str] = PrefixCache(capacity=100)
    cache.put((1, 2), "a", 10)
    cache.put((1, 2, 3, 4), "b", 10)
    cache.put((1, 5), "c", 10)
    assert cache.longest_prefix((1, 2, 3, 4, 5)).value == "b"
    assert cache.longest_prefix((1, 2, 3, 4), below=3).value == "a"
    assert cache.longest_prefix((1, 2, 9)).value == "a"
    assert cache.longest_prefix((2, 1)) is None


def test_lru_eviction_by_bytes():
    cache: PrefixCache[str] = PrefixCache(capacity=30)
    cache.put((1,), "a", 10)
    cache.put((2,), "b", 10)
    cache.put((3,), "c", 10)
    assert cache.longest_prefix((1, 0)) is not None  # (1,) is now the most recently used
    cache.put((4,), "d", 15)  # needs 15: evicts (2,) then (3,)
    assert (1,) in cache and (4,) in cache and (2,) not in cache and (3,) not in cache
    stats = cache.stats()
    assert stats.evictions == 2 and stats.bytes == 25 and stats.entries == 2
    assert not cache.put((5,), "e", 31) and (1,) in cache  # larger than everything: refused


def test_a_child_holds_only_its_tail_and_counts_only_its_bytes():
    cache: PrefixCache[str] = PrefixCache(capacity=100)
    root = cache.put((1, 2, 3), "root", 30)
    child = cache.put((1, 2, 3, 4, 5), "child", 12, parent=root)
    assert child.tail == (4, 5) and child.length == 5 and child.key == (1, 2, 3, 4, 5)
    assert child.chain() == [root, child] and root.children == 1
    assert cache.stats().bytes == 42 and cache.stats().entries == 2  # shared bytes once
    assert cache.longest_prefix((1, 2, 3, 4, 5, 6)) is child
    # A key that parts inside the parent's positions never matches the child.
    assert cache.longest_prefix((1, 9, 3, 4, 5, 6)) is None
    assert cache.longest_prefix((1, 2, 3, 4, 9, 6)) is root
    assert (1, 2, 3, 4, 5) in cache and (4, 5) not in cache and (1, 2, 3, 4) not in cache
    assert cache.put((1, 2, 3, 4, 5), "again", 1, parent=root) is None  # already stored


def test_a_parent_must_be_stored_and_a_prefix():
    cache: PrefixCache[str] = PrefixCache(capacity=100)
    root = cache.put((1, 2), "root", 10)
    with pytest.raises(ValueError):
        cache.put((1, 3, 4), "x", 5, parent=root)
    with pytest.raises(ValueError):
        cache.put((1,), "x", 5, parent=root)
    cache.clear()
    with pytest.raises(ValueError):
        cache.put((1, 2, 4), "x", 5, parent=root)


def test_eviction_takes_leaves_first_and_keeps_chains_whole():
    cache: PrefixCache[str] = PrefixCache(capacity=40)
    a = cache.put((1,), "a", 10)
    b = cache.put((1, 2), "b", 10, parent=a)
    c = cache.put((1, 2, 3), "c", 10, parent=b)
    other = cache.put((7,), "other", 10)
    cache.longest_prefix((1, 2, 3, 4))  # the chain a-b-c is now more recent than `other`
    cache.put((8,), "new", 10)  # evicts the least recent leaf: `other`
    assert not cache.holds(other) and all(cache.holds(e) for e in (a, b, c))
    # `a` is the least recently used entry but has children: the chain goes leaf first.
    cache.longest_prefix((8, 0))
    cache.put((9,), "nine", 20)
    assert not cache.holds(c) and not cache.holds(b) and cache.holds(a) and a.children == 0
    assert cache.stats().evictions == 3 and cache.stats().bytes == 40
    # Every live entry's chain is live: no child ever outlives its parent.
    assert all(cache.holds(link) for e in cache for link in e.chain())


def test_make_room_never_evicts_the_kept_chain():
    cache: PrefixCache[str] = PrefixCache(capacity=60)
    a = cache.put((1,), "a", 20)
    b = cache.put((1, 2), "b", 20, parent=a)
    spare = cache.put((5,), "spare", 10)
    assert cache.longest_prefix((1, 2, 3)) is b
    # 10 bytes fit as is, 15 once `spare` goes; 21 would need part of a-b: refused, and
    # nothing evicted.
    assert not cache.make_room(21, keep=b) and cache.holds(spare)
    assert cache.make_room(10, keep=b) and cache.holds(spare)
    assert cache.make_room(15, keep=b) and not cache.holds(spare) and cache.holds(a) and cache.holds(b)
    # Without `keep`, the chain goes leaf first.
    assert cache.make_room(40) and not cache.holds(b) and cache.holds(a)


def test_two_prompts_differing_only_in_image_bytes_never_share_an_entry():
    red = image_digest(b"\xff\0\0" * 4, 2, 2)
    blue = image_digest(b"\0\0\xff" * 4, 2, 2)
    assert red != blue and image_digest(b"\xff\0\0" * 4, 4, 1) != red  # shape counts too
    ids = [5, 6, 9, 7, 8]  # 9: the image placeholder, two positions each
    cache: PrefixCache[str] = PrefixCache(capacity=100)
    stored = prompt_key(ids, 9, [red], [2])
    cache.put(stored[:2], "before", 10)
    cache.put(stored, "red", 10, parent=cache.find(stored[:2]))
    other = prompt_key(ids, 9, [blue], [2])
    assert cache.longest_prefix(other).value == "before"  # only the positions before the image
    assert other not in cache and cache.longest_prefix(stored).value == "red"


def test_a_zero_capacity_cache_is_off():
    cache: PrefixCache[str] = PrefixCache(capacity=0)
    assert not cache.enabled and not cache.put((1,), "a", 1) and cache.longest_prefix((1, 2)) is None


def test_checkpoints():
    assert checkpoints(0, 10, 4) == [4, 8, 10]
    assert checkpoints(8, 10, 4) == [10]
    assert checkpoints(5, 5, 4) == []
    assert checkpoints(0, 8, 4) == [4, 8]
    assert checkpoints(0, 7, 0) == [7]


def test_image_digests_enter_the_key():
    red, blue = image_digest(b"\xff\0\0", 1, 1), image_digest(b"\0\0\xff", 1, 1)
    a = prompt_key([5, 9, 6], 9, [red], [2])
    b = prompt_key([5, 9, 6], 9, [blue], [2])
    assert a == (5, ("image", red), ("image", red), 6) and a[:1] == b[:1] and a[:2] != b[:2]
    assert prompt_key([5, 6], 9, [], []) == (5, 6)


def _fake(**kw):
    return FakeEngine(load_script("builtin"), **kw)


def _run(engine, ids, images=()):
    return engine.generate(Prompt(ids=tuple(ids), images=tuple(images)),
                           SamplingParams(temperature=0.0, max_tokens=8), lambda e: False)


def _text(engine, text):
    return engine.tokenize_markup(text)


def test_the_fake_reuses_prefixes_like_the_native_adapter():
    engine = _fake(prefix_interval=8)
    ids = _text(engine, "hello there, how are you doing today my friend")
    first = _run(engine, ids)
    assert first.cached_tokens == 0 and engine.record.prefilled[-1] == len(ids)
    again = _run(engine, ids)
    assert again.cached_tokens == len(ids) - 1 and engine.record.prefilled[-1] == 1
    # The next turn: the prompt plus the reply plus new text reuses prompt + reply - 1.
    reply = engine.record.generated[-1]
    assert reply > 1
    delivered = _replies(engine)
    turn = ids + delivered + _text(engine, " and more")
    third = _run(engine, turn)
    assert third.cached_tokens == len(ids) + len(delivered) - 1
    # A prompt parting from the stored ones inside a long prompt reuses the last checkpoint.
    parted = ids[:17] + _text(engine, " something else")
    assert _run(engine, parted).cached_tokens == 16
    assert engine.statistics().prefix_cache.hits == 4  # _replies ran the prompt once more


def _replies(engine):
    """The tokens the last generation delivered (the fake's scripted reply)."""
    seen = []
    engine.generate(Prompt(ids=tuple(engine.record.prompts[-1])),
                    SamplingParams(temperature=0.0, max_tokens=8),
                    lambda e: seen.append(e.token) and False)
    return seen


def test_the_fake_keys_images_by_digest():
    engine = _fake(vision=True)
    pad = engine.special_id(MEDIA_PAD)
    ids = _text(engine, "look at") + [pad] + _text(engine, " this picture please")
    red = PromptImage(rgb=b"\xff\0\0" * 4, width=2, height=2)
    blue = PromptImage(rgb=b"\0\0\xff" * 4, width=2, height=2)
    _run(engine, ids, [red])
    assert _run(engine, ids, [red]).cached_tokens == len(engine.record.prompts[-1]) - 1
    other = _run(engine, ids, [blue])
    assert other.cached_tokens == 0  # the same ids, another picture: only a checkpoint before it could match


def test_a_fake_cache_too_small_for_one_entry_is_off():
    engine = _fake(prefix_cache=100)
    ids = _text(engine, "hello there")
    _run(engine, ids)
    assert _run(engine, ids).cached_tokens == 0 and not engine.prefix_cache.enabled


def test_key_positions_count_inside_the_capacity():
    # 10 bytes a position: an entry of value 20 and 3 own positions counts 50
    cache: PrefixCache[str] = PrefixCache(capacity=100, position_bytes=10)
    root = cache.put((1, 2, 3), "a", 20)
    assert root is not None and root.counted == 50 and cache.bytes == 50
    child = cache.put((1, 2, 3, 4), "b", 5, parent=root)  # its tail is one position
    assert child is not None and child.counted == 15 and cache.bytes == 65
    # 30 + 2 × 10 = 50 more does not fit beside 65: the leaf goes first, then it fits
    assert cache.put((7, 8), "c", 30) is not None
    assert not cache.holds(child) and cache.holds(root) and cache.bytes == 100
    # a value that fits the capacity alone but not with its key positions is refused
    assert cache.put(tuple(range(9)), "d", 20) is None
