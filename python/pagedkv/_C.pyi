"""pagedkv C++ runtime (use the pagedkv package, not this module)"""

from collections.abc import Sequence
import enum
from typing import Any, overload

import numpy
from numpy.typing import NDArray


def _register_error_classes(arg: dict, /) -> None:
    """
    Registers the exception class raised for each status code (called by the package).
    """

def _raise_status(arg0: int, arg1: str, /) -> None:
    """Raises the exception of a status code (tests of the error bridge)."""

def _cuda_backend_built() -> bool:
    """Whether this build has the CUDA backend."""

def _cuda_device_available() -> bool:
    """Whether the CUDA backend is built and a device is present."""

class StatusCode(enum.Enum):
    """Error codes by meaning (pagedkv/status.hpp)."""

    OK = 0

    INVALID_ARGUMENT = 1

    NOT_FOUND = 2

    ALREADY_EXISTS = 3

    OUT_OF_RANGE = 4

    FAILED_PRECONDITION = 5

    RESOURCE_EXHAUSTED = 6

    UNAVAILABLE = 7

    UNIMPLEMENTED = 8

    INTERNAL = 9

class DType(enum.Enum):
    """Element type of a pool or of an input array."""

    FLOAT16 = 0

    BFLOAT16 = 1

    FLOAT32 = 2

    FLOAT8_E4M3 = 3

class PageLayout(enum.Enum):
    """NHD: [block_size, heads, dim]; HND: [heads, ...]."""

    NHD = 0

    HND = 1

class EvictionPolicy(enum.Enum):
    NONE = 0

    LRU = 1

    FIFO = 2

class CacheMode(enum.Enum):
    """Paged (the KvCache) or dense (seed surface only)."""

    PAGED = 0

    DENSE = 1

class KvKind(enum.Enum):
    """
    What a page holds per token: KEY_VALUE (keys and values) or LATENT (one MLA latent vector, keys only).
    """

    KEY_VALUE = 0

    LATENT = 1

class BackendKind(enum.Enum):
    AUTO = 0

    CPU = 1

    CUDA = 2

    NULL = 3

class Tier(enum.Enum):
    """Where a block's bytes live; STORAGE appears only in events."""

    DEVICE = 0

    HOST = 1

    STORAGE = 2

class SequenceResidency(enum.Enum):
    DEVICE = 0

    IN_FLIGHT = 1

    HOST = 2

class EventKind(enum.Enum):
    BLOCK_STORED = 0

    BLOCK_REMOVED = 1

    SEQUENCE_EVICTED = 2

    SEQUENCE_OFFLOADED = 3

    SEQUENCE_RESTORED = 4

    EVENTS_DROPPED = 5

class _KvGroup:
    """The C++ KvGroup (use pagedkv.KvGroup)."""

    def __init__(self) -> None: ...

    @property
    def name(self) -> str: ...

    @name.setter
    def name(self, arg: str, /) -> None: ...

    @property
    def layers(self) -> list[int]: ...

    @layers.setter
    def layers(self, arg: Sequence[int], /) -> None: ...

    @property
    def num_kv_heads(self) -> int: ...

    @num_kv_heads.setter
    def num_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def kv_kind(self) -> KvKind: ...

    @kv_kind.setter
    def kv_kind(self, arg: KvKind, /) -> None: ...

    @property
    def rope_dim(self) -> int: ...

    @rope_dim.setter
    def rope_dim(self, arg: int, /) -> None: ...

    @property
    def sliding_window(self) -> int: ...

    @sliding_window.setter
    def sliding_window(self, arg: int, /) -> None: ...

    @property
    def num_device_blocks(self) -> int: ...

    @num_device_blocks.setter
    def num_device_blocks(self, arg: int, /) -> None: ...

    @property
    def num_host_blocks(self) -> int: ...

    @num_host_blocks.setter
    def num_host_blocks(self, arg: int, /) -> None: ...

class _CacheConfig:
    """The C++ CacheConfig (use pagedkv.CacheConfig)."""

    def __init__(self) -> None: ...

    @property
    def num_layers(self) -> int: ...

    @num_layers.setter
    def num_layers(self, arg: int, /) -> None: ...

    @property
    def num_kv_heads(self) -> int: ...

    @num_kv_heads.setter
    def num_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def block_size(self) -> int: ...

    @block_size.setter
    def block_size(self, arg: int, /) -> None: ...

    @property
    def num_device_blocks(self) -> int: ...

    @num_device_blocks.setter
    def num_device_blocks(self, arg: int, /) -> None: ...

    @property
    def num_host_blocks(self) -> int: ...

    @num_host_blocks.setter
    def num_host_blocks(self, arg: int, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def page_layout(self) -> PageLayout: ...

    @page_layout.setter
    def page_layout(self, arg: PageLayout, /) -> None: ...

    @property
    def mode(self) -> CacheMode: ...

    @mode.setter
    def mode(self, arg: CacheMode, /) -> None: ...

    @property
    def eviction_policy(self) -> EvictionPolicy: ...

    @eviction_policy.setter
    def eviction_policy(self, arg: EvictionPolicy, /) -> None: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @enable_prefix_caching.setter
    def enable_prefix_caching(self, arg: bool, /) -> None: ...

    @property
    def cache_prefixes_on_host(self) -> bool: ...

    @cache_prefixes_on_host.setter
    def cache_prefixes_on_host(self, arg: bool, /) -> None: ...

    @property
    def max_sequence_length(self) -> int: ...

    @max_sequence_length.setter
    def max_sequence_length(self, arg: int, /) -> None: ...

    @property
    def sliding_window(self) -> int: ...

    @sliding_window.setter
    def sliding_window(self, arg: int, /) -> None: ...

    @property
    def kv_kind(self) -> KvKind: ...

    @kv_kind.setter
    def kv_kind(self, arg: KvKind, /) -> None: ...

    @property
    def rope_dim(self) -> int: ...

    @rope_dim.setter
    def rope_dim(self, arg: int, /) -> None: ...

    @property
    def backend(self) -> BackendKind: ...

    @backend.setter
    def backend(self, arg: BackendKind, /) -> None: ...

    @property
    def groups(self) -> list[_KvGroup]: ...

    @groups.setter
    def groups(self, arg: Sequence[_KvGroup], /) -> None: ...

    def num_groups(self) -> int: ...

    def block_bytes(self) -> int: ...

    def page_bytes(self) -> int: ...

    def group_config(self, g: int) -> _CacheConfig:
        """The one-group config of group g. OutOfRangeError."""

    def blocks_per_sequence(self, context: int) -> int: ...

    def with_pools(self, device_bytes: int, host_bytes: int, context: int) -> _CacheConfig: ...

    def rank_config(self, tp_size: int) -> _CacheConfig: ...

class ControlEvent:
    """
    One control-plane event: block stored/removed on a tier, sequence evicted/offloaded/restored, or events dropped (resync).
    """

    @property
    def kind(self) -> EventKind: ...

    @property
    def tier(self) -> Tier: ...

    @property
    def sequence(self) -> int: ...

    @property
    def block_hash(self) -> int: ...

    @property
    def parent_hash(self) -> int: ...

    @property
    def ns(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def dropped_events(self) -> int: ...

    @property
    def group(self) -> int:
        """
        The KV group whose cache recorded the event: 0 from a KvCache, the group's index in CacheConfig.groups from a ModelKvCache (or one of its ModelGroup views).
        """

    def __repr__(self) -> str: ...

class _DeviceMemory:
    """Backend memory owned by exported arrays."""

class _KvCache:
    """The C++ KvCache (use pagedkv.KvCache)."""

    def __init__(self, config: _CacheConfig, enable_events: bool = True, event_capacity: int = 65536, storage: StorageTier | None = None, storage_staging_blocks: int = 64, device: int = -1, stream: object | None = None, step_shape: tuple[int, int, int] | None = None, tp_size: int = 1, record_step_plans: bool = False) -> None:
        """
        Creates the cache from a C++ CacheConfig (use pagedkv.KvCache(config, **fields)); `storage` a FileTier or RedisTier of the config's layout, which the cache holds; `device` the CUDA device (-1: the current one); `stream` the caller's stream (an int handle or an object with `cuda_stream`), on which the cache then queues its work (with tp_size > 1 a list of one per rank: KvCacheOptions::rank_native_compute_streams); `step_shape` (max_batch, max_blocks_per_sequence, max_tokens) the largest step, for which the upload arena is sized now (KvCacheOptions::step_shape); `tp_size` the tensor-parallel ranks (KvCacheOptions::tp_size): one control plane over that many pools, each of its share of the heads, one backend each (GPU r, or the CPU's); `record_step_plans` records the moves, copies and batches of its calls for take_step_plan (KvCacheOptions::record_step_plans).
        """

    def take_step_plan(self) -> bytes:
        """
        The moves, copies and batches the calls since the last take recorded, as the bytes a worker's apply_step_plan takes (pagedkv/step_plan.hpp); a plan of no steps without record_step_plans.
        """

    @property
    def tp_size(self) -> int:
        """
        Tensor-parallel ranks: the `rank` of write_kv, gather_layer, layer_kv and the batch writes is in [0, tp_size).
        """

    @property
    def rank_heads(self) -> int:
        """
        KV heads one rank holds (num_kv_heads / tp_size; a latent cache's 1): rank r holds heads [r * rank_heads, (r + 1) * rank_heads).
        """

    @property
    def config(self) -> _CacheConfig: ...

    @property
    def backend_description(self) -> str: ...

    @property
    def device_type(self) -> int: ...

    @property
    def device(self) -> int:
        """The device ordinal of the pools (DLPack's device_id of every export)."""

    @property
    def compute_stream(self) -> int:
        """
        The native handle of the stream the cache queues its work on (the `stream` it was given, else its own; 0 for the CPU backend's own): torch.cuda.ExternalStream(cache.compute_stream) lets torch wait_stream on it.
        """

    def rank_compute_stream(self, rank: int) -> int:
        """
        compute_stream of rank `rank` (the stream of `stream`'s list given for it, else the rank's own). OutOfRangeError for a rank outside the cache.
        """

    @property
    def pool_info(self) -> dict[str, Any]: ...

    def add_sequence(self, id: int, prompt: Sequence[int], priority: int = 0, ns: int = 0, retention_priority: int = 35, retention_duration_ns: int = 0) -> int:
        """
        Adds a sequence; returns how many prompt tokens are already cached (full blocks of a known prefix). AlreadyExistsError, InvalidArgumentError.
        """

    def reserve(self, id: int, n: int) -> NDArray[numpy.int64]:
        """
        Reserves device slots for the next n tokens (allocates, copy-on-write, restores); returns the slots (block * block_size + offset) as int64 numpy. NotFoundError, OutOfRangeError, ResourceExhaustedError.
        """

    def reserve_batch(self, ids: Sequence[int], n_each: int = 1) -> NDArray[numpy.int64]:
        """
        Reserves n_each slots for each of ids (distinct) in one call; returns every slot, grouped by sequence in ids order. Nothing changes on error.
        """

    def commit(self, id: int, tokens: Sequence[int]) -> None:
        """
        Commits the token ids of the first len(tokens) reserved slots; full blocks enter the prefix index. FailedPreconditionError when nothing is reserved.
        """

    def commit_batch(self, ids: Sequence[int], tokens: Sequence[int], n_each: int = 1) -> None:
        """
        Commits n_each tokens for each of ids: tokens holds them sequence after sequence. Everything is checked first.
        """

    def rollback(self, id: int, length: int) -> None:
        """
        Shortens a sequence to `length` committed tokens (speculative decoding).
        """

    def fork(self, parent: int, child: int) -> None:
        """
        Creates `child` sharing every block of `parent` (parallel sampling, beam search).
        """

    def finish(self, id: int) -> None:
        """Removes a sequence; its full blocks stay cached for later prompts."""

    def erase(self, id: int) -> None:
        """Removes a sequence and the blocks only it held."""

    def set_active(self, ids: Sequence[int]) -> None:
        """Replaces the active set (never evicted or offloaded)."""

    def set_priority(self, id: int, priority: int) -> None:
        """
        Sets a sequence's scheduling priority (lower is offloaded or dropped first).
        """

    def offload(self, id: int) -> None:
        """
        Queues the offload of an inactive sequence to the host tier (copy stream).
        """

    def restore(self, id: int) -> None:
        """
        Queues the restore of an offloaded sequence; later compute-stream work waits for it.
        """

    def prefetch(self, ids: Sequence[int]) -> None:
        """
        Queues the restore of those of ids that are offloaded while free device blocks suffice; never offloads others.
        """

    def residency(self, id: int) -> SequenceResidency:
        """SequenceResidency.DEVICE, IN_FLIGHT or HOST. NotFoundError."""

    def drain_evicted_sequences(self) -> list[int]:
        """Sequences dropped (not offloaded) to make room since the last call."""

    def synchronize(self) -> None:
        """Blocks until the cache's queued work (kernels and transfers) is done."""

    @property
    def storage(self) -> StorageTier | None:
        """
        The storage tier (FileTier or RedisTier) the cache was created with, or None.
        """

    def fetch_from_storage(self, prompt: Sequence[int], ns: int = 0) -> int:
        """
        Starts bringing the blocks the storage tier holds after the prompt's cached prefix into free host slots; returns how many blocks are on their way (0 without a storage tier). Never waits: they become prefix hits once landed (poll_storage, flush_storage). OutOfRangeError for a prompt past max_sequence_length.
        """

    def fetch_prefix_from_storage(self, prompt: Sequence[int], max_cached: int = -1, ns: int = 0) -> tuple[int, int]:
        """
        fetch_from_storage for a hit of at most max_cached tokens (-1: no bound); returns (blocks on their way, tokens a hit reaches once they land). InvalidArgumentError for max_cached < -1.
        """

    def poll_storage(self) -> None:
        """
        Lands finished storage reads (now prefix hits) and hands staged write-backs to the store. Never waits; add_sequence, reserve and reserve_batch do it too.
        """

    def storage_in_flight(self) -> int:
        """Blocks fetched from storage that have not landed yet."""

    def flush_storage(self) -> None:
        """
        Waits (without the GIL) until every staged write-back and storage read has finished and landed.
        """

    def contains(self, id: int) -> bool:
        """Whether the sequence exists (offloaded ones included)."""

    def length(self, id: int) -> int:
        """Committed token count. NotFoundError."""

    def pending(self, id: int) -> int:
        """Reserved, uncommitted token count. NotFoundError."""

    def block_locations(self, id: int) -> list[tuple[Tier, int]]:
        """
        (Tier, physical block id) of each block of the sequence, reserved ones included.
        """

    def stats(self) -> dict[str, Any]:
        """
        Counters as a dict: 'device' and 'host' tier dicts plus the control-plane counts.
        """

    def drain_events(self) -> list[ControlEvent]:
        """
        Control events since the last drain, as ControlEvent objects (block events carry their tier).
        """

    def check_invariants(self) -> None:
        """
        Recounts every reference and state; InternalError names the first broken invariant.
        """

    def layer_kv(self, layer: int, rank: int = 0) -> tuple[Any, Any | None]:
        """
        (K, V): zero-copy DLPack views of one layer of the whole device pool, [num_blocks, block_size, heads, dim] (NHD) or [num_blocks, heads, block_size, dim] (HND), page stride = one block of all layers; (latents, None) for a latent (MLA) cache, heads = 1. They keep the cache alive; read them after synchronize() or on the compute stream. With tensor parallelism, rank `rank`'s pool, of its heads. OutOfRangeError.
        """

    def write_kv(self, id: int, layer: int, key: object, value: object | None = None, rank: int = 0) -> None:
        """
        Writes K/V of the tokens reserved by the last reserve() into one layer. key/value: any DLPack producer on the cache's device, [pending, heads, dim], float16/bfloat16/float32, any row stride; a latent (MLA) cache takes the latents as key and value=None. Host (numpy) inputs are read before the call returns. With tensor parallelism, rank `rank`'s heads [pending, rank_heads, dim] into its pool.
        """

    def gather_layer(self, id: int, layer: int, layout: str = 'token_major', dtype: DType | None = None, begin: int = 0, num_tokens: int = -1, rank: int = 0) -> tuple[Any, Any | None]:
        """
        Packs positions [begin, begin + num_tokens) of one layer of a sequence into new arrays (token_major [len, heads, dim] or head_major [heads, len, dim]); (latents, None) for a latent (MLA) cache. Waits for the copy. With tensor parallelism, rank `rank`'s heads.
        """

    def build_batch(self, ids: Sequence[int], csr: bool = False, pad_slots_to: int = 0) -> Batch:
        """
        Builds a step's batch metadata and uploads it on the compute stream; returns a Batch (.device arrays valid until the next build_batch, .host numpy copies).
        """

    def apply_step_plan(self, plan: bytes) -> list:
        """
        A worker's side of split-process tensor parallelism: carries out another cache's take_step_plan() bytes on this cache's pools (one rank's part of that cache's model: CacheConfig.rank_config) and returns a Batch per built batch in it, through which the worker's model writes and reads (write_kv_batch, its .device arrays). InvalidArgumentError for damaged bytes or block ids outside the pools (nothing changes), FailedPreconditionError for a cache with sequences of its own.
        """

    def write_kv_batch(self, batch: Batch, layer: int, key: object, value: object | None = None, rank: int | None = None) -> None:
        """
        Writes one layer's K/V of every token of the current batch through its slot mapping in one launch; key/value [len(slot_mapping), heads, dim] (padding rows skipped); value=None for a latent (MLA) cache. With tensor parallelism, rank `rank`'s heads (None: the batch's rank) into its pool, through the batch as uploaded to that rank.
        """

    def rank_batch(self, batch: Batch, rank: int) -> object:
        """
        With tensor parallelism: the same batch as uploaded to rank `rank` (Batch.rank), whose .device arrays are on that rank's device and index its pool; current as long as `batch` is. OutOfRangeError for a rank outside the cache, FailedPreconditionError for a stale batch.
        """

    def write_kv_batch_all_layers(self, batch: Batch, key: object, value: object | None = None) -> None:
        """
        write_kv_batch of every layer in one launch: key/value [num_layers, len(slot_mapping), heads, dim] (any layer and row strides; value=None for a latent cache).
        """

    def build_batch_into(self, ids: Sequence[int], kv_indptr: object, kv_indices: object, kv_last_page_len: object, slot_mapping: object | None = None) -> tuple[Batch, NDArray[numpy.int32], NDArray[numpy.int32]]:
        """
        FlashInfer CUDA-graph mode: builds the batch and copies its CSR arrays (int32) into caller-owned fixed-address buffers, and its slot mapping (int64, padded with -1) into `slot_mapping` when given (then write_kv_batch over the batch may be captured); returns (batch, host kv_indptr, host kv_last_page_len) for plan(). Capacities are checked first.
        """

    def append_indices(self, batch: Batch, batch_indices: object | None = None, positions: object | None = None) -> tuple[NDArray[numpy.int32], NDArray[numpy.int32], NDArray[numpy.int32]]:
        """
        FlashInfer append path of a batch: (append_indptr, batch_indices, positions) int32 numpy as get_batch_indices_positions defines them; also copied into the device buffers when given.
        """

    def build_vllm_batch_into(self, ids: Sequence[int], block_table: object, slot_mapping: object) -> Batch:
        """
        vLLM: builds the batch into a caller-owned int32 block_table [max_reqs, max_blocks] (-1 past a row's blocks) and an int64 slot_mapping padded with -1 to its length.
        """

    def _decode_attention(self, batch: object, q: object, layer: int, sm_scale: float) -> Any:
        """
        The C++ reference decode attention (kernels/decode_attention.hpp, the kernel of examples/paged_decode_attention) over a built batch; float32 [batch, q_heads, dim].
        """

    def _bench_step_cpp(self, ids: Sequence[int], steps: int) -> float:
        """
        Seconds for `steps` C++ steps of reserve_batch + build_batch + commit_batch.
        """

    def regions(self) -> list[dict[str, Any]]:
        """
        Every pool as a region to register with a transfer engine: dicts {group, tier, base, bytes, memory ('DRAM'/'VRAM'), device, rank}, per tensor-parallel rank and group the device pool then the host pool.
        """

    def block_geometry(self, group: int = 0, tier: Tier = Tier.DEVICE, model_id: str = '', rank: int = 0) -> BlockGeometry:
        """
        The BlockGeometry of a group's pool on a tier (Tier.DEVICE or Tier.HOST), its fingerprint naming model_id too. A peer writes a sequence's blocks after the reserve that gave them and synchronize(), before commit. With tensor parallelism, rank `rank`'s pool (its fingerprint names the tp_size and the rank). OutOfRangeError, InvalidArgumentError, FailedPreconditionError (no host tier).
        """

class BatchArrays:
    """A batch's arrays, by attribute name."""

    def __getattr__(self, arg: str, /) -> object: ...

    def __dir__(self) -> list[str]: ...

    @property
    def on_device(self) -> bool: ...

class Batch:
    """
    One step's batch metadata: `.device` arrays (valid until the next build_batch, ready on the compute stream) and `.host` numpy copies.
    """

    @property
    def device(self) -> BatchArrays: ...

    @property
    def host(self) -> BatchArrays: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def max_blocks(self) -> int: ...

    @property
    def ring_table(self) -> bool:
        """
        The block table's rows are rings (build_batch(ring_window_tables=True), a window group's): block i of a row at column i % max_blocks while it is in the window.
        """

    @property
    def ids(self) -> list[int]: ...

    @property
    def is_current(self) -> bool: ...

    @property
    def has_csr(self) -> bool: ...

    @property
    def rank(self) -> int:
        """
        The tensor-parallel rank whose device holds the .device arrays (KvCache.rank_batch).
        """

    @property
    def group(self) -> int | None:
        """The group of a ModelBatch's batch; None for a KvCache's."""

    def __repr__(self) -> str: ...

class ModelGroup:
    """
    One KV group of a ModelKvCache, read-only: its pools (layer_kv), config, stats and block locations. Sequence calls and events go through the ModelKvCache, which plans every group at once.
    """

    @property
    def index(self) -> int:
        """The group's index in the model."""

    @property
    def name(self) -> str:
        """The group's name ('' for a model without groups)."""

    @property
    def layers(self) -> list[int]:
        """The model layers the group holds; layer_kv(i) is the i-th of them."""

    @property
    def config(self) -> _CacheConfig:
        """The group's one-group config (its layers numbered from 0)."""

    @property
    def pool_info(self) -> dict[str, Any]:
        """
        Bytes of the model's pools (every group's, which one cache holds) and their allocation times.
        """

    def layer_kv(self, layer: int) -> tuple[Any, Any | None]:
        """
        (K, V) zero-copy views of the group's device pool for its layer `layer` (an index into .layers), as KvCache.layer_kv; (latents, None) for a latent group. They keep the model alive. OutOfRangeError.
        """

    def stats(self) -> dict[str, Any]:
        """
        The group's counters (C++ KvCache::group_stats): its own pools' device and host counts, the pages it evicted and released from its window; every other counter is the model's.
        """

    def block_locations(self, id: int) -> list[tuple[Tier, int]]:
        """
        (Tier, physical block id) of each block of the sequence in this group; -1 for a block that fell out of a sliding window. NotFoundError.
        """

    def __repr__(self) -> str: ...

class ModelBatch:
    """
    One ModelKvCache.build_batch: a Batch per group (batch[g] or .groups), each with the group's block tables, CSR arrays and slot mapping; device arrays valid until the model's next build_batch.
    """

    @property
    def groups(self) -> list[Batch]:
        """The Batch of each group."""

    def __len__(self) -> int: ...

    def __getitem__(self, group: int) -> Batch:
        """The Batch of group `group`. OutOfRangeError."""

    @property
    def num_groups(self) -> int: ...

    @property
    def ids(self) -> list[int]: ...

    @property
    def is_current(self) -> bool: ...

    def __repr__(self) -> str: ...

class _ModelKvCache:
    """The C++ ModelKvCache (use pagedkv.ModelKvCache)."""

    def __init__(self, config: _CacheConfig, enable_events: bool = True, event_capacity: int = 65536, storage: Sequence[StorageTier | None] | None = None, storage_staging_blocks: int = 64) -> None:
        """
        Creates the one KvCache whose KV groups share the logical blocks, from a C++ CacheConfig (use pagedkv.ModelKvCache); `storage` None or one store (or None) per group, each of its group's layout and its own model id; the model holds them.
        """

    @property
    def config(self) -> _CacheConfig: ...

    @property
    def num_groups(self) -> int: ...

    @property
    def backend_description(self) -> str: ...

    @property
    def device_type(self) -> int: ...

    def layer_group(self, layer: int) -> tuple[int, int]:
        """
        (group, layer index inside the group) of a model layer. OutOfRangeError.
        """

    def group(self, group: int) -> ModelGroup:
        """
        A read-only view of group `group` (its pools, config, stats); it keeps the model alive. OutOfRangeError.
        """

    def stats(self) -> dict[str, Any]:
        """
        The model's counters, as KvCache.stats(): device and host counts of the blocks (the owner group's), and what every group does once (sequences, prefix lookups, moves); group(g).stats() has each group's pages.
        """

    def add_sequence(self, id: int, prompt: Sequence[int], priority: int = 0, ns: int = 0, retention_priority: int = 35, retention_duration_ns: int = 0) -> int:
        """
        Adds a sequence to every group; returns the prompt tokens every group can supply from its prefix cache. AlreadyExistsError, InvalidArgumentError.
        """

    def reserve(self, id: int, n: int) -> list:
        """
        Reserves the next n tokens in every group; returns each group's slots (int64 numpy, block * block_size + offset in that group's pool). ResourceExhaustedError drops the reservation in every group.
        """

    def reserve_batch(self, ids: Sequence[int], n_each: int = 1) -> None:
        """
        Reserves n_each tokens for each of ids (distinct) in every group; the slots are in the next build_batch's slot_mapping of each group.
        """

    def commit(self, id: int, tokens: Sequence[int]) -> None:
        """
        Commits in every group (checked in full first). FailedPreconditionError when nothing is reserved or a group offloaded the sequence after its reserve (restore it first).
        """

    def commit_batch(self, ids: Sequence[int], tokens: Sequence[int], n_each: int = 1) -> None:
        """
        Commits n_each tokens for each of ids in every group; tokens holds them sequence after sequence.
        """

    def rollback(self, id: int, length: int) -> None:
        """
        Shortens the sequence in every group. FailedPreconditionError, nothing changed, when a window group no longer holds what the shorter length needs.
        """

    def fork(self, parent: int, child: int) -> None:
        """Forks the sequence in every group."""

    def finish(self, id: int) -> None:
        """Removes the sequence; its full blocks stay cached for later prompts."""

    def erase(self, id: int) -> None:
        """Removes the sequence and the blocks only it held."""

    def set_active(self, ids: Sequence[int]) -> None:
        """Replaces the active set (never evicted or offloaded) in every group."""

    def set_priority(self, id: int, priority: int) -> None:
        """Sets the sequence's scheduling priority."""

    def offload(self, id: int) -> None:
        """
        Offloads the sequence in every group (a window group moves its window only); on an error the groups that went ahead restore it.
        """

    def restore(self, id: int) -> None:
        """Restores the sequence in every group where it is offloaded."""

    def prefetch(self, ids: Sequence[int]) -> None:
        """KvCache.prefetch in every group."""

    def residency(self, id: int) -> SequenceResidency:
        """The least ready residency over the groups. NotFoundError."""

    def drain_evicted_sequences(self) -> list[int]:
        """
        Sequences some group dropped to make room since the last call (gone from every group).
        """

    def build_batch(self, ids: Sequence[int], csr: bool = False, pad_slots_to: int = 0, ring_window_tables: bool = False) -> ModelBatch:
        """
        Builds a step's batch metadata in every group; returns a ModelBatch (batch[g] is group g's Batch; its device arrays are valid until the next build_batch). ring_window_tables=True: window groups beside the full one get ring tables (Batch.ring_table: a row's block i at column i % max_blocks while in the window).
        """

    def write_kv(self, id: int, layer: int, key: object, value: object | None = None) -> None:
        """
        Writes model layer `layer` of the reserved tokens into its group: key/value [pending, heads, dim] of that group's shape; a latent group takes the latents as key and value=None. Host (numpy) inputs are read before the call returns.
        """

    def write_kv_batch(self, batch: ModelBatch, layer: int, key: object, value: object | None = None) -> None:
        """
        Writes model layer `layer` of every token of the current ModelBatch through its group's slot mapping; key/value [len(batch[group].host.slot_mapping), heads, dim] (value=None for a latent group).
        """

    def write_kv_batch_all_layers(self, batch: ModelBatch, group: int, key: object, value: object | None = None) -> None:
        """
        Writes every layer of group `group` of the current ModelBatch in one launch: key/value [len(group.layers), len(batch[group].host.slot_mapping), heads, dim], the layers in the order the group lists them (value=None for a latent group).
        """

    def gather_layer(self, id: int, layer: int, layout: str = 'token_major', dtype: DType | None = None, begin: int = 0, num_tokens: int = -1) -> tuple[Any, Any | None]:
        """
        Packs positions [begin, begin + num_tokens) of model layer `layer` of a sequence into new arrays, as KvCache.gather_layer; (latents, None) for a latent group. OutOfRangeError for positions a window group no longer holds.
        """

    def layer_kv(self, layer: int) -> tuple[Any, Any | None]:
        """
        (K, V) zero-copy views of model layer `layer` in its group's device pool, as KvCache.layer_kv; (latents, None) for a latent group. OutOfRangeError.
        """

    def synchronize(self) -> None:
        """Blocks until the model's queued work (kernels and transfers) is done."""

    @property
    def storage(self) -> list[StorageTier | None]:
        """
        Each group's storage tier (FileTier or RedisTier) or None, in group order.
        """

    def fetch_from_storage(self, prompt: Sequence[int], ns: int = 0) -> int:
        """
        Starts bringing back from the groups' stores what a prefix hit of the prompt needs: the full-attention groups the blocks after their cached prefix, then the window groups the blocks their window lacks at the hit the full groups reach (all or none). Returns the blocks on their way over all groups; never waits.
        """

    def poll_storage(self) -> None:
        """KvCache.poll_storage in every group."""

    def storage_in_flight(self) -> int:
        """Blocks fetched from storage that have not landed yet, over all groups."""

    def flush_storage(self) -> None:
        """KvCache.flush_storage in every group (waits without the GIL)."""

    def contains(self, id: int) -> bool:
        """Whether the sequence exists (offloaded ones included)."""

    def length(self, id: int) -> int:
        """Committed token count (the same in every group). NotFoundError."""

    def pending(self, id: int) -> int:
        """Reserved, uncommitted token count. NotFoundError."""

    def held_blocks(self, id: int, group: int) -> int:
        """
        Blocks the sequence holds in group `group` (not those that fell out of its window). NotFoundError, OutOfRangeError.
        """

    def held_bytes(self, id: int) -> int:
        """
        Bytes of the blocks the sequence holds over all groups, on either tier. NotFoundError.
        """

    def check_invariants(self) -> None:
        """
        Every group's invariants, and every sequence in every group with the same length and reservation; InternalError names the first broken one.
        """

    def drain_events(self) -> list[ControlEvent]:
        """
        Every group's control events since the last drain, each with its group index in .group. Order: the EVENTS_DROPPED event of every group whose event ring overflowed, in group order; then group 0's other events oldest first, then group 1's, and so on.
        """

class StorageLayout:
    """
    What a stored block's bytes mean (shape, dtype, page layout, kind, model id); any difference makes a different store namespace.
    """

    def __init__(self) -> None: ...

    @property
    def num_layers(self) -> int: ...

    @num_layers.setter
    def num_layers(self, arg: int, /) -> None: ...

    @property
    def num_kv_heads(self) -> int: ...

    @num_kv_heads.setter
    def num_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def block_size(self) -> int: ...

    @block_size.setter
    def block_size(self, arg: int, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def page_layout(self) -> PageLayout: ...

    @page_layout.setter
    def page_layout(self, arg: PageLayout, /) -> None: ...

    @property
    def kv_kind(self) -> KvKind: ...

    @kv_kind.setter
    def kv_kind(self, arg: KvKind, /) -> None: ...

    @property
    def rope_dim(self) -> int: ...

    @rope_dim.setter
    def rope_dim(self, arg: int, /) -> None: ...

    @property
    def model_id(self) -> str: ...

    @model_id.setter
    def model_id(self, arg: str, /) -> None: ...

    @property
    def block_bytes(self) -> int: ...

    @block_bytes.setter
    def block_bytes(self, arg: int, /) -> None: ...

    @property
    def engine_digest(self) -> str:
        """Set by opaque(): the name of another engine's block layout."""

    @engine_digest.setter
    def engine_digest(self, arg: str, /) -> None: ...

    @staticmethod
    def opaque(block_bytes: int, engine_digest: str) -> StorageLayout:
        """
        Blocks of block_bytes bytes that pagedkv stores and checksums but does not interpret (another engine's chunks), named by engine_digest: everything that changes their bytes. For stores driven through the raw calls; no cache takes such a store.
        """

    @staticmethod
    def from_config(config: object, model_id: str, group: int | None = None) -> StorageLayout:
        """
        The layout of a CacheConfig (or of its group `group`, required for a config of several KV groups). InvalidArgumentError, OutOfRangeError for a bad group.
        """

    def fingerprint(self) -> int:
        """A stable 64-bit digest of every field (docs/storage.md)."""

    def __eq__(self, arg: StorageLayout, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

class StorageTier:
    """
    A store of whole KV blocks behind a cache's host tier (FileTier, RedisTier), or driven directly through its raw calls. It serves one cache at a time; the cache keeps it alive.
    """

    @property
    def medium(self) -> str:
        """'DISK' or 'REDIS'."""

    @property
    def layout(self) -> StorageLayout:
        """The StorageLayout every block of the store has (a copy)."""

    @property
    def in_use(self) -> bool:
        """Whether a live cache uses the store."""

    def stats(self) -> dict[str, Any]:
        """
        Counters since the store was created, as a dict: puts, gets, bytes_written, bytes_read, failed_puts, failed_gets, rejected_puts, removed, gets_direct, gets_in_place (blocks unless bytes).
        """

    def batch_exists(self, keys: Sequence) -> int:
        """
        How many of keys, from the first, are stored. A key is an int (block hash, namespace 0), a tuple (namespace, block hash) or 16 bytes (a 128-bit key: namespace then hash, little-endian). FailedPreconditionError while a cache uses the store.
        """

    def submit_put(self, keys: Sequence, buffers: Sequence) -> int:
        """
        Queues writes of keys[i] from buffers[i] (an int address or a buffer of the layout's block_bytes); the bytes are copied before it returns. Returns the job id. ResourceExhaustedError (nothing queued) when the write queue is full; InvalidArgumentError for mismatched lists or a buffer of another size.
        """

    def submit_put_borrowed(self, keys: Sequence, buffers: Sequence) -> int:
        """
        Queues writes of keys[i] from buffers[i] without copying them: the store's threads read the buffers, which must stay unchanged (and int addresses valid) until poll() or wait() reports the job; buffer objects are kept alive until then. Returns the job id. ResourceExhaustedError (nothing queued) when the write queue is full; InvalidArgumentError for mismatched lists or a buffer of another size.
        """

    def submit_get(self, keys: Sequence, buffers: Sequence) -> int:
        """
        Queues reads of keys[i] into buffers[i] (int addresses, which must stay valid until the job completes, or writable buffers, which the store keeps alive until poll() or wait() takes the job). Returns the job id. InvalidArgumentError.
        """

    def poll(self) -> list:
        """
        The jobs finished since the last poll: dicts {job, ok, error, blocks_ok} (a failed get's blocks_ok leading blocks are good).
        """

    def wait(self, jobs: Sequence[int], timeout: float | None = None) -> list:
        """
        Blocks (without the GIL) until every job of jobs has finished or timeout seconds pass (None: no limit), and takes their completions: dicts as poll() gives, for those that finished; a later poll() does not report them, other jobs' completions stay for it. May be called from another thread while one submits. NotFoundError (nothing taken) for a job already taken or never submitted.
        """

    def exists_each(self, keys: Sequence) -> list[bool]:
        """
        Whether each of keys is stored: a list of bools (batch_exists counts only the leading ones). An unreachable store answers all False.
        """

    def drain(self) -> None:
        """
        Waits until every queued job has finished (their results come from the next poll).
        """

    def remove(self, keys: Sequence) -> None:
        """
        Queues the removal of the stored blocks of keys (missing ones are no error); done by the next drain().
        """

class FileTier(StorageTier):
    """
    The file store: one directory of segment files, which outlives the process (a restart on the same directory and layout finds its blocks). docs/storage.md.
    """

    def __init__(self, layout_or_config: object, directory: str, *, model_id: str | None = None, group: int | None = None, max_bytes: int = 0, fsync: bool = False, max_queued_blocks: int = 4096, threads: int = 2, direct_io: bool = False, direct_read_depth: int = 0) -> None:
        """
        A store in `directory` (created when missing) for the blocks of a StorageLayout, or of a CacheConfig (group `group` of a model's config) and `model_id`. max_bytes bounds it (least recently used blocks go; 0: no bound); fsync makes every block survive a power loss; direct_io writes its segments with O_DIRECT, past the page cache (where the filesystem refuses O_DIRECT it logs a warning and writes through the page cache); with direct_read_depth > 0, reads of blocks the page cache does not hold go around it with O_DIRECT, that many in flight per I/O thread (0: all through it). InvalidArgumentError for a bad layout or option, UnavailableError when the directory cannot be created or written.
        """

    @property
    def directory(self) -> str:
        """The store's directory."""

    @property
    def max_bytes(self) -> int:
        """The size bound (0: none)."""

    def __repr__(self) -> str: ...

class RedisTier(StorageTier):
    """The Redis (or Valkey) store, shared between replicas. docs/storage.md."""

    def __init__(self, layout_or_config: object, *, model_id: str | None = None, group: int | None = None, host: str = '127.0.0.1', port: int = 6379, timeout_ms: int = 1000, key_prefix: str = 'pagedkv', max_queued_blocks: int = 4096, threads: int = 2) -> None:
        """
        A store on the server at host:port, created even when it cannot be reached yet (lookups miss until it can). UnimplementedError when this build has no hiredis; InvalidArgumentError for a bad layout or option.
        """

    @property
    def address(self) -> str:
        """host:port of the server."""

    def __repr__(self) -> str: ...

class BlockGeometry:
    """
    How one pool lays its blocks out (pagedkv/regions.hpp): block b is the block_bytes bytes at base + b * block_bytes, layer l of it at layer_base[l] + b * block_bytes. Send to_dict() to a peer, which rebuilds it with BlockGeometry.from_dict.
    """

    @property
    def group(self) -> int: ...

    @property
    def tier(self) -> Tier: ...

    @property
    def base(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def memory(self) -> str:
        """"DRAM" or "VRAM" (NIXL's memory types)."""

    @property
    def device(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_bytes(self) -> int: ...

    @property
    def layer_bytes(self) -> int: ...

    @property
    def layer_base(self) -> list[int]: ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def dtype(self) -> DType: ...

    @property
    def page_layout(self) -> PageLayout: ...

    @property
    def kv_kind(self) -> KvKind: ...

    @property
    def fingerprint(self) -> int: ...

    def block_address(self, block: int) -> int:
        """The address of the block's first byte. InvalidArgumentError."""

    def to_dict(self) -> dict[str, Any]:
        """Plain ints and strings, for the wire (e.g. json.dumps)."""

    @staticmethod
    def from_dict(d: dict) -> BlockGeometry:
        """
        The geometry to_dict() described. InvalidArgumentError for a missing or mistyped field, or a region too small for its blocks.
        """

def check_same_block_layout(a: BlockGeometry, b: BlockGeometry) -> None:
    """
    Raises FailedPreconditionError unless blocks of a and b hold the same bytes for the same tokens (same layout fingerprint, model id included, and block size in bytes).
    """

def pair_block_runs(src: BlockGeometry, src_ids: Sequence[int], dst: BlockGeometry, dst_ids: Sequence[int]) -> list[tuple[int, int, int, int, int, int]]:
    """
    Block src_ids[i] of src goes to dst_ids[i] of dst: the copies as runs (src_block, dst_block, blocks, src_address, dst_address, bytes), consecutive ids on both sides merged. InvalidArgumentError (sizes, ids), FailedPreconditionError (layouts differ).
    """

class EventPublisher:
    """
    Publishes a cache's block events on a ZeroMQ PUB socket in vLLM's KVEventBatch format, for KV-aware routers (docs/events.md). Each publish(cache) drains the cache's events and sends one message [topic, 8-byte big-endian sequence number, msgpack batch]; numbers start at 0 and have no gaps. With a replay_endpoint, a ROUTER socket serves readers that missed messages.
    """

    def __init__(self, block_size: int, endpoint: str = 'tcp://127.0.0.1:*', replay_endpoint: str = '', topic: str = '', data_parallel_rank: int = 0, replay_buffer: int = 10000, send_hwm: int = 100000) -> None:
        """
        Binds the PUB socket at `endpoint` (port '*': a free port, see .endpoint) and, when `replay_endpoint` is not empty, the ROUTER socket for replay requests, keeping the last `replay_buffer` messages. `block_size` must be the caches'. InvalidArgumentError for a bad option (block_size < 1, a negative data_parallel_rank, send_hwm < 1, replay_buffer < 1 with a replay_endpoint); UnavailableError when an endpoint cannot be bound.
        """

    @overload
    def publish(self, cache: _KvCache) -> int:
        """
        Drains the KvCache's events and sends them as one message (none when no event goes on the wire); returns the number of wire events sent. InvalidArgumentError when the cache's block_size is not the publisher's (nothing drained); UnavailableError when ZeroMQ refuses the send (the drained events are lost and the next message starts with AllBlocksCleared).
        """

    @overload
    def publish(self, cache: _ModelKvCache) -> int:
        """
        Drains every group's events of the ModelKvCache and sends them as one message; with two or more groups each block event carries group_idx (stored ones also kv_cache_spec_kind and kv_cache_spec_sliding_window).
        """

    @property
    def endpoint(self) -> str:
        """The bound PUB endpoint, e.g. 'tcp://127.0.0.1:41234'."""

    @property
    def replay_endpoint(self) -> str:
        """The bound replay (ROUTER) endpoint; '' without one."""

    def counters(self) -> dict[str, int]:
        """
        What the publisher has done as a dict: messages (the next sequence number), events, bytes (payload), skipped (sequence events not sent), replay_requests, replay_resyncs, bad_requests.
        """

    @property
    def closed(self) -> bool:
        """Whether close() was called."""

    def close(self) -> None:
        """
        Stops the replay thread and closes the sockets (unsent messages are dropped); idempotent. Later calls raise FailedPreconditionError.
        """

    def __enter__(self) -> EventPublisher:
        """Returns the publisher."""

    def __exit__(self, exc_type: object | None, exc_value: object | None, traceback: object | None) -> bool:
        """close()."""
