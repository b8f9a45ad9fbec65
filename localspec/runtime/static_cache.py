"""A preallocated KV cache: each layer's keys and values live in one buffer allocated up front, a step writes its
new positions in place, and cropping (the rollback after a rejection) only moves a length back.

transformers' DynamicCache concatenates every layer's keys and values at every step (a copy of the whole cache)
and crop slices. StaticCache preallocates too, but attends over its whole capacity at every step (the masked tail
included) and keeps its length in a tensor; this one attends over the filled prefix only (a view, no copy) and
keeps the length as a Python int, so no step reads a device value back. A prompt longer than the buffer grows it
(doubling, up to the model's context), which is the only reallocation.

Only models whose layers all use full attention get it (cache_supported); others keep a DynamicCache.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from .memory import load_allocations

INITIAL_CAPACITY = 512  # positions allocated at the first forward (more when the prompt is longer)


def cache_supported(config) -> bool:
    """True when every decoder layer is full attention (no sliding window, chunks or shared / absent KV)."""
    try:
        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except (AttributeError, TypeError, ValueError):
        return False
    return bool(layer_types) and all(kind == "full_attention" for kind in layer_types)


class PreallocatedLayer(CacheLayerMixin):
    is_compileable = False  # the returned views change length every step (see model_runner's compile path)
    is_croppable = True
    is_sliding = False

    def __init__(self, capacity: int, max_capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_capacity = max_capacity
        self.length = 0
        self.allocations = 0  # buffers allocated so far (1 unless a prompt outgrew the buffer)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._allocate(key_states, value_states, self.capacity)
        self.is_initialized = True

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        batch, heads = key_states.shape[:2]
        # empty, not zeros, and mappings of their own (not heap blocks that may already be resident): positions are
        # read only once written (update, append_in_place, crop keep `length`), so a buffer's pages become resident
        # as the conversation reaches them, not all at its allocation. load_allocations also trims the heap (a
        # fraction of a ms): at the first forward that returns what building the backbone freed (50-75 MB of a
        # 1.7B model's peak)
        with load_allocations():
            keys = key_states.new_empty((batch, heads, capacity, key_states.shape[-1]))
            values = value_states.new_empty((batch, heads, capacity, value_states.shape[-1]))
        if self.keys is not None and self.length:
            keys[:, :, : self.length].copy_(self.keys[:, :, : self.length])
            values[:, :, : self.length].copy_(self.values[:, :, : self.length])
        self.keys, self.values, self.capacity = keys, values, capacity
        self.allocations += 1

    def _room(self, new: int, key_states: torch.Tensor, value_states: torch.Tensor) -> int:
        """Positions length .. length + new made to fit (allocating or growing the buffers; the states give their
        shape and dtype) and counted in; returns the first."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length
        end = start + new
        if end > self.capacity:
            if end > self.max_capacity:
                raise ValueError(f"the KV cache holds {self.max_capacity} positions; {end} were asked for")
            capacity = self.capacity
            while capacity < end:
                capacity *= 2
            self._allocate(key_states, value_states, min(capacity, self.max_capacity))
        self.length = end
        return start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self._room(key_states.shape[-2], key_states, value_states)
        end = self.length
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def append_in_place(self, rows: int, template: torch.Tensor) -> int:
        """Room for `rows` more positions that the caller writes into keys / values [1, Hkv, capacity, D] itself
        (the layer kernel: layer_kernel.py); template [1, Hkv, 0, D] gives the buffers' shape and dtype when they
        are not allocated yet. Returns the first new position."""
        return self._room(rows, template, template)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_capacity

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count: the number of trailing positions to drop")
        self.length = max(self.length + tokens_to_remove, 0)

    def reset(self) -> None:
        self.length = 0  # the buffers stay: the next answer overwrites them

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("the preallocated cache holds one sequence")


class PreallocatedCache(Cache):
    """One PreallocatedLayer per decoder layer of `config`; capacity grows to at most `max_capacity` positions."""

    def __init__(self, config, max_capacity: int, capacity: int = INITIAL_CAPACITY) -> None:
        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        start = min(capacity, max_capacity)
        super().__init__(layers=[PreallocatedLayer(start, max_capacity) for _ in layer_types])

    @property
    def allocations(self) -> int:
        return sum(layer.allocations for layer in self.layers)

    def ensure_capacity(self, positions: int) -> None:
        """Size the buffers for `positions` before they are allocated (a long prompt: one allocation, not several)."""
        for layer in self.layers:
            if not layer.is_initialized:
                while layer.capacity < positions:
                    layer.capacity *= 2
                layer.capacity = min(layer.capacity, layer.max_capacity)
