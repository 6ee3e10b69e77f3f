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
    assert max(module._output_lengths(batch, ids)) == longest  # what val/nfe_per_token divides by
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


def test_generated_tokens_count_an_eos_only_for_rows_that_stopped_at_one(monkeypatch):
    """What gen_tokens_per_s counts (issue 30): a row that used its whole budget produced no eos.
    Hand-built outputs of budget 3, against a count of what the decoder emitted."""
    from lightning.pytorch import Trainer

    from data_modules.batch import Example, collate

    emitted = [([7, 8, 9], False), ([7], True), ([], True), ([7, 8], True), ([9, 9, 9], False)]  # (ids, eos?)

    class Fixed(DecoderOnly):
        def generate_ids(self, batch):
            return [ids for ids, _ in emitted]

    class Words:
        def decode_batch(self, rows):
            return [" ".join(map(str, row)) for row in rows]

    module = Fixed(backbone=BACKBONE, vocab_size=40, generation=dict(max_new_tokens=3)).eval()
    module.tokenizer = Words()
    module.trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
    seen = []
    monkeypatch.setattr(EvalMetrics, "update_generation",
                        lambda self, hyp, ref, n_tokens, seconds, calls=0, positions=0: seen.append((n_tokens, positions)))
    batch = collate([Example([7, 8], [9], "a", "b") for _ in emitted], module.special.pad)
    with torch.no_grad():
        module._evaluate(batch, module.val_metrics, generate=True)
    naive = sum(len(ids) + eos for ids, eos in emitted)
    assert seen == [(naive, 3)] and naive == 3 + 2 + 1 + 3 + 3
