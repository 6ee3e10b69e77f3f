"""Decoding's weight layout (components/linear.py, issue 33): weights are multiplied from an
(in, out) copy in thread blocks, or a few rows as weight @ xᵀ, while a decode runs. Checked
against `F.linear` on the original weights, eagerly and inside a compiled graph, and by decoding
with and without the copies; the copies are kept between decodes only while their weights are
what they were copied from."""
from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from attnlab import BackboneConfig, DecoderOnly
from attnlab.components import linear as layout
from attnlab.components.linear import (Linear, decode_layout, decoding_copy, forget_decoding_copies,
                                       kept_decoding_copy, rows_times)
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
    while the weight is what they were copied from; after any of these changes the next decode
    copies it again."""
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


def test_new_data_that_starts_at_the_old_address_is_copied_again():
    """Fewer rows of the same storage: the same address and version counter, another weight."""
    base = torch.randn(7, 4)
    weight = torch.nn.Parameter(base[:6])
    first = kept_decoding_copy(weight, 2)
    weight.data = base[:5]
    assert weight.data_ptr() == base.data_ptr()
    assert kept_decoding_copy(weight, 2) is not first
    torch.testing.assert_close(kept_decoding_copy(weight, 2).reshape(-1, 5), base[:5].t(), rtol=0, atol=0)


def test_another_thread_count_gets_its_own_blocks():
    weight = torch.nn.Parameter(torch.randn(6, 4))
    assert kept_decoding_copy(weight, 2).shape == (2, 2, 6)
    assert kept_decoding_copy(weight, 4).shape == (4, 1, 6)
    assert kept_decoding_copy(weight, 4) is kept_decoding_copy(weight, 4)


def test_a_kept_copy_does_not_keep_its_model_alive():
    net = model(True)
    _copies(net)
    weight = weakref.ref(net.stack.layers[0].ffn.inner.up.weight)
    assert weight() in layout._KEPT
    del net
    gc.collect()
    assert weight() is None


def test_copies_made_in_inference_mode_serve_a_decode_outside_it():
    """A validation decodes in inference mode, a later decode (generate, the bench) in no_grad:
    the copy must be an ordinary tensor. A weight made in inference mode has no version counter
    and is copied at every decode."""
    weight = torch.nn.Parameter(torch.randn(6, 4))
    with torch.inference_mode():
        copy = kept_decoding_copy(weight, 2)
        assert not copy.is_inference()
        inference_weight = torch.randn(6, 4)
        assert kept_decoding_copy(inference_weight, 2) is not kept_decoding_copy(inference_weight, 2)
    assert kept_decoding_copy(weight, 2) is copy


@pytest.mark.parametrize("hook", ["on_validation_epoch_start", "on_test_epoch_start", "on_predict_epoch_start"])
def test_every_evaluation_decodes_from_fresh_copies(hook):
    """Lightning's EMA callback swaps the averaged weights in through `weight.data.copy_`, which
    neither moves the version counter nor the storage: a family forgets its copies whenever an
    evaluation starts, so that one decodes the weights it was given."""
    torch.manual_seed(0)
    family = DecoderOnly(backbone={"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "dropout": 0.0},
                         vocab_size=40).eval()
    up = family.model.stack.layers[0].ffn.inner.up
    before = _copies(family)["model.stack.layers.0.ffn.inner.up"]
    up.weight.data.copy_(torch.randn_like(up.weight))
    assert _copies(family)["model.stack.layers.0.ffn.inner.up"] is before  # unseen by the copies
    getattr(family, hook)()
    after = _copies(family)["model.stack.layers.0.ffn.inner.up"]
    torch.testing.assert_close(after.reshape(-1, up.weight.shape[0]), up.weight.t(), rtol=0, atol=0)


def test_forgetting_drops_only_that_models_copies():
    one, other = model(True), model(False)
    kept_one, kept_other = _copies(one), _copies(other)
    forget_decoding_copies(one)
    assert all(_copies(one)[name] is not kept_one[name] for name in kept_one)
    assert all(_copies(other)[name] is kept_other[name] for name in kept_other)
