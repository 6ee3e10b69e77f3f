"""EncoderDecoder: the translation transformer of "Attention Is All You Need" as a LightningModule."""
from __future__ import annotations

import torch

from attnlab.errors import ConfigError
from attnlab.families.attention_map import AttentionMap, layer_weights, token_labels
from attnlab.families.base import FamilyModule
from attnlab.generation import SamplingConfig
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.models.encoder_decoder import EncoderDecoderModel
from attnlab.models.framing import IGNORE, frame_source_target, is_plain_lm, prompts_of
from attnlab.models.losses import LossTerms, target_losses
from attnlab.training.flops import FlopCounter


class EncoderDecoder(FamilyModule):
    """Encoder reads `source [eos]`; decoder reads `[bos] target` and predicts `target [eos]`.

    `backbone.n_layers` is the decoder depth; `n_encoder_layers` defaults to the same.
    `share_embeddings` ties source, target and output embeddings (one joint vocabulary).
    """

    family = "encoder_decoder"
    autoregressive, nll_is_bound, encodes_source = True, False, True

    def __init__(self, *args, n_encoder_layers: int | None = None, share_embeddings: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        if n_encoder_layers is not None and n_encoder_layers < 1:
            raise ConfigError(f"model.init_args.n_encoder_layers={n_encoder_layers} must be >= 1 (or null)")
        self.hparams.update(n_encoder_layers=n_encoder_layers, share_embeddings=share_embeddings)
        self.model = EncoderDecoderModel(
            self.backbone, self.vocab_size, self.special.pad, n_encoder_layers, share_embeddings
        )

    def _frame(self, batch):
        ids = self.special
        return frame_source_target(batch, ids.bos, ids.eos, ids.pad)

    def loss_terms(self, batch):
        source, source_valid, decoder_in, labels = self._frame(batch)
        encoded, _ = self.model.encode(source, source_valid)
        hidden, _ = self.model.decode(decoder_in, encoded)
        labelled = labels != IGNORE
        logits = self.model.logits(hidden[labelled])
        loss, nll = target_losses(logits.float(), labels[labelled], self.optim.label_smoothing, labelled)
        n_inputs = int(source_valid.sum()) + int((decoder_in != self.special.pad).sum())
        flops = self.flop_counter.step(*decoder_in.shape, projected=len(logits), source_length=source.shape[1])
        return LossTerms(loss, nll, labelled.sum(1), n_inputs, flops)

    def expected_flops(self, batch):
        source, _, decoder_in, labels = self._frame(batch)
        return self.flop_counter.step(*decoder_in.shape, projected=int((labels != IGNORE).sum()),
                                      source_length=source.shape[1])

    @classmethod
    def count_flops(cls, model, vocab):
        return FlopCounter(model.decoder, vocab, encoder=model.encoder)

    @classmethod
    def flops_per_token(cls, model, vocab, source_len, target_len, masked_fraction=0.5):
        """The encoder's work spread over the target tokens."""
        return cls.count_flops(model, vocab).step(1, target_len, target_len, source_len) / target_len

    def positions_needed(self, source_length: int, target_length: int) -> int:
        return max(source_length + 1, target_length + 1, self.max_output_length(source_length))

    def decoding_stack(self):
        """The decoder: the encoder runs once per source, not once per generated token."""
        return self.model.decoder

    def _encode(self, batch) -> torch.Tensor:
        """The encoder's output for the batch's sources (B, Ls, d): what every decoding attends to."""
        source, source_valid, _, _ = self._frame(batch)
        return self.model.encode(source, source_valid)[0]

    def generate_ids(self, batch):
        encoded = self._encode(batch)
        max_lengths = self.max_output_length(batch["source_lengths"])
        ids, cfg = self.special, self.sampling
        # Plain text: the encoder reads nothing but eos (as in training); the decoder continues `[bos] text`.
        prefixes = prompts_of(batch, ids.bos, ids.sep) if is_plain_lm(batch) else None
        if cfg.beam_size > 1:
            return translate_beam(self.model, encoded, max_lengths=max_lengths, bos_id=ids.bos, eos_id=ids.eos,
                                  beam_size=cfg.beam_size, alpha=cfg.length_penalty, prefixes=prefixes, pad_id=ids.pad,
                                  compiled=cfg.compile)
        return translate_greedy(self.model, encoded, max_lengths=max_lengths, bos_id=ids.bos, eos_id=ids.eos,
                                pad_id=ids.pad, prefixes=prefixes, sampling=cfg, compiled=cfg.compile)

    def bench_decodings(self, batch, new, beam, eos_id):
        """Each row's source translated into `new` tokens, the encoder inside the timed call."""
        ids, lengths = self.special, torch.full((len(batch["source"]),), new, device=batch["source"].device)
        common = dict(max_lengths=lengths, bos_id=ids.bos, eos_id=eos_id, pad_id=ids.pad)

        def translate(decode, **kwargs):
            @torch.no_grad()
            def run():
                decode(self.model, self._encode(batch), **common, **kwargs)
            return run

        return {
            "greedy": lambda compiled: translate(translate_greedy, sampling=SamplingConfig(), compiled=compiled),
            f"beam{beam}": lambda compiled: translate(translate_beam, beam_size=beam, alpha=0.6, compiled=compiled),
        }

    def attention_stacks(self):
        return {"encoder": self.model.encoder, "decoder": self.model.decoder}

    @torch.no_grad()
    def attention_weights(self, example):
        """Encoder self-attention over `source [eos]`, decoder self-attention over `[bos] target`,
        and the decoder→encoder cross-attention (the alignment), teacher-forced."""
        source, source_valid, decoder_in, _ = self._frame(self.collate_on_device([example]))
        encoded, encoder_weights = self.model.encode(source, source_valid, need_weights=True)
        _, decoder_weights = self.model.decode(decoder_in, encoded, need_weights=True)
        src, tgt = token_labels(self, source[0]), token_labels(self, decoder_in[0])
        return [
            AttentionMap("encoder_self", layer_weights(encoder_weights, "self"), src, src),
            AttentionMap("decoder_self", layer_weights(decoder_weights, "self"), tgt, tgt),
            AttentionMap("cross", layer_weights(decoder_weights, "cross"), tgt, src),
        ]
