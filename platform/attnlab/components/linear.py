"""Weights laid out for decoding: a few rows times a matrix that is read, not reused.

A decoding call multiplies one row per sequence (or per beam, or a block's few tokens) by every
weight of the model, so it streams the weights from memory and reuses none of them. On a CPU, BLAS
reads a wide weight much faster stored (in, out) than as `nn.Linear` keeps it, (out, in): on 2 cores
of an AMD EPYC, with the weights out of cache, a 1 x 256 row times the 8000 x 256 output projection
took 1.0 ms as `F.linear` and 0.36 ms against the transposed copy, the 768 x 256 q/k/v projection
98 against 53 us. Hugging Face's GPT-2 keeps its block weights (in, out) for the same reason (its
`Conv1D`).

BLAS runs a one-row product on one thread, which gets about 60 % of the memory bandwidth two
threads do. So the copy is kept as P = torch.get_num_threads() blocks of rows (P, in / P, out),
and a single row is multiplied as P partial products in one batched product, one block per
thread, then summed (the output projection: 0.36 -> 0.26 ms). Narrow weights (the feed-forward's
down projection) read about as fast either way eagerly, but a compiled graph lowers a one-row
product by them to its own loop (about 6 % of a compiled batch-1 step), so they get the copy too.

Two to `FEW_ROWS` rows (beam search's 4 beams of one source, a block-diffusion block of one row)
are slow both ways, because BLAS splits a product over its rows: the transposed product
weight @ xᵀ, over the weight's rows, read its 8000 x 256 output projection in 0.6 against 1.5 ms
at 4 rows, and took an EncoderDecoder beam step at batch 1 from 6.3 to 5.1 ms eagerly and from
5.4 to 3.7 ms compiled. More rows use the copy as one (in, out) matrix.

`decode_layout(model)` gives every weight of a CPU model its copy for the length of a decode;
`Linear` and `TokenEmbedding.logits` multiply by it when it is there. The products are
`F.linear`'s to float rounding: for some row counts BLAS sums in another order in the two layouts.

Making the copies is a transpose of every weight: 12-17 ms for the bench's 5M-parameter model on 2
cores, 0.1 ms a token of a 128-token decode at batch 1, about 7 % of it compiled. So a weight keeps
its copy between decodes (`_KEPT`, for as long as the weight lives) and the next decode reuses it
unless the weight has changed since: an optimizer step, `load_state_dict` or any in-place write
bumps the tensor's version counter, and new data (`weight.data = ...`) is another tensor. A write
through `weight.data` bypasses the counter: Lightning's weight averaging (EMA) swaps weights that
way, so a family forgets its copies at the start of every validation, test and predict epoch
(`forget_decoding_copies`). A CPU model that has decoded holds its weights twice, as it already
did during the decode.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from attnlab.compat import private_api


def _split_row(row: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(1, in) times the (P, in / P, out) blocks: P partial products, one slice of `in` each, summed.

    A `baddbmm` that ignores its input (beta 0), not a `bmm`: the same BLAS call and the same bits
    eagerly, but Inductor lowers a one-row `bmm` on a CPU to its own single-threaded loop of
    multiply-adds, while it calls `baddbmm` from C++ as it is. (An operator of attnlab's own,
    which compiled graphs also call as it is, crossed into Python at every product: a chain of 8
    compiled products took 722 against 312 us.)"""
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


# weight -> (what the copy was made from: an alias of the weight, its version, the thread blocks; the copy)
_KEPT: WeakIdKeyDictionary = WeakIdKeyDictionary()


def kept_decoding_copy(weight: torch.Tensor, parts: int) -> torch.Tensor:
    """`decoding_copy(weight, parts)`, made again only when the weight has changed since the last
    one. The alias (a `detach()`, which shares the weight's storage but not the Parameter) keeps
    that storage alive, so new data can never take its address and pass for it. A copy is made
    outside inference mode, so that a decode outside it can reuse a copy made in a validation; an
    inference tensor as weight has no version counter and is copied every time."""
    if weight.is_inference():
        return decoding_copy(weight, parts)
    version = private_api.get(weight, "_version")
    alias, kept_version, kept_parts, copy = _KEPT.get(weight, (None, None, None, None))
    if copy is None or not (alias.is_set_to(weight) and kept_version == version and kept_parts == parts):
        with torch.inference_mode(False):
            copy = decoding_copy(weight, parts)
            _KEPT[weight] = (weight.detach(), version, parts, copy)
    return copy


def forget_decoding_copies(model: nn.Module) -> None:
    """Drop the kept copies of `model`'s weights: the next decode copies them again."""
    for weight in model.parameters():
        _KEPT.pop(weight, None)


@contextlib.contextmanager
def decode_layout(model: nn.Module):
    """Within the block, every weight of `model`'s modules that read `decode_weight`
    (`Linear`, `TokenEmbedding`) has its decoding copy. Re-entrant: an inner block keeps the
    copies of an outer one."""
    given = [m for m in model.modules()
             if hasattr(type(m), "decode_weight") and m.decode_weight is None and _laid_out(m)]
    parts = torch.get_num_threads()
    try:
        for module in given:
            module.decode_weight = kept_decoding_copy(module.weight, parts)
        yield
    finally:
        for module in given:
            del module.decode_weight
