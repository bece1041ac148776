"""Shared fixtures of the pagedkv pytest suite (CPU backend, numpy)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")

import pagedkv  # noqa: E402


def make_cache(**fields) -> pagedkv.KvCache:
    """A small CPU cache; keyword fields override the defaults here."""
    config = dict(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4,
                  num_device_blocks=64, dtype="fp32", backend="cpu")
    config.update(fields)
    return pagedkv.KvCache(**config)


@pytest.fixture
def cache() -> pagedkv.KvCache:
    return make_cache()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def snapshot(cache: pagedkv.KvCache, ids) -> dict:
    """Everything a failed call must leave as it was: stats, each sequence's lengths and blocks,
    and the bytes of the whole device pool."""
    cache.synchronize()
    pool = hashlib.sha256()
    for layer in range(cache.config.num_layers):
        for part in cache.layer_kv(layer):
            pool.update(np.ascontiguousarray(np.from_dlpack(part)).tobytes())
    return {
        "stats": cache.stats(),
        "sequences": {i: (cache.length(i), cache.pending(i), cache.block_locations(i))
                      for i in ids if cache.contains(i)},
        "contains": {i: cache.contains(i) for i in ids},
        "pool": pool.hexdigest(),
    }


def random_kv(rng: np.random.Generator, n: int, cache: pagedkv.KvCache, dtype=np.float32):
    shape = (n, cache.config.num_kv_heads, cache.config.head_dim)
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
