"""A job id names a fit, not a job: under torchrun's `--rdzv-id` a `test` after a `fit` gets its
own folder, and a second `fit` of another configuration is refused instead of resuming the first
run's weights; torchrun's `--standalone` id and elastic restarts name folders the same command
finds again; under srun an evaluation is named by its job step."""
from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from conftest import DEBUG_YAML, read_metrics
from attnlab.training import run_folder
from attnlab.training.run_folder import resolve_version

CPU_DDP = ["--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.devices", "2",
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
           "--trainer.log_every_n_steps", "1", "--data.init_args.n_train", "64", "--data.init_args.batch_size", "16",
           "--data.init_args.max_eval_examples", "8", "--model.init_args.eval_every_n_epochs", "0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, verb, *extra) -> subprocess.CompletedProcess:
    """`torchrun --rdzv-id job1 -m attnlab VERB ... EXTRA`: two CPU ranks of one job named job1."""
    rendezvous = ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "job1"]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *rendezvous, "-m", "attnlab", verb,
                           "--config", DEBUG_YAML, *CPU_DDP, "--run.root", tmp_path, "--run.wandb", "disabled",
                           *map(str, extra)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_fixed_rdzv_id_names_the_fit_and_not_the_test_after_it(tmp_path):
    fit = _torchrun(tmp_path, "fit", "--trainer.max_steps", "2")
    assert fit.returncode == 0, (fit.stdout + fit.stderr)[-3000:]
    folder = tmp_path / "debug" / "torchrun-job1"
    metrics = (folder / "metrics.csv").read_bytes()
    config = (folder / "config.yaml").read_bytes()
    assert read_metrics(folder)["train/loss"], "the fit logged no training step"

    test = _torchrun(tmp_path, "test")
    assert test.returncode == 0, (test.stdout + test.stderr)[-3000:]
    (own,) = [p for p in (tmp_path / "debug").iterdir() if p != folder]
    assert read_metrics(own)["test/nll"], "the test wrote no metrics into its own folder"
    assert (folder / "metrics.csv").read_bytes() == metrics and (folder / "config.yaml").read_bytes() == config

    other = _torchrun(tmp_path, "fit", "--trainer.max_steps", "2", "--model.init_args.optimizer.lr", "1e-4")
    output = other.stdout + other.stderr
    assert other.returncode != 0 and "resuming" not in output, output[-3000:]
    assert "holds a run of another configuration (model.init_args.optimizer.lr: 0.003 there, 0.0001 now)" in output
    assert "--run.version NAME" in output, output[-3000:]
    assert (folder / "metrics.csv").read_bytes() == metrics


@pytest.fixture
def job_env(monkeypatch):
    """A clean launcher environment for resolve_version, rank zero of two."""
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "SLURM_NTASKS",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", run_folder.INHERITED,
                 *run_folder._RANK_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    return monkeypatch


def test_under_srun_a_fit_is_named_by_the_job_and_an_evaluation_by_its_step(job_env, tmp_path):
    job_env.setenv("SLURM_JOB_ID", "4242")
    job_env.setenv("SLURM_STEP_ID", "3")
    folder_of = lambda v: tmp_path / v  # noqa: E731
    assert resolve_version(None, folder_of, command="fit").name == "slurm-4242"
    assert resolve_version(None, folder_of, command="test").name == "slurm-4242-test-3"
    job_env.setenv("SLURM_RESTART_COUNT", "1")  # a requeued job numbers its steps from 0 again
    assert resolve_version(None, folder_of, command="validate").name == "slurm-4242-validate-3-r1"


def test_standalone_ids_and_elastic_restarts_find_the_same_folder(job_env, tmp_path):
    """torchrun --standalone's random uuid is no job id: rank zero's timestamp names the run, the
    hint names it, and a restart of the workers (TORCHELASTIC_RESTART_COUNT 1) finds it again in
    the agent's store and resumes it."""
    from torch.distributed import TCPStore

    port = _free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    job_env.setenv("TORCHELASTIC_RUN_ID", "0f8e7a52-5c7e-4a55-9b1f-2d0c6f3f7a11")
    job_env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    job_env.setenv("MASTER_ADDR", "127.0.0.1")
    job_env.setenv("MASTER_PORT", str(port))
    folder_of = lambda v: tmp_path / v  # noqa: E731
    first = resolve_version(None, folder_of, command="fit")
    assert not first.name.startswith("torchrun-") and first.source == "timestamp" and not first.named
    job_env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = resolve_version(None, folder_of, command="fit")
    assert again.name == first.name and again.named  # named: its last.ckpt is looked for and resumed
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    job_env.setenv("TORCHELASTIC_RUN_ID", "job1")  # a fixed id names the fit
    assert resolve_version(None, folder_of, command="fit").name == "torchrun-job1"
    del store
