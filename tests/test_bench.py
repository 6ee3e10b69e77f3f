"""The bench's arithmetic against references: analytic FLOPs against torch's FLOP counter, the
references against the platform's shapes, and the CLI's JSON against its own table. Nothing
here times anything: speed is the bench's job, not the tests'."""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.bench.contenders import Options, decoder_tokens, platform_module, schema_batch
from attnlab.training.flops import family_flops_per_token, linear_params
from attnlab.bench.references import TorchTranslator, hf_gpt2
from attnlab.bench.report import check_targets
from attnlab.bench.shapes import BenchShape

TINY = BenchShape(vocab=97, d_model=32, n_layers=2, n_heads=4, d_ff=64, batch=3, seq_len=24,
                  ed_layers=2, ed_batch=3, ed_len=16, gen_batches=(2,), gen_prompt=4, gen_new=6, memory_lengths=(64, 128))
CPU = Options(torch.device("cpu"), fused_qkv=True)


def counted_training_flops(module, batch) -> int:
    """Matmul FLOPs of one forward + backward of the family's loss, as torch counts them."""
    module.train()
    with FlopCounterMode(display=False) as counter:
        terms = module.loss_terms(batch)
        (terms.loss.sum() / terms.targets.sum()).backward()
    return counter.get_total_flops()


def math_module(family: str):
    """The explicit-softmax backend, so the counter sees attention as two matmuls."""
    module = platform_module(family, TINY, CPU)
    for stack in module.attention_stacks().values():
        for kind in ("self", "cross"):
            for attention in stack.attention_modules(kind):
                attention.backend = "math"
    return module


def test_decoder_flops_formula_matches_the_counter():
    module = math_module("decoder_only")
    rows = decoder_tokens(TINY, "cpu", torch.Generator().manual_seed(0))
    counted = counted_training_flops(module, schema_batch(None, rows[:, 1:]))
    analytic = family_flops_per_token("decoder_only", module.model, TINY.vocab, 0, TINY.seq_len) * rows.numel()
    # The formula projects every token; training projects the seq_len - 1 labelled ones.
    assert counted == pytest.approx(analytic, rel=0.03)


def test_encoder_decoder_flops_formula_matches_the_counter():
    module = math_module("encoder_decoder")
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(6, TINY.vocab, (TINY.ed_batch, TINY.ed_len - 1), generator=generator)
    target = torch.randint(6, TINY.vocab, (TINY.ed_batch, TINY.ed_len - 1), generator=generator)
    counted = counted_training_flops(module, schema_batch(source, target))
    per_token = family_flops_per_token("encoder_decoder", module.model, TINY.vocab, TINY.ed_len, TINY.ed_len)
    assert counted == pytest.approx(per_token * TINY.ed_batch * TINY.ed_len, rel=0.03)


def test_block_diffusion_flops_formula_matches_the_counter():
    """With t near 1 every target token is masked: the output projection sees all of them."""
    module = math_module("block_diffusion")
    module.train_noise.copy_(torch.tensor([0.9999, 1.0]))
    rows = decoder_tokens(TINY, "cpu", torch.Generator().manual_seed(0))
    counted = counted_training_flops(module, schema_batch(None, rows[:, 1:]))
    per_token = family_flops_per_token("block_diffusion", module.model, TINY.vocab, 0, TINY.seq_len, masked_fraction=1.0)
    assert counted == pytest.approx(per_token * rows.numel(), rel=0.05)


def test_gpt2_reference_has_the_decoder_only_shapes():
    pytest.importorskip("transformers", reason="the GPT-2 reference is in the optional `bench` extra")
    ours = platform_module("decoder_only", TINY, CPU).model
    theirs = hf_gpt2(TINY)
    # GPT-2's Conv1D layers hold the same matrices as our Linear ones (qkv fused in both).
    conv_params = sum(p.numel() for n, p in theirs.transformer.h.named_parameters() if n.endswith("weight") and p.dim() == 2)
    assert conv_params == linear_params(ours.stack.layers)
    assert theirs.lm_head.weight.shape == ours.stack.embedding.weight.shape


def test_torch_transformer_reference_has_the_encoder_decoder_shapes():
    ours = platform_module("encoder_decoder", TINY, CPU).model
    theirs = TorchTranslator(TINY)
    assert linear_params(theirs.transformer) + sum(
        m.in_proj_weight.numel() for m in theirs.modules() if isinstance(m, torch.nn.MultiheadAttention)
    ) == linear_params(ours.encoder.layers) + linear_params(ours.decoder.layers)


def test_targets_are_judged_from_the_measured_rows():
    result = {
        "training": {"decoder_only": {"tokens_per_s": 300.0}, "hf_gpt2": {"tokens_per_s": 100.0},
                     "block_diffusion": {"tokens_per_s": 120.0}},
        "memory": {"sdpa": {4096: 100, 8192: 250}},
        "generation": {"1": {"decoder_only_compiled": {"tokens_per_s": 210.0}, "hf_generate": {"tokens_per_s": 100.0}},
                       "16": {"decoder_only_compiled": {"tokens_per_s": 10.0}, "hf_generate": {"tokens_per_s": 100.0}}},
    }
    checks = {c["what"]: c for c in check_targets(result)}
    generation = checks["DecoderOnly compiled generation vs HF generate, batch 1"]  # batch 1's rows, not 16's
    assert generation["ratio"] == pytest.approx(2.1) and generation["holds"] is True
    assert checks["DecoderOnly training vs HF GPT2LMHeadModel"]["ratio"] == pytest.approx(3.0)
    assert checks["DecoderOnly training vs HF GPT2LMHeadModel"]["holds"] is True
    assert checks["BlockDiffusion training vs DecoderOnly"]["holds"] is False  # 0.4 < 0.45
    memory = checks["sdpa attention peak memory, 8192 over 4096 tokens"]
    assert memory["ratio"] == pytest.approx(2.5) and memory["holds"] is False
    assert not any("EncoderDecoder" in what for what in checks)  # no rows, no verdict


def test_bench_command_writes_json_that_matches_its_table(tmp_path, cli, monkeypatch):
    """In this process, with the compiled rows on Dynamo's eager backend (Inductor's C++ build would
    take most of the test; test_compiled_decoding runs Inductor itself)."""
    from attnlab.bench import memory, run
    from attnlab.generation import compiled_step

    monkeypatch.setattr(compiled_step, "BACKEND", "eager")
    # The memory probes in this process: a probe's own process (what the bench does on a CPU, for
    # a clean peak RSS) is tested once below.
    monkeypatch.setattr(run, "peak_bytes", memory.peak_bytes_here)
    torch.compiler.reset()
    out = tmp_path / "bench.json"
    shape = ["--set", "vocab=97", "d_model=32", "n_layers=1", "n_heads=4", "d_ff=64", "ed_batch=2", "ed_len=8",
             "gen_batches=1,2", "gen_prompt=4", "gen_new=5", "memory_lengths=64,128", "memory_math_max=64"]
    result = cli("bench", "--batch", "2", "--seq-len", "16", "--rounds", "1", "--warmup", "0", "--no-hf",
                 "--device", "cpu", *shape, "-o", out)
    torch.compiler.reset()
    assert result.code == 0, result.err[-3000:]
    data = json.loads(out.read_text())
    assert set(data["training"]) == {"decoder_only", "block_diffusion", "encoder_decoder", "torch_transformer"}
    assert data["training"]["decoder_only"]["tokens_per_step"] == 2 * 16
    assert data["training"]["encoder_decoder"]["tokens_per_step"] == 2 * 8
    assert set(data["generation"]) == {"1", "2"}
    families = {"decoder_only", "block_diffusion", "encoder_decoder", "encoder_decoder_beam"}
    assert set(data["generation"]["1"]) == families | {f + "_compiled" for f in families} | {"torch_transformer"}
    assert "torch_transformer" in data["generation"]["2"]
    assert set(data["memory"]["sdpa"]) == {"64", "128"} and set(data["memory"]["math"]) == {"64"}
    gqa = data["memory"]["gqa"]  # n_heads 4: the cache holds K and V of n_kv heads only
    layers, batch, tokens, head_dim = 1, 2, 4 + 5, 32 // 4
    assert {n: r["cache_bytes"] for n, r in gqa.items()} == {
        n: 2 * layers * batch * int(n) * tokens * head_dim * 4 for n in ("1", "2", "4")}
    assert "| n_kv_heads |" in result.out
    ratio = {c["what"]: c["ratio"] for c in data["targets"]}["BlockDiffusion training vs DecoderOnly"]
    rows = data["training"]
    assert ratio == pytest.approx(rows["block_diffusion"]["tokens_per_s"] / rows["decoder_only"]["tokens_per_s"])
    assert f"| decoder_only | {rows['decoder_only']['seconds_per_step']:.3f} |" in result.out
    # The peak: the best of every matmul size timed with the models, or the fastest model's rate.
    peaks = data["peak_flops"]
    assert set(peaks["by_size"]) == {f"matmul {n}" for n in (256, 512, 1024, 2048)}
    fastest = max(r["tokens_per_s"] * r["flops_per_token"] for r in rows.values())
    assert peaks["measured"] == pytest.approx(max(*peaks["by_size"].values(), fastest))
    assert peaks["raised_to_fastest_model"] == (fastest > max(peaks["by_size"].values()))
    assert all(0 < r["mfu_measured"] <= 1 for r in rows.values())
    assert "peak matmul TFLOP/s by size" in result.out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads VmHWM from /proc/self/status")
def test_the_cpu_memory_probe_measures_the_quadratic_scores_in_its_own_process():
    """The math backend holds (heads x length x length) float32 scores: at 1,024 tokens and 4 heads
    at least 16 MiB more than at 64 tokens, measured by the probe process the bench starts. (At 64
    tokens the step may fit in pages its warm-up step of the same length freed: 0 is a valid peak.)"""
    from attnlab.bench.memory import peak_bytes

    cpu = torch.device("cpu")
    short, long = (peak_bytes(n, 32, 4, "math", cpu) for n in (64, 1024))
    assert short >= 0 and long - short > 4 * 1024 * 1024 * 4


@pytest.mark.parametrize("flags, message", [
    (["--set", "d_modle=4"], "FIELD one of vocab"),
    (["--set", "gen_new=0"], "gen_new must be positive"),
    (["--device", "cuda:0"], "no CUDA device") if not torch.cuda.is_available() else (["--set", "vocab=x"], "integer"),
])
def test_bad_bench_flags_fail_before_any_work(tmp_path, cli, flags, message):
    result = cli("bench", *flags, "-o", tmp_path / "b.json")
    assert result.code == 2 and message in result.err
    assert not (tmp_path / "b.json").exists()


def test_missing_transformers_is_named_with_the_extra_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    from attnlab.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert main(["bench", "-o", str(tmp_path / "b.json")]) == 2
    assert "pip install -e '.[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
