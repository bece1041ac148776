"""The raw store calls an engine's tier builds on beside put/get/poll: the borrowed put (the
store's threads read the caller's buffers, kept alive until the job is taken), exists_each (every
key, not only the leading ones) and wait (blocks for given jobs and takes only theirs)."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import pagedkv

BLOCK = 3001


def make_store(tmp_path, **options):
    layout = pagedkv.StorageLayout.opaque(BLOCK, "engine:model-a:chunk16")
    return pagedkv.FileTier(layout, str(tmp_path / "store"), **options)


def rows(seed, n):
    return np.random.default_rng(seed).integers(0, 256, size=(n, BLOCK), dtype=np.uint8)


def test_a_borrowed_put_stores_the_rows_and_holds_them_until_taken(tmp_path):
    store = make_store(tmp_path)
    data = rows(1, 4)
    held = [bytearray(data[i].tobytes()) for i in range(4)]
    before = [sys.getrefcount(b) for b in held]
    keys = [bytes([i]) * 16 for i in range(4)]
    job = store.submit_put_borrowed(keys, held)
    store.drain()
    # Finished but not yet taken: the store still holds every buffer object.
    assert [sys.getrefcount(b) for b in held] == [n + 1 for n in before]
    done = store.wait([job], timeout=10)
    assert [(c["job"], c["ok"], c["error"]) for c in done] == [(job, True, "")]
    assert [sys.getrefcount(b) for b in held] == before
    out = np.zeros((4, BLOCK), dtype=np.uint8)
    assert store.wait([store.submit_get(keys, list(out))], timeout=10)[0]["ok"]
    np.testing.assert_array_equal(out, data)
    assert store.stats()["puts"] == 4 and store.stats()["bytes_written"] == 4 * BLOCK


def test_a_borrowed_put_takes_addresses_and_refuses_bad_input(tmp_path):
    store = make_store(tmp_path, max_queued_blocks=2)
    data = rows(2, 3)
    job = store.submit_put_borrowed([1, 2], [data[0].ctypes.data, data[1].ctypes.data])
    with pytest.raises(pagedkv.InvalidArgumentError, match="3000 bytes"):
        store.submit_put_borrowed([3], [np.zeros(BLOCK - 1, dtype=np.uint8)])
    with pytest.raises(pagedkv.InvalidArgumentError, match="null"):
        store.submit_put_borrowed([3], [0])
    with pytest.raises(pagedkv.InvalidArgumentError):
        store.submit_put_borrowed([3, 4], [data[2]])
    store.drain()
    assert store.wait([job], timeout=10)[0]["ok"]
    with pytest.raises(pagedkv.ResourceExhaustedError, match="queue full"):
        store.submit_put_borrowed([3, 4, 5], [data[0], data[1], data[2]])
    assert store.stats()["rejected_puts"] == 3 and store.poll() == []


def test_exists_each_answers_every_key(tmp_path):
    store = make_store(tmp_path)
    data = rows(3, 2)
    store.wait([store.submit_put([10, 12], list(data))], timeout=10)
    assert store.exists_each([10, 11, 12, (5, 12)]) == [True, False, True, False]
    assert store.batch_exists([11, 10, 12]) == 0  # the leading count stops at the miss
    assert store.exists_each([]) == []
    with pytest.raises(pagedkv.InvalidArgumentError, match="16 bytes"):
        store.exists_each([b"short"])


def test_wait_takes_only_its_jobs_and_blocks_without_the_gil(tmp_path):
    store = make_store(tmp_path)
    data = rows(4, 64)
    first = store.submit_put_borrowed(list(range(100, 164)), list(data))
    second = store.submit_put(list(range(200, 202)), list(data[:2]))
    ticks = []
    stop = threading.Event()

    def tick():  # runs only if wait() lets go of the GIL
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    done = store.wait([first])
    stop.set()
    t.join()
    assert [c["job"] for c in done] == [first] and done[0]["ok"]
    store.drain()
    assert [c["job"] for c in store.poll()] == [second]  # left for poll, reported once
    assert ticks
    with pytest.raises(pagedkv.NotFoundError, match="not pending"):
        store.wait([first], timeout=0)
    with pytest.raises(pagedkv.NotFoundError):
        store.wait([second + 100], timeout=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="timeout"):
        store.wait([second], timeout=-1)
    assert store.wait([], timeout=0) == []
    third = store.submit_put([300], [data[0]])
    assert [c["job"] for c in store.wait([third], timeout=1e300)] == [third]  # no limit
