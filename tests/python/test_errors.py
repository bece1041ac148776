"""One exception class per status code, each raised by a bad input, and the cache unchanged
afterwards (stats, every sequence's lengths and blocks, the pool's bytes, no events,
check_invariants)."""
from __future__ import annotations

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv, snapshot

IDS = [1, 2, 3, 99]


@pytest.fixture
def busy(rng):
    """A cache with a committed sequence, a reserved one and a finished prefix."""
    cache = make_cache(num_device_blocks=16, eviction_policy="none", max_sequence_length=64)
    cache.add_sequence(1, list(range(10)))
    cache.reserve(1, 10)
    cache.write_kv(1, 0, *random_kv(rng, 10, cache))
    cache.commit(1, list(range(10)))
    cache.add_sequence(2, list(range(100, 106)))
    cache.reserve(2, 6)
    cache.add_sequence(3, list(range(200, 209)))
    cache.reserve(3, 9)
    cache.commit(3, list(range(200, 209)))
    cache.finish(3)
    cache.drain_events()
    return cache


BAD_CALLS = {
    pagedkv.InvalidArgumentError: [
        lambda c, r: c.write_kv(2, 0, *random_kv(r, 5, c)),              # 5 rows, 6 reserved
        lambda c, r: c.write_kv(2, 0, np.zeros((6, 3, 8), np.float32),   # 3 heads, not 2
                                np.zeros((6, 3, 8), np.float32)),
        lambda c, r: c.write_kv(2, 0, np.zeros((6, 2, 8), np.int32),     # not a float
                                np.zeros((6, 2, 8), np.int32)),
        lambda c, r: c.write_kv(2, 0, "not an array", "nor this"),
        lambda c, r: c.reserve_batch([1, 1], 1),                         # duplicate ids
        lambda c, r: c.build_batch_into([1, 2], np.zeros(2, np.int32),   # 2 rows need 3
                                        np.zeros(8, np.int32), np.zeros(2, np.int32)),
        lambda c, r: c.build_vllm_batch_into([1], np.zeros((1, 4), np.int64),  # int64 table
                                             np.zeros(4, np.int64)),
    ],
    pagedkv.NotFoundError: [
        lambda c, r: c.reserve(99, 1),
        lambda c, r: c.commit(99, [1]),
        lambda c, r: c.fork(99, 100),
        lambda c, r: c.build_batch([1, 99]),
        lambda c, r: c.residency(99),
    ],
    pagedkv.AlreadyExistsError: [
        lambda c, r: c.add_sequence(1, [5, 6, 7]),
        lambda c, r: c.fork(1, 2),
    ],
    pagedkv.OutOfRangeError: [
        lambda c, r: c.reserve(1, 60),                                   # past max length 64
        lambda c, r: c.layer_kv(2),
        lambda c, r: c.rollback(1, 11),
    ],
    pagedkv.FailedPreconditionError: [
        lambda c, r: c.commit(1, [1]),                                   # nothing reserved
        lambda c, r: c.write_kv(1, 0, *random_kv(r, 0, c)),
        lambda c, r: c.offload(1),                                       # no host tier
    ],
    pagedkv.ResourceExhaustedError: [
        lambda c, r: c.reserve(1, 50),                                   # 13 blocks, 16 total
    ],
}


@pytest.mark.parametrize(
    "error,call",
    [(e, c) for e, calls in BAD_CALLS.items() for c in calls],
    ids=[f"{e.__name__}-{i}" for e, calls in BAD_CALLS.items() for i in range(len(calls))])
def test_bad_input_raises_its_class_and_changes_nothing(busy, rng, error, call):
    before = snapshot(busy, IDS)
    with pytest.raises(error) as info:
        call(busy, rng)
    assert isinstance(info.value, pagedkv.PagedKvError)
    assert info.value.code == error.code
    assert info.value.message and info.value.message in str(info.value)
    assert snapshot(busy, IDS) == before
    assert busy.drain_events() == []
    busy.check_invariants()


def test_config_errors_name_the_field():
    with pytest.raises(pagedkv.InvalidArgumentError, match="head_dim"):
        make_cache(head_dim=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="no_such_field"):
        make_cache(no_such_field=1)
    with pytest.raises(pagedkv.InvalidArgumentError, match="DType"):
        make_cache(dtype="int8")
    with pytest.raises(pagedkv.UnimplementedError):
        make_cache(mode="dense")


def test_unavailable_backend_raises_unavailable():
    if pagedkv._C._cuda_device_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(pagedkv.UnavailableError):
        make_cache(backend="cuda")


@pytest.mark.parametrize("code", [c for c in pagedkv.StatusCode if c != pagedkv.StatusCode.OK])
def test_every_status_code_has_its_own_class(code):
    # kInternal has no bad input that reaches it (a backend failure does): the bridge itself.
    with pytest.raises(pagedkv.PagedKvError) as info:
        pagedkv._C._raise_status(code.value, "from C++")
    assert type(info.value) is pagedkv.errors.ERROR_CLASSES[code]
    assert info.value.code == code and info.value.message == "from C++"
    assert len(set(pagedkv.errors.ERROR_CLASSES.values())) == len(pagedkv.errors.ERROR_CLASSES)
