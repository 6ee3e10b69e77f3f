"""README command 1 prints no warning a user cannot act on: the main job's first point (its fit, its
test and the report), shortened, run as the README runs it, in real processes with wandb left at
`auto`. This is also the suite's one sweep whose runs are real subprocesses (the others run them
in-process, see conftest.in_process_runs)."""
from __future__ import annotations

import re

import yaml

from conftest import EXPERIMENTS, run_process


def test_the_main_jobs_first_point_prints_no_warning(tmp_path):
    main_job = yaml.safe_load((EXPERIMENTS / "compare_families.yaml").read_text())
    first = main_job["base"][0]
    stem = first.removesuffix(".yaml")  # the evaluations the main job runs for that point, as they are
    evaluate = {name: {k: v for k, v in entry.items() if k != "points"} for name, entry in main_job["evaluate"].items()
                if stem in entry.get("points", [stem])}
    sweep = tmp_path / "first_point.yaml"
    sweep.write_text(yaml.safe_dump({"points": {"first": {}}, "base": str(EXPERIMENTS / first), "evaluate": evaluate}))
    result = run_process(["sweep", sweep, "--trainer.limit_train_batches", "20", "--data.init_args.max_eval_examples",
                          "64"], cwd=tmp_path, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "[sweep] first: test" in output and "report:" in output  # every stage ran
    noisy = [line for line in output.splitlines() if re.search(r"warn(ing)?\b|warn\(", line, re.I)]
    assert not noisy, "\n".join(noisy)
    assert "Total Flops" not in output and "Tip:" not in output
