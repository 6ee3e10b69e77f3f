"""Compiled decoding (issue 18, item 1; issue 33): the same tokens and logits as eager decoding
for every family and positional encoding, with and without padding, greedy and beam; the cache
is written in place and grows by reallocation when full.

The matrix compiles with Dynamo's "eager" backend: the step is captured as a graph (guards,
graph breaks, dynamic shapes, the caches read and written inside it) and run as captured,
in a fraction of the time. One test per family compiles with Inductor itself, as
`generation.compile` does, which adds what the matrix leaves out: AOTAutograd's functional
rewrite of the in-place cache writes, and generated kernels.
"""
from __future__ import annotations

import random

import pytest
import torch

from attnlab import BackboneConfig
from attnlab.generation import compiled_step, model_calls
from attnlab.generation.block_diffusion import sample_blocks
from attnlab.generation.decoder_only import generate, generate_beam
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.generation.model_calls import CallCounter
from attnlab.models.block_diffusion import BlockDiffusionModel
from attnlab.models.decoder_only import DecoderOnlyModel
from attnlab.models.encoder_decoder import EncoderDecoderModel

VOCAB, EOS, PAD, BOS, MASK = 40, 3, 0, 1, 4
# One encoding of each kind the incremental path treats differently: a table added to the inputs
# (sinusoidal; learned is the same path with a trained table, "none" adds nothing), rotations of
# the queries and keys at their positions (RoPE), a score bias by distance (ALiBi).
POSITIONAL = ["sinusoidal", "rope", "alibi"]
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


def run_both_ways(embedding, decode):
    """Tokens and recorded logits of decode(mode), eager and compiled."""
    results = {}
    for mode in ("eager", "compiled"):
        calls = recorded_logits(embedding)
        results[mode] = decode({"compiled": mode == "compiled"}), calls
    del embedding.logits
    return results


def assert_same(results):
    (eager, eager_logits), (compiled, compiled_logits) = results["eager"], results["compiled"]
    assert eager == compiled
    assert len(eager_logits) == len(compiled_logits)
    for reference, graph in zip(eager_logits, compiled_logits):
        finite = reference.isfinite()
        assert torch.equal(finite, graph.isfinite())
        torch.testing.assert_close(graph[finite], reference[finite], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional,prompts", EVERY_POSITIONAL_PADDED_AND_UNPADDED)
def test_decoder_only_compiled_equals_eager(positional, prompts):
    torch.manual_seed(0)
    model = DecoderOnlyModel(config(positional), VOCAB, PAD).eval()
    common = dict(max_new_tokens=BUDGETS, eos_id=EOS, pad_id=PAD)
    greedy = run_both_ways(model.stack.embedding, lambda mode: generate(model, prompts, compact=False, **common, **mode))
    assert_same(greedy)
    beam = run_both_ways(model.stack.embedding, lambda mode: generate_beam(
        model, prompts, beam_size=3, alpha=0.6, compact=False, **common, **mode))
    assert_same(beam)


@pytest.mark.parametrize("positional,prefixes", [
    *(pytest.param(p, None, id=f"{p}-translation") for p in POSITIONAL),
    pytest.param("rope", PADDED, id="rope-padded-prefixes")])
def test_encoder_decoder_compiled_equals_eager(positional, prefixes):
    torch.manual_seed(0)
    model = EncoderDecoderModel(config(positional), VOCAB, PAD).eval()
    source = torch.tensor([[7, 8, 9, 10, 2], [11, 12, 2, 0, 0], [13, 2, 0, 0, 0]])
    encoded = model.encode(source, source != 0)[0]
    common = dict(max_lengths=BUDGETS, bos_id=BOS, eos_id=EOS, pad_id=PAD, prefixes=prefixes, compact=False)
    greedy = run_both_ways(model.decoder.embedding, lambda mode: translate_greedy(model, encoded, **common, **mode))
    assert_same(greedy)
    beam = run_both_ways(model.decoder.embedding, lambda mode: translate_beam(
        model, encoded, beam_size=3, alpha=0.6, **common, **mode))
    assert_same(beam)


SHIFTED = {"shift": True, "context": "causal"}


@pytest.mark.parametrize("positional,prompts,view", [
    *(pytest.param(*p.values, {}, id=p.id) for p in EVERY_POSITIONAL_PADDED_AND_UNPADDED),
    pytest.param("rope", PADDED, SHIFTED, id="rope-padded-shift+causal"),
    pytest.param("alibi", UNPADDED, SHIFTED, id="alibi-unpadded-shift+causal")])
def test_block_diffusion_compiled_equals_eager(positional, prompts, view):
    torch.manual_seed(0)
    model = BlockDiffusionModel(config(positional), VOCAB, PAD, MASK, **view).eval()
    common = dict(max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=EOS, pad_id=PAD, compact=False)
    results = run_both_ways(model.stack.embedding, lambda mode: sample_blocks(model, prompts, **common, **mode))
    assert_same(results)


def test_compiled_calls_are_counted_as_eager_ones_are():
    """A forward hook does not see a call made inside a compiled graph: the runner reports it, and
    each family's compiled decode counts the calls of its eager decode (val/nfe_per_token)."""
    torch.manual_seed(0)
    decoder, blocks = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval(), BlockDiffusionModel(
        config("rope"), VOCAB, PAD, MASK).eval()
    translator = EncoderDecoderModel(config("rope"), VOCAB, PAD).eval()
    encoded = translator.encode(torch.tensor([[7, 8, 2], [9, 2, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]).bool())[0]
    decodes = {
        "greedy": (decoder.stack, lambda mode: generate(decoder, PADDED, max_new_tokens=BUDGETS, eos_id=-1, pad_id=PAD,
                                                        compact=False, **mode)),
        "beam": (decoder.stack, lambda mode: generate_beam(decoder, PADDED, max_new_tokens=BUDGETS, eos_id=-1,
                                                           pad_id=PAD, beam_size=2, alpha=0.6, compact=False, **mode)),
        "translate": (translator.decoder, lambda mode: translate_greedy(
            translator, encoded, max_lengths=BUDGETS[:2], bos_id=BOS, eos_id=-1, pad_id=PAD, compact=False, **mode)),
        "blocks": (blocks.stack, lambda mode: sample_blocks(blocks, PADDED, max_new_tokens=BUDGETS, block_size=4,
                                                            steps=2, eos_id=-1, pad_id=PAD, compact=False, **mode)),
    }
    for name, (stack, decode) in decodes.items():
        counted = {}
        for compiled in (False, True):
            with CallCounter(stack) as calls:
                decode({"compiled": compiled})
            counted[compiled] = calls.calls
        assert counted[True] == counted[False] > 2, name
    assert not model_calls._COUNTING  # every counter closed


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
        (eager, eager_logits), (graph, graph_logits) = run(), run(compiled=True)
        assert eager == graph, family
        torch.testing.assert_close(graph_logits, eager_logits, atol=1e-5, rtol=1e-5)
    blocks = dict(max_new_tokens=BUDGETS, block_size=4, steps=2, eos_id=EOS, pad_id=PAD)
    assert sample_blocks(diffusion, PADDED, compiled=True, **blocks) == sample_blocks(diffusion, PADDED, **blocks)


def test_the_cache_is_written_in_place_and_read_over_its_filled_prefix():
    torch.manual_seed(0)
    model = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval()
    state = model.new_state(2, 16)
    with torch.no_grad():
        model(torch.tensor([[1, 7, 8], [1, 9, 10]]), None, state)
        buffer = state.caches[0].self_attn.buffers[0]
        model(torch.tensor([[11], [12]]), None, state)
    assert state.caches[0].self_attn.buffers[0] is buffer and buffer.shape == (2, 2, 16, 8)  # (B, H_kv, capacity, D)
    assert len(state) == 4 and state.caches[0].self_attn.k.shape[2] == 4  # attention read 4 slots, not 16
    assert buffer[:, :, :4].abs().sum() > 0 and buffer[:, :, 4:].abs().sum() == 0


def test_a_full_cache_grows_and_decodes_as_one_large_enough():
    """A cache built too small reallocates once it is full; the tokens and logits do not change."""
    torch.manual_seed(0)
    model = DecoderOnlyModel(config("rope"), VOCAB, PAD).eval()
    outputs = []
    for capacity in (3, 64):
        state = model.new_state(3, capacity)
        with torch.no_grad():
            steps = [model(torch.tensor([[1, 7, 8], [1, 9, 10], [1, 11, 12]]), None, state)[:, -1]]
            for token in range(13, 23):
                steps.append(model(torch.full((3, 1), token), None, state)[:, -1])
        outputs.append(torch.stack(steps))
        assert len(state) == 13
    assert state.capacity == 64
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)


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
    real = compiled_step.step_runner

    def spy(compiled):
        seen.append(compiled)
        return real(compiled)

    monkeypatch.setattr("attnlab.models.decoder_only.step_runner", spy)
    from attnlab import DecoderOnly
    from data_modules.batch import Example, collate

    module = DecoderOnly(backbone=config("rope"), vocab_size=VOCAB, generation={"compile": True, "max_new_tokens": 3})
    batch = collate([Example([7, 8], [9], "", ""), Example([10], [11], "", "")], module.special.pad)
    assert all(len(ids) <= 3 for ids in module.eval().generate_ids(batch))
    assert seen == [True], "generation.compile did not compile the decoding steps"


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


def test_every_kind_of_compiled_call_stays_compiled_in_one_process(caplog, monkeypatch):
    """Dynamo keeps at most 8 graphs per function and runs it eagerly past that, silently, apart
    from a log line: greedy, beam and block-diffusion decodes of all three families at two batch
    sizes in one process stay within the limit. Each call is one graph (fullgraph: a graph break
    raises): a block call's symbolic is_causal once broke it at every attention layer."""
    monkeypatch.setattr(compiled_step, "FULLGRAPH", True)
    torch.manual_seed(0)
    cfg = config("rope")
    decoder, encdec = DecoderOnlyModel(cfg, VOCAB, PAD).eval(), EncoderDecoderModel(cfg, VOCAB, PAD).eval()
    diffusion = BlockDiffusionModel(cfg, VOCAB, PAD, MASK).eval()
    budget = dict(max_new_tokens=6, eos_id=EOS, pad_id=PAD, compiled=True)
    with caplog.at_level("WARNING", logger="torch._dynamo"):
        for prompts in (UNPADDED[:1], PADDED, UNPADDED):
            generate(decoder, prompts, **budget)
            generate_beam(decoder, prompts, beam_size=3, alpha=0.6, **budget)
            for unmasking in ("confidence", "threshold"):
                sample_blocks(diffusion, prompts, block_size=4, steps=2, unmasking=unmasking, **budget)
            source = torch.tensor([p[1:] + [2] + [0] * (6 - len(p)) for p in prompts])
            encoded = encdec.encode(source, source != 0)[0]
            lengths = dict(max_lengths=torch.full((len(prompts),), 6), bos_id=BOS, eos_id=EOS, compiled=True)
            translate_greedy(encdec, encoded, pad_id=PAD, **lengths)
            translate_beam(encdec, encoded, beam_size=3, alpha=0.6, **lengths)
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]
