"""Checkpoint averaging averages parameters: the function, the CLI verb and the callback."""
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab import EncoderDecoder
from attnlab.checkpoints.averaging import CheckpointAveraging, average_state_dicts
from data_modules import NumberWordsDataModule


def test_average_state_dicts_is_the_elementwise_mean():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "steps": torch.tensor(5)}
    out = average_state_dicts([a, b])
    torch.testing.assert_close(out["w"], torch.tensor([2.0, 4.0]))
    assert out["steps"].item() == 5  # integer buffers come from the last checkpoint


def test_callback_and_cli_verb_average_the_last_epochs(tmp_path, cli):
    data = NumberWordsDataModule(n_train=64, n_val=16, n_test=16, vocab_size=300, batch_size=32,
                                 cache_dir=str(tmp_path / "cache"))
    model = EncoderDecoder(backbone=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0),
                           vocab_size=data.vocab_size, eval_every_n_epochs=0)
    every_epoch = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1,
                                  filename="{epoch}")
    trainer = L.Trainer(max_epochs=3, callbacks=[every_epoch, CheckpointAveraging(last_k=2)], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(model, data)
    epochs = [torch.load(tmp_path / "ckpt" / f"epoch={e}.ckpt", weights_only=True)["state_dict"] for e in (1, 2)]
    averaged = torch.load(tmp_path / "ckpt" / "averaged.ckpt", weights_only=True)
    key = "model.decoder.layers.0.ffn.inner.up.weight"
    torch.testing.assert_close(averaged["state_dict"][key], (epochs[0][key] + epochs[1][key]) / 2)
    assert averaged["attnlab"]["family"] == "encoder_decoder"
    assert not torch.equal(averaged["state_dict"][key], epochs[1][key])
    torch.testing.assert_close(model.state_dict()[key], epochs[1][key])  # the live model is restored

    out = tmp_path / "cli_avg.ckpt"
    paths = [tmp_path / "ckpt" / f"epoch={e}.ckpt" for e in (1, 2)]
    result = cli("average", *paths, "--output", out)
    assert result.code == 0, result.err
    from_cli = torch.load(out, weights_only=True)["state_dict"][key]
    torch.testing.assert_close(from_cli, averaged["state_dict"][key])
    again = cli("average", *paths, "--output", out)  # never overwrite what the user has
    assert again.code == 2 and "exists" in again.err
