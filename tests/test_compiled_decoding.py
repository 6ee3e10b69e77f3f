"""Compiled decoding over a fixed-capacity cache (issue 18, item 1): the same tokens and logits as
eager decoding for every family and positional encoding, with and without padding, greedy and
beam; the fixed cache is written in place and refuses to overflow.

The matrix compiles with Dynamo's "eager" backend: the step is captured as a graph (guards,
graph breaks, dynamic shapes, the fixed state read and written inside it) and run as captured,
in a fraction of the time. One test per family compiles with Inductor itself, as
`generation.compile` does, which adds what the matrix leaves out: AOTAutograd's functional
rewrite of the in-place cache writes, and generated kernels.
"""
from __future__ import annotations

import random

import pytest
import torch

from attnlab import BackboneConfig
from attnlab.components.kv_cache import CacheFullError, DecodeState
from attnlab.generation import compiled_step
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.models.block_diffusion import BlockDiffusionModel
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.encoder_decoder import EncoderDecoderModel

VOCAB, EOS, PAD, BOS, MASK = 40, 3, 0, 1, 4
POSITIONAL = ["sinusoidal", "learned", "rope", "alibi", "none"]
rng = random.Random(0)
PADDED = [[BOS] + [rng.randrange(6, VOCAB) for _ in range(n)] for n in (5, 1, 3)]
UNPADDED = [[BOS] + [rng.randrange(6, VOCAB) for _ in range(4)] for _ in range(3)]
BUDGETS = torch.tensor([7, 10, 5])


@pytest.fixture(autouse=True)
def cheap_backend(monkeypatch):
    """Dynamo's eager backend, and fresh Dynamo caches per test: every model here is really
    captured (Dynamo falls back to eager, silently, past its recompile limit of 8 graphs per function)."""
    monkeypatch.setattr(compiled_step, "BACKEND", "eager")
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def config(positional: str, n_layers: int = 1) -> BackboneConfig:
    """One layer for the matrix (Dynamo's tracing time grows with the layers it unrolls);
    the Inductor test below decodes two, so a cache mixed up between layers still fails there."""
    return BackboneConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=n_layers, d_ff=64, dropout=0.0,
                          positional=positional, max_positions=64)


def recorded_logits(embedding):
    """Every output-projection result of a decoding, in call order (the wrapper shadows the method).
    Not traced: a compiled step then breaks its graph at the projection (whole steps are compared
    with the real backend below, through return_logits), instead of recompiling as the list grows."""
    calls = []
    real = type(embedding).logits.__get__(embedding)

    @torch.compiler.disable
    def logits(hidden):
        out = real(hidden)
        calls.append(out.detach().clone())
        return out

    embedding.logits = logits
    return calls


# Every positional encoding with left-padded prompts (positions that start per row). Unpadded
# prompts change only the masks: ALiBi, whose bias joins the mask, and RoPE cover them.
EVERY_POSITIONAL_PADDED_AND_UNPADDED = [
    *(pytest.param(p, PADDED, id=f"{p}-padded") for p in POSITIONAL),
    *(pytest.param(p, UNPADDED, id=f"{p}-unpadded") for p in ("rope", "alibi"))]


def run_three_ways(embedding, decode):
    """Tokens and recorded logits of decode(mode) for the growing cache, the fixed cache run
    eagerly, and the fixed cache compiled."""
    results = {}
    for mode in ("growing", "fixed", "compiled"):
        calls = recorded_logits(embedding)
        results[mode] = decode(dict(growing={}, fixed={"fixed": True}, compiled={"compiled": True})[mode]), calls
    del embedding.logits
    return results


def assert_same(results, logits_of_growing: bool):
    (grown, grown_logits), (fixed, fixed_logits), (compiled, compiled_logits) = (
        results["growing"], results["fixed"], results["compiled"])
    assert grown == fixed == compiled
    assert len(fixed_logits) == len(compiled_logits)
    for eager, graph in zip(fixed_logits, compiled_logits):
        finite = eager.isfinite()
        assert torch.equal(finite, graph.isfinite())
        torch.testing.assert_close(graph[finite], eager[finite], atol=1e-5, rtol=1e-5)
    if logits_of_growing:
        flat = lambda calls: torch.cat([c.reshape(-1, c.shape[-1]) for c in calls])  # noqa: E731 ((B, 1, V) or (B, V))
        torch.testing.assert_close(flat(grown_logits), flat(fixed_logits), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional,prompts", EVERY_POSITIONAL_PADDED_AND_UNPADDED)
def test_decoder_only_compiled_equals_eager(positional, prompts):
    torch.manual_seed(0)
    model = DecoderOnlyModel(config(positional), VOCAB, PAD).eval()
    common = dict(max_new_tokens=BUDGETS, eos_id=EOS, pad_id=PAD)
    greedy = run_three_ways(model.stack.embedding, lambda mode: generate(model, prompts, compact=False, **common, **mode))
    assert_same(greedy, logits_of_growing=True)
    beam = run_three_ways(model.stack.embedding, lambda mode: generate_beam(
        model, prompts, beam_size=3, alpha=0.6, compact=False, **common, **mode))
    assert_same(beam, logits_of_growing=True)


@pytest.mark.parametrize("positional,prefixes", [
    *(pytest.param(p, None, id=f"{p}-translation") for p in POSITIONAL),
    pytest.param("rope", PADDED, id="rope-padded-prefixes")])
def test_encoder_decoder_compiled_equals_eager(positional, prefixes):
    torch.manual_seed(0)
    model = EncoderDecoderModel(config(positional), VOCAB, PAD).eval()
    source = torch.tensor([[7, 8, 9, 10, 2], [11, 12, 2, 0, 0], [13, 2, 0, 0, 0]])
    encoded = model.encode(source, source != 0)[0]
    common = dict(max_lengths=BUDGETS, bos_id=BOS, eos_id=EOS, pad_id=PAD, prefixes=prefixes, compact=False)
    greedy = run_three_ways(model.decoder.embedding, lambda mode: translate_greedy(model, encoded, **common, **mode))
    # Without prefixes the growing cache does not hide a finished row's pad (nothing is padded
    # yet), so its later logits for finished rows differ; the tokens may not.
    assert_same(greedy, logits_of_growing=prefixes is not None)
    beam = run_three_ways(model.decoder.embedding, lambda mode: translate_beam(
        model, encoded, beam_size=3, alpha=0.6, **common, **mode))
    assert_same(beam, logits_of_growing=False)


SHIFTED = {"shift": True, "context": "causal"}


@pytest.mark.parametrize("positional,prompts,view", [
    *(pytest.param(*p.values, {}, id=p.id) for p in EVERY_POSITIONAL_PADDED_AND_UNPADDED),
    pytest.param("rope", PADDED, SHIFTED, id="rope-padded-shift+causal"),
    pytest.param("alibi", UNPADDED, SHIFTED, id="alibi-unpadded-shift+causal")])
def test_block_diffusion_compiled_equals_eager(positional, prompts, view):
    torch.manual_seed(0)
    model = BlockDiffusionModel(config(positional), VOCAB, PAD, MASK, **view).eval()
    common = dict(max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=EOS, pad_id=PAD, compact=False)
    results = run_three_ways(model.stack.embedding, lambda mode: sample_blocks(model, prompts, **common, **mode))
    assert_same(results, logits_of_growing=True)


def test_inductor_compiles_each_family_to_the_eager_tokens(monkeypatch):
    """The real backend, once per family (the slowest test here: Inductor's C++ compile)."""
    monkeypatch.setattr(compiled_step, "BACKEND", "inductor")
    torch.manual_seed(0)
    cfg = config("rope", n_layers=2)
    decoder, encdec = DecoderOnlyModel(cfg, VOCAB, PAD).eval(), EncoderDecoderModel(cfg, VOCAB, PAD).eval()
    diffusion = BlockDiffusionModel(cfg, VOCAB, PAD, MASK).eval()
    source = torch.tensor([[7, 8, 9, 10, 2], [11, 12, 2, 0, 0], [13, 2, 0, 0, 0]])
    encoded = encdec.encode(source, source != 0)[0]
    runs = {
        "decoder_only": lambda **mode: generate(decoder, PADDED, max_new_tokens=BUDGETS, eos_id=EOS, pad_id=PAD,
                                                return_logits=True, compact=False, **mode),
        "encoder_decoder": lambda **mode: translate_greedy(encdec, encoded, max_lengths=BUDGETS, bos_id=BOS,
                                                           eos_id=EOS, pad_id=PAD, return_logits=True, compact=False,
                                                           prefixes=PADDED, **mode),
    }
    for family, run in runs.items():
        (eager, eager_logits), (graph, graph_logits) = run(fixed=True), run(compiled=True)
        assert eager == graph, family
        torch.testing.assert_close(graph_logits, eager_logits, atol=1e-5, rtol=1e-5)
    blocks = dict(max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=EOS, pad_id=PAD)
    assert sample_blocks(diffusion, PADDED, compiled=True, **blocks) == sample_blocks(diffusion, PADDED, **blocks)


def test_the_fixed_cache_is_written_in_place():
    torch.manual_seed(0)
    model = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval()
    state = model.new_state(2, capacity=16)
    with torch.no_grad():
        model(torch.tensor([[1, 7, 8], [1, 9, 10]]), None, state)
        buffer = state.caches[0].self_attn.k
        model(torch.tensor([[11], [12]]), None, state)
    assert state.caches[0].self_attn.k is buffer and buffer.shape == (2, 2, 16, 8)  # (B, H_kv, capacity, D)
    assert len(state) == 4 and state.key_valid[:, :4].all() and not state.key_valid[:, 4:].any()
    assert buffer[:, :, :4].abs().sum() > 0 and buffer[:, :, 4:].abs().sum() == 0


def test_the_fixed_cache_refuses_to_overflow():
    torch.manual_seed(0)
    model = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval()
    state = model.new_state(1, capacity=4)
    with torch.no_grad():
        model(torch.tensor([[1, 7, 8]]), None, state)
        model(torch.tensor([[9]]), None, state)
        with pytest.raises(CacheFullError, match="holds 4 tokens and already has 4: 1 more do not fit"):
            model(torch.tensor([[10]]), None, state)
    assert len(state) == 4  # nothing was written


def test_compiled_decoding_past_a_learned_table_stops_with_the_clear_error():
    """The compiled step checks no positions inside its graph; the stepper does, once a slot past
    the table is reached (a position never exceeds its slot)."""
    from attnlab.errors import ConfigError

    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0, positional="learned", max_positions=8)
    model = DecoderOnlyModel(cfg, VOCAB, PAD).eval()
    padded_prompts = [[BOS, 7], [BOS, 7, 8, 9, 10]]  # the short row's positions stay within the table longer
    assert len(generate(model, padded_prompts, max_new_tokens=3, eos_id=EOS, pad_id=PAD, compiled=True)[1]) == 3
    with pytest.raises(ConfigError, match="needs 9 positions.*max_positions=8"):
        generate(model, padded_prompts, max_new_tokens=6, eos_id=EOS, pad_id=PAD, compiled=True)


def test_generation_compile_is_checked_and_used_by_the_families(monkeypatch):
    from attnlab.errors import ConfigError
    from attnlab.generation import SamplingConfig

    with pytest.raises(ConfigError, match="generation.compile='yes' must be true or false"):
        SamplingConfig(compile="yes")
    seen = []
    real = DecodeState.fixed.__func__

    def spy(cls, *args, **kwargs):
        seen.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(DecodeState, "fixed", classmethod(spy))
    from attnlab import DecoderOnly
    from data_modules.batch import Example, collate

    module = DecoderOnly(backbone=config("rope"), vocab_size=VOCAB, generation={"compile": True, "max_new_tokens": 3})
    batch = collate([Example([7, 8], [9], "", ""), Example([10], [11], "", "")], module.special.pad)
    assert all(len(ids) <= 3 for ids in module.eval().generate_ids(batch))
    assert seen, "generation.compile did not decode over a fixed cache"


def test_a_model_is_collected_after_compiled_decoding_and_its_step_is_reused(monkeypatch):
    """The compiled steps are kept for the process, never the models they ran (issue 30): a cache
    whose compiled functions closed over their stack kept every decoded model alive."""
    import gc
    import weakref

    compiles = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiles.append(fn) or real_compile(fn, **kwargs))

    def decode_and_drop():
        torch.manual_seed(0)
        decoder = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval()
        diffusion = BlockDiffusionModel(config("rope"), VOCAB, PAD, MASK).eval()
        for _ in range(2):
            generate(decoder, PADDED, max_new_tokens=BUDGETS, eos_id=EOS, pad_id=PAD, compiled=True)
            sample_blocks(diffusion, PADDED, max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=EOS, pad_id=PAD,
                          compiled=True)
        return [weakref.ref(m) for m in (decoder, decoder.stack, diffusion, diffusion.stack)]

    refs = decode_and_drop()
    gc.collect()
    assert [r() for r in refs] == [None] * 4
    decode_and_drop()
    assert len(compiles) <= 2  # one per kind of step (token, stack) at most, whatever the model or decode
