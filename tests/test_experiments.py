"""Every YAML under experiments/ is a complete experiment: it parses and trains through `attnlab fit`.

New YAMLs are picked up by the glob; each runs two steps with a tiny backbone and small data.
"""
from __future__ import annotations

import math

import pytest
import yaml

from conftest import EXPERIMENTS, FAST_TRAINER, read_metrics

CONFIGS = sorted(EXPERIMENTS.rglob("*.yaml")) + sorted(EXPERIMENTS.rglob("*.yml"))


def _id(path) -> str:
    return str(path.relative_to(EXPERIMENTS))


def _load(path) -> dict:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _is_sweep(path) -> bool:
    """A sweep file (base + grid) rather than a LightningCLI config: tested at the end of this file."""
    config = _load(path)
    return "base" in config and "model" not in config


def _is_fragment(path) -> bool:
    """Trainer settings added with a second --config (experiments/distributed/*.yaml), not an
    experiment of their own: tested in test_distributed_configs.py."""
    config = _load(path)
    return "model" not in config and "base" not in config


EXPERIMENT_CONFIGS = [p for p in CONFIGS if not _is_fragment(p)]


def test_the_glob_finds_the_shipped_experiments():
    names = {_id(p) for p in CONFIGS}
    assert {"debug.yaml", "decoder_only.yaml", "multi30k/decoder_only.yaml"} <= names


@pytest.mark.parametrize("path", EXPERIMENT_CONFIGS, ids=_id)
def test_experiment_states_its_question(path):
    """DESIGN.md: each experiment YAML carries a line saying what question it answers."""
    head = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
    assert head.startswith("# Question:"), f"{_id(path)} should start with '# Question: ...'"


def shrink(config: dict, multi30k_dir_factory, text_folder_factory=None) -> list[str]:
    """Overrides that turn an experiment into a seconds-long smoke run of the same classes."""
    model_args = (config.get("model") or {}).get("init_args") or {}
    backbone = model_args.get("backbone") or {}
    args = [
        *FAST_TRAINER,
        "--run.wandb", "disabled",
        "--model.init_args.backbone.d_model", "32",
        "--model.init_args.backbone.n_heads", "2",
        "--model.init_args.backbone.n_layers", "1",
        "--model.init_args.backbone.d_ff", "64",
        "--data.init_args.max_eval_examples", "8",
    ]
    if model_args.get("n_encoder_layers") is not None:
        args += ["--model.init_args.n_encoder_layers", "1"]
    if "bf16" in str((config.get("trainer") or {}).get("precision", "")):
        args += ["--trainer.precision", "32-true"]  # CPU CI: bf16 matmuls are ~500x slower there
    if backbone.get("n_kv_heads") is not None:  # keep grouped-query attention grouped
        args += ["--model.init_args.backbone.n_kv_heads", "1"]
    data_class = str((config.get("data") or {}).get("class_path", "")).rsplit(".", 1)[-1]
    if data_class == "NumberWordsDataModule":
        # Same generator arguments as the other tests, so the cached tokenizer is reused.
        args += ["--data.init_args.n_train", "64", "--data.init_args.n_val", "64",
                 "--data.init_args.n_test", "64", "--data.init_args.vocab_size", "300"]
    elif data_class == "GrammarDataModule":
        args += ["--data.init_args.n_train", "64", "--data.init_args.n_val", "16",
                 "--data.init_args.n_test", "16", "--data.init_args.vocab_size", "400"]
    elif data_class == "SequenceTaskDataModule":
        args += ["--data.init_args.n_train", "64", "--data.init_args.n_val", "8", "--data.init_args.n_test", "8"]
    elif data_class == "Multi30kDataModule":
        args += ["--data.init_args.data_dir", multi30k_dir_factory(), "--data.init_args.vocab_size", "1000"]
    elif data_class == "TextFolderDataModule":
        args += ["--data.init_args.data_dir", text_folder_factory(), "--data.init_args.vocab_size", "300",
                 "--data.init_args.seq_len", "16"]
    return args


def _classes(path) -> tuple[str, str]:
    config = _load(path)
    return tuple(str((config.get(part) or {}).get("class_path", "")).rsplit(".", 1)[-1] for part in ("model", "data"))


RUNNABLE = [p for p in EXPERIMENT_CONFIGS if not _is_sweep(p)]
# One config per (family, data module) trains; the others are built (model, data, trainer) and
# give one training batch: a second fit of the same classes would test nothing new.
TRAINED = {_classes(p): p for p in reversed(RUNNABLE)}.values()


@pytest.mark.parametrize("path", RUNNABLE, ids=_id)
def test_experiment_trains_or_builds(path, cli, tmp_path, request):
    config = _load(path)
    assert {"model", "data"} <= set(config), f"{_id(path)} must define model and data"

    overrides = shrink(config, lambda: request.getfixturevalue("multi30k_dir"),
                       lambda: request.getfixturevalue("text_folder_dir"))
    root = tmp_path / "runs"
    if path not in TRAINED:
        _builds_and_batches(path, overrides, root)
        return
    result = cli("fit", "--config", path, "--run.root", root, "--run.version", "smoke", *overrides)
    assert result.code == 0, result.err[-3000:]

    run_dirs = sorted(root.glob("**/smoke"))
    assert len(run_dirs) == 1, f"expected one run folder under {root}, found {run_dirs}"
    run_dir = run_dirs[0]
    # runs/<path under experiments/ without .yaml>/<version>, e.g. runs/multi30k/decoder_only/smoke
    assert run_dir == root / path.relative_to(EXPERIMENTS).with_suffix("") / "smoke"
    assert (run_dir / "config.yaml").is_file()
    saved = _load(run_dir / "config.yaml")
    assert saved["model"]["class_path"].rsplit(".", 1)[-1] == config["model"]["class_path"].rsplit(".", 1)[-1]
    assert saved["model"]["init_args"]["backbone"]["d_model"] == 32  # the override reached the model

    losses = read_metrics(run_dir).get("train/loss", [])
    assert losses, f"no train/loss in {run_dir / 'metrics.csv'}"
    assert all(math.isfinite(v) for v in losses)
    assert "run folder:" in result.out


def _builds_and_batches(path, overrides: list[str], root) -> None:
    """The experiment's model, data module and trainer are built from the file as `fit` builds
    them, the overrides reach the model, and the data module serves a training batch."""
    from attnlab.cli.lightning_cli import AttnlabCLI

    cli = AttnlabCLI(args=["--config", str(path), "--run.root", str(root), "--run.version", "built",
                           *map(str, overrides)], run=False)
    family, data = _classes(path)
    assert (type(cli.model).__name__, type(cli.datamodule).__name__) == (family, data)
    assert cli.model.backbone.d_model == 32  # the override reached the model
    assert cli.trainer.max_steps == 2
    cli.datamodule.prepare_data()
    cli.datamodule.setup("fit")
    batch = next(iter(cli.datamodule.train_dataloader()))
    assert batch["target"].shape[0] > 0 and batch["target"].max() < cli.model.vocab_size


def _parse_only(args: list[str]):
    """The config LightningCLI parses from `args`, without building model, data or trainer."""
    from attnlab.cli.lightning_cli import AttnlabCLI

    class ParseOnly(AttnlabCLI):
        def instantiate_classes(self):
            pass

    return ParseOnly(args=args, run=False).config


SWEEPS = [p for p in EXPERIMENT_CONFIGS if _is_sweep(p)]


def test_the_shipped_sweeps_are_found():
    assert {"compare_families.yaml", "heads_ablation.yaml", "positions_ablation.yaml",
            "number_words/block_size_sweep.yaml", "number_words/compare_families.yaml"} <= {
        _id(p) for p in SWEEPS}


def test_no_two_shipped_sweeps_share_a_run_folder():
    """lm/compare_families.yaml and compare_families.yaml must not both write runs/compare_families
    (a sweep skips the points it finds done there)."""
    from attnlab.sweeps.spec import load_sweep

    names = {_id(p): load_sweep(p).name for p in SWEEPS}
    assert len(set(names.values())) == len(names), names
    assert names["compare_families.yaml"] == "compare_families"
    assert names["lm/compare_families.yaml"] == "lm/compare_families"


@pytest.mark.parametrize("path", SWEEPS, ids=_id)
def test_sweep_points_parse_as_experiments(path, tmp_path):
    """Every grid point's overrides name real config keys with values of the right type
    (parsed by the CLI, not instantiated: no data or training needed)."""
    from attnlab.sweeps.arguments import as_cli_args
    from attnlab.sweeps.spec import evaluation_checkpoint, load_sweep

    spec = load_sweep(path)
    for point in spec.grid_points():
        for overrides in [{}, *(evaluation_checkpoint(e)[1] for e in spec.evaluations_for(point).values())]:
            args = [*[a for c in point.configs for a in ("--config", str(c))], *as_cli_args(point.overrides),
                    *as_cli_args(overrides), "--run.root", str(tmp_path)]
            config = _parse_only(args)  # raises on an unknown key or a bad value
            for key, value in {**point.overrides, **overrides}.items():
                assert config[key] == value, f"{key} did not reach the config"


def test_a_misspelt_sweep_key_fails_to_parse():
    with pytest.raises(Exception, match="n_haeds"):
        _parse_only(["--config", str(EXPERIMENTS / "decoder_only.yaml"), "--model.init_args.backbone.n_haeds=2"])
