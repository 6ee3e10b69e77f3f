"""Token-budget batches: within budget, every example once, similar lengths, reshuffled per epoch."""
import random

from data_modules.batching import TokenBudgetBatchSampler


def lengths(n=500, seed=0):
    rng = random.Random(seed)
    return [rng.randint(3, 60) for _ in range(n)]


def test_batches_respect_the_budget_and_cover_every_example_once():
    lens = lengths()
    batches = list(TokenBudgetBatchSampler(lens, max_tokens=400))
    assert sorted(i for b in batches for i in b) == list(range(len(lens)))
    for batch in batches:
        assert len(batch) == 1 or max(lens[i] for i in batch) * len(batch) <= 400


def test_examples_of_similar_length_share_a_batch():
    lens = lengths()
    batches = list(TokenBudgetBatchSampler(lens, max_tokens=400))
    padding = sum(max(lens[i] for i in b) * len(b) - sum(lens[i] for i in b) for b in batches)
    assert padding < 0.05 * sum(lens)  # random batches of this size pad ~40 %


def test_order_changes_with_the_epoch_and_repeats_with_the_seed():
    lens = lengths()
    sampler = TokenBudgetBatchSampler(lens, max_tokens=400, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second
    again = TokenBudgetBatchSampler(lens, max_tokens=400, seed=3)
    again.set_epoch(1)
    assert list(again) == second
    assert len(sampler) == len(first)
