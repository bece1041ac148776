"""The "pagedkv" attention function: registered with transformers' AttentionInterface, it
computes a PagedCache's decode step with pagedkv's decode kernel over the pool in place and
hands anything else to sdpa."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from .cache import PagedCache

ATTENTION = "pagedkv"


def register_attention(name: str = ATTENTION) -> str:
    """Registers the paged decode attention with transformers under `name` (and sdpa's mask
    for it) and returns the name: model.set_attn_implementation(name), or
    from_pretrained(..., attn_implementation=name). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, paged_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: Any, scaling: Optional[float] = None,
                    dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """An AttentionInterface function: a decode step (one new token a row) of a PagedCache
    whose K/V the cache left in the pool is computed by pagedkv's decode attention kernel over
    the step's batch (each row's own length, GQA by head groups); anything else (prefill,
    another cache) goes to transformers' sdpa."""
    paged = getattr(key, "_pagedkv", None)
    if paged is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    cache, layer = paged
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    q = query[:, :, 0, :].contiguous()  # [batch, q_heads, dim]
    out = torch.from_dlpack(cache.kv._decode_attention(cache._step[0], q, layer, scaling))
    return out.to(query.dtype)[:, None], None


def _tagged(key: torch.Tensor, cache: PagedCache, layer: int) -> torch.Tensor:
    """A view of the step's new keys marked for paged_attention: the K/V stay in the pool."""
    view = key.view_as(key)
    view._pagedkv = (cache, layer)
    return view
