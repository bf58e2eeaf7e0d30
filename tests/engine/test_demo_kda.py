"""The demo trainer's fast chunked KDA (waste.tools.demo_kda) against transformers' stock
pure-torch kernel: outputs, final state and gradients, on lengths that are and are not a
multiple of either chunk size, with and without an initial state."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("length,initial", [(37, False), (64, True), (5, True)])
def test_fast_chunk_kda_matches_the_stock_kernel(torch_stack, length, initial):
    torch, _ = torch_stack
    from transformers.models.kimi_linear import modeling_kimi_linear as stock

    from waste.tools.demo_kda import chunk_kda

    gen = torch.Generator().manual_seed(length)
    B, H, K, V = 2, 3, 16, 12

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    q, k, v = rand(B, length, H, K), rand(B, length, H, K), rand(B, length, H, V)
    g = (-2 * torch.rand(B, length, H, K, generator=gen, dtype=torch.float64)).requires_grad_()
    beta = torch.rand(B, length, H, generator=gen, dtype=torch.float64).requires_grad_()
    state = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64) if initial else None
    args = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want_out, want_state = stock.chunk_kimi_delta_attention(q, k, v, g, beta, chunk_size=64, **args)
    got_out, got_state = chunk_kda(q, k, v, g, beta, chunk_size=8, **args)
    # The stock kernel computes in float32 whatever the input: compare at float32 precision.
    assert torch.allclose(got_out, want_out, atol=2e-5, rtol=1e-4)
    assert torch.allclose(got_state.to(want_state.dtype), want_state, atol=2e-5, rtol=1e-4)
    want = torch.autograd.grad((want_out * want_out.detach()).sum(), [q, k, v, g, beta])
    got = torch.autograd.grad((got_out * want_out.detach()).sum(), [q, k, v, g, beta])
    for name, a, b in zip("qkvgb", got, want):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3), name


def test_install_replaces_the_prefill_kernel(torch_stack):
    from transformers.models.kimi_linear import modeling_kimi_linear as stock

    from waste.tools.demo_kda import chunk_kda, install

    before = stock.chunk_kimi_delta_attention
    try:
        install()
        assert stock.chunk_kimi_delta_attention is chunk_kda
    finally:
        stock.chunk_kimi_delta_attention = before
