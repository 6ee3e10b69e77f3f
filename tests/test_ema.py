"""EMA of the weights for every family: Lightning's own EMAWeightAveraging callback, added with
`--trainer.callbacks+=EMAWeightAveraging`; validation, checkpoints and the model left after `fit`
hold the EMA (issue 15, item 4)."""
from __future__ import annotations

import lightning as L
import pytest
import torch

from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER

DECAY = 0.5


class WeightsAfterEachStep(L.Callback):
    def __init__(self):
        self.seen: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append({k: v.detach().clone() for k, v in pl_module.model.named_parameters()})


@pytest.mark.parametrize("family", ["DecoderOnly", "EncoderDecoder", "BlockDiffusion"])
def test_the_model_after_fit_is_the_hand_computed_ema(family, tmp_path):
    from attnlab.cli.lightning_cli import AttnlabCLI

    config = tmp_path / "debug.yaml"
    config.write_text(DEBUG_YAML.read_text(encoding="utf-8").replace("attnlab.DecoderOnly", f"attnlab.{family}"),
                      encoding="utf-8")
    cli = AttnlabCLI(args=["--config", str(config), "--run.root", str(tmp_path / "runs"), "--run.wandb", "disabled",
                           *FAST_TRAINER, *DEBUG_DATA, "--trainer.max_steps", "4", "--trainer.max_epochs", "2",
                           "--trainer.callbacks+=EMAWeightAveraging", "--trainer.callbacks.decay", str(DECAY)],
                     run=False)
    recorder = WeightsAfterEachStep()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert len(recorder.seen) == 4
    ema = dict(recorder.seen[0])  # the first update copies the weights
    for weights in recorder.seen[1:]:
        ema = {k: DECAY * ema[k] + (1 - DECAY) * weights[k] for k in ema}
    final = dict(cli.model.model.named_parameters())
    for name, expected in ema.items():
        torch.testing.assert_close(final[name].detach(), expected, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(recorder.seen[-1][k], ema[k]) for k in ema)  # the EMA is not the last weights
