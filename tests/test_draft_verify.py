"""Draft-and-verify decoding (issue 47): the AR view's greedy tokens, as many per call as drafts agree.

The reference is the AR view decoded with no cache, one row at a time (reference_decoding.py). The
models are tiny and trained for a moment on a walk through the vocabulary, so that both views say
something: the AR view a varied continuation, the diffusion view drafts that agree with it some of
the time (an untrained model repeats one token, which every decoder gets right).
"""
from __future__ import annotations

import functools

import pytest
import torch

from attnlab import BlockDiffusion, ConfigError, DecoderOnly, SamplingConfig
from attnlab.generation import compiled_step
from attnlab.generation.draft_verify import DraftStats, accept, draft_and_verify
from attnlab.generation.model_calls import CallCounter
from reference_decoding import ar_view_greedy_uncached

BOS, EOS, SEP, PAD, MASK, VOCAB = 2, 3, 4, 0, 5, 40
FIRST_WORD = 6


def walk(generator, rows: int, length: int) -> torch.Tensor:
    """Rows of words that climb by 1 or 2, wrapping around the vocabulary: easy for the AR view,
    half-guessable for a draft."""
    start = torch.randint(FIRST_WORD, VOCAB, (rows, 1), generator=generator)
    steps = torch.randint(1, 3, (rows, length), generator=generator)
    steps[:, 0] = 0
    return (start - FIRST_WORD + steps.cumsum(1)) % (VOCAB - FIRST_WORD) + FIRST_WORD


@functools.cache
def trained(block_size: int) -> BlockDiffusion:
    torch.manual_seed(0)
    backbone = dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional="rope")
    module = BlockDiffusion(backbone=backbone, vocab_size=VOCAB, block_size=block_size, shift=True, context="causal",
                            ar_loss_weight=1.0)
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(120):
        target = walk(generator, 32, 16)
        batch = {"source": torch.zeros(32, 0, dtype=torch.long), "source_lengths": torch.zeros(32, dtype=torch.long),
                 "target": target, "target_lengths": torch.full((32,), 16)}
        terms = module.loss_terms(batch)
        (terms.loss.sum() / terms.targets.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return module.eval()


class Trained(dict):
    """block size -> a model trained for it, trained when first asked for (once a process)."""

    def __missing__(self, block_size):
        return trained(block_size)


@pytest.fixture(scope="module")
def models():
    return Trained()


def prompts(rows: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (rows,), generator=generator).tolist()
    return [[BOS] + walk(generator, 1, n)[0].tolist() for n in lengths]


def decode(module, rows, budget, block_size, **kwargs):
    return draft_and_verify(module.model, rows, max_new_tokens=budget, block_size=block_size, eos_id=EOS, pad_id=PAD,
                            **kwargs)


# Eager: every batch and block size; compiled (Dynamo's graphs, the slow part): each of them once.
CASES = [(rows, block, False) for rows in (1, 16) for block in (4, 8)] + [(1, 4, True), (16, 8, True)]


@pytest.mark.parametrize("rows, block_size, compiled", CASES,
                         ids=[f"{'batch1' if r == 1 else 'ragged16'}-{b}-{'compiled' if c else 'eager'}" for r, b, c in CASES])
def test_greedy_draft_and_verify_is_the_ar_views_greedy_decoding(models, block_size, rows, compiled, monkeypatch):
    if compiled:
        monkeypatch.setattr(compiled_step, "BACKEND", "eager")  # the captured graph, run as captured (see test_compiled_decoding)
        torch.compiler.reset()
    module = models[block_size]
    batch = prompts(rows)
    budgets = torch.randint(5, 25, (rows,), generator=torch.Generator().manual_seed(rows)) if rows > 1 else 21
    stats = DraftStats()
    got = decode(module, batch, budgets, block_size, compiled=compiled, stats=stats)
    assert got == ar_view_greedy_uncached(module.model, batch, max_new_tokens=budgets, eos_id=EOS)
    assert 1 < stats.tokens_per_call < block_size  # drafts were kept, and rejected: both paths ran
    assert 0 < stats.agreed[0] < stats.checked[0]
    if compiled:
        torch.compiler.reset()


def reference_drafter(module, batch, budget, wrong: bool):
    """A test double for the diffusion view: the AR view's own tokens at the drafts' places (a
    perfect drafter), or a token that is never the AR view's (one always wrong)."""
    truth = ar_view_greedy_uncached(module.model, batch, max_new_tokens=budget + 20, eos_id=EOS)
    table = torch.tensor([row + [EOS] * (budget + 20 - len(row)) for row in truth])

    def draft(drafts, rows, start):
        at = (start[:, None] + torch.arange(drafts.shape[1])).clamp(max=table.shape[1] - 1)
        right = table[rows[:, None], at]
        return (right - FIRST_WORD + 1) % (VOCAB - FIRST_WORD) + FIRST_WORD if wrong else right
    return draft


@pytest.mark.parametrize("block_size", [4, 8])
def test_a_perfect_drafter_keeps_every_draft_of_every_call(models, block_size):
    module, batch, budget = models[block_size], prompts(1, seed=4), 3 * block_size + 1
    stats = DraftStats()
    drafter = reference_drafter(module, batch, budget, wrong=False)
    with CallCounter(module.model.stack) as calls:
        got = decode(module, batch, budget, block_size, stats=stats, drafter=drafter)
    assert got == ar_view_greedy_uncached(module.model, batch, max_new_tokens=budget, eos_id=EOS)
    assert len(got[0]) == budget
    assert stats.agreed == stats.checked and min(stats.checked) > 0  # every draft kept
    assert calls.calls == stats.calls == 4  # the prompt's call (1 token), then block_size tokens a call


@pytest.mark.parametrize("block_size", [4, 8])
def test_a_drafter_that_is_always_wrong_gives_one_token_a_call(models, block_size):
    module, batch, budget = models[block_size], prompts(1, seed=5), 11
    stats = DraftStats()
    drafter = reference_drafter(module, batch, budget, wrong=True)
    with CallCounter(module.model.stack) as calls:
        got = decode(module, batch, budget, block_size, stats=stats, drafter=drafter)
    assert got == ar_view_greedy_uncached(module.model, batch, max_new_tokens=budget, eos_id=EOS)
    assert stats.agreed == [0] * (block_size - 1) and stats.checked[0] > 0 == sum(stats.checked[1:])
    assert calls.calls == stats.tokens == budget  # exactly one token a call


def test_the_speculative_rule_samples_the_ar_views_distribution():
    """Drafts drawn from q, kept by min(1, p / q), else drawn from max(0, p - q): the token at each
    place is distributed as p (checked against p itself over many rows), wherever q puts its mass."""
    rows, n, vocab = 40_000, 3, 5
    generator = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 0.0, 3.0, 0.0, -2.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    q = torch.tensor([[0.05, 0.6, 0.1, 0.2, 0.05], [0.5, 0.1, 0.1, 0.2, 0.1]])  # the drafts' distributions
    drafts = torch.multinomial(q, rows, replacement=True, generator=generator).t()  # (rows, n - 1)
    candidates = torch.cat((torch.zeros(rows, 1, dtype=torch.long), drafts), dim=1)
    drafted_from = torch.cat((torch.zeros(1, 1, vocab), q[None]), dim=1).expand(rows, -1, -1)
    logits = torch.cat((p_logits, torch.zeros(n - 1, vocab)))[None].expand(rows, -1, -1)  # the AR rows, then the block's
    kept, emitted, *_ = accept(candidates, torch.full((rows,), n), drafted_from, logits, SamplingConfig(temperature=1.0),
                               generator)
    p = p_logits.softmax(-1)
    first = torch.bincount(emitted[:, 0], minlength=vocab) / rows  # offset 1: the first draft or its correction
    assert torch.allclose(first, p[0], atol=0.01)
    second = emitted[kept >= 1, 1]  # offset 2 where the first draft was kept: p given it (here independent of it)
    assert torch.allclose(torch.bincount(second, minlength=vocab) / len(second), p[1], atol=0.015)
    kept_share = float((kept >= 1).float().mean())
    assert kept_share == pytest.approx(float(torch.minimum(p[0], q[0]).sum()), abs=0.01)  # P(keep) = sum min(p, q)


def test_sampled_draft_and_verify_is_seeded_and_makes_real_tokens(models):
    module, batch = models[4], prompts(6)
    sampling = SamplingConfig(temperature=0.8, top_p=0.9)
    runs = [decode(module, batch, 15, 4, sampling=sampling, generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(len(row) <= 15 and MASK not in row for row in runs[0])


def test_generation_verify_needs_the_ar_view_and_block_diffusion():
    backbone = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32)
    with pytest.raises(ConfigError, match="generation.verify needs model.init_args.shift"):
        BlockDiffusion(backbone=backbone, vocab_size=VOCAB, block_size=4, generation={"verify": True})
    with pytest.raises(ConfigError, match="generation.verify is draft-and-verify decoding of BlockDiffusion"):
        DecoderOnly(backbone=backbone, vocab_size=VOCAB, generation={"verify": True})
    with pytest.raises(ConfigError, match="generation.verify='yes' must be true or false"):
        SamplingConfig(verify="yes")


def test_a_verify_call_taken_back_leaves_the_state_as_it_found_it(models):
    """retract puts each row's end back, so the same call made again sees the same cache and gives
    the same logits (what the bench's repeated calls and every rejected draft rely on)."""
    model = models[4].model
    state = model.new_state(2, 64, None)
    prompts = torch.tensor([[BOS, 10, 11, 12], [BOS, 20, 21, 22]])
    state.forward(model.stack, prompts)
    before = (state.row_end.clone(), state.end)
    candidates, fed = torch.tensor([[13, 14, 15, 16], [23, 24, 25, 26]]), torch.ones(2, 4, dtype=torch.bool)
    with torch.no_grad():
        first = model.draft_call(candidates, fed, 4, state, first=0)
        state.retract(torch.tensor([4, 4]))
        assert torch.equal(state.row_end, before[0]) and state.end == before[1]
        again = model.draft_call(candidates, fed, 4, state, first=0)
    assert torch.equal(first, again)


def test_rows_kept_after_their_end_stay_inside_prompt_budget_and_three_blocks():
    """A finished row kept in the batch (compiled or sampled decoding; here greedy without
    compaction) is still fed a masked block and padding after its end, which may lie a block past
    its budget: its slots reach DRAFT_SPAN blocks past the budget, what a learned position table
    is sized for (positions_needed), and one block less is too few. Row 0 drafts perfectly and ends
    3 tokens past its budget of 14 (1 + 4 + 4 + 4 + 4 tokens) while row 1, never right, goes on."""
    from attnlab.generation.draft_verify import DRAFT_SPAN

    n, budget, batch = 4, 14, [[BOS, 10, 11], [BOS, 20, 21]]

    def run(table):
        torch.manual_seed(0)
        backbone = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, positional="learned", max_positions=table)
        module = BlockDiffusion(backbone=backbone, vocab_size=VOCAB, block_size=n, shift=True, context="causal").eval()
        truth = ar_view_greedy_uncached(module.model, batch, max_new_tokens=budget + n, eos_id=EOS)
        assert all(len(row) == budget + n for row in truth)  # no eos: both rows run to their budget
        table = torch.tensor(truth)

        def draft(drafts, rows, start):
            at = (start[:, None] + torch.arange(drafts.shape[1])).clamp(max=table.shape[1] - 1)
            right = table[rows[:, None], at]
            return torch.where(rows[:, None] == 0, right, (right - FIRST_WORD + 1) % (VOCAB - FIRST_WORD) + FIRST_WORD)
        return decode(module, batch, budget, n, compact=False, drafter=draft), truth

    out, truth = run(len(batch[0]) + budget + DRAFT_SPAN * n)
    assert out == [row[:budget] for row in truth]
    with pytest.raises(ConfigError, match="learned position table"):
        run(len(batch[0]) + budget + (DRAFT_SPAN - 1) * n)
