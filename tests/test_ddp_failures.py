"""DDP: a rank that dies or hangs makes the others exit with an error in bounded time, and leaves
no process behind (issue 7 item 6).

Real causes, no test hooks in the code: a 2-process CPU DDP fit (gloo) of debug.yaml runs until
its first last.ckpt, then the test SIGKILLs rank 1 (a crash) or SIGSTOPs it (a hang: its sockets
stay open, so only the collective timeout can notice). Every process runs in its own session,
which the test kills in a `finally` whatever happens.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEBUG_DATA, DEBUG_YAML

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses pgrep and process sessions")


def _fit_args(root: Path, *extra) -> list[str]:
    return ["fit", "--config", DEBUG_YAML, "--run.root", root, "--run.version", "v", "--run.wandb", "disabled",
            "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.max_epochs", "1000", "--trainer.limit_train_batches", "2",
            "--trainer.limit_val_batches", "1", *DEBUG_DATA, "--data.init_args.batch_size", "16",
            "--model.init_args.eval_every_n_epochs", "0", *extra]


def _session_pids(sid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


SAFETY_NET = 240  # seconds: no assertion about speed; only a run that never gets there meets it
HANG_TIMEOUT_S = 10  # the hang test's collective timeout (torch's default: 30 minutes)


def _wait_for(condition, what: str, proc: subprocess.Popen | None = None, log: Path | None = None,
              limit: float = SAFETY_NET) -> None:
    """Poll until `condition()` holds (a file, a process state); the process exiting first, or the
    safety net, fails the test."""
    deadline = time.monotonic() + limit
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}: {log.read_text()[-3000:] if log else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within the {limit:.0f} s safety net")
        time.sleep(0.1)


def _run_and_hurt_rank_1(root: Path, signum: int, *extra):
    """Start the fit, wait for training to be under way (its first last.ckpt), send `signum` to
    rank 1; returns (exit code, output, processes left in the session once it is empty or the
    safety net is reached)."""
    log = root / "out.txt"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "attnlab", *map(str, _fit_args(root, *extra))], cwd=root,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        checkpoint = root / "debug" / "v" / "checkpoints" / "last.ckpt"
        _wait_for(checkpoint.is_file, "training got under way", proc, log)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1, children  # Lightning's launcher started rank 1
        os.kill(int(children[0]), signum)
        try:
            code = proc.wait(timeout=SAFETY_NET)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not stop within {SAFETY_NET} s of rank 1's {signal.Signals(signum).name}")
        try:  # the kernel reaps what the run stopped; whatever is left after the net stays
            _wait_for(lambda: not _session_pids(proc.pid), "processes left", limit=10)
        except pytest.fail.Exception:
            pass
        return code, log.read_text(), _session_pids(proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _session_pids(proc.pid):  # a stopped child has left the group? kill it by id
            os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_a_rank_that_dies_stops_the_others_quickly(tmp_path):
    """Quickly: rank 0 learns of the death from the closed connection (or Lightning's child
    watcher), not from a collective timeout (30 minutes here), which would say "stopped answering"."""
    code, output, left = _run_and_hurt_rank_1(tmp_path, signal.SIGKILL)
    assert code != 0, output[-3000:]
    # rank 0 sees the closed connection in its next collective and says so in one line (or, if
    # Lightning's child watcher is first, it kills rank 0 after saying which child died)
    said = ("another process of this distributed run died" in output
            or "terminated with code" in output)
    assert said, output[-3000:]
    assert "stopped answering" not in output, output[-3000:]
    assert not left, f"processes left behind: {left}"


def test_a_rank_that_hangs_stops_the_others_after_the_timeout(tmp_path):
    """A stopped rank keeps its connections open: the others wait in a collective until the
    strategy's timeout (here a few seconds instead of torch's 30 min), then stop and kill it.
    That it was this timeout shows in gloo's message, in one of its two wordings: the wait in
    milliseconds, or "Application timeout caused pair closure" (the pair closed by that same
    timeout; which one a run gets depends on where the survivor waits). Torch's default of 30
    minutes would run into the safety net instead."""
    code, output, left = _run_and_hurt_rank_1(
        tmp_path, signal.SIGSTOP, "--trainer.strategy", "lightning.pytorch.strategies.DDPStrategy",
        "--trainer.strategy.timeout", f"0:00:{HANG_TIMEOUT_S:02d}")
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("attnlab: error:")]
    assert len(errors) == 1 and "stopped answering" in errors[0], output[-3000:]
    assert f"{HANG_TIMEOUT_S * 1000}ms" in errors[0] or "Application timeout" in errors[0], errors[0]
    assert "Traceback" not in output
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("fragment", ["ddp.yaml", "multinode.yaml", "fsdp.yaml"])
def test_distributed_fragments_bound_the_collective_timeout(fragment, tmp_path):
    """A hung rank stops the run after 10 minutes with the experiments/distributed fragments, not 30."""
    from datetime import timedelta

    from attnlab.cli.lightning_cli import AttnlabCLI
    from conftest import EXPERIMENTS

    cli = AttnlabCLI(args=["--config", str(EXPERIMENTS / "decoder_only.yaml"),
                           "--config", str(EXPERIMENTS / "distributed" / fragment),
                           "--run.root", str(tmp_path), "--run.wandb", "disabled"], run=False)
    assert cli.trainer.strategy._timeout == timedelta(minutes=10)


def test_a_non_finite_loss_stops_every_rank_with_exit_code_2(tmp_path):
    """Both ranks stop at the same step with the one-line message; Lightning's child watcher does
    not SIGKILL rank 0 while it waits for rank 1 to stop on the same error."""
    args = _fit_args(tmp_path, "--trainer.max_steps", "4", "--model.init_args.optimizer.lr", "1e30")
    proc = subprocess.Popen([sys.executable, "-m", "attnlab", *map(str, args)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=150)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 2, output[-3000:]
    assert "attnlab: error: the training loss is nan at global step 1 (epoch 0, batch 1)" in output, output[-3000:]
    assert "Traceback" not in output and "terminated with code" not in output
