"""Model calls (NFE) per generated token, logged as val/nfe_per_token for every family (issue 16,
item 1): AR families take exactly one call per token; block diffusion its steps per block."""
from __future__ import annotations

import pytest
import torch

from attnlab import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.families.metrics import EvalMetrics
from attnlab.generation.model_calls import CallCounter

BACKBONE = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0)


def _batch(source_lengths):
    torch.manual_seed(1)
    width = max(source_lengths)
    source = torch.randint(6, 40, (len(source_lengths), width))
    for i, n in enumerate(source_lengths):
        source[i, n:] = 0
    return {"source": source, "source_lengths": torch.tensor(source_lengths),
            "target": torch.randint(6, 40, (len(source_lengths), 3)), "target_lengths": torch.full((len(source_lengths),), 3)}


@pytest.mark.parametrize("family", [DecoderOnly, EncoderDecoder])
@pytest.mark.parametrize("max_new", [5, 40])
def test_an_autoregressive_batch_takes_one_call_per_token_of_its_longest_row(family, max_new):
    """With 40 tokens of budget some rows stop at eos (sampled, so eos comes); with 5 all run out."""
    torch.manual_seed(0)
    module = family(backbone=BACKBONE, vocab_size=40, generation=dict(max_new_tokens=max_new, temperature=1.5)).eval()
    batch = _batch([4, 2, 6])
    with CallCounter(module.decoding_stack()) as calls:
        ids = module.generate_ids(batch)
    # Counted here, not by the metric's own helper: a row that stopped at eos took one call per
    # token and one for the eos; a row that ran out took exactly its budget.
    longest = max(len(row) + 1 if len(row) < max_new else max_new for row in ids)
    assert calls.calls == longest
    assert module._longest_output(batch, ids) == longest  # what val/nfe_per_token divides by
    assert any(len(row) < max_new for row in ids) == (max_new == 40)  # both cases really occur


def test_block_diffusion_takes_its_steps_per_block():
    torch.manual_seed(0)
    module = BlockDiffusion(backbone=BACKBONE, vocab_size=40, block_size=4, denoising_steps=2,
                            generation=dict(max_new_tokens=8)).eval()
    batch = _batch([4, 2, 6])
    with CallCounter(module.decoding_stack()) as calls:
        ids = module.generate_ids(batch)
    blocks = max(min(len(row) // 4 + 1, 2) for row in ids)  # a row ends in the block of its eos, or at 8
    assert calls.calls == 2 * blocks


def test_nfe_per_token_is_calls_over_the_longest_rows_summed_over_batches():
    metrics = EvalMetrics()
    metrics.update_generation(["a"], ["a"], 10, 1.0, calls=12, positions=6)
    metrics.update_generation(["b"], ["b"], 10, 1.0, calls=4, positions=2)
    assert metrics.compute("val")["val/nfe_per_token"] == pytest.approx(16 / 8)
