"""BlockDiffusion end to end through `attnlab`: metric keys, noise-range search, checkpoints, generate."""
import pytest

from conftest import EXPERIMENTS, FAST_TRAINER, assert_trained_on_the_lowest_variance_candidate, read_metrics

CANDIDATES = [[0.001, 1.0], [0.5, 1.0], [0.2, 0.6]]
INITIAL_RANGE = (0.5, 1.0)  # experiments/number_words/block_diffusion.yaml's noise_range


@pytest.fixture(scope="module")
def bd_run(tmp_path_factory):
    from conftest import run_main

    root = tmp_path_factory.mktemp("bd_runs")
    result = run_main([
        "fit", "--config", EXPERIMENTS / "number_words" / "block_diffusion.yaml", "--run.root", root, "--run.version", "tiny",
        *FAST_TRAINER, "--run.wandb", "disabled", "--trainer.max_steps", "4", "--data.init_args.batch_size", "16",
        "--model.init_args.backbone.d_model", "32", "--model.init_args.backbone.n_layers", "1",
        "--model.init_args.backbone.d_ff", "64", "--model.init_args.noise_search", str(CANDIDATES),
        "--data.init_args.n_train", "64", "--data.init_args.n_val", "64", "--data.init_args.n_test", "64",
        "--data.init_args.vocab_size", "300", "--data.init_args.max_eval_examples", "8", "--trainer.log_every_n_steps", "1",
    ], cwd=root)
    assert result.code == 0, result.err[-3000:]
    return result, root / "number_words" / "block_diffusion" / "tiny"


def test_fit_logs_the_common_metric_keys(bd_run):
    _, run_dir = bd_run
    metrics = read_metrics(run_dir)
    for key in ("train/loss", "val/nll", "val/ppl", "val/bleu", "val/chrf", "val/exact_match", "val/gen_tokens_per_s",
                "val/nfe_per_token"):
        assert metrics.get(key), f"{key} missing from {run_dir / 'metrics.csv'}"
    assert metrics["val/gen_tokens_per_s"][-1] > 0


def test_noise_search_trains_on_the_lowest_variance_candidate(bd_run):
    assert_trained_on_the_lowest_variance_candidate(bd_run[1], CANDIDATES)
    metrics = read_metrics(bd_run[1])
    trained_on = list(zip(metrics["train/noise_low"], metrics["train/noise_high"]))  # the range of every logged step
    assert trained_on and set(trained_on) <= {tuple(c) for c in CANDIDATES} | {INITIAL_RANGE}


def test_verify_is_refused_in_one_line_for_a_model_without_an_ar_view(bd_run, cli):
    result = cli("generate", bd_run[1] / "checkpoints" / "last.ckpt", "twenty one", "--verify")
    assert result.code == 2
    assert "generation.verify needs model.init_args.shift true and context causal" in result.err


def test_generate_from_a_block_diffusion_checkpoint(bd_run, cli):
    from attnlab.checkpoints.reading import load_checkpoint

    ckpt = bd_run[1] / "checkpoints" / "last.ckpt"
    module, _ = load_checkpoint(ckpt)
    assert module.family == "block_diffusion" and module.block_size == 4 and module.denoising_steps == 2
    expected = module.translate(["twenty one", "three hundred four"])
    result = cli("generate", ckpt, "twenty one", "three hundred four")
    assert result.code == 0, result.err
    assert result.out.splitlines() == expected


@pytest.mark.parametrize("prompt_len", [0, 6])
def test_plain_text_trains_in_language_model_and_prompt_modes(cli, tmp_path, prompt_len):
    """prompt_len 0: `[bos]` then every chunk token in blocks; > 0: the chunk's head is the clean prefix."""
    lines = [f"line {i} says {' '.join(str(j) for j in range(i % 7 + 2))}" for i in range(200)]
    (tmp_path / "train.txt").write_text("\n".join(lines[:160]), encoding="utf-8")
    (tmp_path / "val.txt").write_text("\n".join(lines[160:]), encoding="utf-8")
    (tmp_path / "lm.yaml").write_text(
        "model:\n  class_path: attnlab.BlockDiffusion\n  init_args:\n    block_size: 4\n"
        "    backbone: {d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64}\n"
        "data:\n  class_path: data_modules.TextDataModule\n  init_args:\n"
        f"    train_files: [train.txt]\n    val_files: [val.txt]\n    seq_len: 18\n    prompt_len: {prompt_len}\n"
        "    vocab_size: 300\n    batch_size: 64\n",
        encoding="utf-8",
    )
    result = cli("fit", "--config", tmp_path / "lm.yaml", "--run.root", tmp_path / "runs", "--run.version", "lm",
                 *FAST_TRAINER, "--trainer.max_steps", "-1", "--trainer.max_epochs", "1", "--run.wandb", "disabled")
    assert result.code == 0, result.err[-3000:]
    metrics = read_metrics(tmp_path / "runs" / "lm" / "lm")
    assert 0 < metrics["val/nll"][-1] < 10
