"""Attention backends agree, GQA works, head masks silence exactly the chosen heads."""
import pytest
import torch

from attnlab.components import BackboneConfig, KVCache, MultiHeadAttention
from kv_slots import open_slots
from attnlab.components.masks import causal_padding_mask, lengths_to_valid, prefix_mask


def make_attention(backend, n_heads=4, n_kv_heads=None, d_model=32):
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=1,
                         d_ff=64, backend=backend, dropout=0.0)
    return MultiHeadAttention(cfg).eval()


def both_backends(n_heads=4, n_kv_heads=None):
    sdpa = make_attention("sdpa", n_heads, n_kv_heads)
    math = make_attention("math", n_heads, n_kv_heads)
    math.load_state_dict(sdpa.state_dict())
    return sdpa, math


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_sdpa_equals_math_with_causal_and_padding_masks(n_kv_heads):
    sdpa, math = both_backends(4, n_kv_heads)
    x = torch.randn(3, 7, 32)
    valid = lengths_to_valid(torch.tensor([7, 4, 1]), 7)
    mask = causal_padding_mask(valid, 7)
    for kwargs in ({"is_causal": True}, {"mask": mask}, {"mask": valid[:, None, None, :]}):
        out_sdpa, _ = sdpa(x, **kwargs)
        out_math, _ = math(x, **kwargs)
        torch.testing.assert_close(out_sdpa, out_math, atol=1e-5, rtol=1e-5)


def test_sdpa_equals_math_for_cross_attention_and_additive_bias():
    sdpa, math = both_backends(4, 2)
    x, context = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    bias = torch.randn(2, 4, 5, 9)
    torch.testing.assert_close(sdpa(x, context=context, mask=bias)[0], math(x, context=context, mask=bias)[0],
                               atol=1e-5, rtol=1e-5)


def test_math_weights_are_a_distribution_that_respects_the_mask():
    _, math = both_backends()
    x = torch.randn(2, 6, 32)
    valid = lengths_to_valid(torch.tensor([6, 3]), 6)
    _, weights = math(x, mask=causal_padding_mask(valid, 6), need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(weights[..., :, :].triu(1) == 0)  # nothing from the future
    assert torch.all(weights[1, :, :3, 3:] == 0)  # real queries never see pads


def test_gqa_equals_mha_with_repeated_key_value_heads():
    gqa = make_attention("math", 4, 2)
    mha = make_attention("math", 4, 4)
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        k, v = gqa.kv_proj.weight.view(2, 2, 8, 32).unbind(0)
        mha.kv_proj.weight.copy_(torch.cat([k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)]).view(-1, 32))
        kb, vb = gqa.kv_proj.bias.view(2, 2, 8).unbind(0)
        mha.kv_proj.bias.copy_(torch.cat([kb.repeat_interleave(2, 0), vb.repeat_interleave(2, 0)]).view(-1))
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], mha(x, is_causal=True)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_head_mask_silences_exactly_the_chosen_heads(backend):
    attention = make_attention(backend)
    with torch.no_grad():  # identity output projection: output columns are the heads' outputs
        attention.out_proj.weight.copy_(torch.eye(32))
        attention.out_proj.bias.zero_()
    x = torch.randn(2, 5, 32)
    full, _ = attention(x, is_causal=True)
    attention.mask_heads([1, 3])
    masked, _ = attention(x, is_causal=True)
    heads_full, heads_masked = full.view(2, 5, 4, 8), masked.view(2, 5, 4, 8)
    assert torch.all(heads_masked[:, :, [1, 3]] == 0)
    torch.testing.assert_close(heads_masked[:, :, [0, 2]], heads_full[:, :, [0, 2]])
    assert heads_full[:, :, [1, 3]].abs().sum() > 0
    attention.mask_heads([])
    torch.testing.assert_close(attention(x, is_causal=True)[0], full)


def test_incremental_attention_with_cache_equals_full_attention():
    _, math = both_backends(4, 2)
    x = torch.randn(2, 6, 32)
    full, _ = math(x, is_causal=True)
    cache = KVCache(capacity=4)  # grows once on the way
    open_slots(cache, 2, 3)
    steps = [math(x[:, :3], is_causal=True, cache=cache)[0]]
    for t in range(3, 6):
        open_slots(cache, 2, 1)
        steps.append(math(x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 6


def test_prefix_mask_is_bidirectional_inside_the_prefix_only():
    valid = torch.ones(1, 5, dtype=torch.bool)
    mask = prefix_mask(torch.tensor([3]), valid)[0, 0]
    assert mask[0, 2] and mask[1, 2]  # prefix tokens see later prefix tokens
    assert not mask[2, 3] and not mask[3, 4]  # but nobody sees the future outside the prefix
    assert mask[4].all()


def test_kv_cache_appends_grows_and_reorders_like_concatenation():
    """The preallocated cache against the obvious torch.cat bookkeeping, across growth; a reorder
    moves only the filled slots and keeps the buffer."""
    torch.manual_seed(0)
    cache, k_ref, v_ref = KVCache(capacity=8), None, None
    chunks = [torch.randn(3, 2, n, 4) for n in (5, 1, 1, 40, 1, 30, 1)]  # grows twice
    for k in chunks:
        v = k * 2 + 1
        open_slots(cache, 3, k.shape[2])
        got_k, got_v = cache.update(k, v)
        k_ref = k if k_ref is None else torch.cat((k_ref, k), dim=2)
        v_ref = v if v_ref is None else torch.cat((v_ref, v), dim=2)
        assert torch.equal(got_k, k_ref) and torch.equal(got_v, v_ref)
    assert cache.capacity >= 79
    index, buffer = torch.tensor([2, 0, 0]), cache.buffers[0]
    cache.select(index, k_ref.shape[2])
    assert cache.buffers[0].data_ptr() == buffer.data_ptr()
    extra = torch.randn(3, 2, 1, 4)
    open_slots(cache, 3, 1)
    cache.update(extra, extra)
    assert torch.equal(cache.k, torch.cat((k_ref[index], extra), dim=2))
