"""layer_kv: zero-copy views of the pool with its real strides (in bytes), and what write_kv
wrote, read back through numpy, equals gather_layer."""
from __future__ import annotations

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv, snapshot

L, H, D, BS, NB = 3, 2, 8, 4, 32


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype,elem", [("fp16", 2), ("fp32", 4)])
def test_layer_kv_strides_in_bytes_equal_the_pool_layout(layout, dtype, elem):
    cache = make_cache(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                       num_device_blocks=NB, dtype=dtype, page_layout=layout)
    page = BS * H * D * elem          # one layer's keys of one block
    block = L * 2 * page              # pool = [blocks][layers][K, V][page]
    k0 = np.from_dlpack(cache.layer_kv(0)[0])
    base = k0.__array_interface__["data"][0]
    for layer in range(L):
        k, v = (np.from_dlpack(a) for a in cache.layer_kv(layer))
        if layout == "nhd":  # [blocks, block_size, heads, dim]
            assert k.shape == (NB, BS, H, D)
            assert k.strides == (block, H * D * elem, D * elem, elem)
        else:  # [blocks, heads, block_size, dim]
            assert k.shape == (NB, H, BS, D)
            assert k.strides == (block, BS * D * elem, D * elem, elem)
        assert v.strides == k.strides
        assert k.__array_interface__["data"][0] == base + layer * 2 * page
        assert v.__array_interface__["data"][0] == base + layer * 2 * page + page
        assert k.dtype == np.dtype(np.float16 if dtype == "fp16" else np.float32)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_write_kv_read_back_through_numpy_equals_gather_layer(layout, dtype, rng):
    cache = make_cache(num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                       num_device_blocks=NB, dtype="fp16" if dtype == np.float16 else "fp32",
                       page_layout=layout)
    prompt = list(rng.integers(0, 1000, size=11))
    cache.add_sequence(5, prompt)
    slots = cache.reserve(5, len(prompt))
    written = []
    for layer in range(L):
        k, v = random_kv(rng, len(prompt), cache, dtype)
        cache.write_kv(5, layer, k, v)
        written.append((k, v))
    cache.commit(5, prompt)
    for layer, (k, v) in enumerate(written):
        kp, vp = (np.from_dlpack(a) for a in cache.layer_kv(layer))
        # Read every token at its slot straight from the pool view.
        block, offset = slots // BS, slots % BS
        if layout == "nhd":
            k_read, v_read = kp[block, offset], vp[block, offset]
        else:
            k_read, v_read = kp[block, :, offset], vp[block, :, offset]
        np.testing.assert_array_equal(k_read, k)
        np.testing.assert_array_equal(v_read, v)
        gk, gv = (np.from_dlpack(a) for a in cache.gather_layer(5, layer))
        np.testing.assert_array_equal(gk, k_read)
        np.testing.assert_array_equal(gv, v_read)
        hk, hv = (np.from_dlpack(a) for a in cache.gather_layer(5, layer, layout="head_major"))
        np.testing.assert_array_equal(hk, np.transpose(k, (1, 0, 2)))
        np.testing.assert_array_equal(hv, np.transpose(v, (1, 0, 2)))


def test_write_kv_takes_a_row_strided_slice_of_a_fused_qkv_output(cache, rng):
    n = 6
    qkv = rng.standard_normal((n, 3, 2, 8)).astype(np.float32)  # [tokens, q|k|v, heads, dim]
    cache.add_sequence(1, list(range(n)))
    slots = cache.reserve(1, n)
    cache.write_kv(1, 1, qkv[:, 1], qkv[:, 2])
    kp, vp = (np.from_dlpack(a) for a in cache.layer_kv(1))
    np.testing.assert_array_equal(kp[slots // 4, slots % 4], qkv[:, 1])
    np.testing.assert_array_equal(vp[slots // 4, slots % 4], qkv[:, 2])


def test_write_kv_batch_writes_every_row_through_the_slot_mapping(cache, rng):
    ids = [1, 2, 3]
    for i in ids:
        cache.add_sequence(i, list(rng.integers(0, 100, size=3)))
        cache.reserve(i, 3)
        cache.commit(i, list(range(3)))
    slots = cache.reserve_batch(ids, 1)
    batch = cache.build_batch(ids, pad_slots_to=5)
    k, v = random_kv(rng, 5, cache)
    cache.write_kv_batch(batch, 0, k, v)
    kp = np.from_dlpack(cache.layer_kv(0)[0])
    np.testing.assert_array_equal(kp[slots // 4, slots % 4], k[:3])  # padding rows skipped


def test_write_kv_batch_all_layers_equals_a_write_per_layer(rng):
    # Two caches in one state: the same rows go in layer by layer on one and in one call on the
    # other, from a slice of a wider buffer (a layer stride other than rows x row).
    caches = [make_cache(num_layers=3), make_cache(num_layers=3)]
    ids = [1, 2, 3]
    batches, slots = [], None
    for cache in caches:
        for i in ids:
            cache.add_sequence(i, [10 * i, 10 * i + 1, 10 * i + 2])
            cache.reserve(i, 3)
            cache.commit(i, [10 * i, 10 * i + 1, 10 * i + 2])
        slots = cache.reserve_batch(ids, 2)
        batches.append(cache.build_batch(ids, pad_slots_to=8))
    wide = rng.standard_normal((2, 3, 11, 2, 8)).astype(np.float32)
    k, v = wide[0, :, :8], wide[1, :, :8]
    for layer in range(3):
        caches[0].write_kv_batch(batches[0], layer, np.ascontiguousarray(k[layer]),
                                 np.ascontiguousarray(v[layer]))
    caches[1].write_kv_batch_all_layers(batches[1], k, v)
    for layer in range(3):
        parts = [[np.from_dlpack(p) for p in c.layer_kv(layer)] for c in caches]
        for got, per_layer, rows in zip(parts[1], parts[0], (k, v)):
            np.testing.assert_array_equal(got[slots // 4, slots % 4], rows[layer][:6])
            np.testing.assert_array_equal(per_layer[slots // 4, slots % 4], rows[layer][:6])


def test_write_kv_batch_all_layers_refusals_change_nothing(cache, rng):
    other = make_cache()
    for c in (cache, other):
        c.add_sequence(1, [1, 2, 3])
        c.reserve_batch([1], 2)
    batch = cache.build_batch([1])
    foreign = other.build_batch([1])
    k = rng.standard_normal((2, 2, 2, 8)).astype(np.float32)
    before = snapshot(cache, [1])
    with pytest.raises(pagedkv.InvalidArgumentError, match="another cache"):
        cache.write_kv_batch_all_layers(foreign, k, k)
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"\[2 layers, tokens, 2, 8\]"):
        cache.write_kv_batch_all_layers(batch, k[0], k[0])
    with pytest.raises(pagedkv.InvalidArgumentError, match="2 slots"):
        cache.write_kv_batch_all_layers(batch, k[:, :1], k[:, :1])
    sparse = np.zeros((2, 4, 2, 8), np.float32)[:, ::2]  # every other row: another row stride
    with pytest.raises(pagedkv.InvalidArgumentError, match="strides must equal"):
        cache.write_kv_batch_all_layers(batch, k, sparse)
    assert snapshot(cache, [1]) == before
    cache.check_invariants()
