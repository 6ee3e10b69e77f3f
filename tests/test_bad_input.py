"""User mistakes: exit 2, one clear message naming the field or file, never a traceback.

Most cases run `attnlab.cli.main` in-process (an exception escaping main fails the test just as a
traceback would); one case runs a real process to check what a user's terminal shows.
"""
from __future__ import annotations

import re

import pytest

from conftest import DEBUG_YAML, FAST_TRAINER, debug_fit_args, parallel_config_text, read_metrics, run_process


def assert_clear_error(result, *needles):
    assert result.code == 2, f"exit {result.code}; stderr: {result.err[-2000:]}"
    assert "Traceback" not in result.err
    assert "attnlab: error:" in result.err
    for needle in needles:
        assert needle in result.err, f"{needle!r} not named in: {result.err[-2000:]}"


def fit(cli, tmp_path, *extra):
    return cli(*debug_fit_args(tmp_path / "runs", *extra))


def no_training_happened(tmp_path) -> bool:
    run_dir = tmp_path / "runs" / "debug" / "v1"
    trained = (run_dir / "metrics.csv").is_file() and "train/loss" in read_metrics(run_dir)
    return not trained and not list(run_dir.glob("checkpoints/*.ckpt"))


# ---- model config ----------------------------------------------------------------------------------

def test_heads_that_do_not_divide_d_model(cli, tmp_path):
    result = fit(cli, tmp_path, "--model.init_args.backbone.n_heads", "3")  # debug.yaml: d_model 32
    assert_clear_error(result, "n_heads", "d_model", "3", "32")
    assert no_training_happened(tmp_path)


def test_heads_that_do_not_divide_d_model_in_a_real_process(tmp_path):
    proc = run_process(debug_fit_args(tmp_path / "runs", "--model.init_args.backbone.n_heads", "3"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error_lines = [l for l in proc.stderr.splitlines() if l.startswith("attnlab: error:")]
    assert len(error_lines) == 1 and "n_heads" in error_lines[0] and "d_model" in error_lines[0], proc.stderr[-2000:]


def test_unknown_positional_encoding(cli, tmp_path):
    result = fit(cli, tmp_path, "--model.init_args.backbone.positional", "foo")
    assert_clear_error(result, "positional", "foo", "sinusoidal", "learned", "rope", "alibi", "none")


def test_learned_position_table_too_short(cli, tmp_path):
    result = fit(cli, tmp_path, "--model.init_args.backbone.positional", "learned",
                 "--model.init_args.backbone.max_positions", "4")
    assert_clear_error(result, "max_positions")
    assert no_training_happened(tmp_path)


def test_learned_table_too_short_for_generation_fails_before_training(cli, tmp_path):
    from data_modules import NumberWordsDataModule

    dm = NumberWordsDataModule(n_train=64, n_val=64, n_test=64, vocab_size=300, max_eval_examples=8)
    framed = max(len(e.source) + len(e.target) + 3 for s in ("train", "val") for e in dm.examples(s))
    max_positions = framed + 2  # every training sequence fits ...
    generation = max(2 * len(e.source) + 52 for e in dm.examples("val"))  # ... generating does not
    assert generation > max_positions
    result = fit(cli, tmp_path, "--model.init_args.backbone.positional", "learned",
                 "--model.init_args.backbone.max_positions", str(max_positions))
    if result.code == 0:
        return  # also fine: generation stops at the table's end
    assert_clear_error(result, "max_positions")
    assert no_training_happened(tmp_path), "the run trained, then failed: the error came too late"


def test_generation_settings_are_checked(cli, tmp_path):
    result = fit(cli, tmp_path, "--model.init_args.generation.top_p", "2")
    assert_clear_error(result, "top_p")


# ---- data ------------------------------------------------------------------------------------------

def _parallel_config(tmp_path, train_source, train_target):
    config = tmp_path / "parallel.yaml"
    # val_target is the source file on purpose: these tests only need two readable files
    config.write_text(parallel_config_text(train_source, train_target, train_source, train_source), encoding="utf-8")
    return config


def test_missing_data_file(cli, tmp_path):
    source = tmp_path / "train.en"
    source.write_text("one\ntwo\n", encoding="utf-8")
    missing = tmp_path / "no" / "such" / "train.de"
    config = _parallel_config(tmp_path, source, source)
    result = cli("fit", "--config", config, "--data.init_args.train_target", missing,
                 "--run.root", tmp_path / "runs", "--run.wandb", "disabled", *FAST_TRAINER)
    assert_clear_error(result, str(missing), "data.init_args.train_target")


def test_parallel_files_with_different_line_counts(cli, tmp_path):
    source, target = tmp_path / "train.en", tmp_path / "train.de"
    source.write_text("one\ntwo\nthree\nfour\nfive\n", encoding="utf-8")
    target.write_text("eins\nzwei\ndrei\nvier\n", encoding="utf-8")
    result = cli("fit", "--config", _parallel_config(tmp_path, source, target),
                 "--run.root", tmp_path / "runs", "--run.wandb", "disabled", *FAST_TRAINER)
    assert_clear_error(result, str(source), str(target))
    assert re.search(r"\b5\b", result.err) and re.search(r"\b4\b", result.err), result.err


def test_vocabulary_too_small(cli, tmp_path):
    result = fit(cli, tmp_path, "--data.init_args.vocab_size", "10")
    assert_clear_error(result, "vocab_size", "300")


# ---- the config file itself ------------------------------------------------------------------------

@pytest.mark.parametrize("section,key", [("trainer", "no_such_key"), ("model.init_args.backbone", "n_head")])
def test_unknown_key_in_yaml(cli, tmp_path, section, key):
    lines = DEBUG_YAML.read_text(encoding="utf-8").splitlines()
    if section == "trainer":
        at = lines.index("trainer:") + 1
        lines.insert(at, f"  {key}: 3")
    else:
        at = lines.index("    backbone:") + 1
        lines.insert(at, f"      {key}: 2")
    config = tmp_path / "typo.yaml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = cli("fit", "--config", config, "--run.root", tmp_path / "runs", "--run.wandb", "disabled", *FAST_TRAINER)
    assert result.code == 2
    assert "Traceback" not in result.err
    assert key in result.err
    assert not (tmp_path / "runs").exists()  # rejected while parsing, before any run folder


def test_unknown_flag(cli, tmp_path):
    result = fit(cli, tmp_path, "--trainer.max_stepz", "3")
    assert result.code == 2 and "Traceback" not in result.err
    assert "max_stepz" in result.err


def test_missing_config_file(cli, tmp_path):
    missing = tmp_path / "nope.yaml"
    result = cli("fit", "--config", missing, "--run.root", tmp_path / "runs", *FAST_TRAINER)
    assert result.code == 2 and "Traceback" not in result.err
    assert str(missing) in result.err


def test_bad_wandb_mode(cli, tmp_path):
    result = fit(cli, tmp_path, "--run.wandb", "sometimes")
    assert result.code == 2 and "Traceback" not in result.err
    assert "run.wandb" in result.err and "offline" in result.err
