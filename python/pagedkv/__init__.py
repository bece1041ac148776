"""pagedkv: a paged KV-cache runtime for transformer inference, from Python.

    import pagedkv
    cache = pagedkv.KvCache(num_layers=2, num_kv_heads=2, head_dim=64, backend="cpu")
    cached = cache.add_sequence(7, prompt)          # prefix-cache hit, in tokens
    slots = cache.reserve(7, len(prompt) - cached)  # blocks, copy-on-write
    cache.write_kv(7, layer, k, v)                  # any DLPack producer: numpy, torch, cupy
    cache.commit(7, prompt[cached:])
    batch = cache.build_batch([7], csr=True)        # batch.device.* / batch.host.*
    K, V = cache.layer_kv(layer)                    # zero-copy views of the pool

A hybrid model (sliding-window and full-attention layers, MLA latents) is a ModelKvCache over a
CacheConfig whose `groups` lists KvGroup entries; see docs/python.md and docs/hybrid-models.md.

Every failed call raises a subclass of PagedKvError (one per status code) and changes nothing.
See docs/python.md.
"""
from __future__ import annotations

from typing import Any, Optional

from . import _C
from .config import (
    BackendKind,
    CacheConfig,
    CacheMode,
    DType,
    EvictionPolicy,
    KvGroup,
    KvKind,
    PageLayout,
)
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
ModelBatch = _C.ModelBatch
ModelGroup = _C.ModelGroup
SequenceResidency = _C.SequenceResidency
Tier = _C.Tier

__version__ = "0.1.0"


def _config(config: Optional[CacheConfig], fields: dict) -> CacheConfig:
    """`config` (or the default CacheConfig) with keyword `fields` replacing its own."""
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
    return config


class KvCache(_C._KvCache):
    """A paged KV cache: the control plane, the device pool and (optionally) a host tier.

    KvCache(config=None, *, enable_events=True, event_capacity=65536, **fields): `config` is a
    CacheConfig; keyword fields override it (or build one). The methods are the C++ KvCache's
    (include/pagedkv/cache.hpp), called directly: see pagedkv/_C.pyi for each.
    """

    def __init__(self, config: Optional[CacheConfig] = None, *, enable_events: bool = True,
                 event_capacity: int = 65536, **fields: Any) -> None:
        config = _config(config, fields)
        super().__init__(config._to_cpp(), enable_events, event_capacity)
        self._python_config = config

    @property
    def cache_config(self) -> CacheConfig:
        """The CacheConfig this cache was created with."""
        return self._python_config


class ModelKvCache(_C._ModelKvCache):
    """The cache of a model whose layers form several KV groups (CacheConfig.groups): sliding
    window next to full attention, or MLA latents. One KvCache per group, kept in step; layers
    are routed to their group.

    ModelKvCache(config=None, *, enable_events=True, event_capacity=65536, **fields), as
    KvCache. The methods are the C++ ModelKvCache's (include/pagedkv/model_cache.hpp);
    group(g) is a read-only view of one group (pools, stats, events).
    """

    def __init__(self, config: Optional[CacheConfig] = None, *, enable_events: bool = True,
                 event_capacity: int = 65536, **fields: Any) -> None:
        config = _config(config, fields)
        super().__init__(config._to_cpp(), enable_events, event_capacity)
        self._python_config = config

    @property
    def cache_config(self) -> CacheConfig:
        """The CacheConfig this model cache was created with."""
        return self._python_config

    @property
    def groups(self) -> "list[ModelGroup]":
        """group(g) for every group, in order."""
        return [self.group(g) for g in range(self.num_groups)]


__all__ = [
    "AlreadyExistsError", "BackendKind", "Batch", "BatchArrays", "CacheConfig", "CacheMode",
    "ControlEvent", "DType", "EventKind", "EvictionPolicy", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "KvCache", "KvGroup", "KvKind", "ModelBatch",
    "ModelGroup", "ModelKvCache", "NotFoundError", "OutOfRangeError", "PageLayout",
    "PagedKvError", "ResourceExhaustedError", "SequenceResidency", "StatusCode", "Tier",
    "UnavailableError", "UnimplementedError",
]
