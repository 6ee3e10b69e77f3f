"""Checkpoint averaging averages parameters: the function, the CLI verb and the callback."""
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab import EncoderDecoder
from attnlab.checkpoints.averaging import CheckpointAveraging, average_state_dicts
from data_modules import NumberWordsDataModule


def test_average_state_dicts_is_the_elementwise_mean_of_the_parameters():
    a = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3), "noise": torch.tensor([0.1, 0.5])}
    b = {"w": torch.tensor([3.0, 6.0]), "steps": torch.tensor(5), "noise": torch.tensor([0.3, 0.9])}
    out = average_state_dicts([a, b], parameters={"w"})
    torch.testing.assert_close(out["w"], torch.tensor([2.0, 4.0]))
    assert out["steps"].item() == 5  # buffers come from the newest checkpoint, floating ones too
    assert torch.equal(out["noise"], b["noise"])
    assert torch.equal(average_state_dicts([b, a], parameters={"w"}, newest=0)["noise"], b["noise"])


def test_the_cli_verb_keeps_the_newest_checkpoints_buffers_and_averages_the_parameters(tmp_path, cli, monkeypatch):
    """Block diffusion's `train_noise` (the range its noise search chose) is a buffer: the average
    takes the newest checkpoint's, by step, not the last named nor a mean of ranges (issue 30)."""
    from attnlab import BlockDiffusion
    from attnlab.checkpoints import averaging
    from attnlab.checkpoints.averaging import parameter_names

    written, atomic_save = [], averaging.atomic_torch_save
    monkeypatch.setattr(averaging, "atomic_torch_save", lambda obj, path: written.append(Path(path)) or atomic_save(obj, path))
    noise = {10: [0.1, 0.5], 20: [0.3, 0.8], 30: [0.2, 0.9]}
    states, paths = {}, []
    for step in (10, 30, 20):  # the newest is named second
        torch.manual_seed(step)
        module = BlockDiffusion(backbone=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64), vocab_size=60,
                                noise_range=noise[step])
        assert parameter_names(module) == set(module.state_dict()) - {"train_noise"}
        states[step] = module.state_dict()
        paths.append(tmp_path / f"step={step}.ckpt")
        torch.save({"state_dict": states[step], "hyper_parameters": dict(module.hparams), "global_step": step,
                    "attnlab": {"family": "block_diffusion"}}, paths[-1])
    result = cli("average", *paths, "--output", tmp_path / "avg.ckpt")
    assert result.code == 0, result.err
    assert written == [tmp_path / "avg.ckpt"]
    averaged = torch.load(tmp_path / "avg.ckpt", weights_only=True)
    assert averaged["global_step"] == 30 and averaged["hyper_parameters"]["noise_range"] == noise[30]
    assert torch.equal(averaged["state_dict"]["train_noise"], states[30]["train_noise"])
    for key in parameter_names(module):
        torch.testing.assert_close(averaged["state_dict"][key], sum(s[key] for s in states.values()) / 3, msg=key)


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


def _tiny_fit(tmp_path, max_steps, averaging, checkpoint):
    data = NumberWordsDataModule(n_train=64, n_val=16, n_test=16, vocab_size=300, batch_size=16,
                                 cache_dir=str(tmp_path / "cache"))
    model = EncoderDecoder(backbone=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0),
                           vocab_size=data.vocab_size, eval_every_n_epochs=0)
    trainer = L.Trainer(max_steps=max_steps, callbacks=[checkpoint, averaging], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
    trainer.fit(model, data)
    return torch.load(tmp_path / "ckpt" / "averaged.ckpt", weights_only=True)["state_dict"]


def test_averaging_by_update_count_averages_the_last_multiples_of_n_steps(tmp_path, cli, monkeypatch):
    """10 steps (4 an epoch, so the snapshots cross epoch ends), a snapshot every 3 steps, the last 2:
    the average is the mean of the weights after steps 6 and 9, not of step 10's or an epoch end's.
    `attnlab average` of the snapshot files writes the same checkpoint. Every file is written whole
    (atomic_torch_save)."""
    from attnlab.checkpoints import averaging

    written, atomic_save = [], averaging.atomic_torch_save
    monkeypatch.setattr(averaging, "atomic_torch_save", lambda obj, path: written.append(Path(path).name) or atomic_save(obj, path))
    every_step = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=1, filename="{step}",
                                 save_last=True)
    averaged = _tiny_fit(tmp_path, 10, CheckpointAveraging(last_k=2, every_n_steps=3), every_step)
    steps = {s: torch.load(tmp_path / "ckpt" / f"step={s}.ckpt", weights_only=True)["state_dict"] for s in (6, 9, 10)}
    for key, value in averaged.items():
        if torch.is_floating_point(value):
            torch.testing.assert_close(value, (steps[6][key] + steps[9][key]) / 2, msg=key)
    key = "model.decoder.layers.0.ffn.inner.up.weight"
    assert not torch.allclose(averaged[key], (steps[9][key] + steps[10][key]) / 2)
    # On disk: the window (6, 9), and 3, which the checkpoint of step 8, saved before 9 came, names.
    assert sorted(p.name for p in (tmp_path / "ckpt" / "averaging").iterdir()) == ["step=3.pt", "step=6.pt", "step=9.pt"]
    snapshots = [tmp_path / "ckpt" / "averaging" / f"step={s}.pt" for s in (6, 9)]
    result = cli("average", *snapshots, "--output", tmp_path / "from_snapshots.ckpt")
    assert result.code == 0, result.err
    assert written == ["step=3.pt", "step=6.pt", "step=9.pt", "from_snapshots.ckpt"]
    from_snapshots = torch.load(tmp_path / "from_snapshots.ckpt", weights_only=True)
    assert from_snapshots["attnlab"]["family"] == "encoder_decoder"
    for key, value in averaged.items():
        torch.testing.assert_close(from_snapshots["state_dict"][key], value, msg=key)
    (tmp_path / "ckpt" / "last.ckpt").unlink()
    orphan = cli("average", *snapshots, "--output", tmp_path / "orphan.ckpt")
    assert orphan.code == 2 and "last.ckpt" in orphan.err and not (tmp_path / "orphan.ckpt").exists()


def test_a_snapshot_the_last_saved_checkpoint_names_stays_on_disk(tmp_path):
    """Snapshots every step, last 2, a checkpoint every 4 steps: after step 10 the window is (9, 10),
    and the checkpoint of step 8 names (7, 8), which a resume from it needs: those four stay."""
    every_4 = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=4, filename="{step}",
                              save_on_train_epoch_end=False)
    _tiny_fit(tmp_path, 10, CheckpointAveraging(last_k=2, every_n_steps=1), every_4)
    state = torch.load(tmp_path / "ckpt" / "step=8.ckpt", weights_only=True)["callbacks"]
    assert [v for k, v in state.items() if k.startswith("CheckpointAveraging")] == [{"steps": [7, 8]}]
    names = sorted(p.name for p in (tmp_path / "ckpt" / "averaging").iterdir())
    assert names == ["step=10.pt", "step=7.pt", "step=8.pt", "step=9.pt"]


def test_bad_averaging_settings_are_refused():
    import pytest

    from attnlab.errors import AttnlabError

    for kwargs in ({"last_k": 0}, {"every_n_steps": 0}, {"every_n_steps": 2.5}, {"last_k": True}):
        with pytest.raises(AttnlabError, match="CheckpointAveraging"):
            CheckpointAveraging(**kwargs)


def test_the_callback_keeps_the_newest_snapshots_buffers(tmp_path):
    """averaged.ckpt of a block diffusion fit whose train_noise changes every step: the newest
    snapshot's range, and the mean of the snapshots' parameters."""
    from attnlab import BlockDiffusion

    class MoveNoise(L.Callback):  # before CheckpointAveraging: each snapshot holds its step's range
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pl_module.train_noise.copy_(torch.tensor([0.01 * trainer.global_step, 1.0]))

    data = NumberWordsDataModule(n_train=64, n_val=16, n_test=16, vocab_size=300, batch_size=16,
                                 cache_dir=str(tmp_path / "cache"))
    model = BlockDiffusion(backbone=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0),
                           vocab_size=data.vocab_size, eval_every_n_epochs=0)
    every_step = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=1, filename="{step}")
    trainer = L.Trainer(max_steps=5, callbacks=[MoveNoise(), every_step, CheckpointAveraging(last_k=2, every_n_steps=2)],
                        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        devices=1, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model, data)
    averaged = torch.load(tmp_path / "ckpt" / "averaged.ckpt", weights_only=True)["state_dict"]
    steps = {s: torch.load(tmp_path / "ckpt" / f"step={s}.ckpt", weights_only=True)["state_dict"] for s in (2, 4)}
    assert torch.equal(averaged["train_noise"], torch.tensor([0.04, 1.0]))
    key = "model.stack.layers.0.ffn.inner.up.weight"
    torch.testing.assert_close(averaged[key], (steps[2][key] + steps[4][key]) / 2)
