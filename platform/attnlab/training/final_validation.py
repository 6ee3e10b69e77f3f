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
the run) it does nothing there.

`check_val_every_n_epoch` N skips the epochs that are not a multiple of N, the last one too (a run
of 5 epochs with N=2 ended 1 epoch past its last validation), and Lightning checks it before
`should_stop`. So in the run's last epoch (by max_epochs), and at the step that reaches
max_steps, the trainer's `check_val_every_n_epoch` (a public attribute, read at every check) is
set to 1: the run's end is validated whatever N is.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import Callback


class FinalValidation(Callback):
    """Validates the run's end: `trainer.should_stop` at the step that reaches `trainer.max_steps`, and
    validation in the last epoch whatever `check_val_every_n_epoch` says (see the module docstring)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1:
            self._validate_this_epoch(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
            self._validate_this_epoch(trainer)

    @staticmethod
    def _validate_this_epoch(trainer) -> None:
        if trainer.check_val_every_n_epoch not in (None, 1):
            trainer.check_val_every_n_epoch = 1
