"""pagedkv's store as an SGLang 0.5.23 HiCache storage backend (pagedkv.integrations.sglang),
created by SGLang's own StorageBackendFactory ("dynamic", interface_v1) over a page-first host
pool: pages stored from their slots, found (a contiguous prefix), read into other slots, bytes
equal; a restart finds them; another model, or another TP rank of an MHA model, does not; an MLA
replica that is not the writer stores nothing. Both backends (a redis-server started here).
No GPU and no model: the host pool is a small stand-in with SGLang's page-pointer call.

Needs sglang==0.5.23 (scripts/test-integrations installs it); skipped without."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory",
                    reason="SGLang is not installed")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

import pagedkv  # noqa: E402
from pagedkv.integrations.sglang import PagedKvStorage  # noqa: E402


class PageFirstPool:
    """An MHA host pool in SGLang's page_first layout: K of every token slot, then V, each slot
    [layers, heads, head_dim]; get_page_buffer_meta gives a K and a V pointer per page, as
    SGLang's MHATokenToKVPoolHost does."""

    layout = "page_first"

    def __init__(self, pages=8, page_size=4, layers=3, heads=2, head_dim=8, dtype=torch.float16):
        self.page_size, self.layer_num, self.head_num, self.head_dim = page_size, layers, heads, head_dim
        self.dtype = dtype
        self.size = pages * page_size
        self.kv_buffer = torch.zeros((2, self.size, layers, heads, head_dim), dtype=dtype)

    def get_page_buffer_meta(self, indices):
        item = self.dtype.itemsize
        slot = self.layer_num * self.head_num * self.head_dim * item
        v_offset = self.size * slot
        ptrs = []
        idx = indices.tolist()
        for i in range(0, len(idx), self.page_size):
            k = self.kv_buffer.data_ptr() + idx[i] * slot
            ptrs += [k, k + v_offset]
        return ptrs, [self.page_size * slot] * len(ptrs)

    def page(self, p):
        s = slice(p * self.page_size, (p + 1) * self.page_size)
        return self.kv_buffer[:, s].clone()

    def slots(self, pages):
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages])


@pytest.fixture(params=["file", "redis"])
def backend_options(request, tmp_path):
    if request.param == "file":
        return {"backend": "file", "directory": str(tmp_path / "store")}
    return {"backend": "redis", "port": request.getfixturevalue("redis_port"),
            "key_prefix": f"pagedkv-{request.node.name}-{time.monotonic_ns()}"}


def make(options, pool, model="m", tp_rank=0, tp_size=1, mla=False):
    extra = dict(options, backend_name="pagedkv", module_path="pagedkv.integrations.sglang",
                 class_name="PagedKvStorage", interface_v1=1)
    config = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                  attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                                  enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name=model, extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)  # as SGLang's cache controller does
    return backend


def hashes(n, tag="p"):
    return [f"{tag}{i:063x}" for i in range(n)]


def test_pages_round_trip_through_sglangs_factory(backend_options):
    pool = PageFirstPool()
    pool.kv_buffer.normal_()
    storage = make(backend_options, pool)
    assert isinstance(getattr(storage, "_backend", storage), PagedKvStorage)
    keys = hashes(3)
    assert storage.batch_set_v1(keys, pool.slots([0, 1, 2])) == [True] * 3
    assert storage.batch_exists(keys) == 3
    assert storage.batch_exists(keys[:2] + hashes(1, "x") + keys[2:]) == 2
    want = [pool.page(p) for p in (0, 1, 2)]
    assert storage.batch_get_v1(keys, pool.slots([5, 6, 7])) == [True] * 3
    for i, p in enumerate((5, 6, 7)):
        assert torch.equal(pool.page(p), want[i]), f"page {i}"


def test_a_missing_page_fails_from_there_on(backend_options):
    pool = PageFirstPool()
    pool.kv_buffer.normal_()
    storage = make(backend_options, pool)
    keys = hashes(2)
    storage.batch_set_v1(keys, pool.slots([0, 1]))
    got = storage.batch_get_v1(keys[:1] + hashes(1, "missing") + keys[1:], pool.slots([4, 5, 6]))
    assert got == [True, False, False]
    assert torch.equal(pool.page(4), pool.page(0))


def test_a_restart_finds_the_pages_and_other_identities_do_not(backend_options):
    pool = PageFirstPool()
    pool.kv_buffer.normal_()
    keys = hashes(2)
    make(backend_options, pool).batch_set_v1(keys, pool.slots([0, 1]))
    again = make(backend_options, PageFirstPool())
    assert again.batch_exists(keys) == 2
    assert make(backend_options, PageFirstPool(), model="other").batch_exists(keys) == 0
    # An MHA rank holds its own heads: rank 1 of 2 does not read rank 0's pages.
    assert make(backend_options, PageFirstPool(), tp_rank=0, tp_size=2).batch_exists(keys) == 0
    assert make(backend_options, PageFirstPool(), tp_rank=1, tp_size=2).batch_exists(keys) == 0
    # Another page shape is another layout.
    assert make(backend_options, PageFirstPool(page_size=8)).batch_exists(keys) == 0


def test_an_mla_replica_that_is_not_the_writer_stores_nothing(backend_options):
    pool = PageFirstPool()
    reader = make(backend_options, pool, tp_rank=1, tp_size=2, mla=True)
    assert reader.batch_set_v1(hashes(1), pool.slots([0])) == [True]
    assert reader.batch_exists(hashes(1)) == 0
    writer = make(backend_options, pool, tp_rank=0, tp_size=2, mla=True)
    writer.batch_set_v1(hashes(1), pool.slots([0]))
    assert reader.batch_exists(hashes(1)) == 1, "MLA ranks share the writer's pages"


def test_the_tensor_interface_and_bad_options_are_refused(tmp_path):
    pool = PageFirstPool()
    storage = make({"backend": "file", "directory": str(tmp_path)}, pool)
    with pytest.raises(NotImplementedError, match="interface_v1"):
        getattr(storage, "_backend", storage).get("k")
    with pytest.raises(pagedkv.InvalidArgumentError, match="directory"):
        make({"backend": "file"}, pool)
    with pytest.raises(pagedkv.InvalidArgumentError, match="backend"):
        make({"backend": "s3"}, pool)
