"""GPU-paying model options: each computes the same function as the plain model (issue 6, item 3).

fused_qkv (one q/k/v GEMM), vocab_multiple (padded vocabulary), compile (torch.compile of the
stacks), bf16 autocast, and the FlexAttention block mask's construction.
"""
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from attnlab import BackboneConfig, BlockDiffusion, ConfigError, DecoderOnly, EncoderDecoder
from attnlab.components import KVCache, MultiHeadAttention, TransformerLayer, TransformerStack
from kv_slots import open_slots
from attnlab.components.masks import block_diffusion_flex_mask, causal_padding_mask, lengths_to_valid
from attnlab.components.positional import Rope
from attnlab.generation.decoder_only import generate
from attnlab.models.decoder_only import DecoderOnlyModel

BATCH = {
    "source": torch.tensor([[7, 8, 9], [11, 0, 0]]), "source_lengths": torch.tensor([3, 1]),
    "target": torch.tensor([[20, 21, 22, 23, 24], [25, 26, 0, 0, 0]]), "target_lengths": torch.tensor([5, 2]),
}
PROMPTS = [[2, 7, 8, 9, 10, 4], [2, 11, 4], [2, 12, 13, 4]]
FAMILIES = {
    "decoder_only": (DecoderOnly, {}),
    "encoder_decoder": (EncoderDecoder, {}),
    "block_diffusion": (BlockDiffusion, {"block_size": 2}),
}


def tiny_backbone(**kw):
    return {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "d_ff": 64, "dropout": 0.0,
            "positional": "rope", **kw}


def tiny_module(family, seed=0, vocab_size=40, **backbone):
    cls, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    return cls(backbone=tiny_backbone(**backbone), vocab_size=vocab_size, **kwargs).eval()


def fuse_state_dict(state: dict) -> dict:
    """An unfused state dict in the fused layout: each self-attention's qkv_proj = [q_proj ; kv_proj] by rows."""
    fused = {}
    for key, value in state.items():
        owner, _, proj = key.rpartition(".")[0].rpartition(".")  # "layers.0.self_attn.inner", "q_proj"
        if "cross_attn" in owner or proj not in ("q_proj", "kv_proj"):
            fused[key] = value
        elif proj == "q_proj":
            fused[key.replace("q_proj", "qkv_proj")] = torch.cat((value, state[key.replace("q_proj", "kv_proj")]))
    return fused


def pad_rows_from(small: nn.Module, padded: nn.Module) -> None:
    """Copy `small`'s weights into `padded`; tensors with more rows get `small`'s in their first rows."""
    target = padded.state_dict()
    with torch.no_grad():
        for key, value in small.state_dict().items():
            target[key][: value.shape[0]].copy_(value)


def loss_sum(module, batch=BATCH):
    if hasattr(module, "reset_eval_noise"):
        module.reset_eval_noise()  # block diffusion: the same noise draw on every call in eval mode
    return module.loss_terms(batch).loss.sum()


# ---- fused q/k/v ---------------------------------------------------------------------------------

def attention_pair(n_kv_heads, backend="sdpa"):
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=1, d_ff=64, dropout=0.0,
                         backend=backend)
    plain = MultiHeadAttention(cfg).eval()
    fused = MultiHeadAttention(replace(cfg, fused_qkv=True)).eval()
    fused.load_state_dict(fuse_state_dict(plain.state_dict()))
    return plain, fused


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_fused_attention_equals_unfused_with_concatenated_weights(n_kv_heads, backend):
    plain, fused = attention_pair(n_kv_heads, backend)
    assert fused.q_proj is None and fused.kv_proj is None and plain.qkv_proj is None
    x = torch.randn(3, 7, 32)
    valid = lengths_to_valid(torch.tensor([7, 4, 1]), 7)
    rotary = Rope(BackboneConfig(d_model=32, n_heads=4)).rotary(torch.arange(7))
    cases = ({"is_causal": True}, {"mask": causal_padding_mask(valid, 7)}, {"is_causal": True, "rotary": rotary},
             {"mask": causal_padding_mask(valid, 7), "need_weights": True})
    for kwargs in cases:
        out_plain, weights_plain = plain(x, **kwargs)
        out_fused, weights_fused = fused(x, **kwargs)
        torch.testing.assert_close(out_fused, out_plain, atol=1e-5, rtol=1e-5)
        if kwargs.get("need_weights"):
            torch.testing.assert_close(weights_fused, weights_plain, atol=1e-5, rtol=1e-5)
    plain.mask_heads([1])
    fused.mask_heads([1])
    torch.testing.assert_close(fused(x, is_causal=True)[0], plain(x, is_causal=True)[0], atol=1e-5, rtol=1e-5)


def test_fused_attention_decodes_incrementally_like_the_unfused_one():
    plain, fused = attention_pair(2)
    x = torch.randn(2, 6, 32)
    rope = Rope(BackboneConfig(d_model=32, n_heads=4))
    outputs = {}
    for name, module in (("plain", plain), ("fused", fused)):
        cache = KVCache(capacity=6)
        open_slots(cache, 2, 3)
        steps = [module(x[:, :3], is_causal=True, cache=cache, rotary=rope.rotary(torch.arange(3)))[0]]
        for t in range(3, 6):
            open_slots(cache, 2, 1)
            steps.append(module(x[:, t : t + 1], cache=cache, rotary=rope.rotary(torch.tensor([t])))[0])
        outputs[name] = torch.cat(steps, dim=1)
        assert len(cache) == 6
    torch.testing.assert_close(outputs["fused"], outputs["plain"], atol=1e-5, rtol=1e-5)
    full, _ = fused(x, is_causal=True, rotary=rope.rotary(torch.arange(6)))
    torch.testing.assert_close(outputs["fused"], full, atol=1e-5, rtol=1e-5)


def test_only_self_attention_is_fused_and_the_default_keeps_checkpoint_keys():
    layer = TransformerLayer(BackboneConfig(d_model=32, n_heads=4, d_ff=64, fused_qkv=True), cross_attention=True)
    keys = set(layer.state_dict())
    assert "self_attn.inner.qkv_proj.weight" in keys and "self_attn.inner.q_proj.weight" not in keys
    assert {"cross_attn.inner.q_proj.weight", "cross_attn.inner.kv_proj.weight"} <= keys
    assert not any("cross_attn.inner.qkv_proj" in k for k in keys)
    with pytest.raises(ValueError, match="self-attention only"):
        layer.self_attn.inner(torch.randn(1, 2, 32), context=torch.randn(1, 3, 32))
    default = TransformerLayer(BackboneConfig(d_model=32, n_heads=4, d_ff=64), cross_attention=True)
    assert not any("qkv_proj" in k for k in default.state_dict())
    assert {"self_attn.inner.q_proj.weight", "self_attn.inner.kv_proj.weight"} <= set(default.state_dict())


def test_fused_projection_starts_like_separate_q_and_kv_projections():
    """Xavier's bound depends on the output width: each part gets its own (q: √(6/(d+q)), kv: √(6/(d+2kv)))."""
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, fused_qkv=True)
    weight = TransformerStack(cfg, vocab_size=40).layers[0].self_attn.inner.qkv_proj.weight
    q, kv = weight[:32], weight[32:]
    q_bound, kv_bound, whole_bound = (6 / 64) ** 0.5, (6 / 96) ** 0.5, (6 / 128) ** 0.5
    assert q.abs().max() <= q_bound and kv.abs().max() <= kv_bound
    assert q.abs().max() > whole_bound  # one xavier over the whole matrix would stay below this


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_fused_decoder_only_model_generates_like_the_unfused_one(positional):
    torch.manual_seed(0)
    cfg = BackboneConfig(**tiny_backbone(positional=positional))
    plain = DecoderOnlyModel(cfg, vocab_size=40).eval()
    fused = DecoderOnlyModel(replace(cfg, fused_qkv=True), vocab_size=40).eval()
    fused.load_state_dict(fuse_state_dict(plain.state_dict()))
    out_plain, logits_plain = generate(plain, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
    out_fused, logits_fused = generate(fused, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
    assert out_fused == out_plain
    torch.testing.assert_close(logits_fused, logits_plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_model_has_the_unfused_loss_and_trains_one_step(family):
    plain = tiny_module(family)
    fused = tiny_module(family, fused_qkv=True)
    fused.load_state_dict(fuse_state_dict(plain.state_dict()))
    torch.testing.assert_close(loss_sum(fused), loss_sum(plain), atol=1e-4, rtol=1e-5)

    fused.train()
    optimizer = torch.optim.SGD(fused.parameters(), lr=1e-2)

    def train_loss():
        torch.manual_seed(1)  # the same noise before and after the step (block diffusion)
        terms = fused.loss_terms(BATCH)
        return terms.loss.sum() / terms.targets.sum()

    before = train_loss()
    before.backward()
    qkv = [m.qkv_proj for m in fused.modules() if isinstance(m, MultiHeadAttention) and m.qkv_proj is not None]
    assert len(qkv) == (4 if family == "encoder_decoder" else 2)  # every self-attention, encoder included
    assert all(p.weight.grad is not None and p.weight.grad.abs().sum() > 0 for p in qkv)
    optimizer.step()
    assert float(train_loss()) < float(before)


# ---- vocabulary padded to a multiple -------------------------------------------------------------

@pytest.mark.parametrize("family,tie", [("decoder_only", True), ("encoder_decoder", False), ("block_diffusion", True)])
def test_padded_vocabulary_keeps_the_logits_and_the_loss(family, tie):
    plain = tiny_module(family, vocab_size=37, tie_embeddings=tie)
    padded = tiny_module(family, vocab_size=37, tie_embeddings=tie, vocab_multiple=64)
    embedding = padded.model.stack.embedding if family != "encoder_decoder" else padded.model.decoder.embedding
    assert embedding.weight.shape == (64, 32)
    if not tie:
        assert embedding.output.weight.shape == (64, 32)
        assert torch.all(embedding.output.weight[37:] == 0)
    assert torch.all(embedding.weight[37:] == 0)  # padded rows start inert
    pad_rows_from(plain, padded)
    assert embedding.logits(torch.randn(3, 32)).shape == (3, 37)
    loss_padded = loss_sum(padded)
    torch.testing.assert_close(loss_padded, loss_sum(plain), atol=1e-5, rtol=1e-5)
    loss_padded.backward()
    assert torch.all(embedding.weight.grad[37:] == 0) and embedding.weight.grad[:37].abs().sum() > 0
    if not tie:
        assert torch.all(embedding.output.weight.grad[37:] == 0)


def test_block_diffusion_never_predicts_the_mask_token_with_a_padded_vocabulary():
    padded = tiny_module("block_diffusion", vocab_size=37, vocab_multiple=64)
    logits = padded.model.logits(torch.randn(2, 3, 32))
    assert logits.shape == (2, 3, 37)
    assert torch.all(logits[..., padded.special.mask] == float("-inf"))
    assert torch.isfinite(logits[..., : padded.special.mask]).all()


def test_padded_decoder_generates_like_the_unpadded_one():
    torch.manual_seed(0)
    plain = DecoderOnlyModel(BackboneConfig(**tiny_backbone()), vocab_size=37).eval()
    padded = DecoderOnlyModel(BackboneConfig(**tiny_backbone(vocab_multiple=8)), vocab_size=37).eval()
    pad_rows_from(plain, padded)
    assert padded.stack.embedding.weight.shape[0] == 40
    out_plain, logits_plain = generate(plain, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
    out_padded, logits_padded = generate(padded, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
    assert out_padded == out_plain and logits_padded.shape[-1] == 37
    torch.testing.assert_close(logits_padded, logits_plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("field,value", [
    ("vocab_multiple", 0), ("vocab_multiple", -64), ("vocab_multiple", 1.5), ("vocab_multiple", True),
    ("fused_qkv", "yes"),
])
def test_bad_backbone_options_name_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"model\.init_args\.backbone\.{field}="):
        BackboneConfig(d_model=32, n_heads=4, **{field: value})


# ---- torch.compile -------------------------------------------------------------------------------

def test_compile_option_is_validated_and_saved():
    with pytest.raises(ConfigError, match=r"model\.init_args\.compile="):
        DecoderOnly(backbone=tiny_backbone(), vocab_size=40, compile="yes")
    module = DecoderOnly(backbone=tiny_backbone(), vocab_size=40, compile=True)
    assert module.hparams["compile"] is True and not module._compiled  # compiled by a Trainer, not here


def test_compiled_training_step_matches_eager_and_checkpoints_stay_clean(tmp_path):
    """One Lightning step through inductor (slow to compile on a CPU: one tiny model, one graph)."""
    import lightning as L
    from torch._dynamo.utils import counters

    from attnlab.checkpoints.reading import load_checkpoint

    kwargs = dict(backbone=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, positional="rope"),
                  vocab_size=40)
    torch.manual_seed(0)
    eager = DecoderOnly(**kwargs)
    compiled = DecoderOnly(**kwargs, compile=True)
    compiled.load_state_dict(eager.state_dict())
    graphs_before = counters["stats"]["unique_graphs"]
    trainer = L.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=tmp_path)
    trainer.fit(compiled, train_dataloaders=DataLoader([BATCH], batch_size=None))
    assert compiled._compiled and counters["stats"]["unique_graphs"] > graphs_before  # it really compiled
    assert compiled.model.stack._compiled_call_impl is not None

    trainer.save_checkpoint(tmp_path / "step1.ckpt")
    raw = torch.load(tmp_path / "step1.ckpt", weights_only=True)
    assert raw["state_dict"] and not any("_orig_mod" in key for key in raw["state_dict"])
    restored, _ = load_checkpoint(tmp_path / "step1.ckpt")  # weights_only, into an eager module
    assert restored.hparams["compile"] is True and not restored._compiled

    # The trained weights, computed both ways (train mode with gradients: the graph compiled above).
    eager.load_state_dict(compiled.state_dict())
    eager.train()
    compiled.train()
    torch.testing.assert_close(compiled.loss_terms(BATCH).loss, eager.loss_terms(BATCH).loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(restored.train().loss_terms(BATCH).loss, eager.loss_terms(BATCH).loss)

    graphs_after_training = counters["stats"]["unique_graphs"]
    with compiled._eager_generation(), torch.no_grad():
        compiled.eval()
        hypotheses = compiled.generate_ids(BATCH)
    assert len(hypotheses) == 2 and counters["stats"]["unique_graphs"] == graphs_after_training


# ---- bf16 autocast -------------------------------------------------------------------------------

@pytest.mark.parametrize("positional", ["rope", "alibi"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_autocast_loss_is_finite_and_close_to_fp32(family, positional):
    """What `--trainer.precision bf16-mixed` runs; tiny, since bf16 matmuls are slow on this CPU."""
    module = tiny_module(family, d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32, positional=positional)
    module.optim.label_smoothing = 0.1
    reference = loss_sum(module).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_sum(module)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss.detach(), reference, rtol=5e-2, atol=0)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# ---- FlexAttention block mask --------------------------------------------------------------------

def test_flex_block_mask_is_built_eagerly_on_cpu(monkeypatch):
    """Compiled construction is for CUDA; a CPU batch keeps the eager reference (and its result)."""
    import torch.nn.attention.flex_attention as flex

    calls = []
    real = flex.create_block_mask

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(flex, "create_block_mask", recording)
    blocks = torch.tensor([[0, 0, 1, 1]])
    mask = block_diffusion_flex_mask(blocks, blocks)
    assert calls == [{"device": blocks.device}]  # the eager builder itself, not a compiled one
    assert mask.shape[-2:] == (8, 8)
    from attnlab.components.masks import _create_block_mask_for

    on_cuda = _create_block_mask_for(torch.device("cuda"))  # compiled lazily: nothing runs here
    assert on_cuda is not recording and on_cuda is _create_block_mask_for(torch.device("cuda"))
