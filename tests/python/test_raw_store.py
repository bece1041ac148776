"""A store driven directly through its raw calls (StorageTier.batch_exists, submit_put,
submit_get, poll, drain, remove) on caller buffers, with an opaque layout of another engine's
block size: what the vLLM and SGLang adapters build on (docs/storage.md, Raw store)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pagedkv

BLOCK = 3001  # an engine's chunk size: nothing pagedkv would pick


def make_store(tmp_path, digest="engine:model-a:chunk16", block=BLOCK, **options):
    layout = pagedkv.StorageLayout.opaque(block, digest)
    return pagedkv.FileTier(layout, str(tmp_path / "store"), **options)


def finished(store, jobs):
    """Polls until every job in `jobs` is reported; their completions by job."""
    store.drain()
    done = {c["job"]: c for c in store.poll()}
    assert set(jobs) <= set(done), f"jobs {set(jobs) - set(done)} not reported after drain"
    return done


def rows(rng, n):
    return rng.integers(0, 256, size=(n, BLOCK), dtype=np.uint8)


def test_put_exists_get_round_trip_on_numpy_rows(tmp_path):
    store = make_store(tmp_path)
    rng = np.random.default_rng(1)
    data = rows(rng, 5)
    keys = [bytes([i]) * 16 for i in range(5)]
    job = store.submit_put(keys, list(data))
    assert finished(store, [job])[job]["ok"]
    assert store.batch_exists(keys) == 5
    assert store.batch_exists(keys[:2] + [b"\xff" * 16] + keys[2:]) == 2  # stops at a miss
    out = np.zeros((5, BLOCK), dtype=np.uint8)
    job = store.submit_get(keys, list(out))
    done = finished(store, [job])[job]
    assert done["ok"] and done["blocks_ok"] == 5 and done["error"] == ""
    np.testing.assert_array_equal(out, data)
    stats = store.stats()
    assert stats["puts"] == 5 and stats["gets"] == 5 and stats["bytes_written"] == 5 * BLOCK


def test_direct_io_writes_aligned_segments_that_read_back_across_a_restart(tmp_path):
    data = rows(np.random.default_rng(11), 7)
    keys = [bytes([0x40 + i]) * 16 for i in range(7)]
    store = make_store(tmp_path, direct_io=True)
    job = store.submit_put(keys, list(data))
    assert finished(store, [job])[job]["ok"]
    del store
    segments = sorted((tmp_path / "store").glob("*/*.seg"))
    assert segments
    for seg in segments:  # version 2: records aligned to 4096 (docs/storage.md, O_DIRECT)
        head = seg.read_bytes()[:32]
        assert head[:4] == b"PKSG"
        assert int.from_bytes(head[4:6], "little") == 2
        assert int.from_bytes(head[24:28], "little") == 4096
    for direct in (True, False):  # read back with or without the option
        store = make_store(tmp_path, direct_io=direct)
        out = np.zeros_like(data)
        job = store.submit_get(keys, list(out))
        assert finished(store, [job])[job]["ok"]
        np.testing.assert_array_equal(out, data)
        del store


def on_tmpfs(path):
    """Whether `path` lies on tmpfs (where every page of a file stays in the page cache)."""
    best, fstype = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount, kind = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, fstype = mount, kind
    return fstype == "tmpfs"


def drop_page_cache(directory):
    for f in directory.rglob("*.seg"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("depth", [8, 0])
def test_blocks_the_page_cache_dropped_are_read_around_it_unless_depth_is_0(tmp_path, depth):
    if on_tmpfs(tmp_path):
        pytest.skip("tmpfs keeps every page cached")
    data = rows(np.random.default_rng(12), 9)
    keys = [bytes([0x60 + i]) * 16 for i in range(9)]
    store = make_store(tmp_path, direct_read_depth=depth)
    job = store.submit_put(keys, list(data))
    assert finished(store, [job])[job]["ok"]
    drop_page_cache(tmp_path / "store")
    out = np.zeros_like(data)
    job = store.submit_get(keys, list(out))
    assert finished(store, [job])[job]["ok"]
    np.testing.assert_array_equal(out, data)
    stats = store.stats()
    assert stats["gets"] == 9
    assert stats["gets_direct"] == (9 if depth > 0 else 0)


def page_aligned_rows(n, width):
    """n rows of `width` bytes (a multiple of 4096), each starting on a page boundary."""
    raw = np.zeros(n * width + 4096, dtype=np.uint8)
    skip = -raw.ctypes.data % 4096
    return raw[skip:skip + n * width].reshape(n, width)


def test_direct_io_blocks_of_whole_pages_are_read_in_place_into_aligned_rows(tmp_path):
    if on_tmpfs(tmp_path):
        pytest.skip("tmpfs keeps every page cached")
    width = 3 * 4096
    data = np.random.default_rng(13).integers(0, 256, size=(7, width), dtype=np.uint8)
    keys = [bytes([0x70 + i]) * 16 for i in range(7)]
    store = make_store(tmp_path, block=width, direct_io=True, direct_read_depth=4)
    job = store.submit_put(keys, list(data))
    assert finished(store, [job])[job]["ok"]
    drop_page_cache(tmp_path / "store")
    out = page_aligned_rows(7, width)
    job = store.submit_get(keys, list(out))
    assert finished(store, [job])[job]["ok"]
    np.testing.assert_array_equal(out, data)
    drop_page_cache(tmp_path / "store")
    off_page = page_aligned_rows(7, width + 4096)[:, 16:16 + width]  # 16 bytes past a page
    job = store.submit_get(keys, list(off_page))
    assert finished(store, [job])[job]["ok"]
    np.testing.assert_array_equal(off_page, data)
    stats = store.stats()
    assert stats["gets_direct"] == 14
    assert stats["gets_in_place"] == 7


def test_a_direct_read_depth_outside_0_to_256_is_refused(tmp_path):
    for depth in (-1, 257):
        with pytest.raises(pagedkv.InvalidArgumentError, match="direct_read_depth"):
            make_store(tmp_path, direct_read_depth=depth)


def test_addresses_are_buffers_too(tmp_path):
    store = make_store(tmp_path)
    data = rows(np.random.default_rng(2), 3)
    out = np.zeros_like(data)
    keys = [(7, 100 + i) for i in range(3)]
    put = store.submit_put(keys, [data[i].ctypes.data for i in range(3)])
    finished(store, [put])
    get = store.submit_get(keys, [out[i].ctypes.data for i in range(3)])
    assert finished(store, [get])[get]["ok"]
    np.testing.assert_array_equal(out, data)


def test_the_three_key_forms_name_the_same_128_bit_keys(tmp_path):
    store = make_store(tmp_path)
    data = rows(np.random.default_rng(3), 1)
    ns, block_hash = 0x0102030405060708, 0x1112131415161718
    as_bytes = ns.to_bytes(8, "little") + block_hash.to_bytes(8, "little")
    finished(store, [store.submit_put([as_bytes], [data[0]])])
    assert store.batch_exists([(ns, block_hash)]) == 1
    assert store.batch_exists([block_hash]) == 0  # namespace 0: another key
    assert store.batch_exists([(ns + 1, block_hash)]) == 0


def test_a_missing_block_fails_its_get_and_says_how_many_are_good(tmp_path):
    store = make_store(tmp_path)
    data = rows(np.random.default_rng(4), 2)
    finished(store, [store.submit_put([1, 2], list(data))])
    out = np.zeros((3, BLOCK), dtype=np.uint8)
    job = store.submit_get([1, 2, 3], list(out))
    done = finished(store, [job])[job]
    assert not done["ok"] and done["blocks_ok"] == 2 and done["error"]
    np.testing.assert_array_equal(out[:2], data)


def test_remove_and_another_digest_miss(tmp_path):
    store = make_store(tmp_path)
    data = rows(np.random.default_rng(5), 2)
    finished(store, [store.submit_put([1, 2], list(data))])
    other = make_store(tmp_path, digest="engine:model-b:chunk16")
    assert other.batch_exists([1, 2]) == 0
    store.remove([1, 99])  # queued, like puts: done once drained
    store.drain()
    assert store.batch_exists([1]) == 0 and store.batch_exists([2]) == 1


def test_bad_calls_are_refused_and_queue_nothing(tmp_path):
    store = make_store(tmp_path)
    good = np.zeros(BLOCK, dtype=np.uint8)
    with pytest.raises(pagedkv.InvalidArgumentError, match="3000 bytes"):
        store.submit_put([1], [np.zeros(BLOCK - 1, dtype=np.uint8)])
    with pytest.raises(pagedkv.InvalidArgumentError, match="writable"):
        store.submit_get([1], [bytes(BLOCK)])
    with pytest.raises(pagedkv.InvalidArgumentError, match="16 bytes"):
        store.batch_exists([b"short"])
    with pytest.raises(pagedkv.InvalidArgumentError, match="keys"):
        store.submit_put(["not a key"], [good])
    with pytest.raises(pagedkv.InvalidArgumentError):
        store.submit_put([1, 2], [good])
    with pytest.raises(pagedkv.InvalidArgumentError, match="null"):
        store.submit_get([1], [0])
    with pytest.raises(pagedkv.InvalidArgumentError, match="engine_digest"):
        pagedkv.StorageLayout.opaque(BLOCK, "")
    store.drain()
    assert store.poll() == [] and store.stats()["puts"] == 0


def test_a_store_serving_a_cache_refuses_raw_calls(tmp_path):
    config = pagedkv.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=8, block_size=4,
                                 num_device_blocks=4, num_host_blocks=4, backend="cpu")
    store = pagedkv.FileTier(config, str(tmp_path / "s"), model_id="m")
    cache = pagedkv.KvCache(config, storage=store)
    with pytest.raises(pagedkv.FailedPreconditionError, match="serves a cache"):
        store.batch_exists([1])
    assert cache.storage is store


def test_a_cache_refuses_an_opaque_store(tmp_path):
    config = pagedkv.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=8, block_size=4,
                                 num_device_blocks=4, num_host_blocks=4, backend="cpu")
    store = make_store(tmp_path, block=2 * 4 * 8 * 2)
    with pytest.raises(pagedkv.PagedKvError):
        pagedkv.KvCache(config, storage=store)
    assert not store.in_use
