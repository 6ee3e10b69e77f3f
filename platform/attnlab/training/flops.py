"""Analytic training FLOPs of each family, and the peak matmul rate they are divided by (MFU).

The bench divides FLOPs per token by it, and training logs train/mfu from `FlopCounter`
(used by both, so the two cannot drift apart).

Matmuls only (norms, softmax and embeddings lookups are noise next to them); a training step
costs 3x the forward (backward = 2x). Attention is counted dense, as nanoGPT and PaLM do:
causal or block masks do not halve it.
"""
from __future__ import annotations

import time

import torch
from torch import nn

# Dense (no sparsity) peak FLOP/s from the vendors' data sheets, by a substring of
# torch.cuda.get_device_name(). bf16 on tensor cores; fp32 without TF32.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp32": 51e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},  # SXM
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp32": 91.6e12},
    "L4": {"bf16": 121e12, "fp32": 30.3e12},
    "A10G": {"bf16": 70e12, "fp32": 31.2e12},
    "RTX 4090": {"bf16": 165e12, "fp32": 82.6e12},
    "V100": {"bf16": 0.0, "fp32": 15.7e12},  # no bf16 tensor cores
}


def table_peak(device: torch.device, precision: str) -> float | None:
    """The data-sheet peak of a known GPU (None for CPUs and unknown GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_FLOPS.items():  # ordered: "H100 PCIe" before "H100"
        if key in name:
            half = precision.startswith("bf16") or precision.startswith("16")
            return peaks["bf16" if half else "fp32"] or None
    return None


# Square matmul sizes the peak is measured at: the best of them is the peak, as no one size is
# fastest on every machine (one size alone can run slower than the model steps divided by it,
# which would print MFU above 100 %).
PEAK_SIZES = {"cpu": (256, 512, 1024, 2048), "cuda": (4096, 8192, 16384)}


def matmul_step(size: int, device: torch.device, dtype: torch.dtype):
    """One size² × size² matmul as a callable, and the FLOPs it does (for interleaved timing)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return (lambda: a @ b), 2 * size**3


def measured_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] | None = None,
                  repeats: int = 5, seconds: float | None = None) -> float:
    """FLOP/s of the fastest of several square matmuls on this device (best of `repeats` calls
    each): what the hardware gives our kernels, the denominator of MFU where no data sheet is.
    `seconds`: no larger size is started once this much time has gone (a dtype the device has no
    fast kernels for, such as bf16 on many CPUs, would otherwise spend long on the largest)."""
    best, started_all = 0.0, time.perf_counter()
    for size in sorted(sizes or PEAK_SIZES.get(device.type, PEAK_SIZES["cuda"])):
        if seconds is not None and best and time.perf_counter() - started_all > seconds:
            break
        step, flops = matmul_step(size, device, dtype)
        step()  # warm-up (kernel selection, allocation)
        for _ in range(repeats):
            synchronize(device)
            started = time.perf_counter()
            step()
            synchronize(device)
            best = max(best, flops / (time.perf_counter() - started))
    return best


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def linear_params(module: nn.Module) -> int:
    """Weights of the Linear layers inside `module` (the matmul parameters)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def cross_kv_params(stack: nn.Module) -> int:
    """Cross-attention key/value projection weights: they run on source tokens, not target ones."""
    return sum(attn.kv_proj.weight.numel() for attn in stack.attention_modules("cross"))


class FlopCounter:
    """Training FLOPs (forward + backward) of one padded batch of a family's model.

    Per position through the layers 6·N (N: their matmul weights); per query-key pair 12·d per
    layer (scores and values, dense: masks do not halve it); per position reaching the output
    projection 6·V·d. `decoder`: the stack every target position runs through; `encoder`: a stack
    that runs on the source, where the decoder's cross-attention key/value projections run too.
    Which shapes a family's step runs is the family's to say (`FamilyModule.count_flops`,
    `flops_per_token`; block diffusion's layers see x_t ⊕ x_0 as one sequence).
    Counted on the padded shapes the kernels run on, so it equals torch's FlopCounterMode.
    """

    def __init__(self, decoder: nn.Module, vocab: int, encoder: nn.Module | None = None):
        self.d, self.vocab = decoder.cfg.d_model, vocab
        self.decoder_layers, self.decoder_params = len(decoder.layers), linear_params(decoder.layers)
        self.cross_kv_params = cross_kv_params(decoder)  # 0 without cross-attention
        self.encoder_layers = len(encoder.layers) if encoder is not None else 0
        self.encoder_params = linear_params(encoder.layers) if encoder is not None else 0

    def step(self, rows: int, length: int, projected: int, source_length: int = 0) -> float:
        """rows × length positions through the (decoder) layers, `projected` of them through the
        output projection; `source_length`: the encoder's padded source (0 without an encoder)."""
        d, source = self.d, source_length
        flops = (6 * (self.decoder_params - self.cross_kv_params) * length
                 + 12 * self.decoder_layers * d * length * (length + source))
        flops += (6 * self.encoder_params + 6 * self.cross_kv_params) * source
        flops += 12 * self.encoder_layers * d * source * source
        return rows * flops + 6 * self.vocab * d * projected
