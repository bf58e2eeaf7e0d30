"""A faster chunked Kimi Delta Attention for training the demo model on a CPU (torch).

Same math as transformers' pure-torch ``chunk_kimi_delta_attention``, re-batched: the
intra-chunk decays and the WY system are built for every chunk at once, the system is solved
with one triangular solve instead of a row loop, and only the state recurrence loops over
chunks. Training only: the engine never uses it; a test holds it to the stock kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # As transformers' (and FLA's) l2norm: + eps inside the square root.
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def chunk_kda(query, key, value, g, beta, chunk_size: int = 8, initial_state=None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **_):
    """Drop-in for transformers' ``chunk_kimi_delta_attention`` (same arguments and results).

    Shapes: query/key/g [B, T, H, K], value [B, T, H, V], beta [B, T, H]; returns
    ([B, T, H, V] in the input dtype, the final [B, H, K, V] state or None).
    """
    dtype = query.dtype
    q, k, v, b, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    B, H, T, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    pad = (C - T % C) % C
    q = F.pad(q, (0, 0, 0, pad)) * K ** -0.5
    k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, g))
    b = F.pad(b, (0, pad))
    N = (T + pad) // C
    # [B, H, N, C, D]
    q, k, v, g = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v, g))
    b = b.reshape(B, H, N, C, 1)
    g = g.cumsum(dim=-2)
    # decay[..., i, j, :] = exp(g_i - g_j) for j <= i, else 0: [B, H, N, C, C, K]
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    diff = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(~lower[..., None], float("-inf"))
    decay = diff.exp()
    kb = k * b
    # WY system: (I + L) T = I with L_ij = beta_i k_i·(decay_ij k_j), strictly lower.
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
    L = torch.einsum("bhnik,bhnijk,bhnjk->bhnij", kb, decay, k).masked_fill(~strict, 0.0)
    eye = torch.eye(C, dtype=L.dtype, device=L.device)
    Tinv = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    u = Tinv @ (v * b)                    # [B, H, N, C, V]
    w = Tinv @ (kb * g.exp())             # [B, H, N, C, K]
    Aqk = torch.einsum("bhnik,bhnijk,bhnjk->bhnij", q, decay, k)  # lower incl. diagonal
    qg = q * g.exp()
    g_last = g[:, :, :, -1:, :]           # [B, H, N, 1, K]
    k_tail = k * (g_last - g).exp()
    state = (torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device) if initial_state is None
             else initial_state.to(torch.float32))
    outs = []
    for n in range(N):
        v_new = u[:, :, n] - w[:, :, n] @ state
        outs.append(qg[:, :, n] @ state + Aqk[:, :, n] @ v_new)
        state = state * g_last[:, :, n, 0].exp().unsqueeze(-1) + k_tail[:, :, n].transpose(-1, -2) @ v_new
    out = torch.stack(outs, dim=2).reshape(B, H, N * C, V)[:, :, :T]
    return out.transpose(1, 2).contiguous().to(dtype), (state if output_final_state else None)


def install() -> None:
    """Make transformers' Kimi-Linear use ``chunk_kda`` for its chunked (prefill) path."""
    from transformers.models.kimi_linear import modeling_kimi_linear as m

    m.chunk_kimi_delta_attention = chunk_kda
