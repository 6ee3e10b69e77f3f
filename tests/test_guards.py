"""When a run goes wrong it stops with one clear line: a non-finite loss (issue 7 item 4)."""
from __future__ import annotations

import re

import pytest
import torch

from conftest import debug_fit_args


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(cli, tmp_path):
    """A real cause: an absurd learning rate. Step 0's loss is finite (initial weights), its Adam
    update blows the weights up to ~1e29, and step 1's loss is NaN. The run must stop with exit 2
    naming the step, before the poisoned update, and last.ckpt must hold step 1's finite weights."""
    args = debug_fit_args(
        tmp_path, "--trainer.max_steps", "4", "--model.init_args.optimizer.lr", "1e30",
        # the platform's last.ckpt after every step, and a step-named copy of each to compare with
        "--run.checkpoint_every_n_steps", "1",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps", "1", "--trainer.callbacks.save_top_k", "-1",
        "--trainer.callbacks.filename", "{step}",
        version="nan",
    )
    result = cli(*args)
    assert result.code == 2, result.err[-3000:]
    lines = [line for line in result.err.splitlines() if line.startswith("attnlab: error:")]
    assert len(lines) == 1, result.err[-3000:]
    line = lines[0]
    assert re.search(r"training loss is (nan|inf|-inf) at global step 1 \(epoch 0, batch 1\)", line), line
    assert "learning rate" in line and "gradient_clip_val" in line and "32-true" in line
    assert "Traceback" not in result.err

    checkpoints = tmp_path / "debug" / "nan" / "checkpoints"
    assert re.search(r"last good checkpoint is kept: \S*last\.ckpt", line), line
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step=1.ckpt"]  # nothing after step 1
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    good = torch.load(checkpoints / "step=1.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == good["global_step"] == 1
    assert last["state_dict"].keys() == good["state_dict"].keys()
    for key, value in last["state_dict"].items():
        if value.is_floating_point():
            assert torch.isfinite(value).all(), key
        assert torch.equal(value, good["state_dict"][key]), key


def test_a_finite_loss_trains_as_before(cli, tmp_path):
    result = cli(*debug_fit_args(tmp_path, version="ok"))
    assert result.code == 0, result.err[-3000:]
    assert (tmp_path / "debug" / "ok" / "checkpoints" / "last.ckpt").is_file()


def test_every_rank_stops_when_one_rank_has_a_non_finite_loss():
    """The flag is reduced over ranks (any): a rank whose own loss is finite stops at the same step."""
    from types import SimpleNamespace

    import pytest

    from attnlab.training.guards import NonFiniteLossError, NonFiniteLossGuard

    asked = []

    def reduce_boolean_decision(decision, all=True):
        asked.append((decision, all))
        return True  # another rank saw NaN

    trainer = SimpleNamespace(world_size=2, global_step=7, current_epoch=3, checkpoint_callbacks=[],
                              strategy=SimpleNamespace(reduce_boolean_decision=reduce_boolean_decision))
    guard = NonFiniteLossGuard()
    guard.on_train_batch_start(trainer, None, None, 5)
    with pytest.raises(NonFiniteLossError, match=r"not finite on another rank at global step 7 \(epoch 3, batch 5\)"):
        guard.on_before_backward(trainer, None, torch.tensor(1.5))
    assert asked == [(False, False)]
    trainer.strategy.reduce_boolean_decision = lambda decision, all=True: decision
    guard.on_before_backward(trainer, None, torch.tensor(1.5))  # finite everywhere: nothing happens


@pytest.mark.parametrize("message, expected", [
    ("Application timeout caused pair closure", "stopped answering"),  # gloo, from a barrier or all-reduce
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234", "died"),
    ("[c10d] Timed out waiting 20000ms for recv operation to complete", "stopped answering"),
    ("CUDA out of memory", None),
])
def test_distributed_failures_are_recognised_by_their_backend_messages(message, expected):
    """What the surviving ranks raise when another one dies or hangs becomes one line; anything
    else stays an ordinary error (a traceback)."""
    from attnlab.distributed.failures import describe_distributed_failure

    line = describe_distributed_failure(RuntimeError(message))
    assert (line is None) if expected is None else (expected in line and message.splitlines()[0][:40] in line)
