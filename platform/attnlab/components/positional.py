"""Positional encodings behind one interface, chosen by `backbone.positional`.

They act at three different points, so each implements only the hooks it needs:
  add_to_embeddings  (sinusoidal, learned)  x + P[pos]
  rotary             (rope)                 cos/sin that rotate q and k
  score_bias         (alibi)                a bias added to attention scores
No code branches on the encoding's name: it asks the class (`adds_score_bias`, `max_positions`,
`check_config`). REGISTRY is the one list of choices `backbone.positional` accepts.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.errors import ConfigError

# `cfg: BackboneConfig` below names components/config.py's class without importing it: config.py
# reads REGISTRY to check `backbone.positional`, and the two would otherwise import each other.

Rotary = tuple[torch.Tensor, torch.Tensor]


class PositionalEncoding(nn.Module):
    """No positions (NoPE); the base class every encoding refines."""

    max_positions: int | None = None  # positions from 0 up to this (excluded) exist; None: any
    adds_score_bias = False  # whether `score_bias` returns a bias (kernels that take none cannot run it)

    @classmethod
    def check_config(cls, cfg: BackboneConfig) -> None:
        """Refuse a backbone this encoding cannot work with, as a ConfigError (BackboneConfig
        asks every encoding it is given)."""

    def check_positions(self, positions: torch.Tensor) -> None:
        """Fail clearly before a forward pass that would need more positions than exist."""

    def add_to_embeddings(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, positions: torch.Tensor) -> Rotary | None:
        return None

    def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        return None


def sinusoid_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), as in the paper."""
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    angles = positions.float()[..., None] / torch.pow(10000.0, i / d_model)
    table = torch.empty(*positions.shape, d_model, device=positions.device)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return table


class Sinusoidal(PositionalEncoding):
    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.d_model = cfg.d_model

    def add_to_embeddings(self, x, positions):
        return x + sinusoid_table(positions, self.d_model).to(x.dtype)


class Learned(PositionalEncoding):
    """A trained table (GPT-2); it cannot go past `max_positions`."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.table = nn.Embedding(cfg.max_positions, cfg.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    @property
    def max_positions(self) -> int:
        return self.table.num_embeddings

    def check_positions(self, positions):
        limit = self.max_positions
        n_positions = int(positions.max()) + 1 if positions.numel() else 0
        if n_positions > limit:
            raise ConfigError(
                f"a sequence needs {n_positions} positions but the learned position table has "
                f"backbone.max_positions={limit}: raise backbone.max_positions, shorten the "
                f"sequences, or use a positional encoding without a table ({', '.join(unbounded())})"
            )

    def add_to_embeddings(self, x, positions):
        return x + self.table(positions)


class Rope(PositionalEncoding):
    """Rotary embeddings (Su et al.): q·k depends on positions only through their difference."""

    @classmethod
    def check_config(cls, cfg):
        if cfg.head_dim % 2:
            raise ConfigError(f"backbone.positional=rope needs an even head size, but d_model/n_heads={cfg.head_dim}")

    def __init__(self, cfg: BackboneConfig, base: float = 10000.0):
        super().__init__()
        dim = cfg.head_dim
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, positions):
        freqs = positions.float()[..., None] * self.inv_freq  # (..., L, dim/2)
        angles = torch.cat((freqs, freqs), dim=-1)
        if angles.dim() == 3:  # (B, L, dim) -> (B, 1, L, dim) to broadcast over heads
            angles = angles[:, None]
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """Rotate (B, H, L, D) queries or keys by the angles of their positions."""
    cos, sin = rotary
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Geometric slopes 2^(-8h/n) (Press et al.); other head counts interleave the next power of 2."""

    def power_of_two(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


def distances(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """|i - j| between every query and key position, (B|1, Lq, Lk) float: what a score bias of
    relative positions is a function of."""
    distance = (q_positions[..., :, None] - k_positions[..., None, :]).abs().float()
    return distance[None] if distance.dim() == 2 else distance


class Alibi(PositionalEncoding):
    """Linear biases: score -= slope_h * |i - j|; nothing is added to the embeddings."""

    adds_score_bias = True

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def score_bias(self, q_positions, k_positions):
        return -self.slopes[None, :, None, None] * distances(q_positions, k_positions)[:, None]  # (B|1, H, Lq, Lk)


REGISTRY: dict[str, type[PositionalEncoding]] = {
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "rope": Rope,
    "alibi": Alibi,
    "none": PositionalEncoding,
}


def unbounded() -> list[str]:
    """The encodings without a position table (any position exists)."""
    return [name for name, cls in REGISTRY.items() if cls.max_positions is None]


def build_positional(cfg: BackboneConfig) -> PositionalEncoding:
    cls = REGISTRY[cfg.positional]
    return cls() if cls is PositionalEncoding else cls(cfg)
