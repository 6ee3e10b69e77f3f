"""docs/guides/families.md "Adding a positional encoding", followed literally: a log-distance
score bias (KERPLE's logarithmic variant, Chi et al. 2022) subclassed, registered, then named by
`backbone.positional` in a fit and in cached decoding, which use it through its hooks alone."""
from __future__ import annotations

import pytest
import torch

from attnlab import BackboneConfig, ConfigError
from attnlab.components import positional
from attnlab.components.positional import PositionalEncoding, alibi_slopes, distances
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate
from attnlab.models.decoder_only import DecoderOnlyModel
from conftest import debug_fit_args, read_metrics
from reference_decoding import generate_uncached, sample_blocks_uncached


class LogDistance(PositionalEncoding):
    """Step 1-2: score -= slope_h * log(1 + |i - j|); nothing is added to the embeddings."""

    adds_score_bias = True

    @classmethod
    def check_config(cls, cfg):
        if cfg.n_heads < 2:
            raise ConfigError("backbone.positional=log_distance needs backbone.n_heads >= 2 (one slope a head)")

    def __init__(self, cfg):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def score_bias(self, q_positions, k_positions):
        return -self.slopes[None, :, None, None] * torch.log1p(distances(q_positions, k_positions))[:, None]


@pytest.fixture
def registered(monkeypatch):
    """Step 3: the encoding in REGISTRY under its name (for this test only)."""
    monkeypatch.setitem(positional.REGISTRY, "log_distance", LogDistance)


def model(**kw) -> DecoderOnlyModel:
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, positional="log_distance", **kw)
    return DecoderOnlyModel(cfg, vocab_size=40).eval()


def test_the_registry_is_what_the_backbone_accepts(registered):
    assert type(model().stack.positional) is LogDistance
    with pytest.raises(ConfigError, match="needs backbone.n_heads >= 2"):
        BackboneConfig(d_model=32, n_heads=1, positional="log_distance")
    positional.REGISTRY.pop("log_distance")
    with pytest.raises(ConfigError, match="log_distance"):
        BackboneConfig(d_model=32, n_heads=4, positional="log_distance")


def test_its_bias_is_the_formula_in_the_attention_scores(registered):
    m = model()
    positions = torch.arange(5)
    bias = m.stack.positional.score_bias(positions, positions)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h].item() * torch.log1p(torch.tensor(abs(i - j) * 1.0)).item())


PROMPTS = [[2, 7, 8, 9, 10, 4], [2, 11, 4], [2, 12, 13, 4]]


def test_cached_decoding_with_it_equals_full_recomputation(registered):
    m = model()
    cached, cached_logits = generate(m, PROMPTS, max_new_tokens=8, eos_id=3, pad_id=0, return_logits=True)
    full, full_logits = generate_uncached(m, PROMPTS, max_new_tokens=8, eos_id=3, pad_id=0)
    assert cached == full
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)  # the same weights without positions: the bias is what changes the logits
    plain = DecoderOnlyModel(BackboneConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, positional="none"),
                             vocab_size=40).eval()
    _, plain_logits = generate(plain, PROMPTS, max_new_tokens=8, eos_id=3, pad_id=0, return_logits=True)
    assert not torch.allclose(plain_logits[:, :1], cached_logits[:, :1], atol=1e-3)


def test_block_diffusion_samples_with_it_as_uncached_sampling_does(registered):
    from attnlab.families import BlockDiffusion

    torch.manual_seed(0)
    module = BlockDiffusion(vocab_size=40, block_size=4, backbone=dict(
        d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, positional="log_distance")).eval()

    def run(sampler):
        return sampler(module.model, [[2, 7, 8, 9, 4], [2, 11, 4]], max_new_tokens=8, block_size=4, steps=2,
                       eos_id=3, pad_id=0, generator=torch.Generator().manual_seed(1))

    assert run(sample_blocks) == run(sample_blocks_uncached)


def test_a_fit_names_it_and_trains(cli, tmp_path, registered):
    result = cli(*debug_fit_args(tmp_path, "--model.init_args.backbone.positional", "log_distance"))
    assert result.code == 0, result.err[-3000:]
    metrics = read_metrics(tmp_path / "debug" / "v1")
    assert len(metrics["train/loss"]) == 2 and all(v == v for v in metrics["val/nll"])
