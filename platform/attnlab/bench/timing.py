"""Interleaved timing: every contender runs one step per round, so a slow spell of the machine
(another process, thermal throttling) hits all of them alike and the ratios stay fair."""
from __future__ import annotations

import time
from typing import Callable

import torch

from attnlab.training.flops import synchronize


def interleaved_rounds(steps: dict[str, Callable[[], None]], warmup: int, rounds: int,
                       device: torch.device, progress: Callable[[str], None] = print,
                       first: dict[str, float] | None = None) -> dict[str, list[float]]:
    """Seconds of each step in each round (its list has one entry a round); `warmup` calls each
    first (allocator, compile), the first of which `first` (if given) receives the seconds of."""
    for name, step in steps.items():
        progress(f"  warming up {name}")
        for call in range(warmup):
            started = time.perf_counter()
            step()
            synchronize(device)
            if call == 0 and first is not None:
                first[name] = time.perf_counter() - started
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(rounds):
        for name, step in steps.items():
            synchronize(device)
            started = time.perf_counter()
            step()
            synchronize(device)
            times[name].append(time.perf_counter() - started)
        progress(f"  round {round_ + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.3f}s" for n, t in times.items()))
    return times
