"""What incremental decoding remembers, for every family: one DecodeState over per-layer KV caches.

DecodeState holds each layer's self-attention cache (growing) and cross-attention cache (filled
once per source), plus each key's validity and position, so left-padded prompts, beams
(`reorder`) and block diffusion's trial blocks (`fork`, `truncate`) all use the same object.

`DecodeState.fixed` is the other layout, for compiled decoding: every cache is preallocated at a
fixed capacity and written in place at the current slots (as litgpt's is), attention reads the
whole buffer under a mask (`slot_mask`), so every step has the same shapes and one compiled
graph serves them all.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from attnlab.errors import AttnlabError


class CacheFullError(AttnlabError, ValueError):
    """A fixed-capacity cache asked to hold more tokens than it was built for."""


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer.

    Self-attention appends every step; cross-attention is filled once per source (`static`).
    Keys are stored after the rotary rotation, so cached positions are never recomputed.
    Appends write into a buffer with spare room (doubled when full), so a step copies only the
    new keys, not the whole cache as torch.cat would. `k` / `v` are views of the filled part;
    whoever replaces them (a fork's result, a reorder) simply gets a fresh buffer at the next append.
    """

    MIN_CAPACITY = 64

    def __init__(self, static: bool = False, capacity: int | None = None):
        """`capacity`: a fixed-capacity cache (see `DecodeState.fixed`): buffers of that many keys,
        written in place at `slots` (set by the state before each call); attention then reads the
        whole buffer, and the state's `slot_mask` hides the slots not yet written."""
        self.static = static
        self.capacity = capacity
        self.slots: torch.Tensor | None = None
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.capacity is not None and not self.static:
            if self.k is None:
                self.k = k.new_zeros(*k.shape[:2], self.capacity, k.shape[3])
                self.v = v.new_zeros(*v.shape[:2], self.capacity, v.shape[3])
            self.k.index_copy_(2, self.slots, k)
            self.v.index_copy_(2, self.slots, v)
            return self.k, self.v
        if self.k is None or self.static:
            self.k, self.v = k, v
            return k, v
        n, total = len(self), len(self) + k.shape[2]
        k_buffer, v_buffer = self._room_for(total)
        k_buffer[:, :, n:total] = k
        v_buffer[:, :, n:total] = v
        self.k, self.v = k_buffer[:, :, :total], v_buffer[:, :, :total]
        return self.k, self.v

    def _owns_buffers(self) -> bool:
        """True when k / v are still the leading part of this cache's own buffers."""
        if self._buffers is None:
            return False
        k_buffer, v_buffer = self._buffers
        return (self.k.data_ptr() == k_buffer.data_ptr() and self.v.data_ptr() == v_buffer.data_ptr()
                and self.k.shape[:2] == k_buffer.shape[:2] and self.k.stride() == k_buffer.stride())

    def _room_for(self, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._owns_buffers() and self._buffers[0].shape[2] >= total:
            return self._buffers
        capacity = max(2 * total, self.MIN_CAPACITY)
        buffers = []
        for cached in (self.k, self.v):
            buffer = cached.new_empty(*cached.shape[:2], capacity, cached.shape[3])
            buffer[:, :, : cached.shape[2]] = cached
            buffers.append(buffer)
        self._buffers = tuple(buffers)
        return self._buffers

    def fork(self) -> "KVCache":
        """A cache that starts from this one's keys and values (no copy) but whose updates stay
        its own: block diffusion reads the clean blocks' cache while a noisy block is denoised.
        (A fixed cache is not forked: its trial slots are hidden by the mask, then overwritten.)"""
        other = KVCache(self.static)
        other.k, other.v = self.k, self.v
        return other

    def truncate(self, n: int) -> None:
        """Keep the first n keys and values (a view: the room after them is reused by appends;
        a fixed cache keeps its buffer, whose later slots its state's mask hides)."""
        if self.k is not None and self.capacity is None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows (beam search keeps the surviving hypotheses); the spare room moves along."""
        if self.k is None:
            return
        n = len(self)
        if self.capacity is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        elif self._owns_buffers():
            self._buffers = tuple(buffer.index_select(0, index) for buffer in self._buffers)
            self.k, self.v = self._buffers[0][:, :, :n], self._buffers[1][:, :, :n]
        else:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


@dataclass
class LayerCache:
    self_attn: KVCache = field(default_factory=KVCache)  # growing, or fixed-capacity (DecodeState.fixed)
    cross_attn: KVCache = field(default_factory=lambda: KVCache(static=True))

    def reorder(self, index: torch.Tensor) -> None:
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)

    def fork(self) -> "LayerCache":
        return LayerCache(self.self_attn.fork(), self.cross_attn)

    def truncate(self, n: int) -> None:
        self.self_attn.truncate(n)


@dataclass
class DecodeState:
    """Per-layer caches plus what the next call needs to mask and place its tokens.

    key_valid (B, Lk) bool and key_positions (B, Lk) describe the cached keys; next_position (B,)
    is where the next real token goes; `padded`: has any key been padding (until then no call
    needs a mask); context_mask (B, 1, 1, S): the source tokens cross-attention may see.
    """

    caches: list[LayerCache]
    key_valid: torch.Tensor
    key_positions: torch.Tensor
    next_position: torch.Tensor
    padded: bool = False
    context_mask: torch.Tensor | None = None
    capacity: int | None = None  # fixed layout: key_valid / key_positions are (B, capacity) ...
    filled: int = 0  # ... of which the first `filled` slots are written,
    slots: torch.Tensor | None = None  # ... the last `append` at these
    last_clean_hidden: torch.Tensor | None = None  # (B, d): shifted block diffusion's predictor of a block's first token

    @classmethod
    def empty(cls, n_layers: int, batch_size: int, device=None, context_mask=None) -> "DecodeState":
        nothing = torch.zeros(batch_size, 0, device=device)
        return cls([LayerCache() for _ in range(n_layers)], nothing.bool(), nothing.long(),
                   torch.zeros(batch_size, dtype=torch.long, device=device), context_mask=context_mask)

    @classmethod
    def new(cls, n_layers: int, batch_size: int, device=None, capacity: int | None = None,
            context_mask=None) -> "DecodeState":
        """A growing state, or with `capacity` a fixed one."""
        if capacity is not None:
            return cls.fixed(n_layers, batch_size, capacity, device, context_mask)
        return cls.empty(n_layers, batch_size, device, context_mask)

    @classmethod
    def fixed(cls, n_layers: int, batch_size: int, capacity: int, device=None, context_mask=None) -> "DecodeState":
        """Caches of `capacity` keys each, written in place: every decoding step has the same
        shapes (what a compiled step needs); more tokens than `capacity` raise CacheFullError."""
        slots = torch.zeros(batch_size, capacity, device=device)
        caches = [LayerCache(KVCache(capacity=capacity)) for _ in range(n_layers)]
        return cls(caches, slots.bool(), slots.long(), torch.zeros(batch_size, dtype=torch.long, device=device),
                   context_mask=context_mask, capacity=capacity)

    def __len__(self) -> int:
        """Keys cached so far (padding included)."""
        return self.filled if self.capacity is not None else self.key_valid.shape[1]

    @staticmethod
    def positions_after(next_position: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Positions (B, n) of new tokens with validity `valid`: real tokens count on from
        next_position, padding takes the position of the token after it (it is never attended)."""
        return (next_position[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)

    def positions_of(self, valid: torch.Tensor) -> torch.Tensor:
        return self.positions_after(self.next_position, valid)

    def place(self, valid: torch.Tensor) -> torch.Tensor:
        """Append new tokens with validity `valid` (B, n) at their positions, and return those."""
        positions = self.positions_of(valid)
        self.append(valid, positions)
        return positions

    def append(self, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Record keys of new tokens (their K/V join the caches in the stack's forward)."""
        if self.capacity is not None:
            self.write_slots(self.key_valid, self.key_positions, self.reserve(valid.shape[1]), valid, positions)
        else:
            self.key_valid = torch.cat((self.key_valid, valid), dim=1)
            self.key_positions = torch.cat((self.key_positions, positions), dim=1)
        self.next_position = self.next_position + valid.long().sum(1)
        self.padded = self.padded or not bool(valid.all())

    def reserve(self, n: int) -> torch.Tensor:
        """The next n slots of a fixed state (the caches write their keys there); CacheFullError
        past the capacity. Python bookkeeping only, so a compiled step never sees `filled`."""
        if self.filled + n > self.capacity:
            raise CacheFullError(
                f"the fixed-capacity KV cache holds {self.capacity} tokens and already has {self.filled}: "
                f"{n} more do not fit; build the state with a capacity of at least prompt + max_new_tokens")
        self.slots = torch.arange(self.filled, self.filled + n, device=self.key_valid.device)
        self.filled += n
        for cache in self.caches:
            cache.self_attn.slots = self.slots
        return self.slots

    @staticmethod
    def write_slots(key_valid: torch.Tensor, key_positions: torch.Tensor, slots: torch.Tensor,
                    valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Record the new keys' validity and positions at `slots`, in place (a compiled step does
        this inside its graph)."""
        key_valid.index_copy_(1, slots, valid)
        key_positions.index_copy_(1, slots, positions)

    @staticmethod
    def mask_at(key_valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """(B, 1, n, capacity) for the n tokens just written at `slots`: each sees the valid keys up
        to its own slot, and itself (a pad query too, so no row is all masked)."""
        keys, query = torch.arange(key_valid.shape[1], device=key_valid.device), slots[:, None]
        return (key_valid[:, None, None, :] & (keys <= query)) | (keys == query)

    def slot_mask(self) -> torch.Tensor:
        """The mask of the tokens the last `append` wrote (see `mask_at`)."""
        return self.mask_at(self.key_valid, self.slots)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` (beam search's surviving hypotheses), caches included."""
        for cache in self.caches:
            cache.reorder(index)
        self.key_valid = self.key_valid.index_select(0, index)  # (fixed: a copy, so never shared with another state)
        self.key_positions = self.key_positions.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)
        if self.context_mask is not None:
            self.context_mask = self.context_mask.index_select(0, index)
        if self.last_clean_hidden is not None:
            self.last_clean_hidden = self.last_clean_hidden.index_select(0, index)

    def fork(self) -> "DecodeState":
        """A state that reads this one's caches but whose appends stay its own."""
        return replace(self, caches=[cache.fork() for cache in self.caches])

    def truncate(self, n: int) -> None:
        """Keep the first n keys: block diffusion drops a trial block's keys after a step."""
        for cache in self.caches:
            cache.truncate(n)
        if self.capacity is not None:
            self.key_valid[:, n:] = False
            self.filled = n
        else:
            self.key_valid, self.key_positions = self.key_valid[:, :n], self.key_positions[:, :n]
