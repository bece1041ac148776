"""pagedkv's store as a vLLM 0.33 secondary offloading tier (pagedkv.integrations.vllm), driven
by vLLM's own code: SecondaryTierFactory loads it by module_path, and vLLM's real
CPUPrimaryTierOffloadingManager and TieringOffloadingManager store chunks, cascade them to the
tier, evict them from the primary tier, find them again in the tier (HIT_PENDING), promote
them and hand them back, bytes equal. Both backends: a FileTier directory and a redis-server
this test starts on 127.0.0.1 (and stops). No GPU, no model: the primary tier is a numpy array.

Needs vllm==0.33.0 (scripts/test-integrations installs it); skipped without."""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.base", reason="vLLM is not installed")

from vllm.v1.kv_offload.base import (LookupResult, Medium, ReqContext,  # noqa: E402
                                     ScheduleEndContext, make_offload_key)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager, TieringOffloadingManager)

import pagedkv  # noqa: E402
from pagedkv.integrations.vllm import PagedKvTier  # noqa: E402

CHUNKS, ROW = 5, 4096 + 8  # primary tier: 5 chunks of an odd size


class Region:
    """The SharedOffloadRegion the primary tier asks for: rows of one numpy array."""

    def __init__(self, chunks=CHUNKS, row=ROW):
        self.rows = np.zeros((chunks, row), dtype=np.int8)

    def create_kv_memoryview(self):
        return memoryview(self.rows)

    def cleanup(self):
        pass


class Spec:
    """The parts of vLLM's OffloadingSpec the tier reads (tests give the digest instead)."""
    config = None


@pytest.fixture(params=["file", "redis"])
def tier_config(request, tmp_path):
    config = {"type": "PagedKvTier", "module_path": "pagedkv.integrations.vllm",
              "digest": "test-model:int8:chunk", "backend": request.param}
    if request.param == "file":
        config["directory"] = str(tmp_path / "store")
    else:
        config["port"] = request.getfixturevalue("redis_port")
        config["key_prefix"] = f"pagedkv-{request.node.name}-{time.monotonic_ns()}"
    return config


def keys(prefix, n):
    return [make_offload_key(f"{prefix}{i}".encode() * 4, 0) for i in range(n)]


def step(manager):
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))


def settle(manager, tier):
    """Runs engine steps until neither the manager nor the tier has work in flight."""
    for _ in range(200):
        tier.drain_jobs()
        step(manager)
        if not manager.has_pending_work():
            return
    raise AssertionError("jobs still pending after 200 steps")


def store(manager, region, tier, ks, rng, ctx):
    """Stores `ks` in the primary tier with random bytes (as the GPU worker would) and lets the
    cascade to the tier finish; returns {key: bytes}."""
    out = manager.prepare_store(ks, ctx)
    assert out is not None and list(out.keys_to_store) == ks
    written = {}
    for k, chunk in zip(ks, out.store_spec.block_ids):
        region.rows[chunk] = rng.integers(-128, 128, size=ROW, dtype=np.int8)
        written[k] = region.rows[chunk].copy()
    manager.complete_store(ks, ctx, success=True)
    settle(manager, tier)
    return written


def make_manager(config, region=None):
    region = region or Region()
    primary = CPUPrimaryTierOffloadingManager(num_chunks=CHUNKS, mmap_region=region)
    tier = SecondaryTierFactory.create_secondary_tier(config, primary.get_kv_memoryview(), Spec())
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier],
                                       tier_poll_interval_s=0)
    return region, tier, manager


def test_the_factory_loads_the_tier_by_module_path_and_ignores_unknown_options(tier_config):
    config = dict(tier_config, an_option_from_a_newer_vllm=3)
    region, tier, manager = make_manager(config)
    assert isinstance(tier, PagedKvTier)
    assert tier.medium is Medium.STORAGE and tier.block_size_bytes == ROW
    assert tier.lookup(keys("x", 1)[0], ReqContext(req_id="r")) is LookupResult.MISS
    manager.shutdown()


def test_chunks_cascade_evict_promote_and_come_back_byte_for_byte(tier_config):
    rng = np.random.default_rng(1)
    region, tier, manager = make_manager(tier_config)
    ctx = ReqContext(req_id="r1")
    manager.on_new_request(ctx)
    first = keys("a", CHUNKS)
    written = store(manager, region, tier, first, rng, ctx)
    assert tier.store.batch_exists([pagedkv.integrations.vllm.store_key(k) for k in first]) == 5
    events = list(manager.take_events())
    assert any(e.medium is Medium.STORAGE and not e.removed and set(e.keys) == set(first)
               for e in events), "the tier announced what it stored"
    # Five more chunks push the first ones out of the primary tier.
    store(manager, region, tier, keys("b", CHUNKS), rng, ctx)
    region.rows[:] = 0  # nothing of the first chunks is left in the primary tier
    # Found in the tier: promoted (HIT_PENDING), then a primary hit.
    assert manager.lookup(first[0], ctx) in (LookupResult.HIT_PENDING, LookupResult.RETRY)
    settle(manager, tier)
    assert manager.lookup(first[0], ctx) is LookupResult.HIT
    spec = manager.prepare_load([first[0]], ctx)
    chunk = int(spec.block_ids[0])
    np.testing.assert_array_equal(region.rows[chunk], written[first[0]])
    manager.complete_load([first[0]], ctx)
    manager.shutdown()


def test_a_restarted_tier_serves_what_the_last_one_stored(tier_config):
    rng = np.random.default_rng(2)
    region, tier, manager = make_manager(tier_config)
    ctx = ReqContext(req_id="r1")
    manager.on_new_request(ctx)
    ks = keys("p", 3)
    written = store(manager, region, tier, ks, rng, ctx)
    manager.shutdown()

    region2, tier2, manager2 = make_manager(tier_config)  # a new engine on the same store
    ctx2 = ReqContext(req_id="r2")
    manager2.on_new_request(ctx2)
    for k in ks:
        assert manager2.lookup(k, ctx2) in (LookupResult.HIT_PENDING, LookupResult.RETRY)
    settle(manager2, tier2)
    for k in ks:
        assert manager2.lookup(k, ctx2) is LookupResult.HIT
        chunk = int(manager2.prepare_load([k], ctx2).block_ids[0])
        np.testing.assert_array_equal(region2.rows[chunk], written[k])
        manager2.complete_load([k], ctx2)
    # Another layout digest sees none of it.
    _, other, m3 = make_manager(dict(tier_config, digest="another-model:int8:chunk"))
    assert all(other.lookup(k, ctx2) is LookupResult.MISS for k in ks)
    manager2.shutdown()
    m3.shutdown()


def test_a_load_of_missing_keys_fails_and_names_the_good_ones(tier_config):
    rng = np.random.default_rng(3)
    region, tier, manager = make_manager(tier_config)
    ctx = ReqContext(req_id="r1")
    manager.on_new_request(ctx)
    ks = keys("m", 2)
    store(manager, region, tier, ks, rng, ctx)
    missing = keys("never", 1)
    # Driven directly: a job of two stored keys and one missing one, into chunks 2, 3, 4.
    job = TransferJob(job_id=901, keys=ks + missing, chunk_ids=np.array([2, 3, 4]),
                      is_promotion=True, req_context=ctx)
    tier.submit_load(job)
    tier.drain_jobs()
    results = [r for r in tier.get_finished_jobs() if r.job_id == 901]
    assert len(results) == 1 and not results[0].success
    assert list(results[0].successful_keys) == ks
    lone = TransferJob(job_id=902, keys=missing, chunk_ids=np.array([1]), is_promotion=True,
                       req_context=ctx)
    tier.submit_load(lone)
    tier.drain_jobs()
    result = [r for r in tier.get_finished_jobs() if r.job_id == 902][0]
    assert not result.success and list(result.successful_keys) == []
    # A store of chunks the tier holds already moves nothing and succeeds.
    again = TransferJob(job_id=903, keys=ks, chunk_ids=np.array([0, 1]), is_promotion=False,
                        req_context=ctx)
    tier.submit_store(again)
    result = [r for r in tier.get_finished_jobs() if r.job_id == 903][0]
    assert result.success and result.transfer_bytes == 0
    # Held and new chunks in one store: only the new one is written (straight from its row).
    fresh = keys("fresh", 1)
    region.rows[4] = rng.integers(-128, 128, size=ROW, dtype=np.int8)
    want = region.rows[4].copy()
    mixed = TransferJob(job_id=904, keys=[ks[0]] + fresh + [ks[1]], chunk_ids=np.array([0, 4, 1]),
                        is_promotion=False, req_context=ctx)
    tier.submit_store(mixed)
    tier.drain_jobs()
    result = [r for r in tier.get_finished_jobs() if r.job_id == 904][0]
    assert result.success and result.transfer_bytes == ROW
    assert list(list(tier.take_events())[-1].keys) == fresh
    region.rows[3] = 0
    tier.submit_load(TransferJob(job_id=905, keys=fresh, chunk_ids=np.array([3]),
                                 is_promotion=True, req_context=ctx))
    tier.drain_jobs()
    assert [r.success for r in tier.get_finished_jobs() if r.job_id == 905] == [True]
    np.testing.assert_array_equal(region.rows[3], want)
    manager.shutdown()


def test_bad_options_are_refused(tmp_path):
    region = Region()
    view = memoryview(region.rows)
    with pytest.raises(pagedkv.InvalidArgumentError, match="directory"):
        PagedKvTier(Spec(), view, "PagedKvTier", backend="file", digest="d")
    with pytest.raises(pagedkv.InvalidArgumentError, match="backend"):
        PagedKvTier(Spec(), view, "PagedKvTier", backend="s3", digest="d")
    with pytest.raises(pagedkv.InvalidArgumentError, match="digest"):
        PagedKvTier(Spec(), view, "PagedKvTier", backend="file", directory=str(tmp_path))
