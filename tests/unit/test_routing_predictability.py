"""bench/routing_predictability.py's metrics on hand-made routings with known answers (no
model is loaded: the script imports torch and transformers only inside its model functions)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("routing_predictability",
                                                  ROOT / "bench" / "routing_predictability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rp = _bench()


def test_ranked_topk_orders_best_first_and_masks_groups():
    scores = np.array([[0.1, 0.9, 0.5, 0.3],
                       [0.8, 0.2, 0.7, 0.75]])
    assert rp.ranked_topk(scores, 2).tolist() == [[1, 2], [0, 3]]
    # Groups {0,1} and {2,3}: row 0 scores them 1.0 and 0.8, row 1 1.0 and 1.45; one group kept.
    assert rp.ranked_topk(scores, 2, n_group=2, topk_group=1).tolist() == [[1, 0], [3, 2]]


def test_overlap_identical_disjoint_and_partial():
    truth = np.array([[0, 1], [2, 3], [4, 5]])
    assert rp.set_overlap(truth, truth).mean() == 1.0
    assert rp.set_overlap(truth[:, ::-1], truth).mean() == 1.0  # order does not matter to the set
    assert rp.set_overlap(np.array([[6, 7], [0, 1], [2, 3]]), truth).mean() == 0.0
    guess = np.array([[0, 7], [6, 3], [5, 4]])
    assert rp.set_overlap(guess, truth).tolist() == [0.5, 0.5, 1.0]
    # By rank: the guess's first pick is right in rows 0 and 2, its second in rows 1 and 2.
    assert rp.rank_hits(guess, truth).mean(axis=0).tolist() == pytest.approx([2 / 3, 2 / 3])


def test_chance_level():
    assert rp.chance_overlap(2, 8) == 0.25
    # A uniform random guess does reach it.
    rng = np.random.default_rng(0)
    guess = np.array([rng.choice(8, 2, replace=False) for _ in range(4000)])
    truth = np.array([rng.choice(8, 2, replace=False) for _ in range(4000)])
    assert rp.set_overlap(guess, truth).mean() == pytest.approx(0.25, abs=0.02)


def test_locality_alternating_is_zero_and_constant_is_one():
    alternating = np.array([[0, 1], [2, 3]] * 5)
    assert rp.temporal_locality([alternating], 8) == 0.0
    constant = np.array([[4, 5]] * 6)
    assert rp.temporal_locality([constant], 8) == 1.0
    # Half the uses repeat: {0,1} -> {0,2} -> {0,3}: 2 of 4 uses carry over.
    assert rp.temporal_locality([np.array([[0, 1], [0, 2], [0, 3]])], 8) == 0.5


def test_locality_does_not_cross_sequences():
    # Each sequence alone alternates; glued, the boundary would add a repeat of {0, 1}.
    a = np.array([[2, 3], [0, 1]])
    b = np.array([[0, 1], [2, 3]])
    assert rp.temporal_locality([a, b], 4) == 0.0
    assert rp.temporal_locality([np.concatenate([a, b])], 4) == pytest.approx(2 / 6)


def test_independent_locality_by_hand():
    # Two experts a token of four: rates 1/2 each is uniform, so a repeat has chance 1/2.
    assert rp.independent_locality(np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
    # Rates 1, 1/2, 1/2, 0 (top-2 of 4): (1 + 1/4 + 1/4) / 2 = 0.75.
    assert rp.independent_locality(np.array([1.0, 0.5, 0.5, 0.0])) == 0.75
    sel = np.array([[0, 1], [0, 2], [0, 1], [0, 2]])
    assert rp.expert_rates(sel, 4).tolist() == [1.0, 0.5, 0.5, 0.0]


def test_top_quarter_share():
    assert rp.top_quarter_share(np.array([[0, 1], [2, 3], [4, 5], [6, 7]]), 8) == 0.25
    # Expert 0 in every one of 4 tokens, 8 selections: the top quarter (2 experts) take 0 and 1.
    assert rp.top_quarter_share(np.array([[0, 1], [0, 1], [0, 2], [0, 3]]), 8) == 6 / 8


def test_distance_summary_pools_pairs():
    hits = {(0, 0): np.ones((2, 2), bool), (1, 1): np.ones((2, 2), bool),
            (0, 1): np.array([[True, False], [True, True]])}
    out = rp.summarize_distances(hits)
    assert out[0]["accuracy"] == 1.0 and out[0]["pairs"] == 2
    assert out[1]["accuracy"] == 0.75 and out[1]["by_rank"] == [1.0, 0.5]


def test_mean_cosine():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert rp.mean_cosine(a, a) == pytest.approx(1.0)
    assert rp.mean_cosine(a, np.array([[0.0, 1.0], [0.0, -1.0]])) == pytest.approx(-0.5)


def test_popular_experts_most_used_first():
    # Uses: expert 3 four times, 1 twice, 2 and 0 once.
    sel = np.array([[3, 1], [3, 2], [3, 1], [0, 3]])
    assert rp.popular_experts(sel, 4, 2).tolist() == [3, 1]
    # Scored as a static guess: rank 1 (expert 3) is always right, rank 2 (expert 1) half the time.
    static = np.tile(rp.popular_experts(sel, 4, 2), (4, 1))
    assert rp.rank_hits(static, sel).mean(axis=0).tolist() == [1.0, 0.5]
