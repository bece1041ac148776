"""pagedkv: a paged KV-cache runtime for transformer inference, from Python.

    import pagedkv
    cache = pagedkv.KvCache(num_layers=2, num_kv_heads=2, head_dim=64, backend="cpu")
    cached = cache.add_sequence(7, prompt)          # prefix-cache hit, in tokens
    slots = cache.reserve(7, len(prompt) - cached)  # blocks, copy-on-write
    cache.write_kv(7, layer, k, v)                  # any DLPack producer: numpy, torch, cupy
    cache.commit(7, prompt[cached:])
    batch = cache.build_batch([7], csr=True)        # batch.device.* / batch.host.*
    K, V = cache.layer_kv(layer)                    # zero-copy views of the pool

Every failed call raises a subclass of PagedKvError (one per status code) and changes nothing.
See docs/python.md.
"""
from __future__ import annotations

from typing import Any, Optional

from . import _C
from .config import BackendKind, CacheConfig, CacheMode, DType, EvictionPolicy, PageLayout
from .errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PagedKvError,
    ResourceExhaustedError,
    StatusCode,
    UnavailableError,
    UnimplementedError,
)

Batch = _C.Batch
BatchArrays = _C.BatchArrays
ControlEvent = _C.ControlEvent
EventKind = _C.EventKind
SequenceResidency = _C.SequenceResidency
Tier = _C.Tier

__version__ = "0.1.0"


class KvCache(_C._KvCache):
    """A paged KV cache: the control plane, the device pool and (optionally) a host tier.

    KvCache(config=None, *, enable_events=True, event_capacity=65536, **fields): `config` is a
    CacheConfig; keyword fields override it (or build one). The methods are the C++ KvCache's
    (include/pagedkv/cache.hpp), called directly: see pagedkv/__init__.pyi for each.
    """

    def __init__(self, config: Optional[CacheConfig] = None, *, enable_events: bool = True,
                 event_capacity: int = 65536, **fields: Any) -> None:
        if config is None:
            config = CacheConfig()
        if fields:
            import dataclasses

            names = {f.name for f in dataclasses.fields(CacheConfig)}
            unknown = sorted(set(fields) - names)
            if unknown:
                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                           f"{unknown[0]}: not a CacheConfig field")
            config = dataclasses.replace(config, **fields)
        super().__init__(config._to_cpp(), enable_events, event_capacity)
        self._python_config = config

    @property
    def cache_config(self) -> CacheConfig:
        """The CacheConfig this cache was created with."""
        return self._python_config


__all__ = [
    "AlreadyExistsError", "BackendKind", "Batch", "BatchArrays", "CacheConfig", "CacheMode", "ControlEvent",
    "DType", "EventKind", "EvictionPolicy", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "KvCache", "NotFoundError", "OutOfRangeError", "PageLayout",
    "PagedKvError", "ResourceExhaustedError", "SequenceResidency", "StatusCode", "Tier",
    "UnavailableError", "UnimplementedError",
]
