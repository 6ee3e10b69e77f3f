"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import ConfigError
from attnlab.generation.compiled_step import check_compilable


@dataclass
class SamplingConfig:
    """temperature 0 is greedy; otherwise sample from the top_k / top_p filtered distribution.

    beam_size > 1 uses beam search instead (decoder-only and encoder-decoder), ranked with the
    GNMT length penalty `length_penalty` (alpha; 0.6 in the paper).

    compile: each decoding call torch.compiled (one graph for every step, dynamic shapes, compiled
    at the first batch: seconds to minutes). The same tokens as eager; off by default, since only
    long decodes win the compile back and how long depends on the device
    (generation/compiled_step.py).

    verify (BlockDiffusion with shift and context causal): draft-and-verify decoding. Each call
    drafts the next block with the diffusion view and, in the same pass, checks the previous
    draft with the model's own AR view (generation/draft_verify.py): the output is the AR view's
    (its greedy tokens, or its distribution when sampling), several tokens a call where the
    drafts agree.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: source length + 50 (the paper's rule)
    beam_size: int = 1
    length_penalty: float = 0.6
    compile: bool = False
    verify: bool = False

    def __post_init__(self):
        if self.temperature < 0:
            raise ConfigError(f"generation.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ConfigError(f"generation.top_k={self.top_k} must be >= 0 (0 = no limit)")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(
                f"generation.max_new_tokens={self.max_new_tokens} must be >= 1 (or null: source length + 50)"
            )
        if self.compile == "auto":
            raise ConfigError("generation.compile=auto is no longer a setting (no one count of calls makes compiling "
                              "pay on every device): set generation.compile true to compile decoding, or false")
        if not isinstance(self.compile, bool):
            raise ConfigError(f"generation.compile={self.compile!r} must be true or false")
        if self.compile:
            check_compilable()
        if not isinstance(self.verify, bool):
            raise ConfigError(f"generation.verify={self.verify!r} must be true or false")
        if self.beam_size < 1:
            raise ConfigError(f"generation.beam_size={self.beam_size} must be >= 1 (1 = greedy / sampling)")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"generation.top_p={self.top_p} must be in (0, 1]")


def filtered_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> the distribution sampling draws from: softmax of the logits over the
    temperature, with tokens outside top_k / top_p at 0 (temperature > 0 only)."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k:
        kth = logits.topk(min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = probs.cumsum(dim=-1) - probs >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def choose_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None):
    """(B, V) logits -> (B,) token ids."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    return torch.multinomial(filtered_probs(logits, cfg), 1, generator=generator).squeeze(-1)
