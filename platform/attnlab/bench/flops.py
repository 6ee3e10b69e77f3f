"""Analytic training FLOPs per token for each family, and the peak matmul rate they are divided by.

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
            return peaks["bf16" if precision.startswith("bf16") else "fp32"] or None
    return None


def measured_peak(device: torch.device, dtype: torch.dtype, size: int | None = None, seconds: float = 1.0) -> float:
    """FLOP/s of a large square matmul on this device: what the hardware gives our kernels."""
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # warm-up (kernel selection, allocation)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or calls < 3:
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        calls += 1
    return 2 * size**3 * calls / (time.perf_counter() - started)


def linear_params(module: nn.Module) -> int:
    """Weights of the Linear layers inside `module` (the matmul parameters)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def cross_kv_params(stack: nn.Module) -> int:
    """Cross-attention key/value projection weights: they run on source tokens, not target ones."""
    return sum(attn.kv_proj.weight.numel() for attn in stack.attention_modules("cross"))


def decoder_flops_per_token(n_matmul: int, vocab: int, d_model: int, n_layers: int, length: int) -> float:
    """6·N + 12·n_layers·d·T with N = layer matmul weights + output projection (REFERENCE.md)."""
    return 6 * (n_matmul + vocab * d_model) + 12 * n_layers * d_model * length


def family_flops_per_token(family: str, model: nn.Module, vocab: int, source_len: int, target_len: int,
                           masked_fraction: float = 0.5) -> float:
    """Training FLOPs per target (sequence) token of one of the platform's models.

    encoder_decoder: encoder work is spread over the target tokens (S/T of it per target token),
    cross-attention K/V projections run on the source. block_diffusion: the layers see
    x_t ⊕ x_0 (2T tokens, each attending to all 2T under the dense count) and only the masked
    fraction of tokens reaches the output projection.
    """
    if family == "decoder_only":
        stack = model.stack
        return decoder_flops_per_token(linear_params(stack.layers), vocab, stack.cfg.d_model, len(stack.layers),
                                       target_len)
    if family == "block_diffusion":
        stack = model.stack
        d, layers = stack.cfg.d_model, len(stack.layers)
        return 2 * 6 * linear_params(stack.layers) + 6 * vocab * d * masked_fraction + 12 * layers * d * 4 * target_len
    if family == "encoder_decoder":
        enc, dec = model.encoder, model.decoder
        d = dec.cfg.d_model
        per_source = 6 * linear_params(enc.layers) + 12 * len(enc.layers) * d * source_len + 6 * cross_kv_params(dec)
        per_target = (6 * (linear_params(dec.layers) - cross_kv_params(dec) + vocab * d)
                      + 12 * len(dec.layers) * d * (target_len + source_len))
        return per_target + per_source * source_len / target_len
    raise ValueError(f"unknown family {family!r}")
