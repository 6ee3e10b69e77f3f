"""The `attnlab` command end to end: help, fit, generate, validate / test / predict, checkpoints."""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, ORACLE_RUN, read_metrics, run_process

VERBS = ("fit", "validate", "test", "predict", "generate")


# ---- help and verbs ----------------------------------------------------------------------------

def test_help_lists_every_verb(cli):
    result = cli("--help")
    assert result.code == 0
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", result.out, re.M), f"--help does not list {verb}"
    assert cli().out == result.out  # no arguments: the same help


def test_unknown_verb_exits_2_with_a_message(cli):
    result = cli("trian", "--config", DEBUG_YAML)
    assert result.code == 2
    assert "unknown verb 'trian'" in result.err
    assert "fit" in result.err  # the help that follows lists the real verbs


def test_verb_help_lists_its_options(cli):
    result = cli("fit", "--help")
    assert result.code == 0
    for option in ("--config", "--run.wandb", "--run.root", "--trainer.max_steps"):
        assert option in result.out


def test_python_dash_m_attnlab_help(tmp_path):
    proc = run_process(["--help"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert all(verb in proc.stdout for verb in VERBS)
    assert "Traceback" not in proc.stderr


# Verbs that do no training print their help without importing torch or Lightning (`report`
# itself runs without them too: test_sweep_report.py). One fresh interpreter asks each in turn.
LIGHT_HELP = """
import contextlib, io, sys
from attnlab.cli.main import main
for argv in ([], ["--help"], ["report", "--help"], ["sweep", "--help"], ["average", "--help"], ["generate", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    heavy = sorted({"torch", "lightning"} & set(sys.modules))
    print(" ".join(argv) or "(none)", code, "usage" in out.getvalue(), heavy or "light")
"""


def test_help_of_the_verbs_that_do_not_train_imports_no_torch():
    import subprocess

    proc = subprocess.run([sys.executable, "-c", LIGHT_HELP], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, proc.stdout + proc.stderr[-3000:]
    for line in lines:
        assert line.endswith(" 0 True light"), line


def test_console_script_is_installed(tmp_path):
    script = Path(sys.executable).parent / "attnlab"
    if not script.exists():
        script = shutil.which("attnlab")
    if not script:
        pytest.skip("the attnlab console script is not installed in this environment")
    import subprocess

    proc = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "generate" in proc.stdout


# ---- one trained run shared by the tests below ----------------------------------------------------

@pytest.fixture(scope="module")
def trained(trained_run):
    """experiments/debug.yaml for one epoch (two steps), which ends with generation on val; the
    model is conftest.Oracle (a DecoderOnly whose generations are right on every second example)."""
    return trained_run(*ORACLE_RUN)


def _best_or_last(run_dir: Path) -> Path:
    ckpts = sorted((run_dir / "checkpoints").glob("best-*.ckpt")) or [run_dir / "checkpoints" / "last.ckpt"]
    assert ckpts[0].is_file(), f"no checkpoint in {run_dir / 'checkpoints'}"
    return ckpts[0]


@pytest.fixture(scope="module")
def ckpt(trained) -> Path:
    return _best_or_last(trained[1])


def test_fit_writes_the_run_folder(trained):
    _, run_dir = trained
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((run_dir / "checkpoints").glob("best-*.ckpt")), "ModelCheckpoint(monitor=val/nll) saved no best"
    assert read_metrics(run_dir)["train/loss"]


def test_fit_summary_prints_examples_and_final_metrics(trained):
    result, run_dir = trained
    out = result.out
    assert "examples (source | reference | output):" in out
    examples = out.split("examples (source | reference | output):", 1)[1].split("final fit metrics:", 1)[0]
    refs = re.findall(r"^\s+ref: (.*)$", examples, re.M)
    outs = re.findall(r"^\s+out: (.*)$", examples, re.M)
    assert len(refs) == len(outs) == 3  # num_examples defaults to 3
    # A reference is a German number word: lower-case letters only, no spaces.
    assert all(re.fullmatch(r"[a-zäöüß]+", ref) for ref in refs), refs
    assert outs[0] == refs[0] and outs[1] == "" and outs[2] == refs[2]  # the oracle: right on even indices

    metrics = dict(re.findall(r"^\s+(\w+/\w+)\s+(-?[\d.]+|nan|inf)$", out.split("final fit metrics:", 1)[1], re.M))
    for key in ("train/loss", "val/loss", "val/nll", "val/ppl", "val/exact_match", "val/bleu", "val/chrf"):
        assert key in metrics, f"{key} missing from the fit summary"
    # 8 validation pairs, the oracle right on indices 0, 2, 4, 6: exact match is a percentage.
    assert float(metrics["val/exact_match"]) == pytest.approx(50.0)
    best = re.search(r"^best checkpoint: (.+)$", out, re.M)
    assert best and Path(best.group(1)).is_file()
    assert f"run folder: {run_dir}" in out


def test_checkpoint_loads_with_weights_only(ckpt):
    from data_modules import Tokenizer

    data = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert data["attnlab"]["family"] == "decoder_only"
    proto = data["attnlab"]["tokenizer"]
    assert isinstance(proto, bytes) and proto
    tokenizer = Tokenizer.from_proto(proto)
    assert tokenizer.vocab_size == data["hyper_parameters"]["vocab_size"]
    assert tokenizer.decode(tokenizer.encode("twenty one")) == "twenty one"


# ---- generate -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def expected_translations(ckpt):
    """What the checkpoint's module itself translates, through the public API."""
    from attnlab.checkpoints.reading import load_checkpoint

    module, _ = load_checkpoint(ckpt)
    texts = ["twenty one", "three hundred four"]
    return dict(zip(texts, module.translate(texts)))


def test_generate_prints_one_line_per_input(cli, ckpt, expected_translations):
    result = cli("generate", ckpt, "twenty one")
    assert result.code == 0, result.err
    assert result.out.endswith("\n")
    assert result.out.split("\n")[:-1] == [expected_translations["twenty one"]]


def test_generate_reads_stdin(cli, ckpt, expected_translations, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("twenty one\n\nthree hundred four\n"))
    result = cli("generate", ckpt)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    # The blank line is skipped; one output line per input line, in order.
    assert result.out.split("\n")[:-1] == [expected_translations["twenty one"], expected_translations["three hundred four"]]


def test_generate_with_nothing_to_read_is_a_clear_error(cli, ckpt, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    result = cli("generate", ckpt)
    assert result.code == 2
    assert "nothing to generate from" in result.err


def test_generate_applies_sampling_flags(cli, ckpt):
    from attnlab.checkpoints.reading import load_checkpoint

    module, _ = load_checkpoint(ckpt)
    module.sampling.max_new_tokens = 2
    expected = module.translate(["twenty one"])
    result = cli("generate", ckpt, "twenty one", "--max-new-tokens", "2")
    assert result.code == 0, result.err
    assert result.out.split("\n")[:-1] == expected
    bad = cli("generate", ckpt, "twenty one", "--top-p", "1.5")
    assert bad.code == 2 and "top_p" in bad.err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_generate_max_new_tokens_is_honoured_or_refused(cli, ckpt, value):
    result = cli("generate", ckpt, "twenty one", "--max-new-tokens", value)
    if result.code == 0:
        assert value == "0" and result.out == "\n", f"--max-new-tokens {value} printed {result.out!r}"
    else:
        assert result.code == 2 and "max_new_tokens" in result.err


def test_generate_refuses_a_missing_checkpoint(cli, tmp_path):
    missing = tmp_path / "nope.ckpt"
    result = cli("generate", missing, "twenty one")
    assert result.code == 2
    assert str(missing) in result.err


def test_generate_refuses_a_checkpoint_not_written_by_attnlab(cli, tmp_path):
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    result = cli("generate", path, "twenty one")
    assert result.code == 2
    assert "not written by attnlab" in result.err


def test_generate_refuses_a_truncated_checkpoint(cli, tmp_path, ckpt):
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(ckpt.read_bytes()[:1000])
    result = cli("generate", path, "twenty one")
    assert result.code == 2
    assert str(path) in result.err


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_generate_refuses_a_checkpoint_that_runs_code(cli, tmp_path, ckpt):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    data = torch.load(ckpt, map_location="cpu", weights_only=True)  # a real checkpoint ...
    data["payload"] = _RunsCodeWhenUnpickled(marker)  # ... plus an object whose unpickling runs a command
    torch.save(data, evil)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # sanity: the file really holds a non-tensor object
        torch.load(evil, weights_only=True)

    result = cli("generate", evil, "twenty one")
    assert result.code == 2
    assert str(evil) in result.err and "refusing" in result.err
    assert "Traceback" not in result.err
    assert not marker.exists(), "loading the checkpoint ran the embedded command"


def test_evaluating_a_checkpoint_that_runs_code_is_refused(cli, tmp_path, ckpt):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    data = torch.load(ckpt, map_location="cpu", weights_only=True)
    data["payload"] = _RunsCodeWhenUnpickled(marker)
    torch.save(data, evil)
    result = cli("test", "--config", DEBUG_YAML, "--run.wandb", "disabled", *FAST_TRAINER, *DEBUG_DATA,
                 "--run.root", tmp_path, "--ckpt_path", evil)
    assert result.code == 2 and "refusing" in result.err
    assert "Traceback" not in result.err
    assert not marker.exists(), "--ckpt_path loaded the checkpoint with weights_only=False"


# ---- validate / test / predict ------------------------------------------------------------------

EVAL_ARGS = ["--config", DEBUG_YAML, "--run.wandb", "disabled", *FAST_TRAINER, *DEBUG_DATA]


@pytest.mark.parametrize("verb,prefix", [("validate", "val"), ("test", "test")])
def test_evaluate_a_checkpoint(cli, tmp_path, ckpt, verb, prefix):
    """The printed metrics and the per-example values saved beside them (examples.jsonl) agree:
    nll per token, bits per UTF-8 byte of the references, exact match in percent."""
    import math

    from attnlab.training.examples_file import read_examples

    result = cli(verb, *EVAL_ARGS, "--run.root", tmp_path, "--run.version", "eval", "--ckpt_path", ckpt)
    assert result.code == 0, result.err[-3000:]
    assert f"final {verb} metrics:" in result.out
    printed = dict(re.findall(rf"^\s+{prefix}/(\w+)\s+(-?[\d.]+)$", result.out, re.M))
    for key in ("loss", "nll", "ppl", "bpb", "exact_match", "bleu", "chrf"):
        assert key in printed, f"{prefix}/{key} not printed"
    examples = read_examples(tmp_path / "debug" / "eval")
    assert [e["index"] for e in examples] == list(range(8))
    assert all(e["bytes"] == len(e["reference"].encode("utf-8")) for e in examples)
    assert all(e["exact"] == (e["hypothesis"].strip() == e["reference"].strip()) for e in examples)
    assert all(e["bits"] == pytest.approx(e["nll"] / math.log(2)) for e in examples)
    nll = sum(e["nll"] for e in examples) / sum(e["tokens"] for e in examples)
    bpb = sum(e["bits"] for e in examples) / sum(e["bytes"] for e in examples)
    assert float(printed["nll"]) == pytest.approx(nll, abs=1e-4)
    assert float(printed["bpb"]) == pytest.approx(bpb, abs=1e-4)
    assert float(printed["exact_match"]) == pytest.approx(100 * sum(e["exact"] for e in examples) / len(examples), abs=1e-4)


def test_predict_a_checkpoint(cli, tmp_path, ckpt):
    result = cli("predict", *EVAL_ARGS, "--run.root", tmp_path, "--run.version", "pred", "--ckpt_path", ckpt)
    assert result.code == 0, result.err[-3000:]
    path = tmp_path / "debug" / "pred" / "predictions.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    from attnlab.checkpoints.reading import load_checkpoint

    module, _ = load_checkpoint(ckpt)  # the checkpoint's weights, not fresh ones, made the predictions
    assert [r["hypothesis"] for r in rows] == module.translate([r["source"] for r in rows])


def test_validate_prints_val_metrics(cli, tmp_path):
    """validate (fresh weights, no checkpoint) evaluates by generation and prints every val key."""
    result = cli("validate", *EVAL_ARGS, "--run.root", tmp_path, "--run.version", "val")
    assert result.code == 0, result.err[-3000:]
    assert "final validate metrics:" in result.out
    for key in ("loss", "nll", "ppl", "exact_match", "bleu", "chrf", "gen_tokens_per_s"):
        assert re.search(rf"^\s+val/{key}\s+-?[\d.]+$", result.out, re.M), f"val/{key} not printed"
    assert "ref:" in result.out  # examples from the validation generations


def test_predict_writes_predictions_jsonl(cli, tmp_path):
    result = cli("predict", *EVAL_ARGS, "--run.root", tmp_path, "--run.version", "pred")
    assert result.code == 0, result.err[-3000:]
    path = tmp_path / "debug" / "pred" / "predictions.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 8  # the test split, cut to max_eval_examples
    assert all(set(row) == {"source", "reference", "hypothesis"} for row in rows)
    assert all(isinstance(row["hypothesis"], str) for row in rows)
    # Rows are the test split in order: the numbers NumberWordsDataModule draws with these arguments.
    import yaml
    from data_modules import NumberWordsDataModule
    from data_modules.number_words import english, german

    data_args = yaml.safe_load(DEBUG_YAML.read_text())["data"]["init_args"]
    numbers = NumberWordsDataModule(
        n_train=64, n_val=data_args["n_val"], n_test=data_args["n_test"], seed=data_args.get("seed", 0),
    ).numbers()["test"][:8]
    assert [(r["source"], r["reference"]) for r in rows] == [(english(n), german(n)) for n in numbers]
    assert re.search(rf"^8 predictions written to {re.escape(str(path))}$", result.out, re.M)


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_output_cut_short_by_its_reader_ends_quietly(argv):
    """`attnlab --help | head -1`: the reader is gone before the output is written (here: its end of
    the pipe is closed at once); the command ends without a BrokenPipeError traceback."""
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "attnlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader went away (head has read what it wanted)
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert code in (0, 128 + signal.SIGPIPE), (code, err)
