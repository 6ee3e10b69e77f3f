"""`init_from:` in a sweep: a point starts, seed by seed, from another point's network at one of its
steps (the main job's block diffusion converted from DecoderOnly), and its ledger counts that cost."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, run_sweep


def _sweep(tmp_path, **extra) -> object:
    converted = tmp_path / "converted.yaml"
    converted.write_text(DEBUG_YAML.read_text(encoding="utf-8").replace("attnlab.DecoderOnly", "attnlab.BlockDiffusion"),
                         encoding="utf-8")
    spec = {"base": [str(DEBUG_YAML), str(converted)], "seeds": [0, 1],
            "init_from": {"converted": {"point": "debug", "step": 1}}, "evaluate": {"test": {}}, **extra}
    path = tmp_path / "convert.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def test_a_point_starts_from_the_same_seeds_snapshot_and_inherits_its_cost(tmp_path):
    result = run_sweep([_sweep(tmp_path), "--root", tmp_path / "runs", *FAST_TRAINER, *DEBUG_DATA,
                        "--run.wandb", "disabled", "--model.init_args.shift", "true"], cwd=tmp_path)
    assert result.returncode != 0 and "shift" in result.stderr, result.stderr[-3000:]  # a passthrough flag
    # reaches every point, and DecoderOnly has no shift
    result = run_sweep([_sweep(tmp_path), "--root", tmp_path / "runs2", *FAST_TRAINER, *DEBUG_DATA,
                        "--run.wandb", "disabled"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "runs2" / "convert"
    for seed in (0, 1):
        snapshot = sweep / "debug" / f"seed{seed}" / "fit" / "checkpoints" / "step=1.ckpt"
        saved = torch.load(snapshot, map_location="cpu", weights_only=True)
        assert saved["global_step"] == 1
        fit = sweep / "converted" / f"seed{seed}" / "fit"
        config = yaml.safe_load((fit / "config.yaml").read_text())
        assert config["run"]["init_from"] == str(snapshot)
        summary = json.loads((fit / "summary.json").read_text())
        ledger, inherited = summary["ledger"], summary["ledger"]["inherited"]
        assert inherited["from"] == str(snapshot) and inherited["steps"] == 1
        assert inherited["flops"] == saved["callbacks"]["BudgetLedger"]["flops"] > 0
        assert ledger["flops"] > inherited["flops"] and ledger["tokens"] > inherited["tokens"]
        assert summary["steps"] == 1 + 2  # the snapshot's step and this fit's two


@pytest.mark.parametrize("init_from,message", [
    ({"debug": {"point": "converted", "step": 1}}, "a point listed before debug"),
    ({"converted": {"point": "debug", "step": 0}}, "step=0 must be an optimizer step >= 1"),
    ({"converted": {"point": "debug"}}, "must be {point:"),
    ({"nowhere": {"point": "debug", "step": 1}}, "init_from.nowhere: no such point"),
])
def test_a_bad_init_from_names_the_field(tmp_path, init_from, message):
    from attnlab.errors import ConfigError
    from attnlab.sweeps.spec import load_sweep

    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("(", r"\(")):
        load_sweep(_sweep(tmp_path, init_from=init_from))


def test_on_several_devices_a_point_waits_for_the_point_it_starts_from(tmp_path, monkeypatch):
    """Points run one per device at once; the converted point of a seed must not start before that
    seed's source point has written its snapshot, whichever device is free first."""
    import threading
    import time

    from attnlab.sweeps.spec import load_sweep
    from attnlab.sweeps.sweep import SweepRunner

    runner = SweepRunner(load_sweep(_sweep(tmp_path)), str(tmp_path / "runs"), [], ["0", "1"])
    events, lock = [], threading.Lock()

    def run_point(point, device):
        with lock:
            events.append(("start", point.folder))
        time.sleep(0.3 if point.name == "debug" else 0.01)
        with lock:
            events.append(("end", point.folder))
        return True

    monkeypatch.setattr(runner, "run_point", run_point)
    assert runner.run() == []
    for seed in (0, 1):
        assert events.index(("start", f"converted/seed{seed}")) > events.index(("end", f"debug/seed{seed}"))
    assert max(sum(1 if kind == "start" else -1 for kind, _ in events[:i + 1]) for i in range(len(events))) <= 2
