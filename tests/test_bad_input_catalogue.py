"""The bad-input catalogue: one row per user mistake (issue 7).

Each row builds a bad input in the test's folder and names the `attnlab` command that meets it
and the words its message must contain (what is wrong and where: the field, file, line or
checkpoint, and the fix). Every row checks the same contract:

- exit status 2 and one `attnlab: error:` message naming what and where;
- no traceback (an exception escaping `attnlab.cli.main` fails the test);
- nothing of the user's touched: every file that existed before the command (data, configs,
  checkpoints, a previous run in the very run folder the command would write) keeps its bytes
  and mtime, and no file appears in that run folder;
- no code from a checkpoint ever runs (the marker a malicious pickle would create never exists).

More cases live in tests/test_bad_input.py (n_heads vs d_model, positional choice, learned table
too short for training data, generation settings, missing data file, misaligned parallel files,
vocab_size below the minimum, unknown YAML keys and flags, missing config file, wandb mode).
Checkpoints are made once per module with one-step debug runs; every case runs in-process (one
`--debug` check runs a real process, to see the traceback a terminal shows).
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.errors import AttnlabError
from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, debug_fit_args, parallel_config_text, run_main, run_process

RUN = ["--run.root", "runs", "--run.name", "debug", "--run.version", "v1", "--run.wandb", "disabled"]
LEARNED_MAX_POSITIONS = 256  # the decoder checkpoint's learned table (fits the debug data, not long inputs)


# ---- checkpoints, made once ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A decoder-only checkpoint (learned positions, table of 256) and an encoder-decoder one."""
    root = tmp_path_factory.mktemp("catalogue_ckpts")
    encdec_yaml = root / "encdec.yaml"
    encdec_yaml.write_text(DEBUG_YAML.read_text(encoding="utf-8").replace("attnlab.DecoderOnly", "attnlab.EncoderDecoder"),
                           encoding="utf-8")
    one_step = ["--trainer.max_steps", "1"]
    runs = {
        "decoder": debug_fit_args(root / "runs", *one_step, "--model.init_args.backbone.positional", "learned",
                                  "--model.init_args.backbone.max_positions", str(LEARNED_MAX_POSITIONS), version="dec"),
        "encoder_decoder": ["fit", "--config", encdec_yaml, "--run.root", root / "runs", "--run.version", "ed",
                            "--run.wandb", "disabled", *FAST_TRAINER, *DEBUG_DATA, *one_step],
    }
    out = {}
    for name, argv in runs.items():
        result = run_main(argv, cwd=root)
        assert result.code == 0, result.err[-3000:]
        (ckpt,) = (root / "runs").glob(f"*/{argv[argv.index('--run.version') + 1]}/checkpoints/last.ckpt")
        out[name] = ckpt
    return out


# ---- building bad inputs ------------------------------------------------------------------------

class Env:
    """The test's folder (also the cwd), with helpers that write the user's files into it."""

    def __init__(self, tmp_path: Path, checkpoints: dict[str, Path]):
        self.tmp = tmp_path
        self._checkpoints = checkpoints
        self.marker = tmp_path / "CODE_RAN"
        self.run_dir = tmp_path / "runs" / "debug" / "v1"
        self.over_user_run: list = []  # files a case puts into the user's run folder (after it is made)

    def write(self, name: str, text: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path

    def ckpt(self, name: str) -> Path:
        """A copy of a session checkpoint in the user's folder (so it is protected like their files)."""
        path = self.tmp / "ckpts" / f"{name}.ckpt"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            shutil.copyfile(self._checkpoints[name], path)
        return path

    def truncated_ckpt(self) -> Path:
        data = self.ckpt("decoder").read_bytes()
        return self.write("ckpts/truncated.ckpt", data[: len(data) // 3])

    def code_running_ckpt(self) -> Path:
        """A checkpoint whose unpickling would run a shell command (creating self.marker)."""
        marker = self.marker

        class RunsCode:
            def __reduce__(self):
                return os.system, (f"touch '{marker}'",)

        path = self.tmp / "ckpts" / "runs_code.ckpt"
        path.parent.mkdir(exist_ok=True)
        torch.save({"attnlab": {"family": "decoder_only"}, "state_dict": {}, "hyper_parameters": {},
                    "payload": RunsCode()}, path)
        return path

    def foreign_torch_file(self) -> Path:
        path = self.tmp / "ckpts" / "weights.pt"
        path.parent.mkdir(exist_ok=True)
        torch.save({"weight": torch.zeros(3, 3)}, path)
        return path

    def lines(self, name: str, lines: list[str]) -> Path:
        return self.write(name, "".join(f"{line}\n" for line in lines))

    def parallel_config(self, train_source, train_target, *, val=None, extra: str = "") -> Path:
        val_source, val_target = val or (train_source, train_target)
        return self.write("parallel.yaml", parallel_config_text(train_source, train_target, val_source, val_target, extra))

    def text_fit(self, train_file, *extra) -> list:
        """`fit` of the debug model on TextDataModule over `train_file` (also the val file)."""
        return ["fit", "--config", DEBUG_YAML, "--data", "data_modules.TextDataModule",
                "--data.init_args.train_files", f"[{train_file}]", "--data.init_args.val_files", f"[{train_file}]",
                "--data.init_args.seq_len", "8", *RUN, *FAST_TRAINER, *extra]

    def fit(self, *extra) -> list:
        return [*debug_fit_args(self.tmp / "runs", *extra)]

    def evaluate(self, verb: str, ckpt: Path, *extra) -> list:
        return [verb, "--config", DEBUG_YAML, "--ckpt_path", ckpt, *RUN, *FAST_TRAINER, *DEBUG_DATA, *extra]

    def sweep_file(self, text: str) -> Path:
        shutil.copyfile(DEBUG_YAML, self.tmp / "debug.yaml")
        return self.write("sweep.yaml", text)


ENGLISH = ["one two three", "four five six", "seven eight nine", "ten eleven twelve"]
GERMAN = ["eins zwei drei", "vier fünf sechs", "sieben acht neun", "zehn elf zwölf"]

# name -> build(env) -> (argv, words the message must contain)
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# ---- the config file and its values ----

@case
def config_malformed_yaml(env):
    config = env.write("broken.yaml", "trainer:\n  max_steps: 3\nmodel:\n  init_args: [1, 2\n  class_path: x\n")
    return ["fit", "--config", config, *RUN], [str(config), "line 5", "not valid YAML"]


@case
def config_not_utf8(env):
    config = env.write("latin1.yaml", "# Größe\ntrainer:\n  max_steps: 3\n".encode("latin-1"))
    return ["fit", "--config", config, *RUN], [str(config), "UTF-8"]


@case
def config_unknown_top_level_key(env):
    config = env.write("typo.yaml", DEBUG_YAML.read_text(encoding="utf-8") + "trianer:\n  max_steps: 3\n")
    return ["fit", "--config", config, *RUN, *FAST_TRAINER, *DEBUG_DATA], ["trianer"]


@case
def config_unknown_data_flag(env):
    return env.fit("--data.init_args.n_trian", "64"), ["data.init_args", "n_trian", "not accepted"]


@case
def config_unknown_model_class(env):
    return env.fit("--model", "attnlab.GPT5"), ["model:", "attnlab.GPT5", "no attribute"]


@case
def value_wrong_type(env):
    return env.fit("--model.init_args.backbone.d_model", "wide"), ["model.init_args.backbone.d_model", "int", "wide"]


@case
def value_batch_size_zero(env):
    return env.fit("--data.init_args.batch_size", "0"), ["data.init_args.batch_size", "0", ">= 1"]


@case
def value_negative_learning_rate(env):
    return env.fit("--model.init_args.optimizer.lr", "-1"), ["optimizer.lr", "-1", "> 0"]


@case
def value_unknown_tokenizer_type(env):
    return env.fit("--data.init_args.tokenizer_type", "wordpiece"), [
        "data.init_args.tokenizer_type", "wordpiece", "unigram", "bpe"]


@case
def value_unknown_multi30k_language(env):
    return env.fit("--data", "data_modules.Multi30kDataModule", "--data.init_args.source_lang", "xx"), [
        "data.init_args.source_lang", "xx", "en, de, fr, cs"]


# ---- block diffusion's block size ----
# A block size that does not divide a target's length is not a mistake: frame_blocks pads each
# target region to a whole number of blocks (tests/test_models_block_diffusion.py). What is
# rejected is a block size that cannot work at all.

def _block_diffusion(env, *extra):
    return env.fit("--model", "attnlab.BlockDiffusion", *extra)


@case
def block_size_zero(env):
    return _block_diffusion(env, "--model.init_args.block_size", "0"), ["model.init_args.block_size", "0", ">= 1"]


@case
def block_size_not_an_integer(env):
    return _block_diffusion(env, "--model.init_args.block_size", "true"), ["model.init_args.block_size", "int", "True"]


@case
def denoising_steps_above_block_size(env):
    return _block_diffusion(env, "--model.init_args.block_size", "4", "--model.init_args.denoising_steps", "8"), [
        "model.init_args.denoising_steps", "8", "block_size=4"]


@case
def block_size_beyond_learned_position_table(env):
    # every debug example fits in 100 positions, but its target padded to one block of 128 does not
    return _block_diffusion(env, "--model.init_args.block_size", "128", "--model.init_args.backbone.positional", "learned",
                            "--model.init_args.backbone.max_positions", "120"), ["backbone.max_positions=120", "positions"]


@case
def context_unknown(env):
    return _block_diffusion(env, "--model.init_args.context", "bidirectional"), [
        "model.init_args.context", "bidirectional", "block_causal, causal"]


@case
def ar_loss_without_causal_context(env):
    return _block_diffusion(env, "--model.init_args.ar_loss_weight", "0.5"), [
        "model.init_args.ar_loss_weight", "context: causal"]


@case
def complementary_masks_with_elbo_weights(env):
    return _block_diffusion(env, "--model.init_args.complementary_masks", "true"), [
        "model.init_args.complementary_masks", "loss_weighting: uniform"]


@case
def resample_range_no_block_reaches(env):
    return _block_diffusion(env, "--model.init_args.resample", "true", "--model.init_args.noise_range", "[0.3, 0.45]"), [
        "model.init_args.noise_range", "[0.3, 0.45]", "no block of 4 tokens", "resample: false"]


@case
def first_hitting_with_fewer_steps(env):
    return _block_diffusion(env, "--model.init_args.unmasking", "first_hitting", "--model.init_args.denoising_steps", "2"), [
        "model.init_args.denoising_steps", "first_hitting", "leave it null"]


# ---- data files ----

@case
def data_file_empty(env):
    source, empty = env.lines("train.en", ENGLISH), env.write("train.de", "")
    return ["fit", "--config", env.parallel_config(source, empty), *RUN, *FAST_TRAINER], [
        "data.init_args.train_target", str(empty), "empty"]


@case
def data_file_not_utf8(env):
    text = env.write("corpus.txt", "one two\nthree four\nfive sechs f\xfcnf\n".encode("latin-1"))
    return env.text_fit(text), ["data.init_args.train_files[0]", str(text), "line 3", "UTF-8", "iconv"]


@case
def data_file_is_a_directory(env):
    folder = env.tmp / "corpus"
    folder.mkdir()
    return env.text_fit(folder), ["data.init_args.train_files[0]", "is a directory", str(folder)]


@case
def data_file_bad_gzip(env):
    fake = env.write("train.en.gz", "not compressed\n")
    target = env.lines("train.de", GERMAN)
    return ["fit", "--config", env.parallel_config(fake, target), *RUN, *FAST_TRAINER], [
        "data.init_args.train_source", str(fake), "gzip"]


@case
def misaligned_validation_files(env):
    source, target = env.lines("train.en", ENGLISH), env.lines("train.de", GERMAN)
    val_source, val_target = env.lines("val.en", ENGLISH), env.lines("val.de", GERMAN[:3])
    config = env.parallel_config(source, target, val=(val_source, val_target))
    return ["fit", "--config", config, *RUN, *FAST_TRAINER], [
        str(val_source), "data.init_args.val_source", "4 lines", str(val_target), "data.init_args.val_target", "has 3"]


@case
def parallel_test_files_half_given(env):
    source, target = env.lines("train.en", ENGLISH), env.lines("train.de", GERMAN)
    config = env.parallel_config(source, target, extra=f"    test_source: {source}\n")
    return ["fit", "--config", config, *RUN, *FAST_TRAINER], ["data.init_args.test_source", "data.init_args.test_target"]


@case
def data_without_test_split(env):
    source, target = env.lines("train.en", ENGLISH), env.lines("train.de", GERMAN)
    return ["test", "--config", env.parallel_config(source, target), *RUN, *FAST_TRAINER], [
        "no test split", "data.init_args.test_source"]


@case
def corpus_shorter_than_seq_len(env):
    text = env.lines("corpus.txt", ENGLISH)
    return env.text_fit(text, "--data.init_args.seq_len", "5000"), ["data.init_args.seq_len = 5000", "fewer than one chunk"]


@case
def corpus_needs_a_larger_vocabulary(env):
    # 400 distinct characters need more pieces than vocab_size 300 leaves after the 262 fixed ones
    chars = "".join(chr(0x4E00 + i) for i in range(400))
    text = env.lines("corpus.txt", [chars[i:i + 20] for i in range(0, 400, 20)])
    return env.text_fit(text), ["data.init_args.vocab_size = 300", "distinct characters", "raise data.init_args.vocab_size"]


# ---- checkpoints ----

@case
def ckpt_of_another_family_validate(env):
    # the issue's own example; refused right after parsing, before the data or tokenizer are built
    ckpt = env.ckpt("encoder_decoder")
    return ["validate", "--config", DEBUG_YAML.parent / "decoder_only.yaml", "--ckpt_path", ckpt, *RUN, *FAST_TRAINER], [
        "--ckpt_path", str(ckpt), "'encoder_decoder'", "'decoder_only'", "pass the config the checkpoint was trained with"]


@case
def ckpt_of_unknown_family_generate(env):
    ckpt = torch.load(env.ckpt("decoder"), weights_only=True)
    ckpt["attnlab"]["family"] = "gpt5"
    path = env.tmp / "ckpts" / "gpt5.ckpt"
    torch.save(ckpt, path)
    return ["generate", path, "twenty one"], [str(path), "'gpt5'", "decoder_only"]


@case
def ckpt_of_another_size_validate(env):
    ckpt = env.ckpt("decoder")  # learned positions; debug.yaml builds rope
    return env.evaluate("validate", ckpt), ["--ckpt_path", str(ckpt), "does not fit",
                                            "backbone.positional: checkpoint 'learned', config 'rope'"]


@case
def ckpt_truncated_generate(env):
    ckpt = env.truncated_ckpt()
    return ["generate", ckpt, "twenty one"], [str(ckpt), "truncated"]


@case
def ckpt_truncated_validate(env):
    ckpt = env.truncated_ckpt()
    return env.evaluate("validate", ckpt), ["--ckpt_path", str(ckpt), "truncated"]


@case
def ckpt_missing_test(env):
    missing = env.tmp / "ckpts" / "nope.ckpt"
    return env.evaluate("test", missing), ["--ckpt_path", str(missing), "does not exist"]


@case
def ckpt_not_attnlab_generate(env):
    path = env.foreign_torch_file()
    return ["generate", path, "twenty one"], [str(path), "not written by attnlab"]


@case
def ckpt_not_attnlab_test(env):
    path = env.foreign_torch_file()
    return env.evaluate("test", path), ["--ckpt_path", str(path), "not written by attnlab"]


@case
def ckpt_that_runs_code_generate(env):
    path = env.code_running_ckpt()
    return ["generate", path, "twenty one"], [str(path), "could run code", "refusing", "system"]


@case
def ckpt_that_runs_code_validate(env):
    path = env.code_running_ckpt()
    return env.evaluate("validate", path), ["--ckpt_path", str(path), "could run code", "refusing"]


@case
def ckpt_that_runs_code_test(env):
    path = env.code_running_ckpt()
    return env.evaluate("test", path), ["--ckpt_path", str(path), "could run code", "refusing"]


@case
def ckpt_that_runs_code_average(env):
    path = env.code_running_ckpt()
    return ["average", env.ckpt("decoder"), path, "--output", env.tmp / "avg.ckpt"], [str(path), "could run code"]


@case
def ckpt_truncated_attention(env):
    ckpt = env.truncated_ckpt()
    return ["attention", ckpt, "twenty one", "--output", env.tmp / "maps"], [str(ckpt), "truncated"]


@case
def input_longer_than_learned_position_table(env):
    ckpt = env.ckpt("decoder")
    return ["generate", ckpt, " ".join(["seventy seven"] * 100)], [
        f"backbone.max_positions={LEARNED_MAX_POSITIONS}", "positions"]


@case
def generate_bad_sampling_flag(env):
    return ["generate", env.ckpt("decoder"), "twenty one", "--top-p", "2"], ["top_p", "2"]


# ---- average ----

@case
def average_of_two_families(env):
    a, b = env.ckpt("decoder"), env.ckpt("encoder_decoder")
    return ["average", a, b, "--output", env.tmp / "avg.ckpt"], [
        "different families", f"{a} (decoder_only)", f"{b} (encoder_decoder)"]


@case
def average_of_two_sizes(env):
    ckpt = torch.load(env.ckpt("decoder"), weights_only=True)
    key = next(k for k, v in ckpt["state_dict"].items() if v.dim() == 2)
    ckpt["state_dict"][key] = torch.zeros(3, 3)
    other = env.tmp / "ckpts" / "other_size.ckpt"
    torch.save(ckpt, other)
    return ["average", env.ckpt("decoder"), other, "--output", env.tmp / "avg.ckpt"], [
        key, "(3, 3)", "shape", str(other)]


@case
def average_onto_existing_output(env):
    existing = env.write("avg.ckpt", b"the user's own file")
    return ["average", env.ckpt("decoder"), env.ckpt("decoder"), "--output", existing], [
        str(existing), "exists already", "--output"]


# ---- sweep and bench ----

@case
def sweep_unknown_key(env):
    sweep = env.sweep_file("base: debug.yaml\ngird:\n  trainer.max_steps: [1, 2]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "gird", "grid"]


@case
def sweep_empty_value_list(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  model.init_args.backbone.n_heads: []\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "grid.model.init_args.backbone.n_heads", "non-empty list"]


@case
def sweep_missing_base(env):
    sweep = env.sweep_file("base: nowhere.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "nowhere.yaml", "relative to the sweep file"]


@case
def sweep_seeds_repeated(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nseeds: [0, 1, 0]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "seeds", "more than once", "distinct"]


@case
def sweep_seeds_not_integers(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nseeds: [0, one]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "seeds", "distinct integers"]


@case
def sweep_seeds_flag_zero(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs", "--seeds", "0"], ["--seeds 0", "at least 1"]


@case
def sweep_reference_not_a_point(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nreference: max_steps=3\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "reference='max_steps=3'", "must name a point"]


@case
def sweep_tune_fewer_than_one_trial(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n"
                           "tune:\n  trials: 0\n  space:\n    model.init_args.optimizer.lr: [0.001, 0.003]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "tune.trials=0", "integer >= 1"]


@case
def sweep_tune_unknown_parameter(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n"
                           "tune:\n  trials: 2\n  space:\n    model.init_args.optimizer.lr: [0.001, 0.003]\n"
                           "    model.init_args.backbone.dropoutt: [0.0, 0.1]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "tune.space", "dropoutt"]


@case
def sweep_monitor_never_logged(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs", "--run.monitor", "val/blue"], ["run.monitor='val/blue'",
                                                                                        "never logged", "val/bleu"]


@case
def sweep_named_point_monitor_never_logged(env):
    sweep = env.sweep_file("base: debug.yaml\npoints:\n  base: {}\n  chrf: {run.monitor: val/chrff}\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], ["run.monitor='val/chrff'", "never logged"]


@case
def sweep_patience_below_one(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nfixed:\n  run.patience: 0\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], ["run.patience=0", ">= 1"]


@case
def sweep_evaluate_unknown_checkpoint(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nevaluate:\n  test: {checkpoint: newest}\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "evaluate.test.checkpoint='newest'", "best, last, averaged"]


@case
def sweep_point_budget_of_two_kinds(env):
    sweep = env.sweep_file("base: debug.yaml\npoints:\n  base: {}\n  big: {budget: {flops: 1.0e12, epochs: 2}}\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "points.big.budget=", "names 2 budgets"]


@case
def sweep_budget_not_positive(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nbudget: {tokens: -5}\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "budget.tokens=-5", "> 0"]


@case
def sweep_budget_with_a_warmup_in_steps(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nbudget: {flops: 1.0e12}\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "point max_steps=1", "warmup_ratio",
                                                          "warmup_steps=5"]


@case
def sweep_tune_seed_among_the_evaluation_seeds(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\nseeds: [0, 1, 2]\n"
                           "tune:\n  trials: 2\n  seed: 1\n  space:\n    model.init_args.optimizer.lr: [0.001, 0.003]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "tune.seed=1", "evaluation seed", "e.g. 1000"]


@case
def sweep_tune_without_the_learning_rate(env):
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  trainer.max_steps: [1, 2]\n"
                           "tune:\n  trials: 2\n  space:\n    model.init_args.backbone.dropout: [0.0, 0.1]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs"], [str(sweep), "tune.space", "model.init_args.optimizer.lr"]


# ---- report ----

def _report_with_damaged_metrics(env, damaged: str | bytes) -> tuple[list, Path]:
    """`attnlab report` of two runs, one with a damaged metrics.csv; --output points into the run
    folder the contract guards, so a report written anyway fails the row."""
    env.write("grid/good/metrics.csv", "epoch,step,train/loss,val/nll\n0,0,5.0,\n0,1,4.0,4.5\n")
    bad = env.write("grid/damaged/metrics.csv", damaged)
    return ["report", env.tmp / "grid", "--output", env.run_dir / "report", "--wandb", "disabled"], bad


@case
def report_metrics_truncated_row(env):
    # a short row with rows after it (a partial *last* line, a cut append, is dropped and said instead)
    argv, bad = _report_with_damaged_metrics(env, "epoch,step,train/loss,val/nll\n0,0,5.0,\n0,1,4.\n0,2,3.0,4.0\n")
    return argv, [str(bad), "line 3", "3 fields where the header has 4", "rerun"]


@case
def report_metrics_not_text(env):
    argv, bad = _report_with_damaged_metrics(env, b"epoch,step,train/loss\n0,0,5.0\n\x89\xfe\x00\x01garbage\n")
    return argv, [str(bad), "line 3", "not UTF-8", "rerun"]


@case
def report_metrics_not_a_number(env):
    argv, bad = _report_with_damaged_metrics(env, "epoch,step,train/loss\n0,0,5.0\n0,1,five\n")
    return argv, [str(bad), "line 3", "train/loss is 'five', not a number"]


@case
def fit_monitor_never_logged(env):
    return env.fit("--run.monitor", "val/blue"), ["run.monitor='val/blue'", "never logged", "val/bleu"]


@case
def fit_patience_below_one(env):
    return env.fit("--run.patience", "0"), ["run.patience=0", ">= 1"]


@case
def fit_budget_of_two_kinds(env):
    return env.fit("--run.budget", "{flops: 1.0e12, tokens: 1.0e6}"), [
        "run.budget=", "names 2 budgets", "exactly one of flops, tokens, epochs, time"]


@case
def fit_budget_not_positive(env):
    return env.fit("--run.budget", "{epochs: 0}"), ["run.budget.epochs=0", "> 0"]


@case
def fit_budget_of_unknown_kind(env):
    return env.fit("--run.budget", "{steps: 100}"), ["run.budget", "unknown budget 'steps'", "flops, tokens, epochs, time"]


@case
def fit_budget_time_unparsable(env):
    return env.fit("--run.budget", "{time: 2h}"), ["run.budget.time='2h'", "DD:HH:MM:SS"]


@case
def fit_time_budget_with_the_cosine_schedule(env):
    return env.fit("--run.budget", "{time: '00:01:00:00'}"), [
        "run.budget time='00:01:00:00'", "cosine", "optimizer.schedule"]


@case
def fit_budget_with_a_warmup_in_steps(env):
    return env.fit("--run.budget", "{epochs: 2}"), ["run.budget epochs 2", "warmup_ratio", "warmup_steps=5"]


@case
def report_remark_without_its_json(env):
    page = env.tmp / "page.md"
    page.write_text("# a page\n")
    return ["report", "--remark", page], ["--remark", str(page.with_suffix(".json")), "attnlab report --publish"]


@case
def bench_set_unknown_field(env):
    return ["bench", "--no-hf", "--device", "cpu", "--set", "heads=3", "--output", env.tmp / "bench.json"], [
        "--set heads=3", "n_heads"]


@case
def bench_set_bad_value(env):
    return ["bench", "--no-hf", "--device", "cpu", "--set", "gen_new=many", "--output", env.tmp / "bench.json"], [
        "--set gen_new=many", "integer"]


@case
def accelerator_that_this_machine_lacks(env):
    if torch.cuda.is_available():  # a GPU machine: ask for more GPUs than it has
        return env.fit("--trainer.accelerator", "gpu", "--trainer.devices", "999"), ["trainer.devices=999", "GPU"]
    return env.fit("--trainer.accelerator", "gpu"), ["trainer.accelerator=gpu", "no GPU", "--trainer.accelerator cpu"]


@case
def run_root_that_cannot_be_created(env):
    blocker = env.write("not_a_folder", "a file where the run root's parent should be\n")
    return env.fit("--run.root", str(blocker / "runs")), [f"run.root={blocker / 'runs'}", "is a file", "--run.root"]


@case
def run_root_on_a_pseudo_file_system(env):
    """Root may write anywhere by the permission bits, but /proc takes no new folders (issue 30)."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    return env.fit("--run.root", "/proc/attnlab_runs"), ["run.root=/proc/attnlab_runs", "/proc", "--run.root"]


@case
def run_root_name_too_long(env):
    root = env.tmp / ("r" * 300)
    return env.fit("--run.root", str(root)), [f"run.root={root}", "cannot be created", os.strerror(errno.ENAMETOOLONG), "--run.root"]


@case
def fit_max_steps_zero(env):
    return env.fit("--trainer.max_steps", "0"), ["trainer.max_steps=0", "trains nothing", "-1 for no limit"]


@case
def fit_max_steps_below_minus_one(env):
    return env.fit("--trainer.max_steps", "-5"), ["trainer.max_steps=-5", "positive number of steps"]


@case
def token_budget_below_every_example(env):
    return env.fit("--data.init_args.max_tokens", "4"), [
        "data.init_args.max_tokens = 4", "below the longest training example", "train split", "raise data.init_args.max_tokens to at least"]


@case
def fit_resuming_a_damaged_last_ckpt(env):
    """The run folder's last.ckpt (the placeholder text of the user's run) is what the same command resumes."""
    return env.fit(), ["resuming", "runs/debug/v1/checkpoints/last.ckpt", "move", "aside", "another --run.version"]


@case
def fit_resuming_a_last_ckpt_of_another_model(env):
    """The run folder's last.ckpt holds learned positions; the config asks for RoPE."""
    env.over_user_run.append(lambda: shutil.copyfile(env._checkpoints["decoder"], env.run_dir / "checkpoints" / "last.ckpt"))
    return env.fit(), ["last.ckpt", "does not fit the model", "move", "aside"]


@case
def fit_resuming_a_run_of_another_configuration(env):
    """The run folder's last.ckpt fits the model but was trained with another learning rate: a fit
    under the same name (a job id, a reused --run.version) must not continue it."""
    env.over_user_run.append(lambda: shutil.copyfile(env._checkpoints["decoder"], env.run_dir / "checkpoints" / "last.ckpt"))
    return env.fit("--model.init_args.backbone.positional", "learned", "--model.init_args.backbone.max_positions",
                   str(LEARNED_MAX_POSITIONS), "--model.init_args.optimizer.lr", "0.001"), [
        "runs/debug/v1 holds a run of another configuration", "model.init_args.optimizer.lr: 0.003 there, 0.001 now",
        "--run.version NAME"]


@case
def fit_limit_train_batches_zero(env):
    return env.fit("--trainer.limit_train_batches", "0"), ["trainer.limit_train_batches=0", "trains nothing"]


@case
def sweep_max_steps_zero(env):
    """Refused once, before the first point, instead of failing in each."""
    sweep = env.sweep_file("base: debug.yaml\ngrid:\n  model.init_args.backbone.n_heads: [1, 2]\n")
    return ["sweep", sweep, "--root", env.tmp / "runs", "--trainer.max_steps", "0"], [
        str(sweep), "point n_heads=1", "trainer.max_steps=0 trains nothing"]


@case
def ckpt_path_a_directory_validate(env):
    folder = env.tmp / "ckpts" / "a_folder"
    folder.mkdir(parents=True)
    return env.evaluate("validate", folder), ["--ckpt_path", str(folder), "is a directory"]


@case
def ckpt_path_a_directory_fit(env):
    folder = env.tmp / "ckpts" / "a_folder"
    folder.mkdir(parents=True)
    return env.fit("--ckpt_path", str(folder)), ["--ckpt_path", str(folder), "is a directory"]


@case
def ckpt_plain_text_generate(env):
    path = env.write("ckpts/notes.ckpt", "my notes about this run\n")
    return ["generate", path, "twenty one"], [str(path), "not a torch checkpoint", "it is text"]


@case
def ckpt_plain_text_validate(env):
    path = env.write("ckpts/notes.ckpt", "my notes about this run\n")
    return env.evaluate("validate", path), ["--ckpt_path", str(path), "not a torch checkpoint"]


@case
def init_from_missing(env):
    missing = env.tmp / "ckpts" / "nope.ckpt"
    return env.fit("--run.init_from", str(missing)), ["run.init_from", str(missing), "does not exist"]


@case
def init_from_another_family(env):
    ckpt = env.ckpt("encoder_decoder")
    return env.fit("--run.init_from", str(ckpt)), ["run.init_from", str(ckpt), "'encoder_decoder'", "does not fit"]


@case
def init_from_another_shape(env):
    ckpt = env.ckpt("decoder")  # learned positions, a table of LEARNED_MAX_POSITIONS
    return env.fit("--run.init_from", str(ckpt), "--model.init_args.backbone.positional", "learned",
                   "--model.init_args.backbone.max_positions", str(LEARNED_MAX_POSITIONS + 44)), [
        "run.init_from", "has shape", f"backbone.max_positions: checkpoint {LEARNED_MAX_POSITIONS}"]


def _folder_fit(env, folder, *extra) -> list:
    return ["fit", "--config", DEBUG_YAML, "--data", "data_modules.TextFolderDataModule",
            "--data.init_args.data_dir", str(folder), "--data.init_args.seq_len", "8", *RUN, *FAST_TRAINER, *extra]


@case
def text_folder_missing(env):
    folder = env.tmp / "no_corpus_here"
    return _folder_fit(env, folder), ["data.init_args.data_dir", str(folder), "does not exist", "train.txt"]


@case
def text_folder_without_val(env):
    env.write("corpus/train.txt", "one two three four five six seven eight nine ten\n" * 20)
    folder = env.tmp / "corpus"
    return _folder_fit(env, folder), ["data.init_args.data_dir", str(folder), "no val.txt"]


@case
def text_corpus_not_utf8_deep_in_the_file(env):
    """Found while sentencepiece streams the file: the line still comes back as the one error."""
    good = "one two three four five six seven eight nine ten\n" * 60
    env.write("latin/train.txt", (good + "caf\xe9 au lait\n" + good).encode("latin-1"))
    env.write("latin/val.txt", good)
    folder = env.tmp / "latin"
    return _folder_fit(env, folder), ["data.init_args.train_files[0]", str(folder / "train.txt"), "line 61",
                                      "not valid UTF-8"]


@case
def text_corpus_empty(env):
    env.write("blank/train.txt", "\n   \n\n")
    env.write("blank/val.txt", "\n\n")
    folder = env.tmp / "blank"
    return _folder_fit(env, folder), ["data.init_args.train_files[0]", str(folder / "train.txt"), "is empty"]


@case
def sample_quality_scorer_trained_on_pairs(env):
    ckpt = env.ckpt("decoder")  # a DecoderOnly of the number-words pairs, not of plain text
    return ["sample-quality", str(ckpt), "--scorer", str(ckpt), "--output", str(env.tmp / "quality")], [
        "--scorer", str(ckpt), "trained on pairs"]


@case
def unknown_verb(env):
    return ["trian", "--config", DEBUG_YAML], ["unknown verb", "trian"]


# ---- the contract every case checks -------------------------------------------------------------

def _user_run(env: Env) -> None:
    """A finished run where every case's run would go (runs/debug/v1): it must survive untouched."""
    for name in ("config.yaml", "hparams.yaml", "metrics.csv", "checkpoints/last.ckpt", "checkpoints/best.ckpt"):
        path = env.run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the user's {name}\n", encoding="utf-8")


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# case -> (its verb, its error line with the test's folder as <tmp>), filled by test_bad_input
MET: dict[str, tuple[str, str]] = {}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, cli, tmp_path, checkpoints):
    env = Env(tmp_path, checkpoints)
    argv, needles = CASES[name](env)
    _user_run(env)
    for put in env.over_user_run:
        put()
    before = _snapshot(tmp_path)

    result = cli(*argv)

    assert result.code == 2, f"exit {result.code}; stderr: {result.err[-3000:]}"
    assert "Traceback" not in result.err
    error_lines = [line for line in result.err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, f"not one error line: {result.err[-3000:]}"
    for needle in needles:  # named in the error line itself, not somewhere in a log
        assert needle in error_lines[0], f"{needle!r} not named in: {result.err[-3000:]}"
    MET[name] = (str(argv[0]), error_lines[0].replace(str(tmp_path), "<tmp>"))
    after = _snapshot(tmp_path)
    changed = [p for p, v in before.items() if after.get(p) != v]
    assert not changed, f"the command changed or removed the user's files: {changed}"
    # (its .lock aside: a command takes an existing folder's lock first, so that a second command on
    # it is refused before anything is built; the lock holds no data)
    new_in_run = [p for p in after if p not in before and p.startswith(str(env.run_dir.relative_to(tmp_path)))
                  and not p.endswith("/.lock")]
    assert not new_in_run, f"the command wrote into the existing run folder: {new_in_run}"
    assert not env.marker.exists(), "a checkpoint ran code while loading"


def test_catalogue_size():
    """Issue 7 asks for at least 25 bad inputs. The table's own length proved nothing; what the
    rows met does: at least 25 different error messages (25 mistakes told apart), and no row a
    copy of another (rows that share a message meet one mistake through different verbs, e.g. a
    code-running checkpoint given to generate, validate, test and average). Reads what
    test_bad_input saw, so it needs every row of it in this session."""
    missing = sorted(set(CASES) - set(MET))
    if missing:
        pytest.skip(f"{len(missing)} rows of test_bad_input did not run in this session (first: {missing[0]})")
    by_message: dict[str, list[tuple[str, str]]] = {}
    for name, (verb, line) in MET.items():
        by_message.setdefault(line, []).append((verb, name))
    assert len(by_message) >= 25, f"only {len(by_message)} different messages from {len(MET)} rows"
    copies = {line: rows for line, rows in by_message.items() if len({verb for verb, _ in rows}) < len(rows)}
    assert not copies, f"rows that meet the same mistake through the same verb: {copies}"


# ---- --debug shows the traceback ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["ckpt_that_runs_code_generate", "data_file_not_utf8", "ckpt_of_another_family_validate"])
def test_debug_raises_instead(name, cli, tmp_path, checkpoints):
    env = Env(tmp_path, checkpoints)
    argv, needles = CASES[name](env)
    with pytest.raises(AttnlabError) as raised:
        cli(*argv, "--debug")
    chain, err = [], raised.value
    while err is not None:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    assert any(needles[-1] in text for text in chain)
    assert not env.marker.exists()


def test_debug_prints_a_traceback_in_a_real_process(tmp_path, checkpoints):
    """(Without --debug the same command prints one line: test_bad_input[ckpt_truncated_generate].)"""
    env = Env(tmp_path, checkpoints)
    ckpt = env.truncated_ckpt()
    debug = run_process(["generate", ckpt, "twenty one", "--debug"], cwd=tmp_path)
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "truncated" in debug.stderr, debug.stderr[-2000:]



# ---- handled, not errors ------------------------------------------------------------------------

def test_vocabulary_larger_than_the_corpus_allows_is_used_as_is_and_said(tmp_path, caplog):
    """Not a mistake to refuse: sentencepiece stops at the pieces the text supports and the model
    is sized from the real vocabulary (the config link). A warning names the field and both sizes.
    (Too *small* a vocabulary for the text's characters is an error: corpus_needs_a_larger_vocabulary.)"""
    import logging

    from data_modules.tokenizer import train_tokenizer

    with caplog.at_level(logging.WARNING, logger="data_modules.tokenizer"):
        tokenizer = train_tokenizer(ENGLISH * 3, 5000, "unigram", tmp_path, "catalogue-small-corpus")
    assert tokenizer.vocab_size < 5000
    assert "data.init_args.vocab_size = 5000" in caplog.text and str(tokenizer.vocab_size) in caplog.text
