"""A sweep and the faults that are the same for every point: a full disk stops the sweep at the
first run that meets it (exit 74, one line), not once per point; a negative value passes through
to the runs (`--trainer.max_epochs -1`)."""
from __future__ import annotations

import resource
import signal
import subprocess
import sys

from conftest import run_sweep
from test_sweep_locks import sweep_args


def _file_size_limit(limit: int):
    """RLIMIT_FSIZE for the sweep and the runs it starts: a write past it fails (EFBIG), as on a full disk."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_stops_the_sweep_once(tmp_path):
    args = [str(a) for a in sweep_args(tmp_path, heads=(1, 2))]
    result = subprocess.run([sys.executable, "-m", "attnlab", "sweep", *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, preexec_fn=_file_size_limit(64 * 1024))
    assert result.returncode == 74, (result.stdout + result.stderr)[-3000:]
    stops = [line for line in result.stderr.splitlines() if "the sweep stops" in line]
    assert len(stops) == 1 and "n_heads=1: fit found no room to write" in stops[0], result.stderr[-3000:]
    assert "run the same sweep command" in stops[0]
    assert "[sweep] n_heads=2" not in result.stdout  # the second point never started
    assert "Traceback" not in result.stderr


def test_a_negative_value_passes_through_a_sweep(tmp_path):
    result = run_sweep([*sweep_args(tmp_path, heads=(1,)), "--dry-run", "--trainer.max_epochs", "-1"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (fit,) = [line for line in result.stdout.splitlines() if "[fit]" in line]
    assert "--trainer.max_epochs -1" in fit
