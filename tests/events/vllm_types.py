"""vLLM's KV event structs (vllm/distributed/kv_events.py), declared the same way: an array_like
batch, tagged-map events with omit_defaults. A strict msgspec decoder of these is what a vLLM
consumer runs, and re-encoding a decoded batch gives the bytes vLLM itself would send.
"""

from typing import Any

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
ENCODER = msgspec.msgpack.Encoder()

END_SEQ = -1


def seq_of(b):
    return int.from_bytes(b, "big", signed=True)


# The chained block hash of docs/events.md, written again here.
M64 = (1 << 64) - 1


def _mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def root_hash(ns):
    return _mix(ns ^ 0x70616765646B7630)


def _fold(x):
    p = x * 0xA0761D6478BD642F
    return (p & M64) ^ (p >> 64)


def block_hash(parent, tokens):
    n = len(tokens)
    t = [v & 0xFFFFFFFF for v in tokens] + [0] * (n % 2)
    digest = 0
    for j in range(len(t) // 2):
        word = t[2 * j] | (t[2 * j + 1] << 32)
        digest += _fold((word + (j + 1) * 0x9E3779B97F4A7C15) & M64)
    return _mix(parent ^ ((digest + n) & M64))
