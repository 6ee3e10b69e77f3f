"""Finished rows leave the batch (issue 16, item 2): compacted generation gives the tokens of
uncompacted generation for all three families, greedy and beam, and really shrinks the batch."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from attnlab import BackboneConfig
from attnlab.components.kv_cache import DecodeState
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.models.block_diffusion import BlockDiffusionModel
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.encoder_decoder import EncoderDecoderModel

CFG = BackboneConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional="rope")
rng = random.Random(0)
PROMPTS = [[2] + [rng.randrange(6, 40) for _ in range(rng.randint(1, 7))] for _ in range(16)]
BUDGETS = torch.tensor([rng.randint(4, 14) for _ in PROMPTS])


@pytest.fixture
def reorders(monkeypatch):
    """The batch sizes every DecodeState.reorder keeps."""
    sizes = []
    real = DecodeState.reorder

    def spy(self, index, sources=None):
        sizes.append(len(index))
        return real(self, index, sources)

    monkeypatch.setattr(DecodeState, "reorder", spy)
    return sizes


def _frequent_token(outputs) -> int:
    """A token the model emits often and at varied positions: as eos, rows end at different steps."""
    return Counter(t for row in outputs for t in row[1:]).most_common(1)[0][0]


def _sources():
    source = torch.zeros(len(PROMPTS), max(map(len, PROMPTS)), dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        source[i, : len(p) - 1] = torch.tensor(p[1:])
    return source


def _decoders():
    torch.manual_seed(0)
    decoder = DecoderOnlyModel(CFG, vocab_size=40).eval()
    encdec = EncoderDecoderModel(CFG, vocab_size=40).eval()
    source = _sources()
    encoded = lambda: encdec.encode(source, source != 0)[0]  # noqa: E731
    return {
        "decoder_only/greedy": lambda eos, compact: generate(
            decoder, PROMPTS, max_new_tokens=BUDGETS, eos_id=eos, pad_id=0, compact=compact),
        "decoder_only/beam": lambda eos, compact: generate_beam(
            decoder, PROMPTS, max_new_tokens=BUDGETS, eos_id=eos, pad_id=0, beam_size=3, alpha=0.6, compact=compact),
        "encoder_decoder/greedy": lambda eos, compact: translate_greedy(
            encdec, encoded(), max_lengths=BUDGETS, bos_id=2, eos_id=eos, pad_id=0, compact=compact),
        "encoder_decoder/beam": lambda eos, compact: translate_beam(
            encdec, encoded(), max_lengths=BUDGETS, bos_id=2, eos_id=eos, beam_size=3, alpha=0.6, compact=compact),
    }


@pytest.mark.parametrize("name", ["decoder_only/greedy", "decoder_only/beam", "encoder_decoder/greedy", "encoder_decoder/beam"])
def test_compacted_autoregressive_generation_gives_the_same_tokens(name, reorders):
    decode = _decoders()[name]
    eos = _frequent_token(decode(-1, False))
    full = decode(eos, False)
    lengths = {len(row) for row in full}
    assert len(lengths) > 2  # rows really end at different steps
    del reorders[:]
    assert decode(eos, True) == full
    beams = 3 if name.endswith("beam") else 1
    assert any(size < len(PROMPTS) * beams for size in reorders), "the batch never shrank"


def test_sampling_keeps_every_row_so_seeded_samples_do_not_depend_on_batch_mates(reorders):
    torch.manual_seed(0)
    decoder = DecoderOnlyModel(CFG, vocab_size=40).eval()
    from attnlab.generation.sampling import SamplingConfig

    generate(decoder, PROMPTS, max_new_tokens=BUDGETS, eos_id=7, pad_id=0, sampling=SamplingConfig(temperature=1.0),
             generator=torch.Generator().manual_seed(0))
    assert reorders == []


@pytest.mark.parametrize("unmasking,threshold", [("confidence", 0.9), ("threshold", 0.5)])
def test_compacted_block_diffusion_gives_the_same_tokens(unmasking, threshold, reorders):
    torch.manual_seed(0)
    model = BlockDiffusionModel(CFG, vocab_size=40, pad_id=0, mask_id=5).eval()

    def decode(eos, compact):
        return sample_blocks(model, PROMPTS, max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=eos, pad_id=0,
                             unmasking=unmasking, threshold=threshold, compact=compact)

    eos = _frequent_token(decode(-1, False))
    full = decode(eos, False)
    assert len({len(row) for row in full}) > 2
    del reorders[:]
    assert decode(eos, True) == full
    assert reorders and min(reorders) < len(PROMPTS)
