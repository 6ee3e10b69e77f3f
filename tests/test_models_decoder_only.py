"""The decoder-only model: cache exactness, padding invariance, framing, loss and sampling."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from attnlab import BackboneConfig, ConfigError, DecoderOnly, SamplingConfig
from attnlab.generation import choose_next
from attnlab.generation.decoder_only import generate
from reference_decoding import generate_uncached, left_padded_logits
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.framing import IGNORE, frame_prefix_target
from attnlab.families.optim import OptimizerConfig, lr_multiplier

PROMPTS = [[2, 7, 8, 9, 10, 4], [2, 11, 4], [2, 12, 13, 4]]
UNPADDED = [[2, 7, 8, 4], [2, 11, 12, 4], [2, 12, 13, 4]]  # equal lengths: the mask-free cached path


def tiny_model(positional="rope", **kw):
    torch.manual_seed(0)
    cfg = BackboneConfig(**{"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "d_ff": 64,
                            "dropout": 0.0, "positional": positional, **kw})
    return DecoderOnlyModel(cfg, vocab_size=40).eval()


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi", "none"])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("prompts", [PROMPTS, UNPADDED], ids=["padded", "unpadded"])
def test_cached_decoding_equals_full_recomputation(positional, norm_position, prompts):
    model = tiny_model(positional, norm_position=norm_position)
    cached, cached_logits = generate(model, prompts, max_new_tokens=8, eos_id=3, pad_id=0, return_logits=True)
    full, full_logits = generate_uncached(model, prompts, max_new_tokens=8, eos_id=3, pad_id=0)
    assert cached == full
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "alibi"])
def test_a_padded_batch_decodes_like_each_prompt_alone(positional):
    model = tiny_model(positional)
    batch_out, batch_logits = generate(model, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
    for i, prompt in enumerate(PROMPTS):
        alone, alone_logits = generate(model, [prompt], max_new_tokens=6, eos_id=3, pad_id=0, return_logits=True)
        assert alone[0] == batch_out[i]
        steps = alone_logits.shape[1]
        torch.testing.assert_close(alone_logits[0], batch_logits[i, :steps], atol=1e-5, rtol=1e-5)


def test_training_path_equals_generation_path_on_real_tokens():
    model = tiny_model("alibi")
    batch = {"source": torch.tensor([[7, 8, 9], [11, 0, 0]]), "source_lengths": torch.tensor([3, 1]),
             "target": torch.tensor([[20, 21], [22, 0]]), "target_lengths": torch.tensor([2, 1])}
    tokens, _ = frame_prefix_target(batch, bos=2, sep=4, eos=3, pad=0)
    right_padded = model(tokens)  # training: fused causal kernel, no explicit mask
    for row, n in enumerate([8, 5]):
        alone = left_padded_logits(model, tokens[row : row + 1, :n], torch.ones(1, n, dtype=torch.bool))
        torch.testing.assert_close(right_padded[row, :n], alone[0], atol=1e-5, rtol=1e-5)


def test_framing_puts_labels_on_target_and_eos_only():
    batch = {"source": torch.tensor([[7, 8], [9, 0]]), "source_lengths": torch.tensor([2, 1]),
             "target": torch.tensor([[20, 21, 22], [23, 0, 0]]), "target_lengths": torch.tensor([3, 1])}
    tokens, labels = frame_prefix_target(batch, bos=2, sep=4, eos=3, pad=0)
    assert tokens.tolist() == [[2, 7, 8, 4, 20, 21, 22, 3], [2, 9, 4, 23, 3, 0, 0, 0]]
    assert labels.tolist() == [[IGNORE] * 3 + [20, 21, 22, 3, IGNORE], [IGNORE] * 2 + [23, 3] + [IGNORE] * 4]


def test_plain_lm_data_trains_on_every_token():
    batch = {"source": torch.zeros(2, 0, dtype=torch.long), "source_lengths": torch.tensor([0, 0]),
             "target": torch.tensor([[20, 21, 22], [23, 24, 0]]), "target_lengths": torch.tensor([3, 2])}
    tokens, labels = frame_prefix_target(batch, bos=2, sep=4, eos=3, pad=0)
    assert tokens.tolist() == [[2, 20, 21, 22], [2, 23, 24, 0]]
    assert labels.tolist() == [[20, 21, 22, IGNORE], [23, 24, IGNORE, IGNORE]]


def test_module_loss_is_the_cross_entropy_of_target_tokens():
    module = DecoderOnly(backbone=dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0),
                         optimizer=dict(label_smoothing=0.1), vocab_size=40)
    batch = {"source": torch.tensor([[7, 8], [9, 0]]), "source_lengths": torch.tensor([2, 1]),
             "target": torch.tensor([[20, 21, 22], [23, 0, 0]]), "target_lengths": torch.tensor([3, 1])}
    terms = module.loss_terms(batch)
    tokens, labels = frame_prefix_target(batch, 2, 4, 3, 0)
    logits = module.model(tokens)
    per_row = [(F.cross_entropy(logits[b][labels[b] != IGNORE], labels[b][labels[b] != IGNORE], reduction="sum"),
                F.cross_entropy(logits[b][labels[b] != IGNORE], labels[b][labels[b] != IGNORE], reduction="sum",
                                label_smoothing=0.1)) for b in range(2)]
    assert terms.targets.tolist() == [4, 2] and terms.inputs == 13
    torch.testing.assert_close(terms.nll, torch.stack([nll for nll, _ in per_row]))
    torch.testing.assert_close(terms.loss, torch.stack([smoothed for _, smoothed in per_row]))


def test_tied_and_scaled_embeddings():
    model = tiny_model(scale_embeddings=True, tie_embeddings=True)
    emb = model.stack.embedding
    tokens = torch.tensor([[5, 6]])
    torch.testing.assert_close(emb(tokens), emb.weight[tokens] * math.sqrt(32))
    hidden = torch.randn(1, 2, 32)
    torch.testing.assert_close(emb.logits(hidden), hidden @ emb.weight.T)
    untied = tiny_model(tie_embeddings=False).stack.embedding
    assert untied.output is not None and untied.output.weight.data_ptr() != untied.weight.data_ptr()


@pytest.mark.parametrize("position", ["post", "pre"])
def test_each_sublayer_is_wired_as_its_norm_position_says(position):
    """post (the paper): norm(x + f(x)); pre: x + f(norm(x)). Each wiring is checked against its
    formula and against the other one's, which gives a different result on the same input."""
    from attnlab.components.layers import SubLayer

    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=8, n_heads=2, d_ff=16, dropout=0.0, norm_position=position)
    inner = torch.nn.Linear(8, 8)
    layer = SubLayer(cfg, inner)
    with torch.no_grad():
        layer.norm.weight.uniform_(0.5, 2.0)  # a norm that is not the identity on its own output
        layer.norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(2, 3, 8) * 3 + 1
    out, _ = layer(x)
    post, pre = layer.norm(x + inner(x)), x + inner(layer.norm(x))
    expected, other = (post, pre) if position == "post" else (pre, post)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, other, atol=1e-2)


def test_post_norm_normalises_every_layer_output_and_pre_norm_only_the_last():
    """Post-norm: each layer's output is a LayerNorm output (no final norm); pre-norm: the layers
    pass on the raw residual stream and only the stack's final norm normalises it."""
    tokens = torch.tensor([[2, 5, 6, 7]])
    for position, normalised in (("post", True), ("pre", False)):
        model = tiny_model(norm_position=position)
        outputs = []
        hooks = [layer.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for layer in model.stack.layers]
        hidden, _ = model.hidden(tokens)
        for hook in hooks:
            hook.remove()
        variances = torch.stack([o.var(-1, unbiased=False) for o in outputs])
        assert bool(torch.allclose(variances, torch.ones_like(variances), atol=1e-3)) == normalised, position
        assert isinstance(model.stack.final_norm, torch.nn.Identity) == normalised
        torch.testing.assert_close(hidden.var(-1, unbiased=False), torch.ones(1, 4), atol=1e-3, rtol=0)


def test_swiglu_and_rmsnorm_build_and_differ_from_defaults():
    a = tiny_model(activation="swiglu", norm="rmsnorm", norm_position="pre")
    ffn = a.stack.layers[0].ffn.inner
    x = torch.randn(3, 32)
    gate, value = (x @ ffn.up.weight.T + ffn.up.bias).chunk(2, dim=-1)
    expected = (F.silu(gate) * value) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expected)
    assert isinstance(a.stack.final_norm, torch.nn.RMSNorm)


@pytest.mark.parametrize("bad, field", [
    (dict(d_model=32, n_heads=3), "n_heads"),
    (dict(positional="relative"), "positional"),
    (dict(n_heads=8, n_kv_heads=3), "n_kv_heads"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(dropout=1.5), "dropout"),
])
def test_backbone_config_errors_name_the_field(bad, field):
    with pytest.raises(ConfigError, match=f"backbone.{field}"):
        BackboneConfig(**bad)


def test_greedy_top_k_one_and_tiny_top_p_all_pick_the_argmax():
    logits = torch.randn(16, 40)
    greedy = choose_next(logits, SamplingConfig())
    g = torch.Generator().manual_seed(0)
    assert torch.equal(choose_next(logits, SamplingConfig(temperature=1.0, top_k=1), g), greedy)
    assert torch.equal(choose_next(logits, SamplingConfig(temperature=1.0, top_p=1e-6), g), greedy)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    top_k = choose_next(logits, SamplingConfig(temperature=1.0, top_k=3), g)
    assert set(top_k.tolist()) == {0, 1, 2}
    probs = logits[0].softmax(-1)  # p ≈ .64 .23 .09 ...: top_p 0.8 keeps exactly the first two
    assert probs[0] < 0.8 < probs[:2].sum()
    top_p = choose_next(logits, SamplingConfig(temperature=1.0, top_p=0.8), g)
    assert set(top_p.tolist()) == {0, 1}


def test_sampling_is_reproducible_with_a_seeded_generator():
    model = tiny_model()
    cfg = SamplingConfig(temperature=1.0, top_p=0.9)
    a = generate(model, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, sampling=cfg, generator=torch.Generator().manual_seed(1))
    b = generate(model, PROMPTS, max_new_tokens=6, eos_id=3, pad_id=0, sampling=cfg, generator=torch.Generator().manual_seed(1))
    assert a == b


def test_learning_rate_schedules_follow_their_formulas():
    cosine = OptimizerConfig(warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_multiplier(cosine, 4, 110) == pytest.approx(0.5)  # step 5 of 10 warmup steps
    assert lr_multiplier(cosine, 9, 110) == pytest.approx(1.0)
    assert lr_multiplier(cosine, 59, 110) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(cosine, 109, 110) == pytest.approx(0.1)
    inverse = OptimizerConfig(warmup_steps=100, schedule="inverse_sqrt")
    assert lr_multiplier(inverse, 399, 10_000) == pytest.approx(math.sqrt(100 / 400))
    # warmup_ratio: a share of the run's steps (it wins over warmup_steps); 0.1 of 100 steps is 10
    share = OptimizerConfig(warmup_steps=999, warmup_ratio=0.1, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_multiplier(share, s, 100) for s in range(100)] == pytest.approx([lr_multiplier(cosine, s, 100) for s in range(100)])
    assert lr_multiplier(share, 9, 200) == pytest.approx(0.5) and lr_multiplier(share, 19, 200) == pytest.approx(1.0)
    assert share.warmup(200) == 20 and cosine.warmup(200) == 10


@pytest.mark.parametrize("field,value,words", [("warmup_ratio", 1.0, "warmup_ratio=1.0 must be a share"),
                                               ("warmup_ratio", -0.1, "in [0, 1)"),
                                               ("label_smoothing", 1.5, "label_smoothing=1.5 must be in [0, 1)")])
def test_a_bad_optimizer_value_names_its_field(field, value, words):
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(words)):
        OptimizerConfig(**{field: value})


@pytest.mark.parametrize("positional", ["rope", "alibi", "learned"])
def test_beam_size_one_is_greedy_and_batching_does_not_change_beams(positional):
    from attnlab.generation.decoder_only import generate_beam

    model = tiny_model(positional)
    greedy = generate(model, PROMPTS, max_new_tokens=7, eos_id=3, pad_id=0)
    assert generate_beam(model, PROMPTS, max_new_tokens=7, eos_id=3, pad_id=0, beam_size=1, alpha=0.6) == greedy
    beams = generate_beam(model, PROMPTS, max_new_tokens=7, eos_id=3, pad_id=0, beam_size=3, alpha=0.6)
    for i, prompt in enumerate(PROMPTS):
        assert generate_beam(model, [prompt], max_new_tokens=7, eos_id=3, pad_id=0, beam_size=3, alpha=0.6)[0] == beams[i]
