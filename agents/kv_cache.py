"""A KV cache for HFAgent's decoding loop that is written in place instead of re-concatenated.

transformers' ``DynamicLayer`` appends a step's keys and values with ``torch.cat``, which copies
the whole cache at every decoding step: O(length) bytes per step per layer, O(length²) per
answer. :class:`GrowingLayer` keeps each layer's keys and values in a buffer with room for the
answer and writes a step's entries into it in place; attention reads a view of the filled part.
The room grows geometrically (so a ``max_new_tokens`` far beyond the real answers costs no memory
up front) and rows can still be dropped (``batch_select_indices``), which is how HFAgent stops
paying for finished answers. The values attention sees are the same numbers in the same order,
so greedy output is bit-identical to the dynamic cache's (``tests/test_kv_cache.py``).

Only plain full-attention layers, and sliding-window layers whose window the whole answer fits
inside, are replaced; any other layer type keeps transformers' own class, and a model whose
cache cannot be built from its config gets ``None`` (its own default cache).

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0,
    ...                                    eos_token_id=0)).eval()
    >>> cache = growing_cache(model, capacity=8)  # room for the prompt and the answer
    >>> out = model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)
    >>> [type(layer).__name__ for layer in cache.layers], cache.get_seq_length()
    (['GrowingLayer'], 3)
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from crl_kit.errors import ConfigError

#: new-token room allocated first (then doubled as answers grow), bounded by the capacity
INITIAL_ROOM = 64


class GrowingLayer(CacheLayerMixin):
    """One attention layer's keys and values in buffers of shape ``[batch, heads, room, head_dim]``.

    ``keys``/``values`` are views of the first ``length`` positions. ``capacity`` is the most
    positions this layer will ever hold (prompt + answer); the buffers start at the prompt plus
    :data:`INITIAL_ROOM` and double, bounded by ``capacity``.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, capacity: int, sliding_window: int | None = None):
        if capacity < 1:
            raise ConfigError(f"GrowingLayer capacity must be >= 1, got {capacity}")
        super().__init__()
        self.capacity = capacity
        self.is_sliding = sliding_window is not None
        self.sliding_window = sliding_window
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"GrowingLayer(length={self.length}, capacity={self.capacity})"

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        room = min(self.capacity, key_states.shape[-2] + INITIAL_ROOM)
        self._k = key_states.new_empty((*key_states.shape[:2], room, key_states.shape[-1]))
        self._v = value_states.new_empty((*value_states.shape[:2], room, value_states.shape[-1]))
        self.is_initialized = True

    def _reserve(self, end: int) -> None:
        """Make room for ``end`` positions: a new buffer of twice the room (at most ``capacity``)."""
        if end > self.capacity:
            raise RuntimeError(f"GrowingLayer: {end} positions exceed the capacity of {self.capacity}")
        room = min(self.capacity, max(end, 2 * self._k.shape[-2]))
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], room, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        """Write the step's keys and values after the filled part; return views of everything so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._reserve(end)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (finished answers leave the batch); copies the filled part."""
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def reset(self) -> None:
        self.keys = self.values = self._k = self._v = None
        self.length = 0
        self.is_initialized = False

    def offload(self) -> None:
        """Move the buffers to CPU (transformers' cache offloading; HFAgent does not use it)."""
        if self.is_initialized:
            self._move("cpu")

    def prefetch(self) -> None:
        """Move offloaded buffers back to the layer's device."""
        if self.is_initialized and self._k.device != self.device:
            self._move(self.device)

    def _move(self, device: str | torch.device) -> None:
        self._k, self._v = self._k.to(device, non_blocking=True), self._v.to(device, non_blocking=True)
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


def growing_cache(model: Any, capacity: int) -> Any | None:
    """A transformers ``DynamicCache`` for ``model`` whose attention layers are :class:`GrowingLayer`.

    ``capacity`` is the most positions a row will hold (prompt width + most new tokens). Returns
    None for models outside transformers (remote code) and when the model's cache cannot be built
    from its config: the caller then lets the model make its own.
    """
    if not type(model).__module__.startswith("transformers."):  # remote code may expect its own cache
        return None
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - remote-code or legacy models: the model's own default cache
        return None
    if not cache.layers:
        return None
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            cache.layers[i] = GrowingLayer(capacity)
        elif type(layer) is DynamicSlidingWindowLayer and capacity < layer.sliding_window:
            # the whole answer fits in the window, so the window never cuts: a full layer, marked sliding
            cache.layers[i] = GrowingLayer(capacity, sliding_window=layer.sliding_window)
    return cache
