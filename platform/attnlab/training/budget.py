"""Matched budgets: `run.budget` names what runs hold equal, and each run derives its length from it.

"The same number of steps" is not the same spend: block diffusion's layers see every position
twice (x_t ⊕ x_0) when there is more than one block, an encoder-decoder also runs its encoder.
A budget of one of

    flops: F     training FLOPs (the ledger's counter, attnlab.training.ledger)
    tokens: T    data tokens processed (non-pad source + target tokens of the training batches)
    epochs: E    passes over the training split's tokens
    time: "DD:HH:MM:SS"   wall time of training (Lightning's max_time)

gives each run its own trainer.max_steps from its own cost per optimizer step: flops ->
ceil(F / FLOPs per step), tokens -> ceil(T / tokens per step), epochs -> ceil(E × optimizer steps
per epoch). It is set before the optimizer and the LR schedule are built, so the schedule ends
where the budget does (BudgetLedger.setup). A time budget sets max_time with max_steps and
max_epochs -1 instead; no step count is known then, so the cosine schedule cannot be used with it.

The budget wins over trainer.max_steps / max_epochs / max_time of the config (the run prints what
it replaced): a sweep's base configs set them, and a budget is what a sweep of budgets varies.

This module parses and checks budgets only (no torch), so sweep files are checked before any run.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from attnlab.errors import ConfigError

KINDS = ("flops", "tokens", "epochs", "time")
EXAMPLE = "{flops: 2.0e13}"
TIME_FORMAT = re.compile(r"^(\d+):(\d+):(\d+):(\d+)$")


@dataclass(frozen=True)
class Budget:
    kind: str  # one of KINDS
    value: float | str  # a positive number, or DD:HH:MM:SS for time

    def as_dict(self) -> dict:
        return {self.kind: self.value}

    @property
    def seconds(self) -> int:
        """A time budget in seconds."""
        days, hours, minutes, seconds = (int(v) for v in TIME_FORMAT.match(str(self.value)).groups())
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds

    def describe(self) -> str:
        return f"{self.kind} {self.value:g}" if self.kind == "epochs" else \
            f"{self.kind} {self.value}" if self.kind == "time" else f"{self.kind} {scientific(self.value)}"


def scientific(x: float) -> str:
    """2.0e13, not Python's 2.0e+13."""
    mantissa, exponent = f"{x:.2e}".split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}{'0' if mantissa.endswith('.') else ''}e{int(exponent)}"


def parse_budget(raw, where: str = "run.budget") -> Budget | None:
    """A budget mapping (None: no budget), checked: exactly one known key, a positive amount, a
    time that Lightning's max_time reads. Amounts may come as strings (PyYAML reads 2.0e13 as one)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}={raw!r} must be a mapping of one of {', '.join(KINDS)} to its amount, "
                          f"e.g. {EXAMPLE}")
    if len(raw) != 1:
        raise ConfigError(f"{where}={raw!r} names {len(raw)} budgets; give exactly one of {', '.join(KINDS)}, "
                          f"e.g. {EXAMPLE}")
    (kind, value), = raw.items()
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown budget {kind!r}; a budget is one of {', '.join(KINDS)}, e.g. {EXAMPLE}")
    if kind == "time":
        match = TIME_FORMAT.match(value) if isinstance(value, str) else None
        budget = Budget(kind, value)
        if match is None or budget.seconds <= 0:
            raise ConfigError(f"{where}.time={value!r} must be a duration DD:HH:MM:SS longer than zero (days, "
                              "hours, minutes, seconds, as trainer.max_time), e.g. '00:02:00:00'; quote it in YAML")
        return budget
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not number > 0 or math.isinf(number):
        raise ConfigError(f"{where}.{kind}={value!r} must be a number > 0, e.g. {{{kind}: "
                          f"{'2.0e13' if kind == 'flops' else '1.0e8' if kind == 'tokens' else '3'}}}")
    return Budget(kind, number)


@dataclass(frozen=True)
class StepCost:
    """What one optimizer step costs on average over an epoch (accumulate_grad_batches micro-batches
    on each of world_size ranks), and how many optimizer steps an epoch takes."""

    flops: float
    tokens: float
    steps_per_epoch: int


def max_steps_for(budget: Budget, cost: StepCost) -> int:
    """The optimizer steps that spend `budget` at `cost` per step (at least one; rounded up, so a
    run spends at least its budget, and less than one step more on average)."""
    if budget.kind == "flops":
        steps = budget.value / cost.flops
    elif budget.kind == "tokens":
        steps = budget.value / cost.tokens
    elif budget.kind == "epochs":
        steps = budget.value * cost.steps_per_epoch
    else:
        raise ValueError("a time budget has no step count")
    return max(1, math.ceil(round(steps, 6)))  # 3.0000000001 steps are 3


def describe_steps(budget: Budget, max_steps: int, cost: StepCost) -> str:
    """The line a run prints: what was matched, and how."""
    per = {"flops": f"{scientific(cost.flops)} FLOPs/step", "tokens": f"{cost.tokens:,.0f} tokens/step",
           "epochs": f"{cost.steps_per_epoch:,} steps/epoch"}[budget.kind]
    return f"budget: {budget.describe()} -> max_steps {max_steps:,} ({per})"


def check_budget_warmup(budget: Budget, warmup_steps: int, warmup_ratio: float | None, where: str = "") -> None:
    """A budget of flops, tokens or epochs derives each run's steps, so warmup is a share of them
    (optimizer.warmup_ratio): a fixed count would be a different share of every family's run. A
    time budget knows no step count, so there warmup can only be a count. `where`: what to name
    (a sweep point) before the message."""
    if budget.kind != "time" and warmup_ratio is None and warmup_steps > 0:
        raise ConfigError(f"{where}run.budget {budget.describe()} derives each run's optimizer steps, so warmup must be "
                          "a share of them: set model.init_args.optimizer.warmup_ratio (e.g. 0.1) instead of "
                          f"warmup_steps={warmup_steps}")
    if budget.kind == "time" and warmup_ratio:
        raise ConfigError(f"{where}run.budget time={budget.value!r} gives no step count for "
                          f"model.init_args.optimizer.warmup_ratio={warmup_ratio} to be a share of: give "
                          "warmup_steps and set warmup_ratio to null")
