"""Attention maps: weights are distributions, match the math reference on the training path's own
inputs, are causal where they must be, and the callback writes PNGs during a real fit."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnlab import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.components.attention import math_attention
from attnlab.components.positional import apply_rotary
from attnlab.probes.attention_maps import AttentionMaps, render_checkpoint
from conftest import MAPS_RUN, png_size, run_main
from data_modules.batch import Example, collate

EXAMPLE = Example([7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25], "src", "tgt")
FAMILIES = (DecoderOnly, EncoderDecoder, BlockDiffusion)


def tiny(cls, **kw):
    torch.manual_seed(0)
    backbone = dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional="rope")
    extra = {"block_size": 4} if cls is BlockDiffusion else {}
    return cls(backbone=backbone, vocab_size=40, **extra, **kw).eval()


@pytest.mark.parametrize("cls", FAMILIES)
def test_weights_are_distributions_over_keys(cls):
    maps = tiny(cls).attention_weights(EXAMPLE)
    assert maps
    for amap in maps:
        layers, heads, n_q, n_k = amap.weights.shape
        assert (layers, heads) == (2, 4) and (len(amap.queries), len(amap.keys)) == (n_q, n_k)
        assert torch.allclose(amap.weights.sum(-1), torch.ones(layers, heads, n_q), atol=1e-5)
        assert bool((amap.weights >= 0).all())


def _reference(attention, args, kwargs):
    """softmax(q·kᵀ/√d + mask) recomputed from what one attention module received."""
    x, context = args[0], kwargs.get("context")
    q = attention._split(attention.q_proj(x), attention.n_heads)
    k, v = attention.project_kv(x if context is None else context)
    if kwargs.get("rotary") is not None:
        q, k = apply_rotary(q, kwargs["rotary"]), apply_rotary(k, kwargs["rotary"])
    repeat = attention.n_heads // attention.n_kv_heads
    k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
    return math_attention(q, k, v, kwargs.get("mask"), kwargs.get("is_causal", False))[1][0]


def _captured_reference(module, run):
    """Per-module reference weights from the family's own evaluation pass (sdpa backend)."""
    seen, hooks = {}, []
    for stack in module.attention_stacks().values():
        for kind in ("self", "cross"):
            for attention in stack.attention_modules(kind):
                hook = lambda m, a, kw: seen.__setitem__(m, _reference(m, a, kw))  # noqa: E731
                hooks.append(attention.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad():
        run()
    for hook in hooks:
        hook.remove()
    return lambda stack, kind: torch.stack([seen[m] for m in stack.attention_modules(kind)])


@pytest.mark.parametrize("cls", FAMILIES)
def test_weights_equal_the_math_reference_on_the_evaluation_path(cls):
    module = tiny(cls)
    assert module.backbone.backend == "sdpa"  # the loss path runs the fused kernel, the maps the math one
    maps = {m.kind: m.weights for m in module.attention_weights(EXAMPLE)}
    batch = collate([EXAMPLE], module.special.pad)
    if cls is BlockDiffusion:  # every target token masked (t = 1), as in the maps
        frame = module._frame(batch)
        ref = _captured_reference(module, lambda: module.nelbo_terms(frame, 0, 1, t=torch.ones(1, 2)))
        full, n = ref(module.model.stack, "self"), frame.region.item()
        expected = {"clean": full[:, :, n:, n:], "denoise": full[:, :, :n]}
    else:
        ref = _captured_reference(module, lambda: module.loss_terms(batch))
        if cls is DecoderOnly:
            expected = {"self": ref(module.model.stack, "self")}
        else:
            encoder, decoder = module.model.encoder, module.model.decoder
            expected = {"encoder_self": ref(encoder, "self"), "decoder_self": ref(decoder, "self"),
                        "cross": ref(decoder, "cross")}
    assert maps.keys() == expected.keys()
    for kind, weights in expected.items():
        torch.testing.assert_close(maps[kind], weights, atol=1e-5, rtol=1e-4)


def test_causal_maps_are_zero_above_the_diagonal():
    weights = tiny(DecoderOnly).attention_weights(EXAMPLE)[0].weights
    assert weights.shape[-1] == 1 + 5 + 1 + 6 + 1  # [bos] source [sep] target [eos]
    assert bool((weights.triu(1) == 0).all()) and bool((weights.diagonal(dim1=-2, dim2=-1) > 0).all())
    decoder_self = {m.kind: m for m in tiny(EncoderDecoder).attention_weights(EXAMPLE)}["decoder_self"].weights
    assert bool((decoder_self.triu(1) == 0).all())


def test_block_diffusion_clean_tokens_never_see_later_blocks():
    module = tiny(BlockDiffusion)
    maps = {m.kind: m for m in module.attention_weights(EXAMPLE)}
    blocks = module._frame(collate([EXAMPLE], 0)).clean_blocks[0]
    later = blocks[None, :] > blocks[:, None]
    assert bool((maps["clean"].weights[..., later] == 0).all())
    assert maps["denoise"].queries == ["<mask>"] * 8 and maps["denoise"].keys[8] == "<bos>"


def _fake_trainer(tmp_path, epoch, sanity=False):
    datamodule = SimpleNamespace(examples=lambda split: [EXAMPLE])
    return SimpleNamespace(sanity_checking=sanity, is_global_zero=True, current_epoch=epoch, global_step=0,
                           datamodule=datamodule, log_dir=str(tmp_path), default_root_dir=str(tmp_path), loggers=[])


def test_callback_skips_the_sanity_check_and_other_epochs(tmp_path):
    module = tiny(DecoderOnly)
    callback = AttentionMaps(every_n_epochs=2)
    callback.on_validation_epoch_end(_fake_trainer(tmp_path, 1, sanity=True), module)
    callback.on_validation_epoch_end(_fake_trainer(tmp_path, 0), module)
    assert not callback.written
    callback.on_validation_epoch_end(_fake_trainer(tmp_path, 1), module)
    assert callback.written == [tmp_path / "attention" / "epoch=1-self.png"]


@pytest.fixture(scope="module")
def fitted(trained_run):
    return trained_run(*MAPS_RUN)[1]


def test_fit_with_the_callback_writes_pngs_and_logs_them(fitted):
    pngs = sorted((fitted / "attention").glob("*.png"))
    assert [p.name for p in pngs] == ["epoch=0-self.png"]
    width, height = png_size(pngs[0])
    assert 200 < width < 5000 and 200 < height < 5000
    assert (fitted / "checkpoints" / "last.ckpt").is_file()  # the default callbacks are still there
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(fitted / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert "attention/self" in events.Tags()["images"]


def test_render_checkpoint_writes_one_png_per_kind(fitted, tmp_path):
    paths = render_checkpoint(fitted / "checkpoints" / "last.ckpt", "twenty one", "einundzwanzig", tmp_path / "out")
    assert paths == [tmp_path / "out" / "self.png"]
    assert min(png_size(paths[0])) > 100


def test_attention_verb_writes_pngs_and_rejects_a_missing_checkpoint(fitted, tmp_path):
    result = run_main(["attention", fitted / "checkpoints" / "last.ckpt", "twenty one", "--output", tmp_path / "maps"])
    assert result.code == 0, result.err
    assert min(png_size(tmp_path / "maps" / "self.png")) > 100 and "wrote" in result.out
    missing = run_main(["attention", tmp_path / "nope.ckpt", "twenty one"])
    assert missing.code == 2 and "nope.ckpt does not exist" in missing.err
