"""What incremental decoding remembers, for every family: one DecodeState over per-layer KV caches.

One layout. Each layer's self-attention keys and values live in a buffer (B, H_kv, capacity, D)
allocated once, written in place at each row's next slots and read over the filled prefix only
(so attention never pays for the spare room, eager or compiled). A full buffer grows by one
reallocation. Cross-attention keys and values are computed once per source and never copied:
beams of a source read them by folding their queries together (see MultiHeadAttention).

One place builds a call. `DecodeState.forward(stack, tokens, valid, noisy=)` turns "these new
tokens" into slots (which are their positions) and `step_mask` into the mask, for every family,
and hands them, as one `StepInputs`, to the state's runner (`cached_forward`, or a compiled one
chosen when the state is made). A decoder's tokens (`noisy` 0) see the keys before them; block
diffusion's trial block (`noisy` tokens at the end) is seen by itself alone and dropped after the
call, so denoising a block writes nothing that has to be undone or copied.

Rows are ragged. Each row's real keys fill its slots from 0 without gaps: a call's valid tokens
take the row's next slots, its padding goes after them and is overwritten later. So left-padded
prompts, finished rows fed padding and block-diffusion rows that commit their blocks at different
calls all share one buffer, and the attended prefix is as long as the longest row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

GROWTH_MULTIPLE = 64  # a cache that grows grows to a multiple of this


def round_capacity(needed: int) -> int:
    return -(-max(needed, 1) // GROWTH_MULTIPLE) * GROWTH_MULTIPLE


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer.

    Self-attention: `buffers` (B, H_kv, capacity, D), allocated at the first write. Before each
    call the state sets `slots` (B, n), where the call's new keys go, and `span`, the prefix
    attention reads; `update` writes there in place and returns views of the prefix.
    Cross-attention (`static`): the source's keys and values, set once (one row per source), read
    by `beams` rows of queries per source. Keys are stored after the rotary rotation, so cached
    positions are never recomputed.
    """

    def __init__(self, static: bool = False, capacity: int = 0):
        self.static = static
        self.capacity = capacity
        self.beams = 1  # static: the rows of queries per source (its beams, adjacent)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.slots: torch.Tensor | None = None
        self.span = 0
        self.k: torch.Tensor | None = None  # self-attention: views of the prefix the next call reads
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def prepare(self, span: int, slots: torch.Tensor | None) -> None:
        """Point the next call at its slots (None: the last of the first `span`, on every row) and at
        the first `span` slots, which attention reads (allocated at the first write)."""
        self.slots, self.span = slots, span
        if self.buffers is not None:
            self.k, self.v = (buffer[:, :, :span] for buffer in self.buffers)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static:
            self.k, self.v = k, v
            return k, v
        if self.buffers is None:
            self.buffers = tuple(x.new_zeros(*x.shape[:2], self.capacity, x.shape[3]) for x in (k, v))
            self.k, self.v = (buffer[:, :, : self.span] for buffer in self.buffers)
        if self.slots is None:  # every row writes the same slots: a plain copy
            self.k[:, :, -k.shape[2]:] = k
            self.v[:, :, -v.shape[2]:] = v
        else:
            index = self.slots[:, None, :, None].expand_as(k)
            self.k.scatter_(2, index, k)
            self.v.scatter_(2, index, v)
        return self.k, self.v

    def grow(self, capacity: int, filled: int) -> None:
        """Reallocate at `capacity` slots, keeping the first `filled` (the only copy a decode makes)."""
        if self.buffers is not None:
            grown = []
            for buffer in self.buffers:
                new = buffer.new_zeros(*buffer.shape[:2], capacity, buffer.shape[3])
                new[:, :, :filled] = buffer[:, :, :filled]
                grown.append(new)
            self.buffers = tuple(grown)
        self.capacity = capacity

    def select(self, index: torch.Tensor, filled: int, moved: torch.Tensor | None = None) -> None:
        """Keep rows `index` (beams, or the rows still decoding): only the filled slots move, and a
        batch that shrinks or stays keeps its buffer. `moved`: for a batch that keeps its size,
        the rows whose index is not their own (only those are written)."""
        if self.static:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            return
        if self.buffers is None:
            return
        self.k = self.v = None
        if moved is not None:
            for buffer in self.buffers:
                buffer[moved, :, :filled] = buffer[:, :, :filled].index_select(0, index[moved])
            return
        kept = []
        for buffer in self.buffers:
            rows = buffer[:, :, :filled].index_select(0, index)
            if len(index) > buffer.shape[0]:
                buffer = buffer.new_zeros(len(index), *buffer.shape[1:])
            buffer = buffer[: len(index)]
            buffer[:, :, :filled] = rows
            kept.append(buffer)
        self.buffers = tuple(kept)


@dataclass
class LayerCache:
    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=lambda: KVCache(static=True))


def step_mask(valid: torch.Tensor, slots: torch.Tensor, row_end: torch.Tensor, keys: torch.Tensor,
              noisy: int, causal: bool) -> torch.Tensor:
    """The mask (B, 1, n, span) of a call's n tokens over the slots `keys` (span,).

    A query sees a key when the key is committed (before its row's end); or new and clean, and
    the query is noisy or, with `causal`, not before it (without: a clean block sees all of
    itself); or noisy, and the query is noisy too. Every query sees itself (a padding query too,
    so no row is all masked). Pure tensor code: a compiled step runs it inside its graph.
    """
    n = valid.shape[1]
    query_noisy = torch.zeros_like(valid)
    if noisy:
        query_noisy[:, n - noisy:] = True
    n_clean = (valid & ~query_noisy).long().sum(1, keepdim=True)
    offset = keys[None, :] - row_end[:, None]  # (B, span): a new key's rank among its row's new slots
    committed = (offset < 0)[:, None, :]
    clean_key = ((offset >= 0) & (offset < n_clean))[:, None, :]
    noisy_key = ((offset >= n_clean) & (offset < n_clean + noisy))[:, None, :]
    query_slot = slots[:, :, None]
    if causal:
        clean_key = clean_key & (query_noisy[..., None] | (keys <= query_slot))
    visible = committed | clean_key | (noisy_key & query_noisy[..., None]) | (keys == query_slot)
    return visible[:, None]


class StepInputs(NamedTuple):
    """One decoding call's inputs besides the stack, as `DecodeState.forward` puts them together."""

    tokens: torch.Tensor  # (B, n) the call's tokens
    valid: torch.Tensor  # (B, n) real tokens (False: padding)
    slots: torch.Tensor  # (B, n) where each token's keys go, which is also its position
    row_end: torch.Tensor  # (B,) each row's committed keys before the call
    keys: torch.Tensor  # (span,) the slots attention reads
    caches: list[LayerCache]  # one per layer
    context_mask: torch.Tensor | None  # (sources, 1, 1, S) what cross-attention may see
    noisy: int  # the last `noisy` tokens are a trial block
    causal: bool  # clean tokens of the call see each other causally
    masked: bool  # some query may not see some key of the span: build the mask
    last_only: bool  # return the last token's logits (B, V), not the hidden states (B, n, d)


def cached_forward(stack, step: StepInputs):
    """One decoding call of `stack` over a state's caches (see `DecodeState.forward`): its hidden
    states (B, n, d), or with `last_only` the logits (B, V) of its last token. A real token's
    position is its slot, so positions need no bookkeeping of their own."""
    mask = step_mask(step.valid, step.slots, step.row_end, step.keys, step.noisy, step.causal) if step.masked else None
    # A branch, not the condition's value: compiled with dynamic shapes the token count is symbolic,
    # and SDPA takes no symbolic is_causal (it broke a block call's graph at every attention layer).
    is_causal = False
    if not step.masked and step.noisy == 0 and step.tokens.shape[1] > 1:
        is_causal = True
    hidden, _ = stack(step.tokens, step.slots, mask=mask, is_causal=is_causal, key_positions=step.keys,
                      caches=step.caches, context_mask=step.context_mask)
    return stack.embedding.logits(hidden[:, -1]) if step.last_only else hidden


@dataclass
class DecodeState:
    """Per-layer caches plus what the next call needs to place and mask its tokens.

    row_end (B,): each row's real keys, in slots 0 .. row_end - 1 (so also the position of its
    next real token); `end`: the longest row's; `aligned`: every row has as many (a call of real
    tokens then needs no mask);
    context_mask (sources, 1, 1, S): the source tokens cross-attention may see, one row per source;
    beams: rows per source (B = sources * beams, a source's beams adjacent), set when the state is
    made or its rows are copied to beams (`expand_beams`), never read off shapes;
    last_clean_hidden (B, d): shifted block diffusion's predictor of a block's first token;
    run: what makes each call, `cached_forward` or a compiled runner (generation/compiled_step.py).
    """

    caches: list[LayerCache]
    row_end: torch.Tensor
    capacity: int
    end: int = 0
    aligned: bool = True
    context_mask: torch.Tensor | None = None
    last_clean_hidden: torch.Tensor | None = None
    slot_index: torch.Tensor | None = None  # arange(capacity): the slots a call attends over are a view of it
    beams: int = 1
    run: Callable = cached_forward

    @classmethod
    def new(cls, n_layers: int, batch_size: int, capacity: int, device=None, context_mask=None, *, beams: int = 1,
            run: Callable = cached_forward) -> "DecodeState":
        """Caches of `capacity` slots per row (prompt + budget, so that a decode never grows them)
        for `batch_size` rows, `beams` of them per source."""
        if batch_size % beams:
            raise ValueError(f"a decoding state of {batch_size} rows cannot hold {beams} beams per source")
        capacity = max(capacity, 1)
        caches = [LayerCache() for _ in range(n_layers)]
        for cache in caches:
            cache.self_attn.capacity = capacity
        state = cls(caches, torch.zeros(batch_size, dtype=torch.long, device=device), capacity,
                    context_mask=context_mask, slot_index=torch.arange(capacity, device=device), run=run)
        state._set_beams(beams)
        return state

    def __len__(self) -> int:
        """Slots filled by the longest row."""
        return self.end

    @property
    def rows(self) -> int:
        return len(self.row_end)

    def _describe(self) -> str:
        return f"{self.rows} rows ({self.rows // self.beams} sources x {self.beams} beams)"

    def _set_beams(self, beams: int) -> None:
        self.beams = beams
        for cache in self.caches:
            cache.cross_attn.beams = beams

    def forward(self, stack, tokens: torch.Tensor, valid: torch.Tensor | None = None, *, noisy: int = 0,
                causal: bool = True, last_only: bool = False):
        """Feed `tokens` (B, n) with validity `valid` (None: all real) through `stack` over this
        state, the last `noisy` of them a trial block (seen by itself alone, then forgotten), and
        return the state's runner's result (see `cached_forward`).

        The one place a call is put together: real tokens take each row's next slots (padding
        after them, overwritten later), the caches grow when full, and the mask is built only
        when some query may not see some key of the attended prefix."""
        if tokens.shape[0] != self.rows:
            raise ValueError(f"a decoding call of {tokens.shape[0]} rows on a state of {self._describe()}")
        n = tokens.shape[1]
        all_valid = valid is None or bool(valid.all())
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        span = self.end + n
        if span > self.capacity:
            self._grow(round_capacity(max(2 * self.capacity, span)))
        if all_valid:
            slots = self.row_end[:, None] + self.slot_index[:n]
        else:  # real tokens first (the trial block counts as real), padding after them
            real = valid.long()
            if noisy:
                real[:, n - noisy:] = 1
            rank = torch.where(valid, real.cumsum(1) - 1, real.sum(1, keepdim=True) + (1 - real).cumsum(1) - 1)
            slots = self.row_end[:, None] + rank
        aligned = self.aligned and all_valid
        masked = not aligned or (noisy == 0 and n > 1 and self.end > 0) or 0 < noisy < n
        limit = stack.positional.max_positions
        if limit is not None and span > limit:  # a real token's position is its slot: only now can one overflow
            stack.positional.check_positions(slots)
        for cache in self.caches:  # aligned: every row's new tokens take the last n slots of the span
            cache.self_attn.prepare(span, None if aligned else slots)
        out = self.run(stack, StepInputs(tokens, valid, slots, self.row_end, self.slot_index[:span], self.caches,
                                         self.context_mask, noisy, causal, masked, last_only))
        self._commit(valid, n - noisy, all_valid)
        return out

    def _commit(self, valid: torch.Tensor, n_clean: int, all_valid: bool) -> None:
        """The call's clean real tokens join their rows; a trial block's slots are simply reused."""
        if all_valid:
            self.row_end = self.row_end + n_clean
            self.end += n_clean
        else:
            self.row_end = self.row_end + valid[:, :n_clean].long().sum(1)
            self._measure_rows()

    def retract(self, count: torch.Tensor) -> None:
        """Take back the last `count` (B,) keys each row committed (draft-and-verify's rejected
        drafts): like a trial block's, their slots are written over by the row's next call."""
        self.row_end = self.row_end - count
        self._measure_rows()

    def _measure_rows(self) -> None:
        """`end` and `aligned` from the rows' ends (one device sync, only after a call with padding)."""
        shortest, longest = (int(x) for x in self.row_end.aminmax()) if self.rows else (0, 0)
        self.end, self.aligned = longest, shortest == longest

    def _grow(self, capacity: int) -> None:
        for cache in self.caches:
            cache.self_attn.grow(capacity, self.end)
        self.capacity = capacity
        self.slot_index = torch.arange(capacity, device=self.row_end.device)

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Keep rows `rows`, a row of the state for each new row (beam search's surviving
        hypotheses, or the rows still decoding); only the filled slots move. `sources`: the
        sources that stay, when some leave, each with its `beams` rows; None: every source stays
        and each row stays with its source (a beam step), and the sources' keys and values are
        not touched."""
        if sources is None and len(rows) != self.rows:
            raise ValueError(f"a reorder to {len(rows)} rows keeps every source of a state of {self._describe()}: "
                             "pass the sources that stay, or copy rows to beams with expand_beams")
        if sources is not None and len(rows) != len(sources) * self.beams:
            raise ValueError(f"a reorder to {len(rows)} rows of {len(sources)} sources on a state of "
                             f"{self._describe()}: each source keeps its {self.beams} beams")
        moved = None
        if sources is None:  # a beam step: most beams keep their own row
            moved = (rows != torch.arange(len(rows), device=rows.device)).nonzero().squeeze(1)
        self._take(rows, moved, sources)

    def expand_beams(self, beams: int) -> None:
        """Copy each row to `beams` adjacent rows, which become that source's beams (a prompt read
        once, then continued by each beam)."""
        if self.beams != 1:
            raise ValueError(f"expand_beams({beams}) on a state of {self._describe()}: its rows are beams already")
        self._take(torch.arange(self.rows, device=self.row_end.device).repeat_interleave(beams), None, None)
        self._set_beams(beams)

    def _take(self, rows: torch.Tensor, moved: torch.Tensor | None, sources: torch.Tensor | None) -> None:
        for cache in self.caches:
            cache.self_attn.select(rows, self.end, moved)
            if sources is not None and cache.cross_attn.k is not None:
                cache.cross_attn.select(sources, 0)
        self.row_end = self.row_end.index_select(0, rows)
        if sources is not None and not self.aligned:  # the rows left behind may have been the longer ones
            self._measure_rows()
        if sources is not None and self.context_mask is not None:
            self.context_mask = self.context_mask.index_select(0, sources)
        if self.last_clean_hidden is not None:
            self.last_clean_hidden = self.last_clean_hidden.index_select(0, rows)

    def keep(self, rows: torch.Tensor) -> None:
        """Keep rows `rows` of a state with one row per source (greedy decoding's compaction)."""
        self.reorder(rows, sources=rows)
