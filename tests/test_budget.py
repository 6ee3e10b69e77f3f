"""The budget ledger and matched budgets (attnlab.training.ledger, attnlab.training.budget).

The ledger's FLOPs are torch's own count of what each family runs; `run.budget` of flops or epochs
makes each run as long as it needs to spend it (to within one step / one batch); a time budget is
Lightning's max_time; a sweep's `budget:` becomes every point's run.budget. That the totals survive
an exact resume is checked by tests/test_resume.py (`_assert_same_run`).
"""
from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.reports.runs import collect_runs
from attnlab.training import mfu as mfu_module
from attnlab.training.ledger import BudgetLedger, length_batch
from conftest import DEBUG_YAML, FAST_TRAINER, debug_fit_args, read_metrics
from test_bench import math_module
from test_mfu import FAMILIES, padded_batch

CLASSES = {"decoder_only": "attnlab.DecoderOnly", "encoder_decoder": "attnlab.EncoderDecoder",
           "block_diffusion": "attnlab.BlockDiffusion"}
SEQ_LEN, BATCH = 16, 8
WARMUP = ["--model.init_args.optimizer.warmup_ratio", "0.25"]  # a budget derives the steps: warmup is a share of them


class CountedSteps(L.Callback):
    """torch's FlopCounterMode around each training batch: forward, backward and the optimizer
    step (whose element-wise updates it does not count, as FLOP counts never do)."""

    def __init__(self):
        self.flops = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.mode = FlopCounterMode(display=False)
        self.mode.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.mode.__exit__(None, None, None)
        self.flops.append(self.mode.get_total_flops())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_ledger_counts_the_flops_torch_counts_step_by_step(family, monkeypatch, tmp_path):
    monkeypatch.setattr(mfu_module, "_measured", lambda device, dtype: 1e15)  # no peak measured: no matmuls
    module = math_module(family)
    if family == "block_diffusion":
        module.train_noise.copy_(torch.tensor([0.3, 0.8]))  # some target tokens masked, some not
    batches = [padded_batch(module, seed) for seed in range(2)]
    counted, ledger = CountedSteps(), BudgetLedger()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[counted, ledger],
                        default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    assert len(counted.flops) == 2 and all(counted.flops)
    assert ledger.flops == sum(counted.flops)  # exactly: the same matmuls, counted two ways
    assert ledger.tokens == sum(int(b["source_lengths"].sum() + b["target_lengths"].sum()) for b in batches)
    assert trainer.callback_metrics["budget/flops"].item() == ledger.flops


@pytest.mark.parametrize("family", FAMILIES)
def test_a_budget_counts_a_step_from_the_batch_shapes_alone(family):
    """What a budget divides by (`expected_flops` of rows of the same lengths, no data) is what the
    step then counts: exactly, or for block diffusion's random masking on average."""
    module = math_module(family).train()
    batch = padded_batch(module)
    lengths = list(zip(batch["source_lengths"].tolist(), batch["target_lengths"].tolist()))
    expected = module.expected_flops(length_batch(lengths, module.special.pad))
    with torch.no_grad():
        if family != "block_diffusion":
            assert expected == module.loss_terms(batch).flops
            return
        torch.manual_seed(0)
        draws = [module.loss_terms(batch).flops for _ in range(200)]
    assert min(draws) < expected < max(draws)
    assert sum(draws) / len(draws) == pytest.approx(expected, rel=0.01)


def _text_fit(root, corpus, family, *extra, version="v1"):
    config = root / f"{family}.yaml"
    config.write_text(DEBUG_YAML.read_text(encoding="utf-8").replace("attnlab.DecoderOnly", CLASSES[family]),
                      encoding="utf-8")
    return ["fit", "--config", config, "--run.root", root, "--run.version", version, "--run.wandb", "disabled",
            *FAST_TRAINER, "--data", "data_modules.TextFolderDataModule", "--data.init_args.data_dir", corpus,
            "--data.init_args.seq_len", str(SEQ_LEN), "--data.init_args.vocab_size", "300",
            "--data.init_args.batch_size", str(BATCH), "--data.init_args.max_eval_examples", "8", *WARMUP, *extra]


FLOPS_BUDGET = 4.0e7  # three steps of the tiny decoder on 8 chunks of 16 tokens, two of block diffusion


@pytest.mark.parametrize("family", FAMILIES)
def test_a_flops_budget_gives_each_family_the_steps_that_spend_it(family, cli, tmp_path, text_folder_dir):
    result = cli(*_text_fit(tmp_path, text_folder_dir, family, "--run.budget", f"{{flops: {FLOPS_BUDGET}}}"))
    assert result.code == 0, result.err[-3000:]
    run = tmp_path / family / "v1"
    summary = json.loads((run / "summary.json").read_text())
    ledger, budget = summary["ledger"], summary["budget"]
    line = next(line for line in result.out.splitlines() if line.startswith("budget:"))
    assert line.startswith(f"budget: flops 4.0e7 -> max_steps {budget['max_steps']} (")
    assert "FLOPs/step" in line and "replaces trainer.max_steps=2" in line  # FAST_TRAINER's, overridden
    assert budget["flops"] == FLOPS_BUDGET and summary["steps"] == budget["max_steps"] >= 2
    step = ledger["flops"] / summary["steps"]  # what a step really cost, on average
    assert abs(ledger["flops"] - FLOPS_BUDGET) < step, (ledger, budget)
    assert ledger["tokens"] == summary["steps"] * BATCH * SEQ_LEN  # fixed-length chunks, full batches
    assert ledger["unique_tokens"] % SEQ_LEN == 0 and ledger["epochs"] == ledger["tokens"] / ledger["unique_tokens"]
    logged = read_metrics(run)
    assert logged["budget/flops"][-1] == ledger["flops"] and logged["budget/tokens"][-1] == ledger["tokens"]


def test_an_epochs_budget_trains_that_many_passes_over_the_training_tokens(cli, tmp_path, monkeypatch):
    """64 number-word pairs of varying length, batches of 32: 1.5 epochs are 3 steps and 1.5 × U
    tokens, U being every source and target token of the 64 pairs, within one batch; the learning
    rate schedule is built for those 3 steps."""
    from attnlab.families import base as family_base
    from data_modules import NumberWordsDataModule

    schedules, build = [], family_base.build_optimizer
    monkeypatch.setattr(family_base, "build_optimizer",
                        lambda module, cfg, horizon, d_model: schedules.append(horizon) or build(module, cfg, horizon, d_model))
    result = cli(*debug_fit_args(tmp_path, "--run.budget", "{epochs: 1.5}", *WARMUP))
    assert result.code == 0, result.err[-3000:]
    summary = json.loads((tmp_path / "debug" / "v1" / "summary.json").read_text())
    ledger = summary["ledger"]
    pairs = NumberWordsDataModule(n_train=64, n_val=64, n_test=64, vocab_size=300, max_eval_examples=8).examples("train")
    unique = sum(len(e.source) + len(e.target) for e in pairs)
    assert ledger["unique_tokens"] == unique
    budget = summary["budget"]
    assert (budget["epochs"], budget["max_steps"], budget["steps_per_epoch"]) == (1.5, 3, 2) and summary["steps"] == 3
    assert [horizon() for horizon in schedules] == [3]  # the cosine schedule ends where the budget does
    assert budget["tokens_per_step"] == unique / 2  # the mean of an epoch's two batches
    longest = max(len(e.source) + len(e.target) for e in pairs)
    assert abs(ledger["tokens"] - 1.5 * unique) <= 32 * longest
    # the report says what was matched, and shows what the run spent
    report = cli("report", tmp_path / "debug", "--wandb", "disabled")
    assert report.code == 0, report.err[-3000:]
    page = (tmp_path / "debug" / "report" / "report.md").read_text()
    assert "Budget: every run trained to a budget of epochs 1.5 (3 optimizer steps)" in page
    header, _, row = report.out.splitlines()[:3]
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["train FLOPs"] == f"{ledger['flops']:.2e}" and cells["epochs"] == f"{ledger['epochs']:.2f}"
    assert cells["train tokens"] == (f"{ledger['tokens']:.2e}" if ledger["tokens"] >= 1e4 else f"{ledger['tokens']:.3g}")
    assert ledger["epochs"] == pytest.approx(1.5, abs=32 * longest / unique)
    (record,) = collect_runs(tmp_path)  # what the report reads
    assert record.ledger("tokens") == ledger["tokens"] and record.ledger("epochs") == ledger["epochs"]
    assert record.budget()["max_steps"] == 3


def test_an_epochs_budget_on_a_subset_of_unique_tokens_trains_e_times_u(cli, tmp_path, text_folder_dir):
    """data.init_args.train_tokens 100 on chunks of 16: a subset of U = 112 unique tokens (7 chunks,
    one batch of 8 chunks holds them all); 5 epochs are 5 steps and 5 × U tokens, within one batch."""
    result = cli(*_text_fit(tmp_path, text_folder_dir, "decoder_only", "--data.init_args.train_tokens", "100",
                            "--run.budget", "{epochs: 5}"))
    assert result.code == 0, result.err[-3000:]
    summary = json.loads((tmp_path / "decoder_only" / "v1" / "summary.json").read_text())
    ledger = summary["ledger"]
    assert ledger["unique_tokens"] == 112 and summary["steps"] == summary["budget"]["max_steps"] == 5
    assert ledger["tokens"] == 5 * 112 and ledger["epochs"] == 5  # whole chunks: exact, within the one batch allowed


def test_an_epochs_budget_counts_optimizer_steps_of_accumulated_batches(cli, tmp_path):
    """Two batches of 32 accumulated into one optimizer step: an epoch is one step, and the ledger
    counts both batches of it."""
    result = cli(*debug_fit_args(tmp_path, "--run.budget", "{epochs: 2}", "--trainer.accumulate_grad_batches", "2", *WARMUP))
    assert result.code == 0, result.err[-3000:]
    summary = json.loads((tmp_path / "debug" / "v1" / "summary.json").read_text())
    assert (summary["budget"]["steps_per_epoch"], summary["budget"]["max_steps"], summary["steps"]) == (1, 2, 2)
    assert summary["ledger"]["tokens"] == 2 * summary["ledger"]["unique_tokens"]  # every pair seen twice
    assert summary["budget"]["tokens_per_step"] == summary["ledger"]["unique_tokens"]


def test_a_time_budget_is_lightnings_max_time(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, "--run.budget", "{time: '00:00:00:01'}",
                                 "--model.init_args.optimizer.schedule", "constant"))
    assert result.code == 0, result.err[-3000:]
    assert "budget: time 00:00:00:01 -> max_time 1 s (max_steps -1); replaces trainer.max_steps=2" in result.out
    summary = json.loads((tmp_path / "debug" / "v1" / "summary.json").read_text())
    assert summary["budget"] == {"time": "00:00:00:01", "max_time_seconds": 1}
    assert summary["steps"] > 2 and 1.0 <= summary["ledger"]["train_seconds"] < 10  # not FAST_TRAINER's 2 steps


def test_a_sweeps_budget_becomes_every_points_run_budget(tmp_path):
    from attnlab.sweeps.arguments import as_cli_args
    from attnlab.sweeps.spec import load_sweep

    (tmp_path / "debug.yaml").write_text(DEBUG_YAML.read_text(encoding="utf-8"), encoding="utf-8")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: debug.yaml\nbudget: {flops: 2.0e13}\n"  # PyYAML reads 2.0e13 as a string
                     "points:\n  base: {}\n  long: {budget: {epochs: 4}, trainer.log_every_n_steps: 2}\n")
    spec = load_sweep(sweep)
    base, long = spec.grid_points()
    assert base.overrides == {"run.budget": {"flops": 2.0e13}}
    assert long.overrides == {"run.budget": {"epochs": 4.0}, "trainer.log_every_n_steps": 2}
    assert '--run.budget={"flops": 20000000000000.0}' in as_cli_args(base.overrides)
    assert "run.budget" in spec.swept_keys  # a point sets it: the report shows it


def test_a_diffusion_run_whose_noise_search_moves_its_cost_ends_within_one_step_of_its_flops_budget(
        cli, tmp_path, text_folder_dir):
    """Trained first on t in [0.001, 1] (half the tokens projected), then, from its first validation,
    on the one noise_search candidate [0.9, 1] (nearly all): a step costs more than the plan made at
    setup, so that plan's steps would overspend. The run re-plans after every step and stops at the
    first one that reaches the budget, and its schedule ends there."""
    budget = 2.0e8
    result = cli(*_text_fit(tmp_path, text_folder_dir, "block_diffusion", "--run.budget", f"{{flops: {budget}}}",
                            "--model.init_args.noise_range", "[0.001, 1.0]", "--model.init_args.noise_search",
                            "[[0.9, 1.0]]", "--trainer.val_check_interval", "2", "--trainer.check_val_every_n_epoch",
                            "null", "--trainer.callbacks+=LearningRateMonitor"))
    assert result.code == 0, result.err[-3000:]
    run = tmp_path / "block_diffusion" / "v1"
    summary, logged = json.loads((run / "summary.json").read_text()), read_metrics(run)
    planned = int(next(line for line in result.out.splitlines() if line.startswith("budget:")).split("max_steps ")[1].split()[0])
    assert logged["val/noise_low"][0] == pytest.approx(0.9)  # the cost moved at the first validation
    spent, steps = summary["ledger"]["flops"], summary["steps"]
    per_step = [b - a for a, b in zip([0.0, *logged["budget/flops"]], logged["budget/flops"])]
    assert len(per_step) == steps and sum(per_step) == pytest.approx(spent)
    assert budget <= spent < budget + max(per_step)  # the first step that reaches it
    assert steps < planned  # the setup's plan, at half the tokens projected, would have overspent by its extra steps
    assert summary["budget"]["max_steps"] == steps
    lr = logged["lr-AdamW/pg1"]  # cosine from the warmup's end down to min_lr_ratio at the last step
    assert lr[-1] == pytest.approx(0.1 * max(lr), rel=1e-6)


def test_a_budget_refuses_a_warmup_counted_in_steps_before_any_run(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, "--run.budget", "{epochs: 2}"))
    assert result.code == 2 and not (tmp_path / "debug").exists()
    assert ("run.budget epochs 2 derives each run's optimizer steps, so warmup must be a share of them: set "
            "model.init_args.optimizer.warmup_ratio (e.g. 0.1) instead of warmup_steps=5") in result.err
    from attnlab.errors import ConfigError
    from attnlab.sweeps.spec import load_sweep
    from attnlab.sweeps.sweep import check_warmups

    (tmp_path / "debug.yaml").write_text(DEBUG_YAML.read_text(encoding="utf-8"), encoding="utf-8")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: debug.yaml\nbudget: {flops: 2.0e13}\npoints:\n  base: {}\n"
                     "  share: {model.init_args.optimizer.warmup_ratio: 0.1}\n")
    spec = load_sweep(sweep)
    with pytest.raises(ConfigError, match=r"point base: run.budget flops 2.0e13 derives .* warmup_steps=5"):
        check_warmups(spec, [])
    check_warmups(spec, ["--model.init_args.optimizer.warmup_ratio", "0.2"])  # a flag for every run
    spec.named.pop("base")
    check_warmups(spec, [])
    plain = tmp_path / "plain.yaml"  # no budget in the file: one given to every run is checked the same
    plain.write_text("base: debug.yaml\npoints:\n  base: {}\n  small: {model.init_args.backbone.d_model: 16}\n")
    check_warmups(load_sweep(plain), [])
    with pytest.raises(ConfigError, match=r"point base: run.budget epochs 2 derives"):
        check_warmups(load_sweep(plain), ["--run.budget", "{epochs: 2}"])
