"""Two CPU processes (DDP over gloo) against one: metrics agree, and only rank zero writes; and
the per-layer FSDP strategy (experiments/distributed/fsdp.yaml) over gloo against DDP.

Lightning relaunches `python -m attnlab ...` for rank 1, so these run in real subprocesses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    DEBUG_DATA,
    DEBUG_YAML,
    EXPERIMENTS,
    assert_trained_on_the_lowest_variance_candidate,
    read_metrics,
    run_main,
    run_process,
)

CPU = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
       "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1"]
DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2"]
# 16 eval pairs split evenly over 2 ranks: no sample is padded in, so sums match exactly. Every
# batch is evaluated (limit_val_batches counts per rank: debug.yaml's 2 would see twice the data).
DATA = [*DEBUG_DATA[:2], "--data.init_args.max_eval_examples", "16", "--data.init_args.eval_batch_size", "4",
        "--trainer.limit_val_batches", "1.0"]


FSDP_YAML = EXPERIMENTS / "distributed" / "fsdp.yaml"


def _fit(root, *extra, fragments=(), in_process=False):
    """fit of debug.yaml; `fragments` are --config files placed before the overrides (they set devices).
    A one-process run may run in this process (`in_process`, without wandb)."""
    configs = [a for fragment in fragments for a in ("--config", fragment)]
    args = ["fit", "--config", DEBUG_YAML, *configs, "--run.root", root, "--run.wandb", "offline", *CPU, *DATA,
            "--trainer.max_epochs", "2", "--model.init_args.eval_every_n_epochs", "0", *extra]
    if in_process:
        result = run_main([*args, "--run.wandb", "disabled"], cwd=root)
        assert result.code == 0, result.err[-3000:]
        return result
    result = run_process(args, cwd=root, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def single_and_ddp(tmp_path_factory):
    single_root, ddp_root = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("ddp")
    # The same global batch (32) and steps (2 per epoch): 1 x 32 against 2 ranks x 16. Two epochs
    # as a run.budget: each rank derives the same 4 steps (rank zero's plan is broadcast).
    budget = ["--run.budget", "{epochs: 2}", "--model.init_args.optimizer.warmup_ratio", "0.25"]
    _fit(single_root, "--trainer.devices", "1", "--data.init_args.batch_size", "32", "--run.version", "one",
         *budget, in_process=True)
    _fit(ddp_root, *DDP, "--data.init_args.batch_size", "16", *budget)  # no --run.version: rank 1 must find rank zero's folder
    return single_root / "debug" / "one", ddp_root / "debug"


def test_validation_metrics_are_synchronised_exactly_across_ranks(single_and_ddp, tmp_path):
    """The same checkpoint validated by 1 process, 2 DDP processes and 2 FSDP processes (which load
    the ordinary checkpoint into their shards) gives the same val/nll."""
    single, _ = single_and_ddp
    validate = ["validate", "--config", DEBUG_YAML]
    args = ["--run.root", tmp_path, "--run.wandb", "disabled", *CPU, *DATA,
            "--model.init_args.eval_every_n_epochs", "0", "--ckpt_path", single / "checkpoints" / "last.ckpt"]
    one = run_main([*validate, *args, "--trainer.devices", "1", "--run.version", "v1"], cwd=tmp_path)
    two = run_process([*validate, *args, *DDP, "--run.version", "v2"], cwd=tmp_path, timeout=300)
    fsdp = run_process([*validate, "--config", FSDP_YAML, *args, "--trainer.devices", "2", "--run.version", "v3"],
                       cwd=tmp_path, timeout=300)
    assert one.code == 0 and two.returncode == 0 and fsdp.returncode == 0, (
        one.err + two.stderr + fsdp.stderr)[-3000:]
    nll_one = read_metrics(tmp_path / "debug" / "v1")["val/nll"][-1]
    nll_two = read_metrics(tmp_path / "debug" / "v2")["val/nll"][-1]
    nll_fsdp = read_metrics(tmp_path / "debug" / "v3")["val/nll"][-1]
    assert nll_two == pytest.approx(nll_one, rel=1e-5)
    assert nll_fsdp == pytest.approx(nll_one, rel=1e-5)


def test_ddp_training_follows_one_process_step_by_step(single_and_ddp):
    """Two ranks of 16 against one process of 32 from the same initialisation: each step's global
    batch holds the same examples (Lightning's sampler deals the seed + epoch shuffle out rank by
    rank), the loss is normalised by the global token count, so every logged step loss matches."""
    single, ddp_parent = single_and_ddp
    (ddp,) = list(ddp_parent.iterdir())
    one, two = read_metrics(single), read_metrics(ddp)
    assert len(one["train/loss"]) == len(two["train/loss"]) == 4
    assert two["train/loss"] == pytest.approx(one["train/loss"], rel=1e-5, abs=1e-6)
    assert two["val/nll"] == pytest.approx(one["val/nll"], rel=1e-5)
    assert one["train/loss"][-1] < one["train/loss"][0]
    # The budget ledger sums every rank's batches: the data tokens of the one process, FLOPs of
    # batches padded per rank (no more than one batch of 32 padded to its longest pair).
    assert two["budget/tokens"] == one["budget/tokens"] and two["budget/epochs"] == one["budget/epochs"]
    (ledger_one, budget_one), (ledger_two, budget_two) = (
        (summary["ledger"], summary["budget"]) for summary in (json.loads((run / "summary.json").read_text())
                                                               for run in (single, ddp)))
    assert ledger_two["tokens"] == ledger_one["tokens"] and ledger_two["epochs"] == ledger_one["epochs"] == 2.0
    assert 0.5 * ledger_one["flops"] < ledger_two["flops"] <= ledger_one["flops"]
    assert budget_one["max_steps"] == budget_two["max_steps"] == 4


def test_an_odd_validation_split_counts_every_example_once(single_and_ddp, tmp_path):
    """15 validation pairs on 2 ranks: one rank gets a padding repeat, which no metric counts, so
    every metric (likelihoods and generations) equals one process's, and examples.jsonl holds
    each of the 15 examples once, in order, with the same values."""
    from attnlab.training.examples_file import read_examples

    single, _ = single_and_ddp
    args = ["validate", "--config", DEBUG_YAML, "--run.root", tmp_path, "--run.wandb", "disabled", *CPU,
            *DEBUG_DATA[:2], "--data.init_args.max_eval_examples", "15", "--data.init_args.eval_batch_size", "4",
            "--trainer.limit_val_batches", "1.0", "--ckpt_path", single / "checkpoints" / "last.ckpt"]
    one = run_main([*args, "--trainer.devices", "1", "--run.version", "one"], cwd=tmp_path)
    two = run_process([*args, *DDP, "--run.version", "two"], cwd=tmp_path, timeout=300)
    assert one.code == 0 and two.returncode == 0, (one.err + two.stderr)[-3000:]
    m1, m2 = (read_metrics(tmp_path / "debug" / v) for v in ("one", "two"))
    for key in ("val/loss", "val/nll", "val/bpb", "val/bleu", "val/chrf", "val/exact_match"):
        assert m2[key][-1] == pytest.approx(m1[key][-1], rel=1e-6, abs=1e-6), key
    e1, e2 = (read_examples(tmp_path / "debug" / v) for v in ("one", "two"))
    assert [e["index"] for e in e2] == list(range(15)) == [e["index"] for e in e1]
    assert [(e["reference"], e["hypothesis"], e["tokens"]) for e in e2] == [(e["reference"], e["hypothesis"], e["tokens"]) for e in e1]
    assert [e["nll"] for e in e2] == pytest.approx([e["nll"] for e in e1], rel=1e-5)


def test_only_rank_zero_writes(single_and_ddp):
    _, ddp_parent = single_and_ddp
    runs = list(ddp_parent.iterdir())
    assert len(runs) == 1, f"one run folder expected, found {runs}"
    run = runs[0]
    assert (run / "metrics.csv").is_file() and (run / "summary.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        p.name for p in (run / "checkpoints").iterdir() if p.suffix == ".ckpt")
    wandb_runs = list((run / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1, f"one wandb run expected, found {wandb_runs}"


def test_block_diffusion_noise_search_agrees_across_ranks(tmp_path):
    """The search's statistics are summed over ranks (a collective every rank must join) before
    a candidate is chosen: the run completes, and the chosen range is logged and trained on.
    And the two ranks draw different training noise (their own masks and times) at every step."""

    candidates = [[0.2, 0.8], [0.5, 1.0]]
    args = ["fit", "--config", EXPERIMENTS / "number_words" / "block_diffusion.yaml", "--run.root", tmp_path, "--run.version", "bd",
            "--run.wandb", "disabled", *CPU, *DDP, *DATA, "--trainer.max_epochs", "1", "--data.init_args.batch_size", "16",
            "--data.init_args.vocab_size", "300", "--data.init_args.n_val", "64", "--data.init_args.n_test", "64",
            "--model.init_args.backbone.d_model", "32", "--model.init_args.backbone.n_layers", "1",
            "--model.init_args.backbone.d_ff", "64", "--model.init_args.eval_every_n_epochs", "0",
            "--model.init_args.noise_search", str(candidates), "--trainer.callbacks+=noise_probe.NoiseProbe"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = run_process(args, cwd=tmp_path, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trained_on_the_lowest_variance_candidate(tmp_path / "number_words" / "block_diffusion" / "bd", candidates)
    ranks = [[json.loads(line) for line in (tmp_path / f"noise_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert [d["step"] for d in ranks[0]] == [d["step"] for d in ranks[1]] and len(ranks[0]) >= 2
    for zero, one in zip(*ranks):
        assert zero["uniforms"] != one["uniforms"], zero["step"]


# A clip far above the gradient norm: the clipping path runs (a collective over the shards) without
# changing the update, so the run still matches DDP's unclipped one; the DDP run's warmup.
FSDP_ARGS = ["--trainer.devices", "2", "--data.init_args.batch_size", "16", "--run.wandb", "disabled",
             "--trainer.gradient_clip_val", "1000", "--model.init_args.optimizer.warmup_ratio", "0.25"]


@pytest.fixture(scope="module")
def fsdp_run(single_and_ddp, tmp_path_factory):
    """LayerWiseFSDP on 2 CPU processes from the same initialisation, data and steps as the DDP run."""
    root = tmp_path_factory.mktemp("fsdp")
    _fit(root, *FSDP_ARGS, "--run.version", "fsdp", "--model.init_args.eval_every_n_epochs", "1",
         "--trainer.callbacks+=attnlab.checkpoints.averaging.CheckpointAveraging", "--trainer.callbacks.last_k", "2",
         fragments=[FSDP_YAML])
    return root / "debug" / "fsdp"


def test_fsdp_trains_like_ddp_and_writes_an_ordinary_checkpoint(single_and_ddp, fsdp_run):
    """LayerWiseFSDP on 2 CPU processes from the same initialisation, data and steps as the DDP run:
    the same losses (sharding changes where the numbers live, not the arithmetic), through
    clipping by norm and generation at every validation (ranks generate different numbers of
    tokens), into a run folder named after the experiment, with a single-file checkpoint that
    loads like any other (the optimizer state in DDP's layout too) and an averaged checkpoint of
    every weight."""
    import json

    import torch

    from attnlab.checkpoints.reading import load_checkpoint

    _, ddp_parent = single_and_ddp
    (ddp,) = list(ddp_parent.iterdir())
    run = fsdp_run
    fsdp_metrics, ddp_metrics = read_metrics(run), read_metrics(ddp)
    assert fsdp_metrics["train/loss"] == pytest.approx(ddp_metrics["train/loss"], rel=1e-4)
    assert fsdp_metrics["val/nll"] == pytest.approx(ddp_metrics["val/nll"], rel=1e-4)
    assert "val/chrf" in fsdp_metrics, "generation did not run in validation"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["params"] == json.loads((ddp / "summary.json").read_text())["params"]

    ckpt_path = run / "checkpoints" / "last.ckpt"
    assert ckpt_path.is_file()
    our_checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    their_checkpoint = torch.load(ddp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    ours, theirs = our_checkpoint["state_dict"], their_checkpoint["state_dict"]
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    for key, value in ours.items():
        torch.testing.assert_close(value, theirs[key], rtol=0, atol=1e-3, msg=key)
    # The optimizer state: parameters numbered as torch numbers them (DDP resumes from it, and
    # FSDP from DDP's), the same Adam moments.
    (our_optimizer,), (their_optimizer,) = our_checkpoint["optimizer_states"], their_checkpoint["optimizer_states"]
    assert [g["params"] for g in our_optimizer["param_groups"]] == [g["params"] for g in their_optimizer["param_groups"]]
    assert our_optimizer["state"].keys() == their_optimizer["state"].keys()
    for index, values in their_optimizer["state"].items():
        assert our_optimizer["state"][index].keys() == values.keys()
        for name, value in values.items():
            torch.testing.assert_close(our_optimizer["state"][index][name], value, rtol=1e-3, atol=1e-6,
                                       msg=f"{index}.{name}")
    module, _ = load_checkpoint(ckpt_path)
    assert len(module.translate(["twenty one"])) == 1
    # The average of the 2 epochs covers every weight, the root unit's (embeddings, final norm) too.
    averaged = torch.load(run / "checkpoints" / "averaged.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert averaged.keys() == ours.keys()
    assert [key for key, value in averaged.items() if torch.equal(value, ours[key])] == []


def test_fsdp_resumes_fit_from_its_checkpoint_as_ddp_does(single_and_ddp, fsdp_run, tmp_path):
    """A third epoch resumed from each run's last.ckpt (weights, Adam moments, schedule, step):
    FSDP's losses follow DDP's, which a fresh optimizer state would not."""
    _, ddp_parent = single_and_ddp
    (ddp,) = list(ddp_parent.iterdir())
    third = ["--trainer.devices", "2", "--data.init_args.batch_size", "16", "--trainer.max_epochs", "3",
             "--run.wandb", "disabled"]
    _fit(tmp_path, *DDP, *third, "--run.version", "ddp", "--ckpt_path", ddp / "checkpoints" / "last.ckpt")
    _fit(tmp_path, *third, "--run.version", "fsdp", "--ckpt_path", fsdp_run / "checkpoints" / "last.ckpt",
         fragments=[FSDP_YAML])
    ddp_resumed, fsdp_resumed = (read_metrics(tmp_path / "debug" / v) for v in ("ddp", "fsdp"))
    # Only the third epoch ran: 2 more steps after global step 4.
    assert ddp_resumed["step"] == fsdp_resumed["step"] and set(fsdp_resumed["epoch"]) == {2}
    assert len(fsdp_resumed["train/loss"]) == 2 and fsdp_resumed["step"][-1] == 5
    assert fsdp_resumed["train/loss"][-2:] == pytest.approx(ddp_resumed["train/loss"][-2:], rel=1e-4)
    assert fsdp_resumed["val/nll"][-1] == pytest.approx(ddp_resumed["val/nll"][-1], rel=1e-4)


SHARDED_SCRIPT = """
import os, signal, sys
from attnlab.checkpoints import sharded_steps
from attnlab.families.base import FamilyModule
term_at, kill_at_commit = int(os.environ.get("TERM_AT_STEP", -1)), int(os.environ.get("KILL_AT_COMMIT", -1))
start, commit = FamilyModule.on_train_batch_start, sharded_steps.commit
def on_train_batch_start(self, batch, batch_idx):
    if self.trainer.global_step == term_at and self.trainer.global_rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    return start(self, batch, batch_idx)
def killed_commit(folder, step):
    if step == kill_at_commit:
        os.kill(os.getpid(), signal.SIGKILL)
    return commit(folder, step)
FamilyModule.on_train_batch_start, sharded_steps.commit = on_train_batch_start, killed_commit
from attnlab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sharded_fit_preempted_and_killed_mid_save_resumes_to_an_uninterrupted_run(fsdp_run, tmp_path):
    """state_dict_type sharded, a save every step. SIGTERM while step 3 trains; the scheduler's
    SIGKILL lands while its save commits (every rank's shards of step 3 written, not yet renamed):
    step 2 stays the newest complete step, and the same command resumes from it to the losses of
    the uninterrupted FSDP run, every step once, keeping the newest two steps."""
    from attnlab.checkpoints import sharded_steps

    script = tmp_path / "fit.py"  # a file: Lightning starts rank 1 with the same script
    script.write_text(SHARDED_SCRIPT)
    args = ["fit", "--config", DEBUG_YAML, "--config", FSDP_YAML, "--run.root", tmp_path, *CPU, *DATA,
            "--trainer.max_epochs", "2", "--model.init_args.eval_every_n_epochs", "0", *FSDP_ARGS,
            "--trainer.strategy.init_args.state_dict_type", "sharded", "--run.checkpoint_every_n_steps", "1",
            "--run.version", "cut"]

    def fit(**env):
        return subprocess.run([sys.executable, script, *map(str, args)], cwd=tmp_path, timeout=300, text=True,
                              capture_output=True, env={**os.environ, **{k: str(v) for k, v in env.items()}})

    last = tmp_path / "debug" / "cut" / "checkpoints" / "last.ckpt"
    killed = fit(TERM_AT_STEP=2, KILL_AT_COMMIT=3)
    assert killed.returncode != 0
    assert [p.name for p in sharded_steps.complete_steps(last)] == ["step-1", "step-2"], sorted(os.listdir(last))
    assert sharded_steps.pending(last, 3).is_dir()  # step 3's shards, never committed
    resumed = fit()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "last.ckpt (epoch 0, step 2)" in resumed.stdout, resumed.stdout[-3000:]
    assert [p.name for p in sharded_steps.complete_steps(last)] == ["step-3", "step-4"]
    assert not list(last.glob(".step-*"))
    got, want = read_metrics(tmp_path / "debug" / "cut"), read_metrics(fsdp_run)
    assert got["step"] == want["step"] and len(got["train/loss"]) == 4
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-5, abs=1e-6)
    assert got["val/nll"] == pytest.approx(want["val/nll"], rel=1e-5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODE_SCRIPT = """
import os, signal, sys
from attnlab.families.base import FamilyModule
kill_at = int(os.environ.get("KILL_AT_STEP", "-1"))  # the first launch only: the node's process dies there
original = FamilyModule.on_train_batch_start
def on_train_batch_start(self, batch, batch_idx):
    if self.trainer.global_step == kill_at and self.trainer.global_rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, batch, batch_idx)
FamilyModule.on_train_batch_start = on_train_batch_start
def on_fit_end(self):  # where this rank's own logger would write
    print(f"rank {self.trainer.global_rank} logs to {self.trainer.loggers[0].log_dir}", flush=True)
FamilyModule.on_fit_end = on_fit_end
from attnlab.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
# Two "nodes" whose clocks disagree by nine hours (the timestamp a node would pick differs).
NODE_CLOCKS = ("UTC0", "JST-9")


def _two_nodes(tmp_path, rendezvous: list[str], extra: list[str], env: dict | None = None) -> list[str]:
    """The README's two-machine command, as two torchrun 'nodes' of one CPU process each on this
    machine (each its own torchrun process, with its own time zone); returns their outputs."""
    import os
    import subprocess
    import sys

    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT)
    args = [script, "fit", "--config", DEBUG_YAML, "--config", EXPERIMENTS / "distributed" / "multinode.yaml",
            *CPU, "--trainer.devices", "1", *DATA, "--data.init_args.batch_size", "16",
            "--model.init_args.eval_every_n_epochs", "0", "--run.root", tmp_path, "--run.wandb", "disabled", *extra]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             *[a.format(rank=rank) for a in rendezvous], *map(str, args)],
            cwd=tmp_path, env={**os.environ, **(env or {}), "TZ": clock}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, encoding="utf-8", errors="replace")
        for rank, clock in enumerate(NODE_CLOCKS)
    ]
    try:
        return [node.communicate(timeout=300)[0] for node in nodes], [node.returncode for node in nodes]
    finally:
        for node in nodes:
            node.kill()


def test_torchrun_two_nodes_whose_clocks_differ_write_one_run_folder(tmp_path):
    """Static rendezvous, no --run.version, no job id: rank zero's timestamp reaches the other node
    through torchrun's store, so both ranks use one run folder whatever their clocks say."""
    port = str(_free_port())
    static = ["--node-rank", "{rank}", "--master-addr", "127.0.0.1", "--master-port", port]
    outputs, codes = _two_nodes(tmp_path, static, ["--trainer.max_epochs", "1"])
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert "MEMBER: 1/2" in outputs[0] and "MEMBER: 2/2" in outputs[1]
    (folder,) = (tmp_path / "debug").iterdir()
    assert read_metrics(folder)["val/nll"]
    for rank, output in enumerate(outputs):
        assert f"rank {rank} logs to {folder}" in output, output[-2000:]
    assert "if interrupted, the same command plus --run.version" in outputs[0]


def test_a_two_node_job_killed_resumes_with_the_same_command_in_one_folder(tmp_path):
    """c10d rendezvous with a job id (--rdzv-id): the run folder is named by the job, so both nodes
    agree without --run.version and relaunching the same command resumes it. Node 0's process is
    SIGKILLed at step 5 (last.ckpt holds step 4); node 1 then fails on the lost peer."""
    import torch

    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "job7"]
    extra = ["--trainer.max_epochs", "1", "--data.init_args.n_train", "640", "--run.checkpoint_every_n_steps", "2"]
    outputs, codes = _two_nodes(tmp_path, rendezvous, extra, env={"KILL_AT_STEP": "5"})
    assert codes[0] != 0 and codes[1] != 0, "\n".join(o[-2000:] for o in outputs)
    folder = tmp_path / "debug" / "torchrun-job7"
    assert [p.name for p in (tmp_path / "debug").iterdir()] == [folder.name]
    assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    outputs, codes = _two_nodes(tmp_path, rendezvous, extra)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert f"resuming {folder.relative_to(tmp_path)}" in outputs[0] or f"resuming {folder}" in outputs[0], outputs[0][-2000:]
    assert [p.name for p in (tmp_path / "debug").iterdir()] == [folder.name]
    import csv

    with (folder / "metrics.csv").open(newline="") as f:
        trained = [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]
    assert trained == list(range(20))  # every step of the epoch once: 4 before the kill, the rest after
