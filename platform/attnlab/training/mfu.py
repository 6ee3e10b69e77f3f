"""Model FLOPs utilisation while training: how far a run is from what its hardware can do.

The peak is the data sheet's on a known GPU and a measured one elsewhere (the best of a few
square matmuls: a CPU has no data sheet we can trust). Lightning's ThroughputMonitor would
need FLOPs per batch as a callback argument and a data-sheet peak, which CPUs lack; the family
already knows its FLOPs per step (`LossTerms.flops`), so the module logs MFU itself.
"""
from __future__ import annotations

import functools

import torch
from lightning.pytorch.utilities import rank_zero_warn

from attnlab.training.flops import measured_peak, table_peak

# Smaller than the bench's sizes, and no larger size started after FIT_PEAK_SECONDS: measured
# once per process, it should cost about a second, whatever the dtype.
FIT_PEAK_SIZES = {"cpu": (256, 512, 1024)}
FIT_PEAK_SECONDS = 1.0
# A measured peak is one second on a machine shared with other work: measured in a slow second,
# it reads low, and a real step reached 1.0x of it in CI. Only a step this far above it proves
# the peak wrong rather than noisy; a data sheet's peak has no noise, so any step above it does.
MEASURED_PEAK_NOISE = 1.5


def precision_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision string ("bf16-mixed", "16-true", "32", ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    return torch.float16 if precision.startswith("16") else torch.float32


@functools.lru_cache(maxsize=None)
def _measured(device: torch.device, dtype: torch.dtype) -> float:
    """Measured once per process and device. Its random matrices come from a forked RNG: drawn from
    the fit's own stream, they would shift the first fit of a process against every later one."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        return measured_peak(device, dtype, FIT_PEAK_SIZES.get(device.type), seconds=FIT_PEAK_SECONDS)


class MFU:
    """FLOP/s → fraction of the run's one peak, fixed for the whole run (the data sheet's, or the one
    measured at the start of the fit), so every step of a run is divided by the same number.

    A step faster than the peak logs its true ratio (> 1), not a hidden one, and `above_peak`
    counts such steps. A step faster than the data sheet's peak, or `MEASURED_PEAK_NOISE` times a
    measured one, proves the peak wrong: rank zero warns once, in one line."""

    def __init__(self, peak: float, source: str):
        self.peak, self.source = peak, source
        self.above_peak, self.warned = 0, False
        self.warn_above = peak * (MEASURED_PEAK_NOISE if source == "measured" else 1.0)

    @classmethod
    def for_device(cls, device: torch.device, precision: str) -> "MFU":
        table = table_peak(device, precision)
        if table:
            return cls(table, "data sheet")
        return cls(_measured(device, precision_dtype(precision)), "measured")

    def __call__(self, flops_per_s: float) -> float:
        if flops_per_s > self.warn_above and not self.warned:
            self.warned = True
            rank_zero_warn(f"a training step ran at {flops_per_s / 1e12:.3f} TFLOP/s, above the {self.source} "
                           f"peak of {self.peak / 1e12:.3f} TFLOP/s that train/mfu divides by: the {self.source} "
                           "peak is below a real step's rate, so train/mfu reads above 1 for such steps")
        self.above_peak += flops_per_s > self.peak
        return flops_per_s / self.peak
