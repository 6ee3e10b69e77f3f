"""Each positional encoding has the property that defines it."""
import math

import pytest
import torch

from attnlab.components import BackboneConfig, POSITIONAL_ENCODINGS, build_positional
from attnlab.components.positional import alibi_slopes, apply_rotary, sinusoid_table
from attnlab.errors import ConfigError


def cfg(positional, **kw):
    return BackboneConfig(**{"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
                             "positional": positional, **kw})


def test_sinusoidal_matches_the_papers_formula():
    d = 16
    table = sinusoid_table(torch.arange(50), d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_is_added_to_the_embeddings():
    enc = build_positional(cfg("sinusoidal"))
    x = torch.zeros(1, 4, 16)
    torch.testing.assert_close(enc.add_to_embeddings(x, torch.arange(4))[0], sinusoid_table(torch.arange(4), 16))


def test_rope_scores_depend_only_on_relative_position():
    enc = build_positional(cfg("rope"))
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq, pk):
        rq = apply_rotary(q, enc.rotary(torch.tensor([pq])))
        rk = apply_rotary(k, enc.rotary(torch.tensor([pk])))
        return (rq * rk).sum().item()

    assert score(5, 2) == pytest.approx(score(103, 100), abs=1e-4)
    assert score(0, 0) == pytest.approx(score(40, 40), abs=1e-4)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # but it does depend on the distance


def test_rope_preserves_norms():
    enc = build_positional(cfg("rope"))
    x = torch.randn(2, 2, 6, 8)
    rotated = apply_rotary(x, enc.rotary(torch.arange(6)))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_alibi_slopes_are_the_published_geometric_sequences():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence
    expected = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))


def test_alibi_bias_is_minus_slope_times_distance():
    enc = build_positional(cfg("alibi", n_heads=2))
    bias = enc.score_bias(torch.arange(4), torch.arange(4))
    assert bias.shape == (1, 2, 4, 4)
    assert bias[0, 0, 3, 0].item() == pytest.approx(-3 * 2.0 ** -4)
    assert bias[0, 1, 2, 1].item() == pytest.approx(-1 * 2.0 ** -8)
    assert torch.all(bias[0, :, range(4), range(4)] == 0)


def test_learned_table_refuses_sequences_longer_than_itself():
    enc = build_positional(cfg("learned", max_positions=8))
    enc.check_positions(torch.arange(8))
    with pytest.raises(ConfigError, match="needs 9 positions.*max_positions=8"):
        enc.check_positions(torch.arange(9))


def test_none_changes_nothing():
    enc = build_positional(cfg("none"))
    x = torch.randn(1, 3, 16)
    assert enc.add_to_embeddings(x, torch.arange(3)) is x
    assert enc.rotary(torch.arange(3)) is None and enc.score_bias(torch.arange(3), torch.arange(3)) is None


def test_registry_names_every_encoding():
    assert set(POSITIONAL_ENCODINGS) == {"sinusoidal", "learned", "rope", "alibi", "none"}
