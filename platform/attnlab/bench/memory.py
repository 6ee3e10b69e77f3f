"""Peak memory of one attention layer (forward + backward) against sequence length.

On GPU the CUDA allocator's peak is exact. On CPU torch has no allocator statistics, so each
length runs in a fresh process that reports its peak resident memory above its resident
memory just before the step (Linux /proc); a fresh process keeps earlier lengths' freed
memory out of the number.
"""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from attnlab.components import BackboneConfig
from attnlab.components.attention import MultiHeadAttention
from attnlab.errors import AttnlabError


def _attention_step(length: int, d_model: int, n_heads: int, backend: str, device: torch.device, dtype,
                    n_kv_heads: int | None = None) -> None:
    attention = MultiHeadAttention(BackboneConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                                  backend=backend, dropout=0.0))
    attention.to(device=device, dtype=dtype)
    x = torch.randn(1, length, d_model, device=device, dtype=dtype, requires_grad=True)
    out, _ = attention(x, is_causal=True)
    out.sum().backward()


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AttnlabError(f"/proc/self/status has no {field}: CPU memory is measured on Linux only")


def _reset_peak() -> None:
    """Set the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_bytes_here(length: int, d_model: int, n_heads: int, backend: str, device: torch.device, dtype,
                    n_kv_heads: int | None = None) -> int:
    """Peak bytes the step adds above what is allocated before it, in this process."""
    _attention_step(64, d_model, n_heads, backend, device, dtype, n_kv_heads)  # thread pools, kernels, lazy init
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        _attention_step(length, d_model, n_heads, backend, device, dtype, n_kv_heads)
        return torch.cuda.max_memory_allocated(device) - before
    _reset_peak()
    before = _proc_kib("VmRSS")
    _attention_step(length, d_model, n_heads, backend, device, dtype, n_kv_heads)
    return (_proc_kib("VmHWM") - before) * 1024


def peak_bytes(length: int, d_model: int, n_heads: int, backend: str, device: torch.device, dtype=torch.float32,
               n_kv_heads: int | None = None) -> int:
    if device.type == "cuda":
        return peak_bytes_here(length, d_model, n_heads, backend, device, dtype, n_kv_heads)
    command = [sys.executable, "-m", "attnlab.bench.memory", str(length), str(d_model), str(n_heads), backend,
               str(n_kv_heads or n_heads)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise AttnlabError(f"the memory probe at length {length} ({backend}) failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_bytes"]


def kv_cache_bytes(model, batch: int, tokens: int) -> int:
    """Bytes of a decoder's KV cache after reading `tokens` tokens per row: what
    decoding holds per layer, measured on the real buffers (GQA stores only the KV heads)."""
    device = next(model.parameters()).device
    state = model.new_state(batch, tokens, device)
    with torch.no_grad():
        model(torch.full((batch, tokens), 6, dtype=torch.long, device=device), None, state)
    return sum(buffer.untyped_storage().nbytes() for c in state.caches for buffer in c.self_attn.buffers)


if __name__ == "__main__":  # the CPU probe: python -m attnlab.bench.memory LENGTH D_MODEL N_HEADS BACKEND N_KV
    length, d_model, n_heads, backend = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    n_kv_heads = int(sys.argv[5]) if len(sys.argv) > 5 else None
    torch.set_grad_enabled(True)
    print(json.dumps({"peak_bytes": peak_bytes_here(length, d_model, n_heads, backend, torch.device("cpu"),
                                                    torch.float32, n_kv_heads)}))
