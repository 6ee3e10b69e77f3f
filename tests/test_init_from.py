"""`--run.init_from CKPT`: a run starts from another checkpoint's network weights, of its own
family or of another whose network fits (BD3-LM fine-tunes block diffusion from an AR model)."""
from __future__ import annotations

import pytest
import torch

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER, debug_fit_args, run_main


@pytest.fixture(scope="module")
def decoder_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("init_from")
    result = run_main(debug_fit_args(root / "runs", "--trainer.max_steps", "3", version="ar"), cwd=root)
    assert result.code == 0, result.err[-3000:]
    (ckpt,) = (root / "runs").glob("*/ar/checkpoints/last.ckpt")
    return ckpt


def _build(tmp_path, family: str, *extra):
    from attnlab.cli.lightning_cli import AttnlabCLI

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / f"{family}.yaml"
    config.write_text(DEBUG_YAML.read_text(encoding="utf-8").replace("attnlab.DecoderOnly", f"attnlab.{family}"),
                      encoding="utf-8")
    return AttnlabCLI(args=["--config", str(config), "--run.root", str(tmp_path / "runs"), "--run.wandb",
                            "disabled", *FAST_TRAINER, *DEBUG_DATA, *extra], run=False)


def _network(state: dict) -> dict:
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


@pytest.mark.parametrize("family", ["DecoderOnly", "BlockDiffusion"])
def test_every_network_weight_is_copied(family, decoder_checkpoint, tmp_path):
    saved = _network(torch.load(decoder_checkpoint, weights_only=True)["state_dict"])
    fresh = _build(tmp_path / "fresh", family).model.model.state_dict()
    built = _build(tmp_path / "init", family, "--run.init_from", str(decoder_checkpoint)).model.model.state_dict()
    assert built.keys() == saved.keys()
    assert all(torch.equal(built[k], saved[k]) for k in saved)
    assert not all(torch.equal(fresh[k], saved[k]) for k in saved)  # it is not what a fresh model holds anyway


def test_training_continues_from_the_copied_weights(decoder_checkpoint, tmp_path):
    """The first training step starts at the checkpoint's loss, not a fresh model's."""
    from conftest import read_metrics

    def first_loss(version, *extra):
        result = run_main(debug_fit_args(tmp_path / "runs", "--trainer.max_steps", "1", *extra, version=version),
                          cwd=tmp_path)
        assert result.code == 0, result.err[-3000:]
        (run,) = (tmp_path / "runs").glob(f"*/{version}")
        return read_metrics(run)["train/loss"][0]

    fresh, started = first_loss("fresh"), first_loss("init", "--run.init_from", str(decoder_checkpoint))
    assert float(started) < float(fresh)


TRAINED_DATA = ("--data.init_args.n_train", "2048")


@pytest.fixture(scope="module")
def trained_decoder(tmp_path_factory):
    """A DecoderOnly trained 300 steps on the number-words grammar: a model whose head means something."""
    root = tmp_path_factory.mktemp("trained_decoder")
    result = run_main(debug_fit_args(root / "runs", "--trainer.max_steps", "300", "--trainer.max_epochs", "-1",
                                     "--trainer.limit_train_batches", "1.0", "--model.init_args.eval_every_n_epochs", "0",
                                     *TRAINED_DATA, version="ar300"), cwd=root)
    assert result.code == 0, result.err[-3000:]
    (ckpt,) = (root / "runs").glob("*/ar300/checkpoints/last.ckpt")
    return ckpt


def test_a_shifted_causal_conversion_starts_far_below_an_unshifted_one(trained_decoder, tmp_path):
    """Converted as it is, block diffusion asks the AR head to predict the token at its own
    position: it must relearn it. Shifted (position i - 1 predicts i) with a causal context, the
    head keeps its meaning: the first training step's loss, on the same batch and noise, is far
    lower. (From a fresh network the two views start alike: the gap is the AR model's.)"""
    def first_loss(name, *view):
        cli = _build(tmp_path / name, "BlockDiffusion", "--run.init_from", str(trained_decoder), *TRAINED_DATA,
                     "--model.init_args.noise_range", "[0.5, 1.0]", *view)
        cli.datamodule.setup("fit")
        batch = next(iter(cli.datamodule.train_dataloader()))
        module = cli.model.train()
        torch.manual_seed(0)
        with torch.no_grad():
            terms = module.loss_terms(batch)
        return float(terms.loss.sum() / terms.targets.sum())

    unshifted = first_loss("unshifted")
    shifted = first_loss("shifted", "--model.init_args.shift", "true", "--model.init_args.context", "causal")
    assert shifted < 0.65 * unshifted, (shifted, unshifted)  # 3.4 against 6.0 nats when written
