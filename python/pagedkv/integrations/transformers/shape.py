"""What a transformers config asks of pagedkv: the model's shape (layers, KV heads, head size,
sliding windows), the pool dtype of a torch dtype, and the KvCache or ModelKvCache made for it."""
from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

import pagedkv

_POOL_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def pool_dtype(dtype: torch.dtype) -> str:
    """The pagedkv pool dtype that stores `dtype` without rounding ("fp32", "fp16", "bf16")."""
    if dtype not in _POOL_DTYPES:
        raise ValueError(f"no pagedkv pool dtype for {dtype}")
    return _POOL_DTYPES[dtype]


def model_shape(config: Any) -> dict:
    """num_layers, num_kv_heads, head_dim and the per-layer types of a transformers config (its
    text decoder's, for a multimodal one): what the pool's page shape and the layers need."""
    text = config.get_text_config(decoder=True)
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
    unsupported = sorted(set(layer_types) - set(_SUPPORTED_LAYER_TYPES))
    if unsupported:
        raise NotImplementedError(f"pagedkv: layer types {unsupported} are not supported yet")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    windows = [kw.get("sliding_window") or 0 for kw in layer_kwargs]
    return dict(num_layers=len(layer_types), num_kv_heads=kv_heads, head_dim=head_dim,
                windows=windows, types=list(layer_types))


def kv_cache_for(config: Any, *, block_size: int = 16, num_device_blocks: int = 1024,
                 window_device_blocks: Optional[int] = None, dtype: str = "fp32",
                 backend: str = "cpu", paged_windows: bool = True, **fields: Any) -> Any:
    """A pagedkv cache shaped for a transformers model config. Create one per model and share
    it between requests: that is what makes a later prompt hit an earlier one's prefix.

    A model whose layers all attend fully gets a KvCache. One with sliding-window layers gets a
    ModelKvCache whose window groups release the blocks that fall out of the window (a decoding
    sequence holds ceil(W / block_size) + 1 blocks of such a group); paged_windows=False keeps
    every position of every layer in one KvCache instead. `num_device_blocks` sizes the pool of
    full-attention layers, `window_device_blocks` (default: the same) each window group's.
    `fields` are further CacheConfig fields (num_host_blocks, page_layout, ...)."""
    shape = model_shape(config)
    common = dict(num_layers=shape["num_layers"], block_size=block_size, backend=backend,
                  **fields)
    groups = _groups(shape, block_size, dtype, num_device_blocks,
                     window_device_blocks or num_device_blocks) if paged_windows else None
    if not groups:
        return pagedkv.KvCache(num_kv_heads=shape["num_kv_heads"], head_dim=shape["head_dim"],
                               num_device_blocks=num_device_blocks, dtype=dtype, **common)
    return pagedkv.ModelKvCache(groups=groups, **common)


def _groups(shape: dict, block_size: int, dtype: str, full_blocks: int,
            window_blocks: int) -> Optional[list]:
    """KV groups for a model with sliding layers: one for the full-attention layers, one per
    window size; None when no layer slides by at least a block (pagedkv's smallest window), so
    one uniform KvCache serves. A window below block_size stays in the full group: correct,
    only not paged by window."""
    by_window: dict = {}
    for layer, window in enumerate(shape["windows"]):
        by_window.setdefault(window if window >= block_size else 0, []).append(layer)
    if set(by_window) == {0}:
        return None
    heads, dim = shape["num_kv_heads"], shape["head_dim"]
    return [pagedkv.KvGroup(name=f"window{w}" if w else "full", layers=layers, num_kv_heads=heads,
                            head_dim=dim, dtype=dtype, sliding_window=w,
                            num_device_blocks=window_blocks if w else full_blocks)
            for w, layers in sorted(by_window.items())]
