"""Grouped-query attention reads each KV head once per group: equal to multi-head attention whose
key/value weights are repeated (1e-6), and never materialises the repeated keys or values."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.components import BackboneConfig, KVCache, MultiHeadAttention
from kv_slots import open_slots
from attnlab.components.masks import causal_padding_mask, lengths_to_valid

D_MODEL, HEADS, KV_HEADS = 32, 8, 2


def grouped_and_repeated(backend):
    """A GQA layer and the MHA layer whose K/V heads are its KV heads, each repeated per group."""
    torch.manual_seed(0)

    def layer(n_kv):
        cfg = BackboneConfig(d_model=D_MODEL, n_heads=HEADS, n_kv_heads=n_kv, n_layers=1, d_ff=64,
                             backend=backend, dropout=0.0)
        return MultiHeadAttention(cfg).eval().double()

    gqa, mha = layer(KV_HEADS), layer(HEADS)
    group, head_dim = HEADS // KV_HEADS, D_MODEL // HEADS
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        weight = gqa.kv_proj.weight.view(2, KV_HEADS, head_dim, D_MODEL).repeat_interleave(group, 1)
        mha.kv_proj.weight.copy_(weight.reshape(-1, D_MODEL))
        bias = gqa.kv_proj.bias.view(2, KV_HEADS, head_dim).repeat_interleave(group, 1)
        mha.kv_proj.bias.copy_(bias.reshape(-1))
    return gqa, mha


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_grouped_attention_equals_repeated_heads(backend):
    gqa, mha = grouped_and_repeated(backend)
    x, context = torch.randn(3, 7, D_MODEL).double(), torch.randn(3, 5, D_MODEL).double()
    valid = lengths_to_valid(torch.tensor([7, 4, 1]), 7)
    cases = [
        dict(is_causal=True),
        dict(mask=causal_padding_mask(valid, 7)),
        dict(mask=valid[:, None, None, :]),
        dict(mask=torch.randn(3, HEADS, 7, 7).double()),  # a per-head additive bias
    ]
    for kwargs in cases:
        torch.testing.assert_close(gqa(x, **kwargs)[0], mha(x, **kwargs)[0], atol=1e-6, rtol=1e-6)
    gqa.qkv_proj = mha.qkv_proj = None
    cross_mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    cross_mask[1, ..., 3:] = False
    torch.testing.assert_close(gqa(x, context=context, mask=cross_mask)[0],
                               mha(x, context=context, mask=cross_mask)[0], atol=1e-6, rtol=1e-6)


def test_grouped_attention_weights_equal_repeated_heads():
    gqa, mha = grouped_and_repeated("math")
    x = torch.randn(2, 6, D_MODEL).double()
    out_g, weights_g = gqa(x, is_causal=True, need_weights=True)
    out_m, weights_m = mha(x, is_causal=True, need_weights=True)
    assert weights_g.shape == (2, HEADS, 6, 6)
    torch.testing.assert_close(weights_g, weights_m, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out_g, out_m, atol=1e-6, rtol=1e-6)


def allocation_sizes(fn) -> set[int]:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return {abs(event.cpu_memory_usage) for event in prof.events() if event.cpu_memory_usage}


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_a_decode_step_stores_and_allocates_only_the_kv_heads(backend):
    """The cache holds H_kv heads, and a decode step never allocates a tensor the size of the
    keys repeated to H heads (which the old repeat_interleave did, once for K and once for V)."""
    gqa, _ = grouped_and_repeated(backend)
    gqa.float()
    batch, prompt, head_dim = 2, 13, D_MODEL // HEADS
    cache = KVCache(capacity=prompt + 1)
    with torch.no_grad():
        open_slots(cache, batch, prompt)
        gqa(torch.randn(batch, prompt, D_MODEL), is_causal=True, cache=cache)
        step = torch.randn(batch, 1, D_MODEL)
        open_slots(cache, batch, 1)
        sizes = allocation_sizes(lambda: gqa(step, cache=cache))
    assert cache.k.shape == (batch, KV_HEADS, prompt + 1, head_dim)
    repeated = batch * HEADS * (prompt + 1) * head_dim * 4
    assert sizes, "the profiler recorded no allocation at all"
    assert repeated not in sizes, f"a {repeated}-byte tensor (K or V repeated to {HEADS} heads) was allocated"
