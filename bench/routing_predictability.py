"""How predictable a Kimi-Linear MoE model's expert routing is, across layers and across tokens.

The engine guesses the experts of MoE layer l+d while it computes layer l: it applies layer
l+d's router (sigmoid scores + ``e_score_correction_bias``, group mask, top_k) to layer l's
FFN input, the post-attention-norm tensor layer l's own router sees. This script runs a
checkpoint (or, with ``--random-init``, the same config with fresh seeded weights: the control)
in float32 over a few thousand tokens, captures every sparse layer's router input and true
selection, and reports:

* cross-layer accuracy, for each distance d = 0, 1, 2, ...: mean over tokens and layer pairs of
  |guess ∩ true| / top_k, the same by the guess's rank (is its r-th pick in the true set), and
  the chance level top_k / n_experts (d = 0 applies a layer's router to its own input: 1.0);
* temporal locality per sparse layer: P(e used by token t+1 | e used by token t), pooled over
  the (token, expert) pairs of each sequence, against the value for independent tokens with
  the same per-expert rates, sum_e p_e^2 / sum_e p_e;
* skew per sparse layer: the share of selections taken by the most used quarter of experts.

Tokens: the demo model's own held-out conversations, encoded as it was trained
(``waste.tools.demo_train.encode``), or ``--ids-file`` (a JSON list of ids, or a list of such
lists, one a sequence). Ids at or above a model's vocabulary are folded into it (``id % vocab``)
so the same text drives a model with a smaller vocabulary; equal tokens stay equal. ``--seed``
seeds only the random init and ``--text-seed`` only the conversations, so controls of
different seeds see the same tokens.

    .venv/bin/python bench/routing_predictability.py data/demo-model
    .venv/bin/python bench/routing_predictability.py data/demo-model --random-init --seed 1
    .venv/bin/python bench/routing_predictability.py /tmp/b2/kimi-linear-h1024.hf --tokens 200

Prints one line per metric and, last, one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# -- pure metrics (numpy; the unit tests hold them to hand-made answers) -----------------------


def ranked_topk(scores_for_choice: np.ndarray, top_k: int, n_group: int = 1, topk_group: int = 1) -> np.ndarray:
    """[T, top_k] expert ids, best first, as KimiLinearTopkRouter selects them: each group
    scored by the sum of its best two choice scores, only the ``topk_group`` best groups kept,
    then the ``top_k`` best experts of those. (The router's own top_k is unsorted; the rank is
    what the by-rank accuracy needs.)"""
    scores = np.asarray(scores_for_choice, dtype=np.float64)
    n_tokens, n_experts = scores.shape
    if n_group > 1:
        grouped = scores.reshape(n_tokens, n_group, n_experts // n_group)
        group_scores = -np.sort(-grouped, axis=-1)[..., :2].sum(-1)
        kept_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, :topk_group]
        group_mask = np.zeros((n_tokens, n_group), dtype=bool)
        np.put_along_axis(group_mask, kept_groups, True, axis=1)
        scores = np.where(np.repeat(group_mask, n_experts // n_group, axis=1), scores, -np.inf)
    return np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]


def set_overlap(guess: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per token, |guess ∩ true| / top_k ([T] floats; both [T, top_k] ids)."""
    return rank_hits(guess, true).mean(axis=1)


def rank_hits(guess: np.ndarray, true: np.ndarray) -> np.ndarray:
    """[T, top_k] booleans: is the guess's rank-r pick among the token's true experts."""
    guess, true = np.asarray(guess), np.asarray(true)
    return (guess[:, :, None] == true[:, None, :]).any(axis=2)


def chance_overlap(top_k: int, n_experts: int) -> float:
    """Expected |guess ∩ true| / top_k for a guess drawn uniformly, independent of the truth."""
    return top_k / n_experts


def usage(selections: np.ndarray, n_experts: int) -> np.ndarray:
    """[T, n_experts] booleans: does token t use expert e ([T, top_k] ids in)."""
    selections = np.asarray(selections)
    used = np.zeros((selections.shape[0], n_experts), dtype=bool)
    np.put_along_axis(used, selections, True, axis=1)
    return used


def expert_rates(selections: np.ndarray, n_experts: int) -> np.ndarray:
    """p_e: the fraction of tokens that use expert e ([T, top_k] ids in)."""
    return usage(selections, n_experts).mean(axis=0)


def usage_locality(sequences: list[np.ndarray]) -> float:
    """P(column e used by row t+1 | e used by row t), pooled over every used (t, e) of every
    [T, E] boolean matrix (the next row never crosses into another matrix). The columns may
    be experts of one layer or (layer, expert) pairs, as bench/policy_sim.py pools them."""
    repeats, uses = 0, 0
    for used in sequences:
        if len(used) < 2:
            continue
        repeats += int((used[:-1] & used[1:]).sum())
        uses += int(used[:-1].sum())
    return repeats / uses if uses else float("nan")


def temporal_locality(sequences: list[np.ndarray], n_experts: int) -> float:
    """P(expert e used by token t+1 | e used by token t), pooled over every (t, e in S_t) of
    every sequence ([T, top_k] ids each; the next token never crosses into another sequence).
    With a constant top_k this is also the hit rate of guessing token t+1's experts as token t's."""
    return usage_locality([usage(seq, n_experts) for seq in sequences])


def independent_locality(rates: np.ndarray) -> float:
    """The pooled locality if tokens chose independently with expert rates p_e: a use of e
    (weight p_e) repeats with probability p_e, so sum_e p_e^2 / sum_e p_e."""
    rates = np.asarray(rates, dtype=np.float64)
    return float((rates ** 2).sum() / rates.sum())


def top_quarter_share(selections: np.ndarray, n_experts: int) -> float:
    """The share of all selections taken by the most used ceil(n_experts / 4) experts."""
    counts = np.bincount(np.asarray(selections).ravel(), minlength=n_experts)
    quarter = -(-n_experts // 4)
    return float(np.sort(counts)[::-1][:quarter].sum() / counts.sum())


def popular_experts(selections: np.ndarray, n_experts: int, top_k: int) -> np.ndarray:
    """The ``top_k`` most used experts, most used first: a static guess that ignores the token.
    Taken from the same tokens it is scored on, so it is an optimistic baseline."""
    counts = np.bincount(np.asarray(selections).ravel(), minlength=n_experts)
    return np.argsort(-counts, kind="stable")[:top_k]


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of the cosine similarity of a[t] and b[t]."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    dots = (a * b).sum(axis=1)
    return float((dots / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).mean())


def summarize_distances(pair_hits: dict[tuple[int, int], np.ndarray]) -> dict[int, dict]:
    """Per distance d: accuracy and by-rank accuracy averaged over the layer pairs (l, l+d)
    (every pair has the same tokens, so this is also the token mean)."""
    by_distance: dict[int, list[np.ndarray]] = {}
    for (src, dst), hits in pair_hits.items():
        by_distance.setdefault(dst - src, []).append(hits)
    out = {}
    for d in sorted(by_distance):
        stacked = np.concatenate(by_distance[d], axis=0)
        out[d] = {"pairs": len(by_distance[d]), "accuracy": float(stacked.mean()),
                  "by_rank": [float(x) for x in stacked.mean(axis=0)]}
    return out


# -- the model run (torch, transformers) -------------------------------------------------------

DEMO_MODEL = Path(__file__).resolve().parents[1] / "data" / "demo-model"


def demo_conversation_ids(model_dir: Path, n_tokens: int, seed: int) -> list[list[int]]:
    """Held-out demo conversations (prompt + reply, encoded as the last training phase did),
    the families taken in turn, until ``n_tokens``; the last one cut to fit."""
    from waste.tools import demo_data, demo_train
    from waste.tools.bpe_train import read_tiktoken_file

    tok = demo_train.Tok(read_tiktoken_file(model_dir / "tiktoken.model"))
    per_family = 40
    examples = demo_data.held_out_examples(seed, per_family)
    n_families = len(demo_data.FAMILIES)
    # held_out_examples is family-major; round-robin so a short run still sees every family.
    interleaved = [examples[f * per_family + i] for i in range(per_family) for f in range(n_families)]
    sequences, total = [], 0
    for ex in interleaved:
        ids, _ = demo_train.encode(tok, ex, spelled_answers=True)
        ids = ids[:n_tokens - total]
        sequences.append(ids)
        total += len(ids)
        if total >= n_tokens:
            break
    return sequences


def load_model(model_dir: Path, random_init: bool, seed: int):
    import torch
    import transformers

    if random_init:
        config = transformers.AutoConfig.from_pretrained(model_dir)
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, output_loading_info=True)
        # A missing router weight would be silently random-initialised: the "trained" numbers
        # would then be the control's.
        if info.get("missing_keys"):
            raise SystemExit(f"checkpoint is missing weights: {sorted(info['missing_keys'])[:10]}")
    return model.eval()


def capture_routing(model, sequences: list[list[int]]):
    """Runs each sequence alone (no padding to mask) and returns, per sparse layer index, the
    router inputs [T, hidden] (float32, sequences concatenated), the router module, and the
    model's own selections per sequence."""
    import torch
    from transformers.models.kimi_linear import modeling_kimi_linear as mkl

    routers = {i: layer.mlp.gate for i, layer in enumerate(model.model.layers)
               if isinstance(layer.mlp, mkl.KimiLinearMoE)}
    inputs: dict[int, list] = {i: [] for i in routers}
    chosen: dict[int, list] = {i: [] for i in routers}

    def hook_for(i):
        def hook(module, args, result):
            inputs[i].append(args[0].detach().reshape(-1, module.hidden_dim).float().clone())
            chosen[i].append(result[2].detach().cpu().numpy())
        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in routers.items()]
    try:
        with torch.no_grad():
            for ids in sequences:
                model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return routers, {i: torch.cat(v) for i, v in inputs.items()}, chosen


def router_choice_scores(router, hidden):
    """The scores the router ranks by: sigmoid(W x) + e_score_correction_bias, computed with
    the router's own float32 ops so the ranking matches its choice bit for bit."""
    import torch.nn.functional as F

    logits = F.linear(hidden.float(), router.weight.float())
    return (logits.sigmoid() + router.e_score_correction_bias).detach().cpu().numpy()


def measure(model, sequences: list[list[int]]) -> dict:
    routers, inputs, model_choice = capture_routing(model, sequences)
    layers = sorted(routers)
    some = routers[layers[0]]
    top_k, n_experts = some.top_k, some.num_experts
    lengths = [len(s) for s in sequences]
    bounds = np.cumsum([0] + lengths)

    def select(dst: int, src: int) -> np.ndarray:
        r = routers[dst]
        return ranked_topk(router_choice_scores(r, inputs[src]), r.top_k, r.num_group, r.topk_group)

    true = {i: select(i, i) for i in layers}
    for i in layers:
        # The recomputation must be the model's own choice, or every number below is wrong.
        ours = np.sort(true[i], axis=1)
        theirs = np.sort(np.concatenate(model_choice[i]), axis=1)
        bad = np.flatnonzero((ours != theirs).any(axis=1))
        if len(bad):
            raise SystemExit(f"layer {i}: recomputed top-{top_k} differs from the model's on "
                             f"{len(bad)}/{len(ours)} tokens (first at {bad[0]}: {ours[bad[0]]} vs "
                             f"{theirs[bad[0]]})")

    pair_hits, pair_cosine = {}, {}
    for a, src in enumerate(layers):
        for dst in layers[a:]:
            pair_hits[(src, dst)] = rank_hits(select(dst, src), true[dst])
            pair_cosine[(src, dst)] = mean_cosine(inputs[src].numpy(), inputs[dst].numpy())
    distances = summarize_distances({(layers.index(s), layers.index(d)): h for (s, d), h in pair_hits.items()})
    for d, row in distances.items():
        # Why a guess works: how alike the two layers' router inputs are, token by token.
        row["input_cosine"] = float(np.mean([c for (s, t), c in pair_cosine.items()
                                             if layers.index(t) - layers.index(s) == d]))

    per_layer = {}
    for i in layers:
        per_seq = [true[i][bounds[j]:bounds[j + 1]] for j in range(len(sequences))]
        rates = expert_rates(true[i], n_experts)
        static_hits = rank_hits(np.tile(popular_experts(true[i], n_experts, top_k), (len(true[i]), 1)), true[i])
        per_layer[i] = {"locality": temporal_locality(per_seq, n_experts),
                        "static_accuracy": float(static_hits.mean()),
                        "static_by_rank": [float(x) for x in static_hits.mean(axis=0)],
                        "independent": independent_locality(rates),
                        "top_quarter_share": top_quarter_share(true[i], n_experts),
                        "max_over_mean_load": float(rates.max() / rates.mean())}
    return {"sparse_layers": layers, "top_k": top_k, "n_experts": n_experts,
            "chance": chance_overlap(top_k, n_experts), "tokens": int(bounds[-1]),
            "sequences": len(sequences), "by_distance": distances,
            "by_pair": {f"{s}->{d}": float(h.mean()) for (s, d), h in pair_hits.items()},
            "by_pair_input_cosine": {f"{s}->{d}": c for (s, d), c in pair_cosine.items()},
            "per_layer": per_layer}


def print_table(result: dict) -> None:
    k, n = result["top_k"], result["n_experts"]
    print(f"{result['tokens']} tokens in {result['sequences']} sequences; sparse layers "
          f"{result['sparse_layers']}; top-{k} of {n}; chance {result['chance']:.3f}")
    print("cross-layer guess (d = sparse layers ahead): accuracy, mean cosine of the two router inputs | by rank 1..top_k")
    for d, row in result["by_distance"].items():
        ranks = " ".join(f"{x:.2f}" for x in row["by_rank"])
        print(f"  d={d:<2} pairs={row['pairs']:<3} acc={row['accuracy']:.3f} "
              f"input-cos={row['input_cosine']:.3f} | {ranks}")
    # The cross-layer guess is worth something only where it beats guessing the popular experts.
    static = np.array([row["static_by_rank"] for row in result["per_layer"].values()])
    print(f"  static guess (each layer's {k} most used experts): acc={static.mean():.3f} | "
          + " ".join(f"{x:.2f}" for x in static.mean(axis=0)))
    print("per layer: locality P(e at t+1 | e at t) vs independent | top-quarter share | max/mean load"
          " | static acc")
    for i, row in result["per_layer"].items():
        print(f"  layer {i:<2} locality={row['locality']:.3f} indep={row['independent']:.3f} "
              f"top25%={row['top_quarter_share']:.3f} max/mean={row['max_over_mean_load']:.2f} "
              f"static={row['static_accuracy']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--random-init", action="store_true",
                        help="the same config with fresh seeded weights (the control)")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the random-init seed")
    parser.add_argument("--text-seed", type=int, default=0,
                        help="the held-out conversations' seed (apart from --seed, so controls share the text)")
    parser.add_argument("--ids-file", type=Path, help="JSON list of ids, or a list of such lists")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    if args.ids_file:
        data = json.loads(args.ids_file.read_text())
        sequences = data if data and isinstance(data[0], list) else [data]
    else:
        # The demo's conversations in the demo's tokenizer, whatever the model (see folding).
        sequences = demo_conversation_ids(DEMO_MODEL, args.tokens, args.text_seed)
    model = load_model(args.model_dir, args.random_init, args.seed)
    vocab = model.config.vocab_size
    folded = any(t >= vocab for s in sequences for t in s)
    sequences = [[t % vocab for t in s] for s in sequences]
    loaded = time.monotonic()
    result = measure(model, sequences)
    result.update(model_dir=str(args.model_dir), random_init=args.random_init, seed=args.seed,
                  text_seed=None if args.ids_file else args.text_seed,
                  ids_folded_into_vocab=folded, load_seconds=round(loaded - t0, 1),
                  run_seconds=round(time.monotonic() - loaded, 1))
    print(f"{args.model_dir} {'random-init seed ' + str(args.seed) if args.random_init else 'trained'}"
          f"{' (ids folded into vocab ' + str(vocab) + ')' if folded else ''}: "
          f"load {result['load_seconds']}s, run {result['run_seconds']}s")
    print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
