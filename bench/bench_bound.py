"""The §8 bound of one decode run: C, B_d, and the three terms segment by segment.

``tok/s ≤ min(W/((1−h)·B_r), M/(B_d+B_r), F/C)`` (docs/ENGINE.md §8); bench_engine.py measures W,
M and F and each run's h, and this module turns them into the bound and ours/bound.
"""

from __future__ import annotations

import math


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def attention_flops(cfg: dict, position: float) -> float:
    """FLOPs per token outside the weight matvecs (which 2·params_active already counts).

    KDA: the short conv plus ≈8·d² per head for the delta-rule state (decay, kᵀS, update,
    qS). MLA (latent-absorbed, as libwaste computes it): scores and context over the
    position's latents, 2·(r+d_r) + 2·r per head per cached position.
    """
    kinds = cfg["layer_types"]
    n_kda = sum(kind == "linear_attention" for kind in kinds)
    n_mla = len(kinds) - n_kda
    heads, d, conv = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    kda = 2 * 3 * heads * d * conv + 8 * heads * d * d
    r, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    mla = cfg["num_attention_heads"] * (2 * (r + dr) + 2 * r) * (position + 1)
    return n_kda * kda + n_mla * mla


def resident_read_bytes(cfg: dict, trunk_bytes: int, embed_row_bytes: int, position: float) -> float:
    """B_d: the resident trunk (the on-disk embedding excluded: one row per token), the KDA
    state and conv rings, and the MLA latents up to ``position``."""
    kinds = cfg["layer_types"]
    n_kda = sum(kind == "linear_attention" for kind in kinds)
    n_mla = len(kinds) - n_kda
    heads, d, conv = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    kda_state = 4 * (heads * d * d + 3 * heads * d * (conv - 1))
    latents = 4 * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * (position + 1)
    return trunk_bytes + embed_row_bytes + n_kda * kda_state + n_mla * latents


def bound_terms(run: dict, *, M: float, B_r: float, B_d: float, C: float) -> dict:
    """The three §8 terms, their minimum and ours/bound, segment by segment.

    Segment s has its own h_s and the W_s, F_s probed right before and after it (W_s raised
    to the engine's own read rate in s when that is higher); its bound
    is b_s = min(W_s/((1−h_s)·B_r), M/(B_d+B_r), F_s/C). Bound tok/s over the run is
    N/Σ(n_s/b_s) (the time the bound allows), and each term is aggregated the same way.
    The serial bound charges disk time plus the larger of RAM and compute time per token
    (reading and computing never overlap).

    The contended bound is the overlapped one with compute slowed while the disk streams:
    the kernel runs at F_io = r·F while a read is in flight (r probed beside F, with the
    probe's readers streaming), so a token needs max(t_disk, t_compute + t_disk·(1 − r),
    t_ram). It says how much of the overlapped bound this machine can deliver at all.
    """
    segs, probes = run["segment_list"], run["probes"]
    allowed = {"disk": 0.0, "ram": 0.0, "compute": 0.0, "bound": 0.0, "serial": 0.0, "contended": 0.0}
    shares = [p.get("F_io_share") for p in probes]
    contended = all(r is not None for r in shares)
    Ws, engine_faster = [], 0
    for i, seg in enumerate(segs):
        W = (probes[i]["W"] + probes[i + 1]["W"]) / 2
        # The engine's own record-read rate is also a measurement of the disk: when it is
        # higher than the probes (it is, often, on this VM), the disk could do at least that.
        # (bytes over the time >= 1 read was in flight: with reader threads the reads overlap)
        busy = seg.busy_s or seg.io_s
        engine_rate = seg.bytes_read / busy if busy > 0 else 0.0
        if engine_rate > W:
            W, engine_faster = engine_rate, engine_faster + 1
        Ws.append(W)
        F = (probes[i]["F"] + probes[i + 1]["F"]) / 2
        miss = seg.misses / max(seg.hits + seg.misses, 1)
        per_token = {"disk": miss * B_r / W, "ram": (B_d + B_r) / M, "compute": C / F}
        for name, t in per_token.items():
            allowed[name] += seg.tokens * t
        allowed["bound"] += seg.tokens * max(per_token.values())
        allowed["serial"] += seg.tokens * (per_token["disk"] + max(per_token["ram"], per_token["compute"]))
        if contended:
            r = min(1.0, (shares[i] + shares[i + 1]) / 2)
            slowed = per_token["compute"] + per_token["disk"] * (1 - r)
            allowed["contended"] += seg.tokens * max(per_token["disk"], slowed, per_token["ram"])
    n, seconds = run["tokens"], run["seconds"]
    rate = {name: (n / t if t > 0 else math.inf) for name, t in allowed.items()}
    limit = min(("disk", "ram", "compute"), key=rate.get)
    probed = [p["W"] for p in probes]
    return {"W_mean": sum(Ws) / len(Ws), "W_probe_min": min(probed), "W_probe_max": max(probed),
            "W_probe_mean": sum(probed) / len(probed), "segments_W_from_engine": engine_faster,
            "F_mean": sum(p["F"] for p in probes) / len(probes),
            "bound_disk_tok_s": _finite(rate["disk"]), "bound_ram_tok_s": rate["ram"],
            "bound_compute_tok_s": rate["compute"], "bound_tok_s": rate["bound"],
            "limited_by": limit, "ratio": allowed["bound"] / seconds,
            "serial_bound_tok_s": rate["serial"], "ratio_serial": allowed["serial"] / seconds,
            "F_io_share_mean": sum(shares) / len(shares) if contended else None,
            "contended_bound_tok_s": rate["contended"] if contended else None,
            "ratio_contended": allowed["contended"] / seconds if contended else None}
