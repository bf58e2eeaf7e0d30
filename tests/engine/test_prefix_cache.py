"""The native adapter's prefix cache (docs/ENGINE.md §2 "Prefix cache"): a restored prefix
plus the rest gives logits byte-identical to one fresh prefill of the whole prompt, with
chunked prefill and after eviction; generations with the cache equal those without it; the
budget is shared honestly. The oracle is libwaste's own fresh prefill on a second context
that has no cache (the snapshot route vs the plain route, docs/ENGINE.md §7)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from tests.engine.test_invariants import prompt_of, same_bytes
from waste.domain.ports import BudgetExceeded, Prompt, SamplingParams
from waste.domain.prefix_cache import checkpoints
from waste.tools.make_container import Geometry, build_container

CTX = 512
BUDGET = 256 << 20  # above the tiny container's automatic budget, so the cache has room


@pytest.fixture(scope="module")
def native(libwaste):
    from waste.adapters import native

    return native


def open_engine(native, path, **options):
    opts = dict(ctx_tokens=CTX, usage_path="", prefix_cache=0, ram_budget_bytes=BUDGET)
    opts.update(options)
    return native.NativeEngine.open(path, native.NativeOptions(**opts))


def greedy(engine, ids, max_tokens=6):
    events = []
    result = engine.generate(Prompt(ids=tuple(ids)), SamplingParams(temperature=0.0, max_tokens=max_tokens),
                             lambda e: events.append((e.token, e.logprob)) and False)
    return result, events


@pytest.fixture(scope="module")
def k3_container(synthetic_dir, libwaste):
    """A tiny Kimi K3 container (every K3 delta on, arch kimi_k3)."""
    out = synthetic_dir / "k3-f32.waste"
    return out if out.exists() else build_container(out, seed=3, geometry=Geometry(k3=True))


@pytest.fixture(scope="module", params=["kimi_linear", "kimi_k3"])
def container(request, synthetic_f32, k3_container):
    return synthetic_f32 if request.param == "kimi_linear" else k3_container


@pytest.fixture(scope="module")
def reference(native, container):
    """A context without a cache on the same container: fresh prefills are the oracle."""
    engine = open_engine(native, container)
    yield engine
    engine.close()


def fresh(reference, ids):
    reference.reset()
    return reference.eval(ids)


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_restored_prefix_plus_rest_equals_fresh_prefill(native, container, reference, chunk,
                                                        request):
    engine = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=16,
                         prefill_chunk=chunk)
    try:
        ids = prompt_of(70, engine.model_info().vocab)
        assert engine.model_info().arch == request.node.callspec.params["container"]
        result, _ = greedy(engine, ids)
        assert result.cached_tokens == 0 and result.prompt_tokens == 70
        # Stored: every 16 tokens inside the prompt, the prompt's end (less one), the reply.
        stored = sorted(e.length for e in engine.prefix_cache)
        assert stored[:-1] == checkpoints(0, 69, 16) and stored[-1] == 70 + 6 - 1
        # A longer prompt sharing 50 tokens restores 48 (the last checkpoint inside them).
        longer = ids[:50] + prompt_of(30, engine.model_info().vocab, seed=8)
        engine.reset()
        assert engine.restore_prefix(tuple(longer)) == 48
        assert same_bytes(engine.eval(longer[48:]), fresh(reference, longer))
        # The same prompt again restores all but its last token.
        engine.reset()
        assert engine.restore_prefix(tuple(ids)) == 69
        assert same_bytes(engine.eval(ids[69:]), fresh(reference, ids))
    finally:
        engine.close()


def test_generations_with_and_without_the_cache_are_equal(native, container):
    with_cache = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=16)
    without = open_engine(native, container)
    try:
        vocab = with_cache.model_info().vocab
        turn, expected = prompt_of(40, vocab), 0
        for n in range(4):  # a conversation: each prompt extends the previous reply
            a, ea = greedy(with_cache, turn)
            b, eb = greedy(without, turn)
            assert ea == eb and a.tokens_generated == b.tokens_generated
            assert a.cached_tokens == expected and b.cached_tokens == 0
            reply = [t for t, _ in ea]
            expected = len(turn) + len(reply) - 1  # the reply's last token was never evaluated
            turn = turn + reply + prompt_of(5, vocab, seed=20 + n)
        stats = with_cache.statistics().prefix_cache
        assert stats.hits == 3 and stats.reused_tokens > 0 and stats.entries > 0
    finally:
        with_cache.close()
        without.close()


def test_eviction_keeps_restores_exact(native, container, reference):
    engine = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=0)
    try:
        vocab = engine.model_info().vocab
        prompts = [prompt_of(60, vocab, seed=s) for s in range(3)]
        greedy(engine, prompts[0], max_tokens=1)
        one_entry = engine.prefix_cache.stats().bytes
        # Room for about two entries of this size: the third prompt evicts the first's.
        engine.prefix_cache.capacity = 2 * one_entry + one_entry // 2
        for ids in prompts[1:]:
            greedy(engine, ids, max_tokens=1)
        stats = engine.prefix_cache.stats()
        assert stats.evictions >= 1 and stats.bytes <= stats.capacity_bytes
        engine.reset()
        assert engine.restore_prefix(tuple(prompts[0])) == 0  # evicted
        result, _ = greedy(engine, prompts[0], max_tokens=1)
        assert result.cached_tokens == 0
        engine.reset()
        assert engine.restore_prefix(tuple(prompts[0])) == 59  # stored again, exact again
        assert same_bytes(engine.eval(prompts[0][59:]), fresh(reference, prompts[0]))
    finally:
        engine.close()


def test_cache_bytes_come_out_of_the_budget(native, synthetic_f32):
    plan = native.plan_memory(synthetic_f32, native.NativeOptions(ctx_tokens=CTX, ram_budget_bytes=BUDGET))
    room = plan.budget_bytes - plan.floor_bytes
    default = native.plan_prefix_cache(plan, native.NativeOptions(ctx_tokens=CTX, ram_budget_bytes=BUDGET, prefix_cache=None))
    assert default.bytes == min(plan.budget_bytes // 8, room)
    assert default.engine_budget_bytes == plan.budget_bytes - default.bytes
    tiny = native.plan_prefix_cache(plan, native.NativeOptions(ctx_tokens=CTX, ram_budget_bytes=BUDGET, prefix_cache=1024))
    assert tiny.bytes == 0 and "cannot hold one entry" in tiny.note
    with pytest.raises(BudgetExceeded, match="--prefix-cache"):
        native.plan_prefix_cache(plan, native.NativeOptions(ctx_tokens=CTX, ram_budget_bytes=BUDGET, prefix_cache=room + 1))
    engine = open_engine(native, synthetic_f32, prefix_cache=None)
    try:
        stats = engine.statistics()
        assert engine.prefix_cache.capacity == default.bytes
        # libwaste was opened with the rest; the total reported is the whole budget.
        assert stats.budget_bytes == plan.budget_bytes
        assert stats.peak_bytes <= default.engine_budget_bytes
    finally:
        engine.close()


def test_a_cache_too_small_for_one_entry_is_off(native, synthetic_f32):
    engine = open_engine(native, synthetic_f32, prefix_cache=1024)
    try:
        assert not engine.prefix_cache.enabled and "cannot hold one entry" in engine.prefix_plan.note
        ids = prompt_of(30, engine.model_info().vocab)
        greedy(engine, ids)
        result, _ = greedy(engine, ids)
        assert result.cached_tokens == 0 and len(engine.prefix_cache) == 0
    finally:
        engine.close()


def test_logprobs_are_those_of_a_fresh_prefill(native, container, reference):
    """The first token after a restore is the argmax of a fresh prefill's logits."""
    engine = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=16)
    try:
        ids = prompt_of(45, engine.model_info().vocab)
        greedy(engine, ids)
        result, events = greedy(engine, ids, max_tokens=1)
        assert result.cached_tokens == 44
        logits = np.asarray(fresh(reference, ids), np.float64)
        assert events[0][0] == int(np.argmax(logits))
    finally:
        engine.close()


def test_the_server_says_at_start_whether_the_cache_is_on(native, synthetic_f32, caplog):
    """open_native (the server's opener) logs the cache's size, or why it is off."""
    from waste.app.settings import Settings

    def opened(**flags):
        caplog.clear()
        settings = Settings(model=str(synthetic_f32), ctx=CTX, usage="", budget=BUDGET, **flags)
        with caplog.at_level("INFO", logger="waste.engine"):
            engine, tokenizer = native.open_native(synthetic_f32, settings)
        engine.close()
        tokenizer.close()
        return " ".join(r.getMessage() for r in caplog.records if "prefix cache" in r.getMessage())

    assert f"prefix cache: {2 << 20} bytes of the budget" in opened(prefix_cache=2 << 20)
    assert "prefix cache off: 1024 bytes cannot hold one entry" in opened(prefix_cache=1024)
    assert "prefix cache off (--prefix-cache 0)" in opened(prefix_cache=0)


def _restores_exactly(engine, reference, key):
    """Restore ``key``'s longest stored prefix; the logits of the rest equal a fresh prefill."""
    engine.reset()
    n = engine.restore_prefix(tuple(key))
    assert same_bytes(engine.eval(list(key[n:])), fresh(reference, list(key)))
    return n


def _chains_are_whole(cache):
    """Every live entry's parents are live, and the bytes are each entry's own, once."""
    entries = list(cache)
    assert all(cache.holds(link) for e in entries for link in e.chain())
    assert cache.stats().bytes == sum(e.counted for e in entries) <= cache.capacity
    assert all(e.children == sum(1 for c in entries if c.parent is e) for e in entries)


def test_entries_of_a_conversation_share_their_latents(native, container, reference):
    """Each entry holds the latents of its own positions only (docs/FORMAT.md §7.1): a
    whole snapshot less the parent's positions; a child restores exactly through its chain."""
    engine = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=16)
    try:
        vocab = engine.model_info().vocab
        ids = prompt_of(70, vocab)
        greedy(engine, ids)
        entries = sorted(engine.prefix_cache, key=lambda e: e.length)
        assert [e.length for e in entries] == [16, 32, 48, 64, 69, 75]
        assert entries[0].parent is None
        assert all(e.parent is p for p, e in zip(entries, entries[1:]))
        # Bytes per position of a whole snapshot (ids + every MLA layer's latents).
        per_position = (entries[1].value.whole_bytes - entries[0].value.whole_bytes) // 16
        assert per_position > 4
        for e in entries[1:]:  # the parent's positions are not stored again (48 − 32: headers)
            assert e.value.whole_bytes - e.value.length == e.parent.length * per_position - 16
        # The cache counts each segment's pages, once, and its own key positions.
        stored, unshared = engine.prefix_cache_sharing()
        assert stored == sum(e.counted for e in entries) < unshared
        assert all(e.size == -(-e.value.length // mmap.PAGESIZE) * mmap.PAGESIZE for e in entries)
        key_bytes = native.engine.KEY_POSITION_BYTES
        assert all(e.counted == e.size + key_bytes * len(e.tail) for e in entries)
        _chains_are_whole(engine.prefix_cache)
        # Restores from the leaf (six segments), from the middle, and parting inside a parent.
        assert _restores_exactly(engine, reference, ids + prompt_of(3, vocab, seed=9)) == 69
        assert _restores_exactly(engine, reference, ids[:40] + prompt_of(9, vocab, seed=4)) == 32
        assert _restores_exactly(engine, reference, ids[:20]) == 16
        # The next turn extends the chain from the restored entry.
        turn = ids + prompt_of(30, vocab, seed=11)
        result, events = greedy(engine, turn, max_tokens=2)
        assert result.cached_tokens == 69
        new = [e for e in engine.prefix_cache if e.length > 75]
        assert new and min(new, key=lambda e: e.length).parent.length == 69
        reply = turn + [events[0][0]]  # stored at the generation's end, on the new chain
        assert _restores_exactly(engine, reference, reply + [5]) == len(reply)
    finally:
        engine.close()


def test_eviction_of_parents_and_children_keeps_restores_exact(native, container, reference):
    """A cache too small for two conversations evicts leaves first (no child outlives its
    parent), a chain that fills the cache continues as a new root, and every restore left
    is exact."""
    engine = open_engine(native, container, prefix_cache=64 << 20, prefix_interval=8)
    try:
        vocab = engine.model_info().vocab
        first = prompt_of(40, vocab, seed=1)
        greedy(engine, first, max_tokens=1)
        one_conversation = engine.prefix_cache.stats().bytes
        engine.prefix_cache.capacity = one_conversation + one_conversation // 3
        second = prompt_of(40, vocab, seed=2)
        greedy(engine, second, max_tokens=1)
        stats = engine.prefix_cache.stats()
        assert stats.evictions >= 1
        _chains_are_whole(engine.prefix_cache)
        # The first conversation lost its leaves (its latest positions) before its root.
        kept_first = [e.length for e in engine.prefix_cache if e.key == tuple(first[:e.length])]
        assert kept_first and kept_first == list(range(8, 8 * len(kept_first) + 1, 8))
        for key in (first, second):
            _restores_exactly(engine, reference, key)
        # Grow the second conversation until its own chain fills the cache: entries go on
        # as new roots (whole states), never past the capacity, and stay exact.
        turn = second
        for n in range(4):
            turn = turn + prompt_of(24, vocab, seed=30 + n)
            greedy(engine, turn, max_tokens=1)
            _chains_are_whole(engine.prefix_cache)
        roots = [e for e in engine.prefix_cache if e.parent is None]
        assert any(e.length > 40 for e in roots)
        assert _restores_exactly(engine, reference, turn + [7]) == len(turn)
    finally:
        engine.close()
