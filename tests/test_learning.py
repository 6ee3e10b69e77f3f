"""Short runs of the embedded-task configs learn: far better than the same model untrained."""
import pytest

from conftest import EXPERIMENTS, read_metrics

SHORT = [
    "--data.init_args.n_train", "3000", "--data.init_args.max_eval_examples", "64",
    "--trainer.max_epochs", "4", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false", "--run.wandb", "disabled",
    "--model.init_args.backbone.d_model", "64", "--model.init_args.optimizer.warmup_steps", "20",
    "--model.init_args.eval_every_n_epochs", "4",  # generate at the last epoch only: what is asserted
]


@pytest.mark.parametrize("config", ["encoder_decoder.yaml", "decoder_only.yaml", "block_diffusion.yaml"])
def test_a_short_run_beats_the_untrained_model(cli, tmp_path, config):
    args = ["--config", EXPERIMENTS / "number_words" / config, "--run.root", tmp_path, *SHORT]
    untrained = cli("validate", *args, "--run.version", "untrained")
    assert untrained.code == 0, untrained.err[-2000:]
    trained = cli("fit", *args, "--run.version", "trained")
    assert trained.code == 0, trained.err[-2000:]
    name = config.removesuffix(".yaml")
    before = read_metrics(tmp_path / "number_words" / name / "untrained")
    after = read_metrics(tmp_path / "number_words" / name / "trained")
    # An untrained model spreads its probability over the vocabulary (nll ≈ ln V ≈ 6);
    # chance cannot bring the NLL of 64 held-out translations below a third of that.
    assert after["val/nll"][-1] < before["val/nll"][-1] / 3
    assert after["val/chrf"][-1] > before["val/chrf"][-1] + 20
