"""Two fits in one process (a notebook, the tests) log to two wandb runs: a command finishes the
wandb run it started, else Lightning's next WandbLogger reuses the open `wandb.run`."""
from __future__ import annotations

from conftest import debug_fit_args, run_main


def test_each_in_process_fit_logs_to_its_own_wandb_run(tmp_path):
    import wandb

    folders = {}
    for version in ("first", "second"):
        result = run_main(debug_fit_args(tmp_path, "--run.wandb", "offline", version=version), cwd=tmp_path)
        assert result.code == 0, result.err[-3000:]
        assert wandb.run is None  # finished with its command
        run_dir = tmp_path / "debug" / version
        run_id = (run_dir / "wandb_id.txt").read_text().strip()
        folders[version] = [p.name for p in (run_dir / "wandb").glob("offline-run-*")]
        assert len(folders[version]) == 1 and folders[version][0].endswith(f"-{run_id}"), folders
    assert folders["first"] != folders["second"]
