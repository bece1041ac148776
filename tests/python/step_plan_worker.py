"""A worker process of split-process tensor parallelism, for test_step_plans.py: its KvCache holds
rank `rank`'s part of the model (CacheConfig.rank_config) and makes no decisions. It reads framed
messages on stdin (8-byte little-endian length, then the payload) and answers on stdout:
  b"P" + step (4 bytes) + plan bytes: applies the plan, writes the step's K/V of its heads
      through the last batch (step_kv), answers b"K", or b"E" and the error;
  b"F": answers the bytes of its pools (ctypes over regions()), device then host.
Usage: step_plan_worker.py CONFIG_JSON TP_SIZE RANK"""
import ctypes
import json
import struct
import sys

import numpy as np

import pagedkv


def step_kv(step, layer, n, heads, dim):
    """The K and V [n, heads, dim] float32 the model writes at step `step`: the same in every
    process (a generator seeded by step and layer)."""
    rng = np.random.default_rng([step, layer])
    return (rng.standard_normal((n, heads, dim)).astype(np.float32) for _ in "kv")


def pool_bytes(cache, rank=0):
    return b"".join(ctypes.string_at(r["base"], r["bytes"]) for r in cache.regions()
                    if r["rank"] == rank)


def zero_pools(cache):
    for r in cache.regions():
        ctypes.memset(r["base"], 0, r["bytes"])


def write_step(cache, batch, step, rank, heads):
    """Writes step `step`'s K/V of heads [rank * h, (rank + 1) * h) of every layer through
    `batch` (of rank `rank` in cache)."""
    h = cache.rank_heads
    n = len(batch.host.slot_mapping)
    for layer in range(cache.config.num_layers):
        k, v = step_kv(step, layer, n, heads, cache.config.head_dim)
        part = slice(rank * h, (rank + 1) * h)
        k, v = np.ascontiguousarray(k[:, part]), np.ascontiguousarray(v[:, part])
        cache.write_kv_batch(batch, layer, k, v, rank=rank if cache.tp_size > 1 else 0)


def read_msg(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return stream.read(n)


def send_msg(stream, payload):
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def main():
    fields, tp, rank = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    model = pagedkv.CacheConfig(**fields)
    cache = pagedkv.KvCache(model.rank_config(tp))
    zero_pools(cache)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while (msg := read_msg(inp)) is not None:
        if msg[:1] == b"F":
            cache.synchronize()
            send_msg(out, pool_bytes(cache))
            return
        (step,) = struct.unpack("<i", msg[1:5])
        try:
            batches = cache.apply_step_plan(msg[5:])
            if batches:
                write_step(cache, batches[-1], step, rank, model.num_kv_heads)
            cache.check_invariants()
            send_msg(out, b"K")
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            send_msg(out, b"E" + repr(e).encode())


if __name__ == "__main__":
    main()
