"""wandb unreachable or misconfigured: training continues offline and says so once (issue 7 item 5).

Never contacts the network: the "server" is a closed port on 127.0.0.1.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess

from conftest import debug_fit_args, read_metrics, run_process


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, **extra) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC", "ATTNLAB_RUN_VERSION")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"), **extra)
    return env


def test_unreachable_wandb_server_falls_back_to_offline_once(tmp_path):
    env = _env(tmp_path, WANDB_API_KEY="0" * 40, WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",
               WANDB_INIT_TIMEOUT="5")
    root = tmp_path / "runs"
    args = debug_fit_args(root, version="unreachable")
    args[args.index("--run.wandb") + 1] = "auto"  # credentials present: auto means online
    proc = run_process(args, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, timeout=120)  # a safety net only
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    run_dir = root / "debug" / "unreachable"
    metrics = read_metrics(run_dir)
    assert len(metrics["train/loss"]) == 2 and metrics["val/nll"]  # the run itself is complete

    output = proc.stdout + proc.stderr
    fallback = [line for line in output.splitlines() if "could not start online" in line]
    assert len(fallback) == 1, output[-3000:]
    match = re.search(r"logging offline to (\S+) instead; upload it later with `wandb sync (\S+)`", fallback[0])
    assert match, fallback[0]
    # The online attempt was bounded by WANDB_INIT_TIMEOUT (not wandb's 90 s): wandb's own log of
    # that attempt says what it waited, which no clock on a busy machine can tell.
    (online_log,) = (run_dir / "wandb").glob("run-*/logs/debug.log")
    waits = re.findall(r"communicating run to backend with ([\d.]+) second timeout", online_log.read_text())
    assert waits == ["5.0"], waits
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb")), offline
    assert os.path.samefile(match.group(2), offline[0])
    id_file = run_dir / "wandb_id.txt"  # the run's wandb id (for resuming): the offline run keeps it
    if id_file.is_file():
        assert offline[0].name.endswith("-" + id_file.read_text().strip()), offline[0].name


def test_nonsense_wandb_mode_in_the_environment_is_a_clear_error(cli, tmp_path, monkeypatch):
    """Refused by attnlab before wandb starts, so this process's environment is enough."""
    for name in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC", "ATTNLAB_RUN_VERSION"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in _env(tmp_path, WANDB_MODE="nonsense").items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    args = debug_fit_args(tmp_path / "runs", version="badmode")
    args[args.index("--run.wandb") + 1] = "auto"
    result = cli(*args)
    assert result.code == 2, result.err[-3000:]
    assert "Traceback" not in result.err
    assert "WANDB_MODE='nonsense'" in result.err and "--run.wandb disabled" in result.err
