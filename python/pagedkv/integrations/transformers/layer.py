"""PagedLayer: the per-layer object transformers' Cache API expects; it answers for one layer and
routes the K/V update to the PagedCache that owns the step."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import CacheLayerMixin

if TYPE_CHECKING:
    from .cache import PagedCache


class PagedLayer(CacheLayerMixin):
    """One model layer's face of a PagedCache: transformers asks layers for their lengths and
    mask sizes and whether they slide; the K/V themselves live in the shared pool."""

    is_compileable = False

    def __init__(self, cache: "PagedCache", layer: int, sliding_window: int,
                 layer_type: str = "full_attention") -> None:
        super().__init__()
        self.layer_type = layer_type
        self._cache = weakref.ref(cache)  # the cache owns its layers, not the reverse
        self.layer = layer
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window > 0
        # crop() is pagedkv's rollback; a window layer may have released what it would need.
        self.is_croppable = not self.is_sliding
        self.is_initialized = True

    @property
    def cache(self) -> "PagedCache":
        """The PagedCache this layer belongs to."""
        return self._cache()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the pool exists before the first token."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Routed to the cache, which owns the step (reserve, write, commit)."""
        return self.cache.update(key_states, value_states, self.layer)

    def first_visible(self, past: int) -> int:
        """The first position this layer's attention sees when `past` tokens are cached: 0, or
        for a window of W the W - 1 newest cached ones onwards (transformers' sliding layer
        keeps exactly those, so the masks and the sums match its own cache's)."""
        if not self.is_sliding:
            return 0
        return max(past - self.sliding_window + 1, 0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the K/V update() will return, for transformers' masks."""
        past = self.cache.get_seq_length()
        offset = self.first_visible(past)
        return past - offset + query_length, offset

    def get_seq_length(self) -> int:
        """Tokens cached (committed) for every row."""
        return self.cache.get_seq_length()

    def get_max_length(self) -> int:
        """-1: the pool bounds the length, not the layer."""
        return -1

    def reset(self) -> None:
        """Not supported: a pagedkv sequence is shortened by rollback, ended by finish."""
        raise NotImplementedError("PagedCache: use finish() and a new PagedCache")
