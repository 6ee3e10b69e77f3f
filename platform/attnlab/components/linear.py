"""Weights laid out for decoding: a few rows times a matrix that is read, not reused.

A decoding call multiplies one row per sequence (or per beam, or a block's few tokens) by every
weight of the model, so it streams the weights from memory and reuses none of them. A CPU's BLAS
streams a wide weight faster stored (in, out) than as `nn.Linear` keeps it, (out, in) (Hugging
Face's GPT-2 keeps its block weights (in, out) for the same reason, its `Conv1D`). BLAS also runs
a one-row product on one thread, so for a single row the copy is kept as P =
torch.get_num_threads() blocks of rows (P, in / P, out), multiplied as P partial products in one
batched product and summed. Narrow weights get the copy too: a compiled graph lowers a one-row
product by them to a loop of its own instead of calling BLAS. Two to `FEW_ROWS` rows (a source's
beams, a block of one row) are multiplied as weight @ xᵀ, which BLAS splits over the weight's
rows; more rows use the copy as one (in, out) matrix.

`decode_layout(model)` is the one place copies exist: it makes them when a decode starts and drops
them when it ends, so a decode always multiplies the weights as they are at its start, whatever
wrote them before (an optimizer, `load_state_dict`, a weight-averaging callback through `.data`),
and nothing outlives it. `Linear` and `TokenEmbedding.logits` multiply by a copy when one is there.
The products are `F.linear`'s to float rounding: for some row counts BLAS sums in another order.
A GPU model, or a sharded one, decodes from its weights as they are.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def _split_row(row: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(1, in) times the (P, in / P, out) blocks: P partial products, one slice of `in` each, summed.

    A `baddbmm` that ignores its input (beta 0), not a `bmm`: the same BLAS call and the same bits
    eagerly, but Inductor lowers a one-row `bmm` on a CPU to a single-threaded loop of its own,
    while it calls `baddbmm` as it is."""
    return torch.baddbmm(blocks.new_zeros(()), row.view(blocks.shape[0], 1, -1), blocks, beta=0).sum(0)


FEW_ROWS = 4  # products of 2 .. FEW_ROWS rows read the weight as it is, over its rows


def rows_times(x: torch.Tensor, weight: torch.Tensor, blocks: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) times weight (out, in), plus bias: `F.linear`, computed from the weight's
    decoding copy `blocks` (P, in / P, out) or, for a few rows, as (weight @ xᵀ)ᵀ."""
    parts, _, width = blocks.shape
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n > FEW_ROWS or (n == 1 and parts == 1):
        weight_t = blocks.view(-1, width)
        out = rows @ weight_t if bias is None else torch.addmm(bias, rows, weight_t)
    else:
        if n == 1:
            out = _split_row(rows, blocks)
        else:
            out = (weight @ rows.t()).t()
        out = out if bias is None else out + bias
    return out.reshape(*x.shape[:-1], width)


class Linear(nn.Linear):
    """`nn.Linear` (the same parameters and state dict) that uses its decoding copy when it has one."""

    decode_weight: torch.Tensor | None = None  # (P, in / P, out), set by `decode_layout` only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.decode_weight is None:
            return F.linear(x, self.weight, self.bias)
        return rows_times(x, self.weight, self.decode_weight, self.bias)


def _laid_out(module: nn.Module) -> bool:
    """A plain CPU weight (out, in). A sharded FSDP weight is not whole outside its forward and a
    GPU's BLAS reads both layouts alike, so they are left alone; so is an untied embedding table,
    which is only looked up (its `output` Linear multiplies)."""
    weight = getattr(module, "weight", None)
    return (getattr(module, "output", None) is None and type(weight) is nn.Parameter
            and weight.device.type == "cpu" and weight.dim() == 2)


def decoding_copy(weight: torch.Tensor, parts: int) -> torch.Tensor:
    """weight (out, in) as (P, in / P, out) blocks of its transpose (P = 1 where P does not divide in)."""
    parts = parts if weight.shape[1] % parts == 0 else 1
    return weight.detach().t().contiguous().view(parts, -1, weight.shape[0])


@contextlib.contextmanager
def decode_layout(model: nn.Module):
    """Within the block, every weight of `model`'s modules that read `decode_weight`
    (`Linear`, `TokenEmbedding`) has a decoding copy, made on entry from the weight as it is then
    and dropped on exit. Re-entrant: an inner block keeps the copies of an outer one."""
    given = [m for m in model.modules()
             if hasattr(type(m), "decode_weight") and m.decode_weight is None and _laid_out(m)]
    parts = torch.get_num_threads()
    try:
        for module in given:
            module.decode_weight = decoding_copy(module.weight, parts)
        yield
    finally:
        for module in given:
            del module.decode_weight
