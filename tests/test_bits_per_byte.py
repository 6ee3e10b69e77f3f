"""val/bpb of every family equals a hand computation on a fixed batch: the summed target NLL in
bits over the UTF-8 bytes of the reference texts, with a distributed sampler's padding row left out."""
from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from attnlab import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.models.framing import IGNORE, frame_prefix_target, frame_source_target
from data_modules.batch import Example, collate_indexed
from reference_decoding import denoise

BACKBONE = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0)
# "Grüße": G r ü(2) ß(2) e = 7 bytes; "zwölf Bäume": z w ö(2) l f, space, B ä(2) u m e = 13 bytes.
EXAMPLES = [Example([7, 8, 9], [20, 21], "x", "Grüße"), Example([10], [22, 23, 24], "y", "zwölf Bäume")]
BYTES = 7 + 13


def _bpb_through_validation(module) -> float:
    # The third row repeats example 0 as a padding row (counted False): it must not count.
    items = [(0, True, EXAMPLES[0]), (1, True, EXAMPLES[1]), (0, False, EXAMPLES[0])]
    loader = DataLoader(items, batch_size=3, collate_fn=lambda rows: collate_indexed(rows, 0))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, dataloaders=loader)
    return float(trainer.callback_metrics["val/bpb"])


def _batch():
    return collate_indexed([(i, True, e) for i, e in enumerate(EXAMPLES)], 0)


def _nll_by_hand(logits, labels) -> float:
    keep = labels != IGNORE
    return float(F.cross_entropy(logits[keep], labels[keep], reduction="sum"))


@torch.no_grad()
def test_decoder_only_bpb_by_hand():
    torch.manual_seed(0)
    module = DecoderOnly(backbone=BACKBONE, vocab_size=40).eval()
    tokens, labels = frame_prefix_target(_batch(), bos=2, sep=4, eos=3, pad=0)
    expected = _nll_by_hand(module.model(tokens), labels) / math.log(2) / BYTES
    assert _bpb_through_validation(module) == pytest.approx(expected, rel=1e-5)


@torch.no_grad()
def test_encoder_decoder_bpb_by_hand():
    torch.manual_seed(0)
    module = EncoderDecoder(backbone=BACKBONE, vocab_size=40).eval()
    source, valid, decoder_in, labels = frame_source_target(_batch(), bos=2, eos=3, pad=0)
    expected = _nll_by_hand(module.model(source, valid, decoder_in), labels) / math.log(2) / BYTES
    assert _bpb_through_validation(module) == pytest.approx(expected, rel=1e-5)


@torch.no_grad()
def test_block_diffusion_bpb_is_its_bound_in_bits_per_byte():
    """Block diffusion's likelihood is the NELBO bound; at block size 1 with every target token
    masked (t = 1) it is the autoregressive NLL, so the hand computation is a plain cross-entropy."""
    torch.manual_seed(0)
    module = BlockDiffusion(backbone=BACKBONE, vocab_size=40, block_size=1).eval()
    module.eval_noise_floor = 1.0 - 1e-9  # evaluation draws t in [floor, 1]: t = 1, every token masked
    frame = module._frame(_batch())
    target, blocks, positions = frame.target_view()
    noisy = torch.full_like(target, module.special.mask)
    hidden = denoise(module.model, noisy, blocks, positions, frame.clean, frame.clean_blocks)
    logits = module.model.logits(hidden).float()
    logits[..., module.special.mask] = float("-inf")
    real = torch.arange(target.shape[1])[None] < frame.n_targets[:, None]
    expected = float(F.cross_entropy(logits[real], target[real], reduction="sum")) / math.log(2) / BYTES
    assert _bpb_through_validation(module) == pytest.approx(expected, rel=1e-4)
