"""The bench's arithmetic against references: analytic FLOPs against torch's FLOP counter, the
references against the platform's shapes, and the CLI's JSON against its own table. Nothing
here times anything: speed is the bench's job, not the tests'."""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.bench.contenders import (Options, decoder_tokens, family_flops_per_token, generation_steps,
                                     platform_module, schema_batch)
from attnlab.training.flops import linear_params
from attnlab.bench.references import TorchTranslator, hf_gpt2
from attnlab.bench.report import check_targets, format_report
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
        "generation": {"1": {"decoder_only/greedy_compiled": {"tokens_per_s": 260.0},
                             "hf_generate/greedy": {"tokens_per_s": 100.0}},
                       "16": {"decoder_only/greedy_compiled": {"tokens_per_s": 10.0},
                              "hf_generate/greedy": {"tokens_per_s": 100.0}}},
    }
    checks = {c["what"]: c for c in check_targets(result)}
    generation = checks["DecoderOnly compiled greedy vs HF generate greedy, batch 1"]  # batch 1's rows, not 16's
    assert generation["ratio"] == pytest.approx(2.6) and generation["holds"] is True and generation["target"] == 2.5
    assert checks["DecoderOnly training vs HF GPT2LMHeadModel"]["ratio"] == pytest.approx(3.0)
    assert checks["DecoderOnly training vs HF GPT2LMHeadModel"]["holds"] is True
    assert checks["BlockDiffusion training vs DecoderOnly"]["holds"] is False  # 0.4 < 0.45
    memory = checks["sdpa attention peak memory, 8192 over 4096 tokens"]
    assert memory["ratio"] == pytest.approx(2.5) and memory["holds"] is False
    assert not any("EncoderDecoder" in what for what in checks)  # no rows, no verdict


def test_rows_timed_in_the_same_rounds_are_compared_round_by_round():
    """A slow round slows both rows of a twin pair: the verdict is the median of the per-round
    ratios, not the ratio of the medians (here 2.0 against 100 / 45.45 = 2.2)."""
    calls = {"compiled": [1.0, 2.0, 1.0], "eager": [2.0, 4.0, 2.2]}  # seconds per call, 100 tokens each
    rows = {"decoder_only/greedy" + ("_compiled" if mode == "compiled" else ""):
            {"tokens_per_s": 100.0 / sorted(t)[1], "round_seconds": t} for mode, t in calls.items()}
    result = {"generation": {"1": rows}, "shape": {}, "peak_flops": {}, "date": "d", "device": "cpu", "torch": "t",
              "options": {"precision": "32", "compile": False}}
    check = {c["what"]: c for c in check_targets(result)}["DecoderOnly greedy, compiled vs eager, batch 1"]
    per_round = sorted((100.0 / c) / (100.0 / e) for c, e in zip(calls["compiled"], calls["eager"]))
    assert check["ratio"] == pytest.approx(per_round[1]) == pytest.approx(2.0)
    assert check["round_range"] == pytest.approx([per_round[0], per_round[-1]])
    result["targets"] = [check]
    assert "| DecoderOnly greedy, compiled vs eager, batch 1 | 2.00x (2.00-2.20) | >= 1.0 | holds |" in format_report(result)
    rows["decoder_only/greedy"]["round_seconds"] = [2.0, 4.0]  # not the same rounds: the rows' own values
    check = {c["what"]: c for c in check_targets(result)}["DecoderOnly greedy, compiled vs eager, batch 1"]
    assert check["ratio"] == pytest.approx(2.2) and "round_range" not in check


def _row(tokens_per_s: float, calls_per_token: float = 1.0) -> dict:
    return {"tokens_per_s": tokens_per_s, "calls_per_token": calls_per_token}


def test_generation_targets_compare_compiled_with_eager_at_every_batch_and_hf_at_batch_1():
    """Compiled >= eager for both AR families, greedy and beam (named after the shape's beam), at
    each measured batch; DecoderOnly compiled greedy >= 2.5x HF generate at batch 1."""
    generation = {}
    for b, speedup in (("1", 1.2), ("16", 1.0), ("256", 0.8)):
        generation[b] = {}
        for name in ("decoder_only/greedy", "decoder_only/beam3", "encoder_decoder/greedy", "encoder_decoder/beam3"):
            generation[b][name] = _row(100.0)
            generation[b][name + "_compiled"] = _row(100.0 * speedup)
    generation["1"]["hf_generate/greedy"] = _row(50.0)
    checks = {c["what"]: c for c in check_targets({"shape": {"gen_beam": 3}, "generation": generation})}
    for what in ("DecoderOnly greedy", "DecoderOnly beam", "EncoderDecoder greedy", "EncoderDecoder beam"):
        for b, holds in (("1", True), ("16", True), ("256", False)):  # 1.0 is enough: ">= 1.0"
            check = checks[f"{what}, compiled vs eager, batch {b}"]
            assert check["holds"] is holds and check["target"] == 1.0 and not check.get("at_most")
    hf = checks["DecoderOnly compiled greedy vs HF generate greedy, batch 1"]
    assert hf["ratio"] == pytest.approx(120.0 / 50.0) and hf["holds"] is False  # 2.4 < 2.5
    eager = checks["DecoderOnly eager greedy vs HF generate greedy, batch 1"]
    assert eager["ratio"] == pytest.approx(2.0) and eager["holds"] is None  # informative
    assert len([w for w in checks if "compiled vs eager" in w]) == 12


@pytest.mark.parametrize("at_16, holds", [(1.1, True), (1.0, True), (0.5, True), (1.12, False), (2.0, False)])
def test_threshold_calls_per_token_may_grow_at_most_10_percent_from_batch_1_to_16(at_16, holds):
    generation = {"1": {"block_diffusion/tau0.9": _row(100.0, calls_per_token=0.5)},
                  "16": {"block_diffusion/tau0.9": _row(900.0, calls_per_token=0.5 * at_16)}}
    checks = [c for c in check_targets({"generation": generation}) if "calls per token" in c["what"]]
    assert len(checks) == 1
    check = checks[0]
    assert check["what"] == "BlockDiffusion tau 0.9 calls per token, batch 16 over batch 1"
    assert check["ratio"] == pytest.approx(at_16) and check["target"] == 1.1 and check["at_most"] is True
    assert check["holds"] is holds  # calls per token, not tokens/s (which grew 9x here)


def test_the_report_prints_at_most_targets_with_their_sign():
    result = {"date": "d", "device": "cpu", "torch": "t", "options": {"precision": "32", "compile": False},
              "peak_flops": {}, "targets": [{"what": "x", "ratio": 1.0, "target": 1.1, "holds": True, "at_most": True}]}
    assert "| x | 1.00x | <= 1.1 | holds |" in format_report(result)


def test_bench_command_writes_json_that_matches_its_table(tmp_path, cli, monkeypatch):
    """Training and memory in this process (generation: the next test)."""
    from attnlab.bench import memory, run

    # The memory probes in this process: a probe's own process (what the bench does on a CPU, for
    # a clean peak RSS) is tested once below.
    monkeypatch.setattr(run, "peak_bytes", memory.peak_bytes_here)
    out = tmp_path / "bench.json"
    shape = ["--set", "vocab=97", "d_model=32", "n_layers=1", "n_heads=4", "d_ff=64", "ed_batch=2", "ed_len=8",
             "gen_batches=1,2", "gen_prompt=4", "gen_new=5", "memory_lengths=64,128", "memory_math_max=64"]
    result = cli("bench", "--only", "train", "memory", "--batch", "2", "--seq-len", "16", "--rounds", "1",
                 "--warmup", "0", "--no-hf", "--device", "cpu", *shape, "-o", out)
    assert result.code == 0, result.err[-3000:]
    data = json.loads(out.read_text())
    assert set(data["training"]) == {"decoder_only", "block_diffusion", "encoder_decoder", "torch_transformer"}
    assert data["training"]["decoder_only"]["tokens_per_step"] == 2 * 16
    assert data["training"]["encoder_decoder"]["tokens_per_step"] == 2 * 8
    assert "generation" not in data
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


def test_decoding_table_has_every_decoding_at_every_batch_with_its_model_calls(tmp_path, cli, monkeypatch):
    """Every family's decodings, eager and compiled, at each batch, with calls per token as the
    algorithms make them. Compiled rows on Dynamo's eager backend (Inductor's C++ build would take
    most of the test; test_compiled_decoding runs Inductor itself)."""
    from attnlab.generation import compiled_step

    monkeypatch.setattr(compiled_step, "BACKEND", "eager")
    torch.compiler.reset()
    out = tmp_path / "bench.json"
    new, block = 12, 4
    # Batch 2 reaches gen_few_rounds_from: two timed rounds after a warm-up call of two blocks.
    shape = ["--set", "vocab=97", "d_model=32", "n_layers=1", "n_heads=4", "d_ff=64", "ed_len=8", "gen_batches=1,2",
             "gen_prompt=4", f"gen_new={new}", f"block_size={block}", "gen_few_rounds_from=2", "gen_few_rounds=2"]
    result = cli("bench", "--only", "generate", "--rounds", "1", "--warmup", "0", "--no-hf", "--device", "cpu",
                 *shape, "-o", out)
    torch.compiler.reset()
    assert result.code == 0, result.err[-3000:]
    data = json.loads(out.read_text())
    # Model calls (stack forwards) of one decode of `new` tokens a row, from the algorithms:
    expected = {
        "decoder_only/greedy": new,  # the prompt's call gives the first token, each later token one call
        "decoder_only/beam4": new,  # the same: the first beam step takes the prompt call's logits
        "encoder_decoder/greedy": new,  # bos gives the first token; the encoder is no decoding call
        "encoder_decoder/beam4": new,
        "torch_transformer/greedy": new,  # one decoder pass per token (over the whole prefix: no cache)
        # k calls per block; a clean block joins the cache in the next block's first call
        **{f"block_diffusion/steps{k}": new // block * k for k in (1, 2, 4)},
        # draft-and-verify: the prompt's call gives one token, then every draft kept: block tokens a
        # call; none kept: one token a call (a rejecting call, then a drafting one, and so on)
        "block_diffusion/verify_all": 1 + -(-(new - 1) // block), "block_diffusion/verify_none": new,
    }
    thresholds = {"block_diffusion/tau0.9", "block_diffusion/tau0.7"}
    eager = set(expected) | thresholds
    assert set(data["generation"]) == {"1", "2"}
    for batch, rows in data["generation"].items():
        assert set(rows) == eager | {name + "_compiled" for name in eager - {"torch_transformer/greedy"}}
        for name, row in rows.items():
            twin = name.removesuffix("_compiled")
            assert row["mode"] == ("eager" if name == twin else "compiled")
            assert f"{row['family']}/{row['decoding']}" == twin
            if twin in expected:
                assert row["calls"] == expected[twin], (batch, name)
            else:  # threshold: at least one call per block, at most one per token
                assert new // block <= row["calls"] <= new, (batch, name)
            assert row["calls"] == rows[twin]["calls"]  # a compiled row counts its own calls
            if name != twin and batch == "1":  # compiling: the first (full-length) call over a timed one
                assert row["compile_s"] >= 0
                saved = (rows[twin]["seconds"] - row["seconds"]) / row["calls"]
                assert row["pays_after_calls"] == (math.ceil(row["compile_s"] / saved) if saved > 0 else None)
            else:  # eager, or batch 2's short warm-up (other decodings), which times no compile
                assert "compile_s" not in row
            assert row["calls_per_token"] == pytest.approx(row["calls"] / new)
            assert len(row["round_seconds"]) == (3 if batch == "1" else 2)  # max(3, --rounds 1); gen_few_rounds
            assert row["tokens_per_s"] == pytest.approx(int(batch) * new / row["seconds"])
            assert row["ms_per_token"] == pytest.approx(1000 * row["seconds"] / new)
    # The table: a line per decoding, eager and compiled side by side.
    rows = data["generation"]["2"]
    e, c = rows["block_diffusion/steps2"], rows["block_diffusion/steps2_compiled"]
    assert (f"| block_diffusion/steps2 | {e['tokens_per_s']:,.0f} | {c['tokens_per_s']:,.0f} | 0.50 | "
            f"{e['ms_per_token']:.2f} | {c['ms_per_token']:.2f} | - | - |") in result.out
    t = rows["torch_transformer/greedy"]
    assert (f"| torch_transformer/greedy | {t['tokens_per_s']:,.0f} | - | 1.00 | {t['ms_per_token']:.2f} | - | - | - |"
            in result.out)
    c = data["generation"]["1"]["decoder_only/greedy_compiled"]
    assert f"{c['ms_per_token']:.2f} | {c['compile_s']:.1f} |" in result.out
    assert "3 timed rounds after a warm-up call of 12 new tokens" in result.out  # batch 1
    assert "2 timed rounds after a warm-up call of 8 new tokens" in result.out  # batch 2
    assert "compiled during the timed rounds" not in result.out  # the short warm-up compiled batch 2's steps
    targets = {check["what"] for check in data["targets"]}
    assert {"DecoderOnly beam, compiled vs eager, batch 2",
            "EncoderDecoder greedy, compiled vs eager, batch 1"} <= targets
    assert not any("HF" in what or "batch 16" in what for what in targets)  # no such rows, no verdict


def test_hf_generate_rows_take_one_call_per_token_greedy_and_beam():
    """GPT-2's prefill gives the first token, as ours does; both run full length (generate asserts it)."""
    pytest.importorskip("transformers", reason="the GPT-2 reference is in the optional `bench` extra")
    from attnlab.bench.run import counting
    from attnlab.generation.model_calls import CallCounter

    steps = generation_steps(TINY, CPU, {"decoder_only": platform_module("decoder_only", TINY, CPU)}, True, True, 2)
    calls = {}
    with CallCounter(steps["hf_generate/greedy"].stack) as counter:  # the beam row's stack too: GPT-2's
        for name in ("hf_generate/greedy", "hf_generate/beam4"):
            counting(steps[name], counter, calls)()
    assert calls == {"hf_generate/greedy": TINY.gen_new, "hf_generate/beam4": TINY.gen_new}


PAGE_SHAPE = ["--device", "cpu", "--set", "vocab=97", "d_model=32", "n_layers=1", "n_heads=4", "d_ff=64",
              "gen_batches=2", "gen_prompt=4", "gen_new=4", "memory_lengths=64,128", "memory_math_max=64"]


def test_page_rewrites_its_generated_block_and_nothing_else(tmp_path, cli, monkeypatch):
    from attnlab.bench import memory, run

    monkeypatch.setattr(run, "peak_bytes", memory.peak_bytes_here)
    page = tmp_path / "page.md"
    # Mixed line ends, non-ASCII text and another block's end marker after ours: all kept as they are.
    before = "# Bench\r\n\r\nTyped by hand.\r\n\n"
    after = "\nAfter the block: café.\n<!-- /generated -->\nno newline at the end"
    page.write_bytes(f"{before}<!-- generated: bench -->\nold table\n<!-- /generated -->{after}".encode())
    for _ in range(2):  # the second run replaces the first run's block
        result = cli("bench", "--only", "memory", *PAGE_SHAPE, "-o", tmp_path / "b.json", "--page", page)
        assert result.code == 0, result.err[-3000:]
        text = page.read_bytes().decode()
        assert text.startswith(before) and text.endswith(after)
        block = text[len(before):-len(after)]
        assert block.startswith("<!-- generated: bench -->\nGenerated by `attnlab bench --only memory --device cpu")
        assert block.endswith("\n<!-- /generated -->") and block.count("<!-- generated") == 1
        assert "old table" not in block and "commit `" in block and f"torch {torch.__version__}" in block
        data = json.loads((tmp_path / "b.json").read_text())
        assert data["device"] in block and format_report(data) in block


def test_a_page_without_a_block_gets_one_at_its_end(tmp_path):
    from attnlab.bench.run import write_page

    page = tmp_path / "page.md"
    page.write_bytes(b"# Title\r\nno newline at the end")
    write_page(page, "TABLE")
    assert page.read_bytes() == (b"# Title\r\nno newline at the end\n"
                                 b"\n<!-- generated: bench -->\nTABLE\n<!-- /generated -->\n")
    write_page(tmp_path / "new.md", "T")
    assert (tmp_path / "new.md").read_text() == "<!-- generated: bench -->\nT\n<!-- /generated -->\n"


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
    (["--page", "no/such/folder/page.md"], "--page no/such/folder/page.md: no folder no/such/folder"),
    (["--page", "."], "--page .: not a file"),
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


def test_a_page_with_an_unclosed_block_fails_before_any_work(tmp_path, cli):
    (tmp_path / "page.md").write_text("text\n<!-- generated: bench -->\nno end marker\n")
    result = cli("bench", "--page", tmp_path / "page.md", "-o", tmp_path / "b.json")
    assert result.code == 2 and "without a <!-- /generated --> line after it" in result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "b.json").exists()


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root may write any file")
def test_a_read_only_page_fails_before_any_work(tmp_path, cli):
    page = tmp_path / "page.md"
    page.write_text("text\n")
    page.chmod(0o444)
    result = cli("bench", "--page", page, "-o", tmp_path / "b.json")
    assert result.code == 2 and "not writable" in result.err and not (tmp_path / "b.json").exists()


def test_the_calls_table_times_ar_steps_beside_block_and_verify_calls(tmp_path, cli, monkeypatch):
    """Every kind of call at every generation batch up to reference_max_batch, eager and compiled
    (Dynamo's eager backend here), each against the AR step of its own mode in the same rounds."""
    from attnlab.bench import calls as bench_calls
    from attnlab.generation import compiled_step

    monkeypatch.setattr(compiled_step, "BACKEND", "eager")
    monkeypatch.setattr(bench_calls, "CALLS_PER_ROUND", 2)
    torch.compiler.reset()
    out = tmp_path / "bench.json"
    shape = ["--set", "vocab=97", "d_model=32", "n_layers=1", "n_heads=4", "d_ff=64", "gen_batches=2,32",
             "gen_prompt=4", "gen_new=8", "reference_max_batch=2"]
    result = cli("bench", "--only", "calls", "--rounds", "1", "--device", "cpu", *shape, "-o", out)
    torch.compiler.reset()
    assert result.code == 0, result.err[-3000:]
    calls = json.loads(out.read_text())["calls"]
    kinds = ["ar_step"] + [f"{kind}{n}" for n in bench_calls.CALL_WIDTHS for kind in ("block", "verify")]
    assert set(calls) == {"2"}  # 32 is past reference_max_batch
    for rows in calls.values():
        assert set(rows) == set(kinds) | {k + "_compiled" for k in kinds}
        assert rows["ar_step"]["ratio_to_ar"] == rows["ar_step_compiled"]["ratio_to_ar"] == 1.0
        for name, row in rows.items():
            reference = rows["ar_step_compiled" if name.endswith("_compiled") else "ar_step"]
            ratios = [a / b for a, b in zip(row["round_ms"], reference["round_ms"])]
            assert row["ratio_to_ar"] == pytest.approx(statistics.median(ratios))
    assert "| verify16, batch 2 |" in result.out and "b / a eager" in result.out
