"""A validation at the last step of a run that `max_steps` stops in the middle of an epoch.

Lightning validates at its validation interval (by default the epoch's last batch) only, so a run
stopped by `trainer.max_steps` mid-epoch ended with its last steps never validated: the best
checkpoint and early stopping never saw them, and the last val/nll row was older than the weights.

Lightning 2.6 also validates at a step when `trainer.should_stop` is set and the fit may stop
(`min_epochs` / `min_steps` met; `_should_check_val_fx` in loops/training_epoch_loop.py). That
decision is taken once per batch, after every `on_train_batch_end` hook, so setting `should_stop`
at the step that reaches `max_steps` adds a validation where none would run and never a second one
where one already runs (a validation step, the epoch's last batch). The run stops at that step
either way (`max_steps`), so `should_stop` changes nothing else. With `max_steps` -1 (epochs bound
the run) it does nothing, and it leaves the epochs that `check_val_every_n_epoch` skips unvalidated.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import Callback


class FinalValidation(Callback):
    """Sets `trainer.should_stop` at the step that reaches `trainer.max_steps` (see the module docstring)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
