"""What a user would otherwise write: Hugging Face GPT-2 and a torch.nn.Transformer translator,
built at the same widths as the platform's models (dropout 0, tied embeddings)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.bench.shapes import BenchShape
from attnlab.errors import AttnlabError


def hf_gpt2(shape: BenchShape):
    """GPT2LMHeadModel at the bench's shape, or a clear error naming the extra to install."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging as hf_logging
    except ImportError as err:
        raise AttnlabError(
            "the GPT-2 reference needs Hugging Face transformers: pip install -e '.[bench]' "
            "(or pass --no-hf to bench without it)"
        ) from err
    hf_logging.set_verbosity_error()  # its notes about defaults would interleave with the bench's progress
    config = GPT2Config(
        vocab_size=shape.vocab, n_positions=max(shape.seq_len, shape.gen_prompt + shape.gen_new),
        n_embd=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads, n_inner=shape.d_ff,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2, eos_token_id=3, pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


def sinusoids(length: int, d_model: int) -> torch.Tensor:
    position = torch.arange(length)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
    return table


class TorchTranslator(nn.Module):
    """torch.nn.Transformer with a shared, scaled embedding, sinusoidal positions and a tied
    output projection: the paper's model as the PyTorch tutorial builds it."""

    def __init__(self, shape: BenchShape, max_len: int = 1024):
        super().__init__()
        self.embedding = nn.Embedding(shape.vocab, shape.d_model)
        self.register_buffer("positions", sinusoids(max_len, shape.d_model), persistent=False)
        self.transformer = nn.Transformer(
            shape.d_model, shape.n_heads, shape.ed_layers, shape.ed_layers, shape.d_ff, dropout=0.0,
            batch_first=True,
        )
        self.scale = math.sqrt(shape.d_model)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens) * self.scale + self.positions[: tokens.shape[1]]

    def encode(self, source: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.embed(source))

    def decode(self, target_in: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        n = target_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(n, device=target_in.device)
        hidden = self.transformer.decoder(self.embed(target_in), memory, tgt_mask=causal, tgt_is_causal=True)
        return F.linear(hidden, self.embedding.weight)

    def loss(self, source: torch.Tensor, target_in: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.decode(target_in, self.encode(source))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    @torch.no_grad()
    def greedy(self, source: torch.Tensor, bos_id: int, new_tokens: int) -> torch.Tensor:
        """Without a KV cache (nn.Transformer has none): every step re-decodes the whole prefix."""
        memory = self.encode(source)
        tokens = torch.full((len(source), 1), bos_id, dtype=torch.long, device=source.device)
        for _ in range(new_tokens):
            next_token = self.decode(tokens, memory)[:, -1].argmax(-1)
            tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        return tokens[:, 1:]
