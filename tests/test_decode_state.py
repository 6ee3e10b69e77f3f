"""One decode state for every family (issue 33): decoding steps write the cache in place and
allocate nothing the size of it; beams share their source's cross-attention keys and values;
ragged block-diffusion rows decode as they would alone."""
from __future__ import annotations

import random

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from attnlab import BackboneConfig
from attnlab.components.kv_cache import DecodeState
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.models.block_diffusion import BlockDiffusionModel
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.encoder_decoder import EncoderDecoderModel

VOCAB, EOS, PAD, BOS, MASK = 40, 3, 0, 1, 4
NEVER = -1  # an eos no model produces: every row runs its whole budget
rng = random.Random(0)
PROMPTS = [[BOS] + [rng.randrange(6, VOCAB) for _ in range(n)] for n in (5, 1, 3)]
SOURCE = torch.tensor([[7, 8, 9, 10, 2], [11, 12, 2, 0, 0], [13, 2, 0, 0, 0]])
# Wide heads and a narrow feed-forward, math attention: a cache slot (2 KV heads x 32) holds more
# than any activation of a call holds per key, so "as large as one layer's cache" is unambiguous.
CFG = BackboneConfig(d_model=64, n_heads=2, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional="rope",
                     backend="math")
BUDGET = 40


def _decoders():
    torch.manual_seed(0)
    decoder = DecoderOnlyModel(CFG, VOCAB, PAD).eval()
    encdec = EncoderDecoderModel(CFG, VOCAB, PAD).eval()
    diffusion = BlockDiffusionModel(CFG, VOCAB, PAD, MASK).eval()
    encoded = encdec.encode(SOURCE, SOURCE != 0)[0]
    budget = dict(max_new_tokens=BUDGET, eos_id=NEVER, pad_id=PAD)
    lengths = dict(max_lengths=torch.full((3,), BUDGET), bos_id=BOS, eos_id=NEVER)
    return {
        "decoder_only/greedy": lambda: generate(decoder, PROMPTS, **budget),
        "decoder_only/beam": lambda: generate_beam(decoder, PROMPTS, beam_size=3, alpha=0.6, **budget),
        "encoder_decoder/greedy": lambda: translate_greedy(encdec, encoded, pad_id=PAD, **lengths),
        "encoder_decoder/beam": lambda: translate_beam(encdec, encoded, beam_size=3, alpha=0.6, **lengths),
        "block_diffusion/confidence": lambda: sample_blocks(diffusion, PROMPTS, block_size=4, steps=2, **budget),
        "block_diffusion/threshold": lambda: sample_blocks(diffusion, PROMPTS, block_size=4, steps=4,
                                                           unmasking="threshold", threshold=0.12, **budget),
    }


@pytest.mark.parametrize("name", list(_decoders()))
def test_no_decoding_step_allocates_a_tensor_the_size_of_the_cache(name, monkeypatch):
    """Every call after the first (which allocates the caches) is profiled alone: none allocates as
    many bytes as one layer's key buffer, and no buffer moves. (A copied or doubled cache, as the
    old trial-block fork made at every block-diffusion call, allocates at least that.)"""
    real = DecodeState.forward
    steps, buffers = [], set()

    def profiled(self, stack, tokens, *args, **kwargs):
        if self.caches[0].self_attn.buffers is None:
            return real(self, stack, tokens, *args, **kwargs)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = real(self, stack, tokens, *args, **kwargs)
        sizes = [event.cpu_memory_usage for event in prof.events() if event.cpu_memory_usage > 0]
        steps.append((max(sizes, default=0), self.caches[0].self_attn.buffers[0].nbytes))
        buffers.add(tuple(cache.self_attn.buffers[0].data_ptr() for cache in self.caches))
        return out

    monkeypatch.setattr(DecodeState, "forward", profiled)
    _decoders()[name]()
    assert len(steps) >= BUDGET // 4 - 1  # a call per block at least, the first excluded
    largest, cache = max(steps)
    assert largest < cache, f"a decoding step allocated {largest} bytes; one layer's key cache is {cache}"
    assert len(buffers) == 1 or name.endswith("beam"), "a cache buffer was reallocated while decoding"


def test_beam_search_never_copies_the_cross_attention_keys_and_values(monkeypatch):
    """The source's keys and values are computed once, one row per source, and every reorder
    (beam moves, and the copy of a prefix's cache to its beams) leaves their storage alone."""
    torch.manual_seed(0)
    model = EncoderDecoderModel(CFG, VOCAB, PAD).eval()
    encoded = model.encode(SOURCE, SOURCE != 0)[0]
    seen, expanded = [], []

    def spied(real, record):
        def spy(self, *args):
            before = [(c.cross_attn.k, c.cross_attn.k.clone(), c.cross_attn.v.data_ptr()) for c in self.caches]
            real(self, *args)
            for cache, (k, k_values, v_pointer) in zip(self.caches, before):
                assert cache.cross_attn.k is k and torch.equal(k, k_values) and cache.cross_attn.v.data_ptr() == v_pointer
                assert len(k) == len(SOURCE)  # one row per source, not per beam
            record.append(self.rows)
        return spy

    monkeypatch.setattr(DecodeState, "reorder", spied(DecodeState.reorder, seen))
    monkeypatch.setattr(DecodeState, "expand_beams", spied(DecodeState.expand_beams, expanded))
    common = dict(max_lengths=torch.tensor([7, 10, 5]), bos_id=BOS, eos_id=EOS, beam_size=3, alpha=0.6, compact=False)
    translate_beam(model, encoded, **common)
    translate_beam(model, encoded, prefixes=PROMPTS, pad_id=PAD, **common)
    assert len(seen) > 10 and set(seen) == {3 * len(SOURCE)}
    assert expanded == [3 * len(SOURCE)]  # the prefixes' cache, copied to the beams


def test_beams_that_read_shared_source_keys_equal_beams_with_copies():
    """Folding a source's beams into one row of queries computes what copying the source's keys
    to every beam computes."""
    torch.manual_seed(0)
    model = EncoderDecoderModel(CFG, VOCAB, PAD).eval()
    encoded = model.encode(SOURCE, SOURCE != 0)[0]
    shared = model.start_state(encoded, 8, beams=3)
    copied = model.start_state(encoded, 8, beams=3)
    for cache in copied.caches:  # a row of keys per beam: each reads its own
        cache.cross_attn.k = cache.cross_attn.k.repeat_interleave(3, 0)
        cache.cross_attn.v = cache.cross_attn.v.repeat_interleave(3, 0)
        cache.cross_attn.beams = 1
    copied.context_mask = copied.context_mask.repeat_interleave(3, 0)
    tokens = torch.randint(6, VOCAB, (9, 1))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model.decode(tokens, state=shared)[0], model.decode(tokens, state=copied)[0],
                                       atol=1e-5, rtol=1e-5)


def test_a_batch_that_does_not_match_its_sources_and_beams_raises():
    """Beams are what the state was told, never a ratio of shapes: a call, a reorder or an
    attention whose rows do not match the state's sources times beams is refused, not folded."""
    torch.manual_seed(0)
    model = EncoderDecoderModel(CFG, VOCAB, PAD).eval()
    encoded = model.encode(SOURCE, SOURCE != 0)[0]
    state = model.start_state(encoded, 8, beams=2)
    assert (state.rows, state.beams) == (6, 2)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"call of 9 rows on a state of 6 rows \(3 sources x 2 beams\)"):
            state.forward(model.decoder, torch.full((9, 1), BOS))
        with pytest.raises(ValueError, match="reorder to 9 rows keeps every source"):
            state.reorder(torch.arange(3).repeat_interleave(3))
        with pytest.raises(ValueError, match="reorder to 3 rows of 2 sources"):
            state.reorder(torch.arange(3), sources=torch.arange(2))
        with pytest.raises(ValueError, match="beams already"):
            state.expand_beams(2)
        # 6 rows of queries against 3 sources of 1 beam each: folded as 2 beams before, refused now
        state.caches[0].cross_attn.beams = 1
        with pytest.raises(ValueError, match="6 rows of queries against keys of 3 rows, 1 row"):
            state.forward(model.decoder, torch.full((6, 1), BOS))


def test_expanding_beams_copies_each_row_to_its_beams():
    torch.manual_seed(0)
    model = DecoderOnlyModel(CFG, VOCAB, PAD).eval()
    state, alone = model.new_state(2, 16), model.new_state(2, 16)
    tokens = torch.randint(6, VOCAB, (2, 4))
    with torch.no_grad():
        model(tokens, torch.tensor([[False, True, True, True], [True] * 4]), state)
        model(tokens, torch.tensor([[False, True, True, True], [True] * 4]), alone)
        state.expand_beams(3)
        assert (state.rows, state.beams, state.row_end.tolist()) == (6, 3, [3, 3, 3, 4, 4, 4])
        step = torch.randint(6, VOCAB, (2, 1))
        beams = model(step.repeat_interleave(3, 0), None, state)[:, -1]
        expected = model(step, None, alone)[:, -1].repeat_interleave(3, 0)
    torch.testing.assert_close(beams, expected, atol=1e-5, rtol=1e-5)


def test_a_reorder_copies_only_the_filled_slots():
    torch.manual_seed(0)
    model = DecoderOnlyModel(CFG, VOCAB, PAD).eval()
    state = model.new_state(3, 200)
    with torch.no_grad():
        model(torch.randint(6, VOCAB, (3, 5)), None, state)
    buffer = state.caches[0].self_attn.buffers[0]
    filled = buffer[:, :, :5].nbytes
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state.reorder(torch.tensor([2, 0, 0]))
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert 0 < largest <= filled < buffer.nbytes
    assert state.caches[0].self_attn.buffers[0].data_ptr() == buffer.data_ptr()


def _diffusion():
    torch.manual_seed(0)
    return BlockDiffusionModel(BackboneConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0,
                                              positional="rope"), VOCAB, PAD, MASK).eval()


ROWS = [[BOS] + [random.Random(i).randrange(6, VOCAB) for _ in range(1 + i % 5)] for i in range(16)]
THRESHOLD = dict(max_new_tokens=24, block_size=4, steps=4, eos_id=NEVER, pad_id=PAD, unmasking="threshold",
                 threshold=0.12)  # varied: rows take 6 to 19 calls


def test_ragged_and_unragged_block_decoding_give_the_same_tokens():
    model = _diffusion()
    ragged = sample_blocks(model, ROWS, ragged=True, **THRESHOLD)
    assert ragged == sample_blocks(model, ROWS, ragged=False, **THRESHOLD)
    assert ragged == [sample_blocks(model, [row], **THRESHOLD)[0] for row in ROWS]


def _row_calls(model, prompts, **kwargs) -> list[int]:
    """The calls each row has seen by the call that finishes its last block (the model's view: the
    noisy block is the last block_size tokens of every call, and a row with masked tokens there is
    still being decoded), so the calls a row spends waiting for other rows count too."""
    calls, last = [0], torch.zeros(len(prompts), dtype=torch.long)

    def record(module, args, output):
        calls[0] += 1
        last[(args[0][:, -4:] == MASK).any(1)] = calls[0]  # no compaction below: rows keep their place

    handle = model.stack.register_forward_hook(record)
    try:
        sample_blocks(model, prompts, compact=False, **kwargs, **THRESHOLD)
    finally:
        handle.remove()
    return last.tolist()


def test_threshold_decoding_makes_each_row_as_many_calls_as_it_would_alone():
    """At batch 16 each row makes the calls it would make decoded alone (within one per block),
    while the batch that waits for its slowest row's block (ragged=False) makes its rows wait."""
    model = _diffusion()
    alone = [_row_calls(model, [row])[0] for row in ROWS]
    batched, waiting = _row_calls(model, ROWS), _row_calls(model, ROWS, ragged=False)
    blocks, tokens = 24 // 4, 24
    assert len(set(alone)) > 2, "the rows should need different numbers of calls"
    assert all(abs(b - a) <= blocks for a, b in zip(alone, batched))
    mean = lambda values: sum(values) / len(values) / tokens  # noqa: E731 (calls per token)
    assert abs(mean(batched) - mean(alone)) <= 1 / 4
    assert mean(waiting) > mean(alone) + 1 / 4, "waiting for the slowest row should cost calls"
