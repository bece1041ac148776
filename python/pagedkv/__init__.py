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

A storage tier behind the host tier (FileTier: a directory that outlives the process; RedisTier)
is given at creation: KvCache(..., storage=FileTier(config, dir, model_id="m")), or one store
per group for a ModelKvCache (storage=[...]); see docs/python.md (Storage tiers).

Block events go to KV-aware routers through EventPublisher (ZeroMQ, vLLM's wire format;
docs/events.md): pub = pagedkv.EventPublisher(block_size); pub.publish(cache) once per step.
It needs the extension built with the event library (HAS_EVENT_PUBLISHER); without it,
EventPublisher raises UnimplementedError.

Every failed call raises a subclass of PagedKvError (one per status code) and changes nothing.
See docs/python.md.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

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
BlockGeometry = _C.BlockGeometry
ControlEvent = _C.ControlEvent
EventKind = _C.EventKind
FileTier = _C.FileTier
ModelBatch = _C.ModelBatch
ModelGroup = _C.ModelGroup
RedisTier = _C.RedisTier
SequenceResidency = _C.SequenceResidency
StorageLayout = _C.StorageLayout
StorageTier = _C.StorageTier
Tier = _C.Tier
# Whether the extension was built with the event library (PAGEDKV_BUILD_EVENTS; ZeroMQ and
# msgpack-cxx found at build time).
HAS_EVENT_PUBLISHER = hasattr(_C, "EventPublisher")
# A cache's pools as regions for a transfer engine, block ids as addresses (docs/scale-out.md).
check_same_block_layout = _C.check_same_block_layout
pair_block_runs = _C.pair_block_runs

__version__ = "0.1.0"

if HAS_EVENT_PUBLISHER:
    EventPublisher = _C.EventPublisher
else:
    class EventPublisher:  # type: ignore[no-redef]
        """Stand-in for an extension built without the event library: creating one raises
        UnimplementedError (docs/python.md, "KV events")."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise UnimplementedError(
                StatusCode.UNIMPLEMENTED,
                "EventPublisher: pagedkv was built without the event library; install ZeroMQ "
                "and msgpack-cxx (scripts/setup-deps: libzmq3-dev cppzmq-dev "
                "libmsgpack-cxx-dev) and reinstall the package")


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


def _create(cache: Any, base_init: Callable[..., None], config: Optional[CacheConfig],
            fields: dict, *args: Any) -> None:
    """The __init__ of a KvCache or ModelKvCache: `base_init` (its super().__init__) creates the
    C++ cache from `config` with keyword `fields` replacing its own and `args`; the cache keeps
    the config."""
    config = _config(config, fields)
    base_init(config._to_cpp(), *args)
    cache._python_config = config


class KvCache(_C._KvCache):
    """A paged KV cache: the control plane, the device pool and (optionally) a host tier and a
    storage tier behind it.

    KvCache(config=None, *, enable_events=True, event_capacity=65536, storage=None,
    storage_staging_blocks=64, device=-1, stream=None, step_shape=None, tp_size=1,
    record_step_plans=False, **fields):
    `config` is a CacheConfig; keyword fields override it (or build one). `storage` is a
    FileTier or RedisTier of the config's layout (the cache needs a host tier); the cache holds
    it, and it serves no other cache meanwhile. `device` is the CUDA device of the pools (-1: the current one); every array
    the cache exports carries it as its DLPack device_id, and inputs on another device are
    refused. `stream` is the caller's stream (an int handle, or an object with `cuda_stream`
    such as torch.cuda.current_stream()): the cache queues all its work there, so it is ordered
    with the model's kernels and captured with them (docs/python.md, Streams); with tp_size > 1
    it is a list of one stream per rank (rank_compute_stream(r) gives each). `step_shape`,
    a tuple (max_batch, max_blocks_per_sequence, max_tokens), is the largest step the server
    runs: the upload arena is sized for it now, so such a step never allocates. `tp_size` > 1
    makes one control plane over that many tensor-parallel ranks' pools, rank r holding heads
    [r * rank_heads, (r + 1) * rank_heads) of every block (docs/scale-out.md): write_kv,
    gather_layer, layer_kv and write_kv_batch take `rank=`. With the ranks in worker processes,
    `record_step_plans=True` makes the scheduler's cache record its moves, copies and batches
    for take_step_plan(), whose bytes each worker's cache (of config.rank_config(tp_size))
    applies with apply_step_plan() (docs/scale-out.md, "Split processes"). The methods are
    the C++ KvCache's (include/pagedkv/cache.hpp), called directly: see pagedkv/_C.pyi for each.
    """

    def __init__(self, config: Optional[CacheConfig] = None, *, enable_events: bool = True,
                 event_capacity: int = 65536, storage: Optional[StorageTier] = None,
                 storage_staging_blocks: int = 64, device: int = -1, stream: Any = None,
                 step_shape: Optional[Tuple[int, int, int]] = None, tp_size: int = 1,
                 record_step_plans: bool = False, **fields: Any) -> None:
        _create(self, super().__init__, config, fields, enable_events, event_capacity, storage,
                storage_staging_blocks, device, stream, step_shape, tp_size, record_step_plans)

    @property
    def cache_config(self) -> CacheConfig:
        """The CacheConfig this cache was created with."""
        return self._python_config


class ModelKvCache(_C._ModelKvCache):
    """The cache of a model whose layers form several KV groups (CacheConfig.groups): sliding
    window next to full attention, windows of several widths, or MLA latents; layers are routed
    to their group.

    ModelKvCache(config=None, *, enable_events=True, event_capacity=65536, storage=None,
    storage_staging_blocks=64, **fields), as KvCache; `storage` is None or one store (FileTier,
    RedisTier or None) per group, each of its group's layout and with its own model id
    (FileTier(config, dir, model_id="m/full", group=0)), the group that owns the blocks among
    them. Every group lives in one cache whose groups share the logical blocks
    (docs/hybrid-models.md): one plan for every group, so a failed call never leaves a group
    behind. The group that attends furthest back (no window, else the widest) owns the blocks,
    with any number of window groups beside it. The
    methods are the C++ ModelKvCache's (include/pagedkv/model_cache.hpp); group(g) is a
    read-only view of one group (pools, stats, block locations); events are drained from the
    model.
    """

    def __init__(self, config: Optional[CacheConfig] = None, *, enable_events: bool = True,
                 event_capacity: int = 65536,
                 storage: Optional[Sequence[Optional[StorageTier]]] = None,
                 storage_staging_blocks: int = 64, **fields: Any) -> None:
        _create(self, super().__init__, config, fields, enable_events, event_capacity, storage,
                storage_staging_blocks)

    @property
    def cache_config(self) -> CacheConfig:
        """The CacheConfig this model cache was created with."""
        return self._python_config

    @property
    def groups(self) -> "list[ModelGroup]":
        """group(g) for every group, in order."""
        return [self.group(g) for g in range(self.num_groups)]


__all__ = [
    "AlreadyExistsError", "BackendKind", "Batch", "BatchArrays", "BlockGeometry", "CacheConfig",
    "CacheMode", "check_same_block_layout", "pair_block_runs", "ControlEvent", "DType",
    "EventKind", "EventPublisher", "EvictionPolicy", "FailedPreconditionError", "FileTier",
    "HAS_EVENT_PUBLISHER", "InternalError", "InvalidArgumentError", "KvCache", "KvGroup", "KvKind",
    "ModelBatch", "ModelGroup", "ModelKvCache", "NotFoundError", "OutOfRangeError", "PageLayout",
    "PagedKvError", "RedisTier", "ResourceExhaustedError", "SequenceResidency", "StatusCode",
    "StorageLayout", "StorageTier", "Tier", "UnavailableError", "UnimplementedError",
]
