"""BudgetLedger: what a fit spent, so runs compare at equal cost and not only at equal steps.

Totals over the whole fit (continued exactly by a resumed run: they are saved in checkpoints):

- flops: training FLOPs, the counter behind train/mfu (`LossTerms.flops`, counted on the shapes
  each family really runs: block diffusion's x_t ⊕ x_0 (x_t alone for one block, MDLM) and its
  masked positions, the encoder).
  One optimizer step counts every micro-batch of its gradient accumulation on every rank.
- tokens: data tokens processed: the non-pad source + target tokens of the training batches,
  before each family frames them (no bos / sep / eos, no block-diffusion copy), so the same data
  counts the same for every family.
- unique_tokens: the training split's tokens counted the same way (the datamodule's
  `train_token_count`: for plain text the token file's chunks, its tail shorter than seq_len
  left out; for pairs every source and target token).
- epochs: tokens / unique_tokens, passes over the training data however batches were cut.
- train_seconds: wall time from Lightning's train start to train end (validation inside the fit
  included, set-up and sanity check not), as Lightning's max_time measures it; the time between
  a resumed run's last checkpoint and its interruption is lost, as for max_time.

A run started from another's network (`run.init_from`) inherits that checkpoint's totals (and
its steps, in summary.json): a converted model's cost includes what its network cost, so a
budget of flops, tokens or epochs covers both (a time budget counts the run's own time only).

Logged as budget/flops, budget/tokens and budget/epochs every step (float64, so they read back
exactly), written to summary.json by RunSummary, read back by attnlab.reports.runs. With a
`run.budget` (attnlab.training.budget) the ledger also sets the run's length: at setup, and for
flops and tokens again after every optimizer step from what is left at what a step costs now (a
family's cost per step may change as it trains: block diffusion's noise_search moves the share of
tokens it projects), so the run ends at the first step that reaches its budget, and the learning
rate schedule, which reads the trainer's step count, decays to that step.
"""
from __future__ import annotations

import dataclasses
import math
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_only

from attnlab.errors import ConfigError
from attnlab.training.budget import Budget, StepCost, describe_steps, max_steps_for, parse_budget
from data_modules.batch import SpecialIds

FIRST_PIECE = max(dataclasses.astuple(SpecialIds())) + 1  # a token id that is no special piece


class BudgetLedger(L.Callback):
    """Counts FLOPs, tokens and time of a fit (see the module docstring); with `budget` (a run.budget
    mapping) sets trainer.max_steps at setup so the run spends it. `replaces`: the trainer settings
    the budget overrides, named in the line the run prints."""

    def __init__(self, budget: dict | None = None, replaces: str = ""):
        self.budget: Budget | None = parse_budget(budget)
        self.replaces = replaces
        self.flops, self.tokens, self.seconds = 0, 0, 0.0
        self.unique_tokens: int | None = None
        self.plan: dict | None = None  # what the budget derived (summary.json "budget")
        self.inherited: dict | None = None  # what run.init_from's network had cost (see `inherit`)
        self._started: float | None = None
        self._cost: tuple | None = None  # (the module's cost_key, its StepCost): recomputed when the key moves
        self._planned_at: int | None = None  # the optimizer step the last plan was made after

    def inherit(self, checkpoint: dict, source: str) -> None:
        """Start the totals at those of the checkpoint a run starts from (nothing to inherit from a
        checkpoint written before the ledger)."""
        state = (checkpoint.get("callbacks") or {}).get(type(self).__name__)
        if not state:
            return
        self.flops, self.tokens, self.seconds = state["flops"], state["tokens"], state["seconds"]
        self.inherited = {"from": str(source), "steps": int(checkpoint.get("global_step", 0)),
                          "flops": state["flops"], "tokens": state["tokens"], "seconds": round(state["seconds"], 2)}

    @property
    def inherited_steps(self) -> int:
        return self.inherited["steps"] if self.inherited else 0

    # ---- the budget --------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(trainer, "datamodule", None)
        count = getattr(datamodule, "train_token_count", None)
        self.unique_tokens = count() if count is not None else None
        if self.budget is None:
            return
        if self.budget.kind == "time":
            if not any(isinstance(c, Timer) for c in trainer.callbacks):
                raise ConfigError("a time budget stops the run through Lightning's max_time: give the Trainer "
                                  f"max_time={self.budget.value!r} (attnlab fit does)")
            self.plan = {"time": self.budget.value, "max_time_seconds": self.budget.seconds}
            self._say(f"budget: time {self.budget.value} -> max_time {self.budget.seconds:,} s (max_steps -1)")
            return
        if not hasattr(datamodule, "train_batches") or not hasattr(pl_module, "expected_flops"):
            raise ConfigError(f"run.budget {self.budget.kind} needs an attnlab family and data module, which "
                              "know a training step's cost")
        cost = self._step_cost(trainer, pl_module)
        max_steps = max_steps_for(self._left(), cost)
        # Public loop attributes; with max_epochs -1, estimated_stepping_batches (the schedule's
        # length, FamilyModule.schedule_horizon) is max_steps.
        trainer.fit_loop.epoch_loop.max_steps = max_steps
        trainer.fit_loop.max_epochs = -1
        self.plan = {self.budget.kind: self.budget.value, "max_steps": max_steps, "flops_per_step": cost.flops,
                     "tokens_per_step": cost.tokens, "steps_per_epoch": cost.steps_per_epoch}
        self._say(describe_steps(self.budget, max_steps, cost))

    def _step_cost(self, trainer, pl_module) -> StepCost:
        """A step's cost over this rank's epoch of batches, rank 0's on every rank (so all stop at one
        step), computed again only when the module's `cost_key` says its cost changed. The key must
        change on every rank at once (noise_search reduces its choice over ranks), as the broadcast
        is a collective."""
        key = pl_module.cost_key()
        if self._cost is None or self._cost[0] != key:
            cost = step_cost(pl_module, trainer.datamodule.train_batches(), trainer.world_size,
                             trainer.accumulate_grad_batches)
            self._cost = (key, trainer.strategy.broadcast(cost, src=0))
        return self._cost[1]

    def _replan(self, trainer, pl_module) -> None:
        """A flops or tokens budget: the run's last step becomes the first at which the ledger reaches
        the budget, at what a step costs now; so it spends the budget to within one step however its
        cost moved (an epochs budget is a step count already; time is Lightning's max_time)."""
        if self.budget is None or self.budget.kind not in ("flops", "tokens"):
            return
        self._planned_at = trainer.global_step
        cost = self._step_cost(trainer, pl_module)
        left = self.budget.value - (self.flops if self.budget.kind == "flops" else self.tokens)
        max_steps = trainer.global_step + (max_steps_for(Budget(self.budget.kind, left), cost) if left > 0 else 0)
        trainer.fit_loop.epoch_loop.max_steps = max_steps
        self.plan.update(max_steps=max_steps, flops_per_step=cost.flops, tokens_per_step=cost.tokens)

    def _left(self) -> Budget:
        """The budget less what the inherited network spent (ConfigError when nothing is left)."""
        if not self.inherited:
            return self.budget
        spent = {"flops": self.flops, "tokens": self.tokens,
                 "epochs": self.tokens / self.unique_tokens if self.unique_tokens else 0.0}[self.budget.kind]
        if spent >= self.budget.value:
            raise ConfigError(f"run.budget {self.budget.describe()}: run.init_from {self.inherited['from']} already "
                              f"spent {spent:.4g} of it; raise the budget or start from an earlier checkpoint")
        return Budget(self.budget.kind, self.budget.value - spent)

    @rank_zero_only
    def _say(self, line: str) -> None:
        print(line + (f"; replaces {self.replaces}" if self.replaces else ""), flush=True)

    # ---- counting ----------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()
        self._replan(trainer, pl_module)  # a resumed run: from its restored spend and cost

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds, self._started = self.elapsed(), None

    def elapsed(self) -> float:
        return self.seconds + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        flops = getattr(pl_module, "step_flops", 0)
        tokens = int(batch["source_lengths"].sum() + batch["target_lengths"].sum())
        if trainer.world_size > 1:  # every rank's micro-batch: the totals are the run's, on every rank
            both = torch.tensor([flops, tokens], dtype=torch.float64, device=pl_module.device)
            flops, tokens = trainer.strategy.reduce(both, reduce_op="sum").tolist()
            tokens = int(tokens)
        self.flops += flops
        self.tokens += tokens
        logged = {"budget/flops": self.flops, "budget/tokens": self.tokens}
        if self.unique_tokens:
            logged["budget/epochs"] = self.tokens / self.unique_tokens
        pl_module.log_dict({k: torch.tensor(float(v), dtype=torch.float64) for k, v in logged.items()},
                           on_step=True, on_epoch=False, batch_size=1)
        if trainer.global_step != self._planned_at:  # an optimizer step was taken: not inside an accumulation
            self._replan(trainer, pl_module)

    def totals(self) -> dict:
        """summary.json's "ledger"."""
        totals = {"flops": self.flops, "tokens": self.tokens, "unique_tokens": self.unique_tokens,
                  "epochs": self.tokens / self.unique_tokens if self.unique_tokens else None,
                  "train_seconds": round(self.elapsed(), 2)}
        return {**totals, "inherited": self.inherited} if self.inherited else totals

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"flops": self.flops, "tokens": self.tokens, "seconds": self.elapsed()}
        return {**state, "inherited": self.inherited} if self.inherited else state

    def load_state_dict(self, state_dict: dict) -> None:
        self.flops, self.tokens = state_dict["flops"], state_dict["tokens"]
        self.seconds = state_dict["seconds"]
        self.inherited = state_dict.get("inherited")


def length_batch(lengths: list[tuple[int, int]], pad: int) -> dict:
    """A schema batch with rows of these (source, target) lengths: the shapes a family frames and
    counts, without the data (its values never matter to the count)."""
    source = torch.tensor([s for s, _ in lengths], dtype=torch.long)
    target = torch.tensor([t for _, t in lengths], dtype=torch.long)

    def padded(n: torch.Tensor) -> torch.Tensor:
        width = int(n.max()) if len(n) else 0
        return torch.where(torch.arange(width)[None, :] < n[:, None], FIRST_PIECE, pad)

    return {"source": padded(source), "source_lengths": source, "target": padded(target), "target_lengths": target}


@torch.no_grad()
def step_cost(module, batches, world: int, accumulate: int) -> StepCost:
    """Mean FLOPs and tokens of one optimizer step over an epoch, from this rank's batches as
    (how many, their rows' (source, target) lengths), as `TokenizedDataModule.train_batches` gives:
    each batch's FLOPs are the family's own count of its shapes (`expected_flops`)."""
    flops = tokens = 0.0
    count = 0
    for repeats, lengths in batches:
        flops += repeats * module.expected_flops(length_batch(lengths, module.special.pad))
        tokens += repeats * sum(s + t for s, t in lengths)
        count += repeats
    steps = max(1, math.ceil(count / accumulate))
    return StepCost(world * flops / steps, world * tokens / steps, steps)
