"""Decoding's weight layout (components/linear.py, issue 33): weights are multiplied from an
(in, out) copy in thread blocks, or a few rows as weight @ xᵀ, while a decode runs. Checked
against `F.linear` on the original weights, eagerly and inside a compiled graph, and by decoding
with and without the copies."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from attnlab import BackboneConfig
from attnlab.components.linear import Linear, decode_layout, decoding_copy, rows_times
from attnlab.generation import loop
from attnlab.generation.decoder_only import generate
from attnlab.models.decoder_only import DecoderOnlyModel


@pytest.mark.parametrize("parts", [1, 2, 4])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 17])
def test_rows_times_is_f_linear_for_any_rows_and_thread_blocks(rows, parts):
    torch.manual_seed(rows * 10 + parts)
    weight, bias, x = torch.randn(96, 32), torch.randn(96), torch.randn(rows, 1, 32)
    blocks = decoding_copy(weight, parts)
    assert blocks.shape == (parts, 32 // parts, 96)
    torch.testing.assert_close(rows_times(x, weight, blocks, bias), F.linear(x, weight, bias))
    torch.testing.assert_close(rows_times(x, weight, blocks), F.linear(x, weight))


def test_a_width_the_threads_do_not_divide_is_one_block():
    assert decoding_copy(torch.randn(30, 15), parts=2).shape == (1, 15, 30)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_decoding_products_compile_into_one_graph(rows):
    """fullgraph: neither the thread count nor the one-row product nor the few-row one may break
    the graph."""
    torch.manual_seed(0)
    weight, bias, x = torch.randn(64, 32), torch.randn(64), torch.randn(rows, 1, 32)
    compiled = torch.compile(rows_times, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, weight, decoding_copy(weight, 2), bias), F.linear(x, weight, bias))


def model(tie: bool) -> DecoderOnlyModel:
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, tie_embeddings=tie)
    return DecoderOnlyModel(cfg, vocab_size=50).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_every_weight_gets_a_copy_and_only_within_the_block(tie):
    net = model(tie)
    linears = [m for m in net.modules() if isinstance(m, Linear)]
    with decode_layout(net):
        copied = {m for m in net.modules() if m.__dict__.get("decode_weight") is not None}
        with decode_layout(net):  # re-entrant: the inner block neither replaces nor removes them
            assert {m for m in net.modules() if m.__dict__.get("decode_weight") is not None} == copied
        assert all(m.__dict__.get("decode_weight") is not None for m in copied)
        assert set(linears) <= copied  # q/k/v (96 x 32), out (32 x 32), up (64 x 32) and down (32 x 64)
        embedding = net.stack.embedding
        assert (embedding in copied) == tie  # an untied table is only looked up
        for module in copied:
            torch.testing.assert_close(module.decode_weight.reshape(-1, module.weight.shape[0]), module.weight.t())
    assert not any("decode_weight" in m.__dict__ for m in net.modules())


def test_the_copies_go_when_a_decode_fails():
    net = model(True)
    with pytest.raises(RuntimeError, match="stop"):
        with decode_layout(net):
            raise RuntimeError("stop")
    assert not any("decode_weight" in m.__dict__ for m in net.modules())


@pytest.mark.parametrize("tie", [True, False])
def test_decoding_with_the_copies_gives_the_logits_of_the_module_weights(tie, monkeypatch):
    """The same decode with `decode_layout` turned off (the weights as nn.Linear keeps them): the
    same tokens and, to rounding, the same logits, at one row (the thread split) and at several."""
    net = model(tie)
    prompts = [[1, 7, 9, 11], [1, 5], [1, 8, 8], [1, 20, 21, 22, 23]]
    kwargs = dict(max_new_tokens=6, eos_id=-1, pad_id=0, return_logits=True, compact=False)
    for batch in (prompts[:1], prompts):
        tokens, logits = generate(net, batch, **kwargs)
        with monkeypatch.context() as patch:
            patch.setattr(loop, "decode_layout", lambda *_: contextlib.nullcontext())
            plain_tokens, plain_logits = generate(net, batch, **kwargs)
        assert tokens == plain_tokens
        torch.testing.assert_close(logits, plain_logits)


def _copies(net) -> dict:
    with decode_layout(net):
        return {name: m.decode_weight for name, m in net.named_modules() if m.__dict__.get("decode_weight") is not None}


def _write_under_no_grad(net):
    with torch.no_grad():
        net.stack.layers[0].ffn.inner.up.weight.mul_(2)


def _optimizer_step(net):
    net.zero_grad()
    net(torch.tensor([[1, 2, 3]])).sum().backward()
    torch.optim.AdamW(net.parameters(), lr=0.1).step()


def _load_state_dict(net):
    net.load_state_dict({k: v + 1 for k, v in net.state_dict().items()})


def _new_data(net):
    up = net.stack.layers[0].ffn.inner.up
    up.weight.data = up.weight.detach() * 3


@pytest.mark.parametrize("change", [_write_under_no_grad, _optimizer_step, _load_state_dict, _new_data])
def test_a_decode_reuses_the_last_copies_until_their_weight_changes(change):
    """Copies outlive their decode (making them is a transpose of every weight) and are reused
    while the weight is what they were copied from; after any change the next decode copies it
    again, so it never multiplies by a stale weight."""
    net = model(True)
    first = _copies(net)
    again = _copies(net)
    assert all(again[name] is first[name] for name in first)
    change(net)
    after = _copies(net)
    modules = dict(net.named_modules())
    changed = {name for name in first if after[name] is not first[name]}
    assert "stack.layers.0.ffn.inner.up" in changed
    for name in first:
        weight = modules[name].weight
        torch.testing.assert_close(after[name].reshape(-1, weight.shape[0]), weight.t(), rtol=0, atol=0)
    assert not any("decode_weight" in m.__dict__ for m in net.modules())
