"""Where, when and how a result was measured: what a results page states beside its numbers.

A sweep records this in `runs/<sweep>/sweep.json` when it ends, so a report regenerated later
still names the command, machine and commit that produced the runs, not those of the moment.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

SWEEP_FILE = "sweep.json"


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo; elsewhere what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> str:
    """e.g. `2 cores of Intel Xeon ..., no GPU` or `... , 8 × NVIDIA H100 80GB HBM3`."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    accelerator = f"{gpus} × {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    return f"{cores} cores of {cpu_name()}, {accelerator}"


def commit(cwd: str | Path = ".") -> str:
    """The short commit of the checkout in `cwd`, `+changes` when tracked files other than the docs
    and markdown differ from it (a results page being written is no change to what measured it)."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs", ":(exclude)*.md")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+changes" if changed else "")) if head else "unknown"


def question(sweep_file: str | Path) -> str | None:
    """The `# Question: ...` line an experiment file opens with (every file under experiments/ has one)."""
    try:
        lines = Path(sweep_file).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("# Question:"):
            return line.split(":", 1)[1].strip()
    return None


def context(command: str) -> dict:
    """The command, the UTC date and minute, the machine, the commit and torch's version, now."""
    import torch

    now = datetime.datetime.now(datetime.timezone.utc)
    return {"command": command, "date": now.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
            "commit": commit(), "torch": torch.__version__}


def measured_on(record: dict) -> str:
    """`<machine>, commit `<commit>`, torch <version>`: where a results page says it was measured
    (`record` as `context` returns it; an unrecorded field says so)."""
    return (f"{record.get('machine', 'an unrecorded machine')}, commit `{record.get('commit', 'unrecorded')}`, "
            f"torch {record.get('torch', 'unrecorded')}")


def write_sweep_record(sweep_dir: Path, command: str, sweep_file: str | Path, name: str) -> None:
    """sweep.json: the context of the sweep command that last finished runs in `sweep_dir`."""
    record = {**context(command), "name": name, "question": question(sweep_file)}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(record, indent=1) + "\n")


def read_sweep_record(folder: Path) -> dict | None:
    path = folder / SWEEP_FILE
    return json.loads(path.read_text()) if path.is_file() else None
