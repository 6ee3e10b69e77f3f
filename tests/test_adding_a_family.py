"""Adding a family, walked through (issue 45): a toy family registered with `register_family`, as
docs/guides/families.md tells a user, then fit, the report, the bench and the FLOPs counter run on
it without knowing its name: they ask the class.

Toy is DecoderOnly under a name of its own. ToyDenoiser says of itself that it is not
autoregressive and that its val/nll is a bound (a pretence: its network is DecoderOnly's), so
where the report sets a non-AR run against an AR one, that can only come from the classes."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from attnlab.errors import AttnlabError, ConfigError
from attnlab.families import FAMILIES, DecoderOnly, FamilyModule, register_family
from attnlab.generation.model_calls import CallCounter
from test_bench import CPU, TINY, math_module
from test_mfu import counted, padded_batch


class Toy(DecoderOnly):
    """A user's family: DecoderOnly's network and training under the name `toy`."""

    family = "toy"


class ToyDenoiser(Toy):
    family = "toy_denoiser"
    autoregressive, nll_is_bound = False, True


@pytest.fixture
def toys():
    """Toy and ToyDenoiser registered for one test (other tests see the three families only)."""
    for cls in (Toy, ToyDenoiser):
        register_family(cls)
    yield
    for cls in (Toy, ToyDenoiser):
        FAMILIES.pop(cls.family)


def test_the_registry_takes_a_whole_family_and_refuses_part_of_one(toys):
    assert FAMILIES["toy"] is Toy and list(FAMILIES)[:3] == ["decoder_only", "encoder_decoder", "block_diffusion"]
    assert register_family(Toy) is Toy  # again: a no-op

    class Unsaid(DecoderOnly):
        family = "unsaid"
        autoregressive = None

    with pytest.raises(ConfigError, match="Unsaid .*not set to True or False: autoregressive"):
        register_family(Unsaid)

    class Clash(DecoderOnly):
        family = "toy"

    with pytest.raises(ConfigError, match="'toy' is taken by test_adding_a_family.Toy"):
        register_family(Clash)

    class Half(FamilyModule):
        family, autoregressive, nll_is_bound, encodes_source = "half", True, False, False

    with pytest.raises(ConfigError, match="methods not implemented: .*generate_ids"):
        register_family(Half)
    assert set(FAMILIES) == {"decoder_only", "encoder_decoder", "block_diffusion", "toy", "toy_denoiser"}


def test_flops_are_counted_for_the_toy_as_torch_counts_them_and_as_for_its_parent(toys):
    from attnlab.bench.contenders import family_flops_per_token

    module = math_module("toy").train()
    assert type(module) is Toy
    flops, terms = counted(module, padded_batch(module))
    assert terms.flops == flops  # torch's FlopCounterMode over forward and backward
    assert module.expected_flops(padded_batch(module)) == flops
    for source, target in ((0, TINY.seq_len), (0, 7)):
        assert family_flops_per_token("toy", module.model, TINY.vocab, source, target) == \
            family_flops_per_token("decoder_only", module.model, TINY.vocab, source, target) > 0


def test_the_bench_trains_and_decodes_the_toy_as_it_does_its_parent(toys):
    from attnlab.bench.contenders import (
        NEVER,
        bench_lengths,
        generation_steps,
        platform_module,
        training_steps,
    )
    from attnlab.bench.run import parse_args

    assert parse_args(["--families", "toy", "--no-references"]).families == ["toy"]
    assert bench_lengths(TINY, "toy") == (0, TINY.seq_len)
    steps, tokens, modules = training_steps(TINY, CPU, ["toy", "decoder_only"], references=False, hf=False)
    assert list(steps) == ["decoder_only", "toy"]  # registry order, whatever the order asked
    assert tokens == {"decoder_only": TINY.batch * TINY.seq_len, "toy": TINY.batch * TINY.seq_len}
    before = [p.detach().clone() for p in modules["toy"].parameters()]
    steps["toy"]()  # one AdamW step on the decoder rows
    assert any(not torch.equal(a, b) for a, b in zip(before, modules["toy"].parameters()))

    toy, parent = platform_module("toy", TINY, CPU), platform_module("decoder_only", TINY, CPU)
    parent.load_state_dict(toy.state_dict())
    decodings = generation_steps(TINY, CPU, {"toy": toy, "decoder_only": parent}, False, False, batch=2)
    assert [n for n in decodings if n.startswith("toy/")] == [
        "toy/greedy", "toy/greedy_compiled", "toy/beam4", "toy/beam4_compiled"]
    assert NEVER < 0
    for decoding in ("greedy", "beam4"):
        ours = decodings[f"toy/{decoding}"]
        assert ours.stack is toy.model.stack and ours.family == "toy"
        with CallCounter(ours.stack) as counter:
            generated = ours.run()
        assert counter.calls == TINY.gen_new  # the prompt's call gives the first token
        assert generated == decodings[f"decoder_only/{decoding}"].run()
        assert [len(row) for row in generated] == [TINY.gen_new] * 2  # eos never stops a row


def _write_fit(folder, point: str, index: int, cls: type, losses: list[float]) -> None:
    """A sweep point's fit as `attnlab fit` leaves it, with the budget ledger: config.yaml names
    the class, summary.json the family."""
    fit = folder / point / "fit"
    fit.mkdir(parents=True)
    header = ["epoch", "step", "train/loss", "budget/epochs", "budget/flops", "val/nll"]
    rows = [[0, s, 4.0, s + 1, 1e9 * (s + 1), ""] for s in range(0, 40, 10)]
    rows += [[0, s, "", "", "", v] for s, v in zip((9, 19, 29, 39), losses)]
    with (fit / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows([header, *sorted(rows, key=lambda r: r[1])])
    (fit / "config.yaml").write_text(f"model:\n  class_path: {cls.__module__}.{cls.__qualname__}\n")
    (fit / "summary.json").write_text(json.dumps({"family": cls.family, "params": 1000, "steps": 40,
                                                  "ledger": {"flops": 4e10, "epochs": 40.0, "unique_tokens": 64}}))
    (fit.parent / "done.json").write_text(json.dumps({"point": point, "index": index, "seed": 0}))


def test_the_report_sets_the_toys_against_each_other_by_what_their_classes_say(toys, tmp_path):
    from attnlab.reports.curves import build_curves, crossover_text
    from attnlab.reports.report import group_points
    from attnlab.reports.runs import collect_runs

    _write_fit(tmp_path, "ar", 0, Toy, [3.0, 2.5, 2.4, 2.3])
    _write_fit(tmp_path, "denoiser", 1, ToyDenoiser, [3.5, 2.6, 2.2, 2.0])
    records = collect_runs(tmp_path)
    assert [(r.family, r.family_class()) for r in records] == [("Toy", Toy), ("ToyDenoiser", ToyDenoiser)]
    curves = build_curves(group_points(records), None)
    assert [(c.name, c.ar, c.bound) for c in curves] == [("ar", True, False), ("denoiser", False, True)]
    text = "\n".join(crossover_text(curves, None))
    # best so far: ar 3.0, 2.5, 2.4, 2.3 and denoiser 3.5, 2.6, 2.2, 2.0 at 1e10 .. 4e10 FLOPs:
    # below from the third validation on (3e10 FLOPs, epoch 30)
    assert "- denoiser against ar: below from 3e+10 FLOPs on (epoch 30.0)" in text
    assert "| ar | Toy | 1 |" in text and "| denoiser | ToyDenoiser | 1 |" in text


def test_a_toy_fit_reports_and_loads_back_as_the_toy(toys, trained_run, tmp_path):
    from attnlab.checkpoints.reading import load_checkpoint, read_checkpoint
    from attnlab.reports.report import report_main
    from attnlab.reports.runs import collect_runs

    _, run_dir = trained_run("--model.class_path", "test_adding_a_family.Toy")
    assert json.loads((run_dir / "summary.json").read_text())["family"] == "toy"
    (record,) = collect_runs(run_dir)
    assert record.family_class() is Toy
    assert report_main([str(run_dir), "--wandb", "disabled", "--output", str(tmp_path / "report")]) == 0
    (row,) = json.loads((tmp_path / "report" / "report.json").read_text())["rows"]
    assert row["family"] == "Toy"
    module, _ = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert type(module) is Toy
    FAMILIES.pop("toy")  # a checkpoint of a family this process has not registered: one clear refusal
    try:
        with pytest.raises(AttnlabError, match="family 'toy', which this attnlab does not know"):
            read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    finally:
        register_family(Toy)


def test_the_built_in_names_are_taken_before_anything_reads_the_registry():
    """In a fresh interpreter, before `attnlab.families.FAMILIES` is ever read: a run's recorded
    family name finds its class, and a user's class cannot claim a built-in name."""
    import subprocess
    import sys

    code = (
        "from attnlab.families.registry import family_class, register_family\n"
        "print(family_class(name='block_diffusion').__name__)\n"
        "from attnlab.families.decoder_only import DecoderOnly\n"
        "class Mine(DecoderOnly):\n"
        "    family = 'decoder_only'\n"
        "try:\n"
        "    register_family(Mine)\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["BlockDiffusion", "ConfigError"], result.stderr[-2000:]
