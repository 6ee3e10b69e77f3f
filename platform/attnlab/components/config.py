"""The backbone hyper-parameters of every family, validated up front so a typo costs seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from attnlab.components import positional
from attnlab.errors import ConfigError

CHOICES = {
    "norm_position": ("post", "pre"),
    "norm": ("layernorm", "rmsnorm"),
    "activation": ("relu", "gelu", "swiglu"),
    "positional": positional.REGISTRY,  # the encodings' one list, read live (a new encoding registers there)
    "backend": ("sdpa", "math"),
}


@dataclass
class BackboneConfig:
    """Shape of a transformer stack. Defaults are the paper's base model (Vaswani et al., 2017).

    Configs name these as `model.init_args.backbone.<field>`.
    """

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: Optional[int] = None  # None: = n_heads (MHA); fewer: GQA; 1: MQA
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    norm_position: str = "post"
    norm: str = "layernorm"
    activation: str = "relu"
    positional: str = "sinusoidal"
    max_positions: int = 1024  # size of the learned table; the limit of any run with `learned`
    backend: str = "sdpa"
    bias: bool = True
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model), as the paper does
    tie_embeddings: bool = True  # share input embedding and output projection
    # GPU options: they change how the same function is computed, not the function.
    fused_qkv: bool = False  # self-attention q, k, v in one GEMM (False keeps older checkpoints' keys)
    vocab_multiple: int = 1  # pad the embedding rows to a multiple (64: tensor-core shapes); logits stay V wide

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(
                    f"backbone.{name}={value!r} is not one of {', '.join(allowed)}: pick one of those"
                )
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "max_positions", "vocab_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"model.init_args.backbone.{name}={value!r} must be a positive integer"
                    + (" (1: no padding; 64 suits GPU tensor cores)" if name == "vocab_multiple" else "")
                )
        if not isinstance(self.fused_qkv, bool):
            raise ConfigError(
                f"model.init_args.backbone.fused_qkv={self.fused_qkv!r} must be true or false"
            )
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and h <= 64]
            raise ConfigError(
                f"backbone.n_heads={self.n_heads} does not divide backbone.d_model={self.d_model}: "
                f"choose n_heads among {divisors} or change d_model"
            )
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ConfigError(
                f"backbone.n_kv_heads={self.n_kv_heads} must divide backbone.n_heads={self.n_heads} "
                "(n_heads for MHA, a divisor for GQA, 1 for MQA)"
            )
        positional.REGISTRY[self.positional].check_config(self)
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"backbone.{name}={getattr(self, name)} must be in [0, 1)")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when unset (plain multi-head attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads
