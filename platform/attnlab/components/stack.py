"""The trunk every family shares: embeddings, positions, N layers, and a final norm (pre-norm)."""
from __future__ import annotations

import torch
from torch import nn

from attnlab.components.config import BackboneConfig
from attnlab.components.embedding import TokenEmbedding
from attnlab.components.feedforward import build_norm
from attnlab.components.kv_cache import LayerCache
from attnlab.components.layers import TransformerLayer
from attnlab.components.masks import causal_mask
from attnlab.components.positional import build_positional


def merge_bias(mask, is_causal: bool, bias: torch.Tensor, n_q: int, n_k: int):
    """Fold a boolean (or implicit causal) mask into an additive score bias."""
    if mask is None and is_causal:
        mask = causal_mask(n_q, n_k, bias.device)
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


class TransformerStack(nn.Module):
    def __init__(
        self,
        cfg: BackboneConfig,
        vocab_size: int,
        cross_attention: bool = False,
        embedding: TokenEmbedding | None = None,
        pad_id: int = 0,
    ):
        super().__init__()
        self.cfg = cfg
        self.embedding = embedding if embedding is not None else TokenEmbedding(cfg, vocab_size, pad_id)
        self.positional = build_positional(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerLayer(cfg, cross_attention) for _ in range(cfg.n_layers))
        self.final_norm = build_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()
        self._init_linear_weights()

    def _init_linear_weights(self) -> None:
        for module in self.layers.modules():
            if isinstance(module, nn.Linear):
                # A fused projection (fused_qkv) starts as its parts would: xavier's bound depends on the width.
                for part in module.weight.split(getattr(module, "init_rows", [module.out_features])):
                    nn.init.xavier_uniform_(part)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def attention_modules(self, kind: str = "self"):
        """The attention modules of each layer ('self' or 'cross'), for head masking and maps."""
        return [getattr(layer, f"{kind}_attn").inner for layer in self.layers if getattr(layer, f"{kind}_attn")]

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        key_positions: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, list[dict]]:
        """tokens (B, L), positions (L,) or (B, L); key_positions include cached keys (for ALiBi).

        Returns the final hidden states (B, L, d) and per-layer attention weights (when asked).
        """
        if not torch.compiler.is_compiling():  # a compiled decode step checks before it is called
            self.positional.check_positions(positions)
        x = self.positional.add_to_embeddings(self.embedding(tokens), positions)  # (B, L) -> (B, L, d)
        x = self.drop(x)
        rotary = self.positional.rotary(positions)
        # (B|1, H, L, Lk) or None
        bias = self.positional.score_bias(positions, positions if key_positions is None else key_positions)
        if bias is not None:
            mask = merge_bias(mask, is_causal, bias.to(x.dtype), tokens.shape[1], bias.shape[-1])
            is_causal = False
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(
                x, mask=mask, is_causal=is_causal, rotary=rotary, context=context,
                context_mask=context_mask, cache=caches[i] if caches else None, need_weights=need_weights,
            )
            weights.append(w)
        return self.final_norm(x), weights
