"""DecoderOnly: the GPT-style family as a LightningModule."""
from __future__ import annotations

from functools import partial

import torch

from attnlab.families.attention_map import AttentionMap, layer_weights, token_labels
from attnlab.families.base import FamilyModule
from attnlab.generation import SamplingConfig
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.framing import IGNORE, frame_prefix_target, prompts_of
from attnlab.models.losses import LossTerms, target_losses


class DecoderOnly(FamilyModule):
    """Trains on `[bos] source [sep] target [eos]` with loss on the target (all tokens for plain LM)."""

    family = "decoder_only"
    autoregressive, nll_is_bound, encodes_source, causal_lm = True, False, False, True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model = DecoderOnlyModel(self.backbone, self.vocab_size, self.special.pad)

    def loss_terms(self, batch):
        ids = self.special
        tokens, labels = frame_prefix_target(batch, ids.bos, ids.sep, ids.eos, ids.pad)
        hidden, _ = self.model.hidden(tokens)
        labelled = labels != IGNORE
        # Project only labelled positions: the prompt needs no output distribution.
        logits = self.model.stack.embedding.logits(hidden[labelled])
        loss, nll = target_losses(logits.float(), labels[labelled], self.optim.label_smoothing, labelled)
        flops = self.flop_counter.step(*tokens.shape, projected=len(logits))
        return LossTerms(loss, nll, labelled.sum(1), int((tokens != ids.pad).sum()), flops)

    def expected_flops(self, batch):
        ids = self.special
        tokens, labels = frame_prefix_target(batch, ids.bos, ids.sep, ids.eos, ids.pad)
        return self.flop_counter.step(*tokens.shape, projected=int((labels != IGNORE).sum()))

    def positions_needed(self, source_length: int, target_length: int) -> int:
        if source_length == 0:  # plain LM: [bos] target, no generation
            return 1 + target_length
        generated = self.max_output_length(source_length) - 1  # the last token is never fed back
        return source_length + 2 + max(target_length + 1, generated)

    def generate_ids(self, batch):
        prompts = prompts_of(batch, self.special.bos, self.special.sep)
        max_new = self.max_output_length(batch["source_lengths"])  # one budget per row
        ids, cfg = self.special, self.sampling
        if cfg.beam_size > 1:
            return generate_beam(self.model, prompts, max_new_tokens=max_new, eos_id=ids.eos, pad_id=ids.pad,
                                 beam_size=cfg.beam_size, alpha=cfg.length_penalty, compiled=cfg.compile)
        return generate(self.model, prompts, max_new_tokens=max_new, eos_id=ids.eos, pad_id=ids.pad, sampling=cfg,
                        compiled=cfg.compile)

    def sample_decodings(self, steps, thresholds, unmasking):
        return [{}]  # one token a call

    def continue_ids(self, prompts, setting, **common):
        return generate(self.model, prompts, **setting, **common)

    def bench_decodings(self, batch, new, beam, eos_id):
        prompts, common = batch["source"].tolist(), dict(max_new_tokens=new, eos_id=eos_id, pad_id=self.special.pad)
        return {
            "greedy": lambda compiled: partial(self.continue_ids, prompts, {}, sampling=SamplingConfig(),
                                               compiled=compiled, **common),
            f"beam{beam}": lambda compiled: partial(generate_beam, self.model, prompts, beam_size=beam, alpha=0.6,
                                                    compiled=compiled, **common),
        }

    def attention_stacks(self):
        return {"decoder": self.model.stack}

    @torch.no_grad()
    def attention_weights(self, example):
        """The causal self-attention over `[bos] source [sep] target [eos]`, as in training."""
        ids = self.special
        tokens, _ = frame_prefix_target(self.collate_on_device([example]), ids.bos, ids.sep, ids.eos, ids.pad)
        _, weights = self.model.hidden(tokens, need_weights=True)
        labels = token_labels(self, tokens[0])
        return [AttentionMap("self", layer_weights(weights, "self"), labels, labels)]
