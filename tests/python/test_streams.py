"""The device and the stream a cache works on, as a GPU server sets them up (docs/python.md,
Streams and devices).

* Device: every DLPack export (pool views, gathers, batch arrays) carries the backend's device
  ordinal as its device_id, and an input on another device is refused (InvalidArgumentError,
  nothing changed). The CPU backend takes an ordinal (`device=1`) so that this is tested here;
  the CUDA twin creates a cache on the last GPU and skips without one (fails with
  PAGEDKV_REQUIRE_CUDA=1).
* Stream: `stream=` takes a handle or any object with `cuda_stream`; the cache queues its work on
  it and `compute_stream` gives the handle back. `step_shape=` sizes the step's upload arena.
* CUDA graphs (twin only; the CPU form is tests/runtime/graph_capture_test.cpp): a step's
  write_kv_batch over build_vllm_batch_into's buffers captured once and replayed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv


def dl_device(x) -> tuple[int, int]:
    return tuple(x.__dlpack_device__())


def on_device(cache: pagedkv.KvCache, k: np.ndarray, v: np.ndarray):
    """Copies of `k` and `v` in arrays the cache exported (its device, its device id): the
    gathered layer of a scratch sequence, filled through numpy."""
    n = k.shape[0]
    scratch = 10**6
    cache.add_sequence(scratch, list(range(scratch, scratch + n + 1)))
    cache.reserve(scratch, n)
    cache.commit(scratch, list(range(scratch, scratch + n)))
    gk, gv = cache.gather_layer(scratch, 0, begin=0, num_tokens=n)
    cache.erase(scratch)
    np.from_dlpack(gk)[...] = k
    np.from_dlpack(gv)[...] = v
    return gk, gv


def fill(cache: pagedkv.KvCache, rng: np.random.Generator, sid: int, n: int):
    cache.add_sequence(sid, list(range(n)))
    cache.reserve(sid, n)
    for layer in range(cache.config.num_layers):
        k, v = random_kv(rng, n, cache)
        if cache.device != 0:
            k, v = on_device(cache, k, v)
        cache.write_kv(sid, layer, k, v)
    cache.commit(sid, list(range(n)))
    cache.synchronize()


def test_exports_carry_the_backends_device_ordinal(rng):
    cache = make_cache(device=1)
    assert cache.device == 1
    fill(cache, rng, 7, 6)
    k, v = cache.layer_kv(0)
    assert dl_device(k) == (1, 1) and dl_device(v) == (1, 1)
    gk, gv = cache.gather_layer(7, 0)
    assert dl_device(gk) == (1, 1) and dl_device(gv) == (1, 1)
    batch = cache.build_batch([7], csr=True)
    assert dl_device(batch.device.slot_mapping) == (1, 1)
    assert dl_device(batch.device.kv_indptr) == (1, 1)
    assert make_cache().device == 0
    assert dl_device(make_cache().layer_kv(0)[0]) == (1, 0)


def test_an_input_on_another_device_is_refused_and_changes_nothing(rng):
    cache = make_cache(device=1)
    fill(cache, rng, 7, 6)
    cache.reserve(7, 2)
    k, v = random_kv(rng, 2, cache)  # numpy: DLPack device (CPU, 0)
    pool = [np.from_dlpack(part).copy() for part in cache.layer_kv(0)]
    stats, pending = cache.stats(), cache.pending(7)
    with pytest.raises(pagedkv.InvalidArgumentError, match="device"):
        cache.write_kv(7, 0, k, v)
    cache.synchronize()
    assert cache.stats() == stats and cache.pending(7) == pending
    for before, now in zip(pool, cache.layer_kv(0)):
        np.testing.assert_array_equal(before, np.from_dlpack(now))
    # Arrays of the cache's own device are taken: positions 0-1 gathered, written as 6-7.
    for layer in range(cache.config.num_layers):
        gk, gv = cache.gather_layer(7, layer, begin=0, num_tokens=2)
        cache.write_kv(7, layer, gk, gv)
    cache.commit(7, [0, 1])
    for layer in range(cache.config.num_layers):
        first = cache.gather_layer(7, layer, begin=0, num_tokens=2)
        last = cache.gather_layer(7, layer, begin=6, num_tokens=2)
        for a, b in zip(first, last):
            np.testing.assert_array_equal(np.from_dlpack(a), np.from_dlpack(b))


def test_a_bad_device_is_refused():
    with pytest.raises(pagedkv.InvalidArgumentError, match="device"):
        make_cache(device=-2)


class TorchLikeStream:
    """What torch.cuda.Stream and CuPy streams offer: a `cuda_stream` handle."""

    def __init__(self, handle: int):
        self.cuda_stream = handle


@pytest.mark.parametrize("stream", [0x5eed, TorchLikeStream(0xbeef)])
def test_the_cache_works_on_the_callers_stream(rng, stream):
    cache = make_cache(stream=stream)
    handle = stream if isinstance(stream, int) else stream.cuda_stream
    assert cache.compute_stream == handle
    fill(cache, rng, 3, 9)
    k, v = random_kv(rng, 1, cache)
    cache.reserve(3, 1)
    cache.write_kv(3, 1, k, v)
    cache.commit(3, [9])
    cache.synchronize()
    gk, gv = cache.gather_layer(3, 1, begin=9, num_tokens=1)
    np.testing.assert_array_equal(np.from_dlpack(gk), k)
    np.testing.assert_array_equal(np.from_dlpack(gv), v)


def test_without_a_stream_the_cache_uses_its_own():
    assert make_cache().compute_stream == 0  # the CPU backend's default stream has no handle
    assert make_cache(stream=0).compute_stream == 0  # CUDA's legacy stream: the cache's own


def test_a_stream_that_is_no_handle_is_refused():
    with pytest.raises(pagedkv.InvalidArgumentError, match="stream"):
        make_cache(stream="the default one")


def test_a_step_shape_sizes_the_cache_for_its_steps(rng):
    # The largest step: 8 sequences of up to 4 blocks, 32 slots. Steps of that shape run as
    # without it; a shape the C++ side refuses (a negative field) is refused here too, so the
    # argument reaches KvCacheOptions::step_shape.
    cache = make_cache(step_shape=(8, 4, 32))
    ids = list(range(8))
    for i in ids:
        cache.add_sequence(i, [])
    for _ in range(3):
        cache.reserve_batch(ids, 1)
        batch = cache.build_batch(ids)
        want = [cache.length(i) + 1 for i in ids]
        np.testing.assert_array_equal(np.from_dlpack(batch.device.seq_lens), want)
        cache.commit_batch(ids, [int(x) for x in rng.integers(0, 1000, len(ids))], 1)
    cache.check_invariants()
    with pytest.raises(pagedkv.InvalidArgumentError, match="step_shape"):
        make_cache(step_shape=(8, -1, 32))


def cuda_or_skip():
    if not pagedkv._C._cuda_device_available():
        if os.environ.get("PAGEDKV_REQUIRE_CUDA") == "1":
            pytest.fail("PAGEDKV_REQUIRE_CUDA=1 but no CUDA device is available")
        pytest.skip("no CUDA device")


def test_cuda_exports_carry_the_device_the_cache_was_created_on():
    cuda_or_skip()
    torch = pytest.importorskip("torch")
    last = torch.cuda.device_count() - 1
    cache = make_cache(backend="cuda", device=last)
    assert cache.device == last
    k, _ = cache.layer_kv(0)
    assert dl_device(k) == (2, last)  # kDLCUDA
    assert torch.from_dlpack(k).device == torch.device("cuda", last)
    with pytest.raises(pagedkv.InvalidArgumentError, match="device"):
        cache.add_sequence(1, [1, 2, 3])
        cache.reserve(1, 2)
        cache.write_kv(1, 0, torch.zeros(2, cache.config.num_kv_heads, cache.config.head_dim),
                       torch.zeros(2, cache.config.num_kv_heads, cache.config.head_dim))


def test_cuda_writes_on_torchs_stream_are_ordered_with_its_kernels(rng):
    cuda_or_skip()
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    cache = make_cache(backend="cuda", stream=side)
    assert cache.compute_stream == side.cuda_stream
    n = 4
    cache.add_sequence(1, list(range(n)))
    cache.reserve(1, n)
    shape = (n, cache.config.num_kv_heads, cache.config.head_dim)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the producer is slow: the write must wait for it
        k = torch.full(shape, 3.0, device="cuda")
        v = torch.full(shape, 5.0, device="cuda")
        cache.write_kv(1, 0, k, v)
    cache.commit(1, list(range(n)))
    torch.cuda.current_stream().wait_stream(torch.cuda.ExternalStream(cache.compute_stream))
    gk, gv = cache.gather_layer(1, 0)
    side.synchronize()
    assert torch.all(torch.from_dlpack(gk) == 3.0) and torch.all(torch.from_dlpack(gv) == 5.0)


def test_cuda_a_captured_decode_step_replays_with_each_steps_kv():
    """A decode step's K/V writes captured once in a CUDA graph (over build_vllm_batch_into's
    fixed buffers) and replayed for four steps with new K/V: the pool holds every step's."""
    cuda_or_skip()
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    cache = make_cache(backend="cuda", stream=stream)
    ids, layers = [1, 2], cache.config.num_layers
    heads, dim = cache.config.num_kv_heads, cache.config.head_dim
    shape = (4, heads, dim)  # 4 slot rows: 2 tokens and 2 padding rows
    block_table = torch.full((4, 16), -1, dtype=torch.int32, device="cuda")
    slot_mapping = torch.full((4,), -1, dtype=torch.int64, device="cuda")
    k_in = torch.zeros((layers,) + shape, device="cuda")
    v_in = torch.zeros((layers,) + shape, device="cuda")
    with torch.cuda.stream(stream):
        for sid in ids:
            cache.add_sequence(sid, [sid] * 5)
            cache.reserve(sid, 5)
            for layer in range(layers):
                cache.write_kv(sid, layer, torch.zeros(5, heads, dim, device="cuda"),
                               torch.zeros(5, heads, dim, device="cuda"))
            cache.commit(sid, [sid] * 5)
    graph, expected = torch.cuda.CUDAGraph(), []
    for step in range(4):
        cache.reserve_batch(ids, 1)
        batch = cache.build_vllm_batch_into(ids, block_table, slot_mapping)
        with torch.cuda.stream(stream):
            k_in.copy_(torch.randn_like(k_in))
            v_in.copy_(torch.randn_like(v_in))
            expected.append((k_in[:, :2].clone(), v_in[:, :2].clone()))
            if step == 0:
                with torch.cuda.graph(graph, stream=stream):
                    for layer in range(layers):
                        cache.write_kv_batch(batch, layer, k_in[layer], v_in[layer])
                    with pytest.raises(pagedkv.FailedPreconditionError, match="capturing"):
                        cache.build_batch(ids)
            graph.replay()
        cache.commit_batch(ids, [7, 7], 1)
    stream.synchronize()
    for r, sid in enumerate(ids):
        for layer in range(layers):
            gk, gv = cache.gather_layer(sid, layer, begin=5, num_tokens=4)
            got_k, got_v = torch.from_dlpack(gk), torch.from_dlpack(gv)
            for step, (k, v) in enumerate(expected):
                assert torch.equal(got_k[step], k[layer, r]), (sid, layer, step)
                assert torch.equal(got_v[step], v[layer, r]), (sid, layer, step)
