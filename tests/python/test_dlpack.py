"""DLPack lifetimes: a capsule is consumed once, exported arrays keep the cache alive, batch
device arrays are refused once a later build_batch reused them; torch interop if installed."""
from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def test_a_dlpack_capsule_is_consumed_once(cache, rng):
    cache.add_sequence(1, [1, 2, 3])
    cache.reserve(1, 3)
    k, v = random_kv(rng, 3, cache)
    capsule = k.__dlpack__()
    assert _capsule_is_valid(capsule, b"dltensor")
    cache.write_kv(1, 0, capsule, v)
    assert _capsule_is_valid(capsule, b"used_dltensor")  # renamed by the consumer
    before = cache.stats()
    with pytest.raises(pagedkv.InvalidArgumentError):
        cache.write_kv(1, 0, capsule, v)
    assert cache.stats() == before
    kp = np.from_dlpack(cache.layer_kv(0)[0])
    slots = np.array([cache.block_locations(1)[p // 4][1] * 4 + p % 4 for p in range(3)])
    np.testing.assert_array_equal(kp[slots // 4, slots % 4], k)


def test_a_capsule_of_a_temporary_array_stays_alive_until_written(cache):
    cache.add_sequence(1, [1, 2, 3])
    slots = cache.reserve(1, 3)
    # Nothing but the capsules holds these arrays: the write must finish before they go.
    cache.write_kv(1, 0, np.full((3, 2, 8), 1.5, np.float32).__dlpack__(),
                   np.full((3, 2, 8), -2.5, np.float32).__dlpack__())
    gc.collect()
    np.full((3, 2, 8), 9.0, np.float32)  # would likely reuse freed memory
    k, v = (np.from_dlpack(a) for a in cache.layer_kv(0))
    assert (k[slots // 4, slots % 4] == 1.5).all() and (v[slots // 4, slots % 4] == -2.5).all()


def test_deleting_the_cache_while_an_exported_array_lives_is_safe(rng):
    cache = make_cache()
    cache.add_sequence(1, [1, 2, 3, 4, 5])
    slots = cache.reserve(1, 5)
    k, v = random_kv(rng, 5, cache)
    cache.write_kv(1, 1, k, v)
    alive = weakref.ref(cache)
    keys = np.from_dlpack(cache.layer_kv(1)[0])
    gathered = np.from_dlpack(cache.gather_layer(1, 1, num_tokens=0)[0])
    batch_host = cache.build_batch([1]).host.slot_mapping
    del cache
    gc.collect()
    assert alive() is not None, "an exported array must keep the cache alive"
    np.testing.assert_array_equal(keys[slots // 4, slots % 4], k)  # the pool is still there
    np.testing.assert_array_equal(batch_host, slots)
    assert gathered.shape == (0, 2, 8)
    del keys, gathered
    gc.collect()
    assert alive() is not None  # the batch's host copy still holds it
    del batch_host
    gc.collect()
    assert alive() is None, "the cache is freed once nothing exported lives"


def test_batch_device_arrays_are_refused_after_a_later_build_batch(cache):
    cache.add_sequence(1, [1, 2, 3])
    cache.reserve(1, 3)
    first = cache.build_batch([1], csr=True)
    assert first.is_current
    np.testing.assert_array_equal(np.from_dlpack(first.device.seq_lens), [3])
    cache.build_batch([1])
    assert not first.is_current
    with pytest.raises(pagedkv.FailedPreconditionError):
        first.device.seq_lens
    np.testing.assert_array_equal(first.host.seq_lens, [3])  # host copies stay valid
    with pytest.raises(pagedkv.FailedPreconditionError):
        cache.build_batch([1]).host.kv_indptr  # built without csr=True
    with pytest.raises(AttributeError):
        first.host.no_such_array


def test_torch_tensors_are_accepted_and_views_are_shared():
    torch = pytest.importorskip("torch")
    cache = make_cache()
    cache.add_sequence(1, [1, 2, 3])
    slots = cache.reserve(1, 3)
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    cache.write_kv(1, 0, k, v)
    kp = torch.from_dlpack(cache.layer_kv(0)[0])
    assert kp.stride() == (2 * 2 * 4 * 2 * 8, 16, 8, 1)
    torch.testing.assert_close(kp[torch.from_numpy(slots // 4), torch.from_numpy(slots % 4)], k)
