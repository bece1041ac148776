"""Tensor parallelism from Python (KvCache(tp_size=N), docs/scale-out.md): one control plane over
N ranks' pools on the CPU backend, rank r holding heads [r * rank_heads, (r + 1) * rank_heads).
The same prompts, decode steps, fork, offload and restore on an unsharded cache and a TP cache:
the blocks are the same, and each rank's gathered heads, side by side, are the unsharded
cache's bytes, which are what was written."""
from __future__ import annotations

import numpy as np
import pytest

import pagedkv
from conftest import make_cache


def split(rows, cache, rank):
    """Rank `rank`'s heads of token-major rows [n, heads, dim]."""
    h = cache.rank_heads
    return np.ascontiguousarray(rows[:, rank * h:(rank + 1) * h, :])


def write(cache, seq, layer, k, v):
    for r in range(cache.tp_size):
        cache.write_kv(seq, layer, split(k, cache, r), split(v, cache, r), rank=r)


def gather(cache, seq, layer):
    parts = [cache.gather_layer(seq, layer, rank=r) for r in range(cache.tp_size)]
    k = np.concatenate([np.from_dlpack(p[0]) for p in parts], axis=1)
    v = np.concatenate([np.from_dlpack(p[1]) for p in parts], axis=1)
    return k, v


@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_hold_the_unsharded_cache_heads_in_the_same_blocks(tp):
    fields = dict(num_kv_heads=4, num_device_blocks=12, num_host_blocks=12)
    one, many = make_cache(**fields), make_cache(tp_size=tp, **fields)
    assert (one.tp_size, many.tp_size, many.rank_heads) == (1, tp, 4 // tp)
    rng = np.random.default_rng(7)
    written = {}  # (seq, layer) -> (k, v) of every committed token
    layers = one.config.num_layers
    system = list(range(10, 19))

    def prefill(seq, prompt):
        hits = [c.add_sequence(seq, prompt) for c in (one, many)]
        assert hits[0] == hits[1]
        for c in (one, many):
            c.reserve(seq, len(prompt))
        for layer in range(layers):
            k, v = (rng.standard_normal((len(prompt), 4, 8)).astype(np.float32) for _ in "kv")
            one.write_kv(seq, layer, k, v)
            write(many, seq, layer, k, v)
            written[seq, layer] = (k, v)
        for c in (one, many):
            c.commit(seq, prompt)

    prefill(1, system + [40, 41, 42])
    prefill(2, [60, 61, 62, 63, 64, 65])
    for c in (one, many):
        c.fork(1, 3)
    for layer in range(layers):
        written[3, layer] = written[1, layer]
    # Two decode steps through the batch: each rank writes its heads through its batch.
    for step in range(2):
        ids = [1, 2, 3]
        for c in (one, many):
            c.reserve_batch(ids, 1)
        batches = [c.build_batch(ids) for c in (one, many)]
        for layer in range(layers):
            k, v = (rng.standard_normal((3, 4, 8)).astype(np.float32) for _ in "kv")
            one.write_kv_batch(batches[0], layer, k, v)
            for r in range(tp):
                many.write_kv_batch(batches[1], layer, split(k, many, r), split(v, many, r),
                                    rank=r)
            for i, seq in enumerate(ids):
                pk, pv = written[seq, layer]
                written[seq, layer] = (np.concatenate([pk, k[i:i + 1]]),
                                       np.concatenate([pv, v[i:i + 1]]))
        for c in (one, many):
            c.commit_batch(ids, [100 + step] * 3)
    # The host tier and back, on every rank.
    for c in (one, many):
        c.offload(2)
        c.synchronize()
        c.restore(2)
        c.synchronize()
    for seq in (1, 2, 3):
        assert one.block_locations(seq) == many.block_locations(seq)
        for layer in range(layers):
            k, v = written[seq, layer]
            for got in (one.gather_layer(seq, layer), gather(many, seq, layer)):
                np.testing.assert_array_equal(np.from_dlpack(got[0]), k)
                np.testing.assert_array_equal(np.from_dlpack(got[1]), v)
    many.check_invariants()
    # Each rank's pool view holds its heads of the same block.
    block = many.block_locations(2)[0][1]
    k0 = np.concatenate([np.from_dlpack(many.layer_kv(0, rank=r)[0])[block]
                         for r in range(tp)], axis=1)
    np.testing.assert_array_equal(k0, np.from_dlpack(one.layer_kv(0)[0])[block])
    assert [r["rank"] for r in many.regions()] == [r for r in range(tp) for _ in range(2)]
    fingerprints = {many.block_geometry(rank=r).fingerprint for r in range(tp)}
    assert len(fingerprints) == tp


def test_a_rank_outside_the_cache_and_heads_that_do_not_split_are_refused():
    cache = make_cache(num_kv_heads=4, tp_size=2)
    cache.add_sequence(1, [1, 2, 3])
    cache.reserve(1, 3)
    k = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(pagedkv.OutOfRangeError, match="rank"):
        cache.write_kv(1, 0, k, k, rank=2)
    with pytest.raises(pagedkv.OutOfRangeError, match="rank"):
        cache.layer_kv(0, rank=-1)
    with pytest.raises(pagedkv.InvalidArgumentError):  # rank 0 takes 2 heads, not 4
        cache.write_kv(1, 0, np.zeros((3, 4, 8), np.float32), np.zeros((3, 4, 8), np.float32))
    assert cache.pending(1) == 3
    with pytest.raises(pagedkv.InvalidArgumentError, match="do not split"):
        make_cache(num_kv_heads=4, tp_size=3)


def test_each_rank_has_its_batch_arrays_and_its_callers_stream():
    # The CPU backend takes any non-null handle as the caller's stream.
    cache = make_cache(num_kv_heads=4, tp_size=2, stream=[11, 22])
    assert [cache.rank_compute_stream(r) for r in range(2)] == [11, 22]
    with pytest.raises(pagedkv.OutOfRangeError):
        cache.rank_compute_stream(2)
    with pytest.raises(pagedkv.InvalidArgumentError):
        make_cache(num_kv_heads=4, tp_size=2, stream=[11])
    cache.add_sequence(1, [1, 2, 3, 4, 5])
    cache.reserve(1, 5)
    batch = cache.build_batch([1], csr=True)
    ranks = [cache.rank_batch(batch, r) for r in range(2)]
    assert [b.rank for b in ranks] == [0, 1] and batch.rank == 0
    addresses = set()
    for b in ranks:  # the same metadata, each rank's own copy on its device
        for name in ("slot_mapping", "block_tables", "kv_indices"):
            on_device = np.from_dlpack(getattr(b.device, name))
            np.testing.assert_array_equal(on_device, getattr(batch.host, name))
            addresses.add(on_device.ctypes.data)
    assert len(addresses) == 6
    # Writing through rank 1's batch writes rank 1's pool (the batch's rank unless told).
    rng = np.random.default_rng(3)
    k0, v0, k1, v1 = (rng.standard_normal((5, 2, 8)).astype(np.float32) for _ in range(4))
    cache.write_kv_batch(batch, 0, k0, v0)
    cache.write_kv_batch(ranks[1], 0, k1, v1)
    cache.commit(1, [1, 2, 3, 4, 5])
    for r, (k, v) in enumerate([(k0, v0), (k1, v1)]):
        got = cache.gather_layer(1, 0, rank=r)
        np.testing.assert_array_equal(np.from_dlpack(got[0]), k)
        np.testing.assert_array_equal(np.from_dlpack(got[1]), v)
    cache.reserve(1, 1)
    cache.build_batch([1])
    assert not ranks[1].is_current
    with pytest.raises(pagedkv.FailedPreconditionError):
        cache.rank_batch(batch, 1)
