"""vLLM's built-in `fs` secondary tier and pagedkv's PagedKvTier (file backend) side by side,
under the same vLLM TieringOffloadingManager and CPU primary tier, on the same chunks and the
same kind of directory, in one run: chunks/s stored (the cascade from the primary tier) and
chunks/s promoted (found in the tier, read back into the primary tier).

    python tests/integrations/bench_vllm_tier.py [--chunks 64] [--chunk-kib 2048] [--rounds 3]
        [--threads 2] [--direct-read-depth 0] [--direct-io] [--step-pause-ms 0]

With the tier's default direct_read_depth (8), pagedkv reads cold chunks in place, straight into
the primary tier's page-aligned rows (as the fs tier does); --direct-read-depth 0 reads them
through the page cache. --step-pause-ms sleeps between the
promotion loop's scheduler steps, as an engine's steps take time; 0 spins (on a small machine the
spinning loop takes CPU from the fs tier's Python reader threads).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

import numpy as np

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")

from vllm.v1.kv_offload.base import (LookupResult, ReqContext,  # noqa: E402
                                     ScheduleEndContext, make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,  # noqa: E402
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager, TieringOffloadingManager)


class Region:
    """The primary tier's shared region: page-aligned rows (the fs tier reads with O_DIRECT)."""

    def __init__(self, chunks, row):
        raw = np.zeros(chunks * row + 4096, dtype=np.int8)
        skip = -raw.ctypes.data % 4096
        self.rows = raw[skip:skip + chunks * row].reshape(chunks, row)

    def create_kv_memoryview(self):
        return memoryview(self.rows)

    def cleanup(self):
        pass


def spec(chunk_bytes):
    """An OffloadingSpec as far as the tiers read it: a Llama-8B-like model, 16-token blocks."""
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16,
                                      layer_names=tuple(f"model.layers.{i}" for i in range(32)),
                                      group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes, enable_kv_cache_events=False, extra_config={},
        engine_id="bench", model=OffloadingModelConfig(name="bench/llama-8b", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1,
                                          dcp_size=1, data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=0,
                                          is_parallelism_agnostic=True))
    return SimpleNamespace(config=config, blocks_per_chunk=1,
                           kv_events_config=SimpleNamespace(enable_kv_cache_events=False))


def step(manager):
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))


def settle(manager):
    while manager.has_pending_work():
        step(manager)
        time.sleep(0.0005)


def drop_page_cache():
    """Empties the page cache where allowed (root), so promotions read the disk, as the fs
    tier's O_DIRECT reads always do; True when it did."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def run(tier_config, n, chunk_bytes, rng, pause_s):
    """(seconds to store n chunks through the cascade, seconds to promote them back)."""
    region = Region(n, chunk_bytes)
    primary = CPUPrimaryTierOffloadingManager(num_chunks=n, mmap_region=region)
    tier = SecondaryTierFactory.create_secondary_tier(tier_config, primary.get_kv_memoryview(),
                                                      spec(chunk_bytes))
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier],
                                       tier_poll_interval_s=0)
    ctx = ReqContext(req_id="bench")
    manager.on_new_request(ctx)
    tag = rng.integers(1 << 60)
    first = [make_offload_key(f"{tag}-a{i}".encode().ljust(32, b"."), 0) for i in range(n)]
    second = [make_offload_key(f"{tag}-b{i}".encode().ljust(32, b"."), 0) for i in range(n)]

    def store(keys):
        out = manager.prepare_store(keys, ctx)
        for chunk in out.store_spec.block_ids:
            region.rows[chunk] = rng.integers(-128, 128, size=chunk_bytes, dtype=np.int8)
        t0 = time.perf_counter()
        manager.complete_store(keys, ctx, success=True)
        settle(manager)
        return time.perf_counter() - t0

    t_store = store(first)
    store(second)  # pushes the first chunks out of the primary tier
    run.cold = drop_page_cache()
    t0 = time.perf_counter()
    waiting = list(first)
    while waiting:
        waiting = [k for k in waiting if manager.lookup(k, ctx) is not LookupResult.HIT]
        step(manager)
        if pause_s > 0:
            time.sleep(pause_s)
    t_promote = time.perf_counter() - t0
    manager.shutdown()
    return t_store, t_promote


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-kib", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="PagedKvTier I/O threads")
    ap.add_argument("--direct-read-depth", type=int, default=None,
                    help="PagedKvTier reads around the page cache, this many in flight (0: none; "
                         "default: the tier's default)")
    ap.add_argument("--direct-io", action="store_true",
                    help="PagedKvTier writes and reads its segments with O_DIRECT")
    ap.add_argument("--step-pause-ms", type=float, default=0.0,
                    help="sleep between the promotion loop's steps (0: spin)")
    args = ap.parse_args()
    n, chunk_bytes = args.chunks, args.chunk_kib * 1024
    rng = np.random.default_rng(0)
    results = {"fs": ([], []), "pagedkv": ([], [])}
    with tempfile.TemporaryDirectory(dir=os.environ.get("PAGEDKV_BENCH_DIR")) as tmp:
        for r in range(args.rounds):  # alternate, so drift hits both
            for name in ("fs", "pagedkv"):
                root = os.path.join(tmp, f"{name}-{r}")
                config = ({"type": "fs", "root_dir": root} if name == "fs" else
                          {"type": "PagedKvTier", "module_path": "pagedkv.integrations.vllm",
                           "backend": "file", "directory": root, "threads": args.threads,
                           "direct_io": args.direct_io})
                if name == "pagedkv" and args.direct_read_depth is not None:
                    config["direct_read_depth"] = args.direct_read_depth
                s, p = run(config, n, chunk_bytes, rng, args.step_pause_ms / 1000)
                results[name][0].append(s)
                results[name][1].append(p)
    rate = {name: (n / statistics.median(s), n / statistics.median(p))
            for name, (s, p) in results.items()}
    print(f"{n} chunks of {args.chunk_kib} KiB, median of {args.rounds} rounds, one directory "
          f"kind ({tmp}); promotions read "
          f"{'the disk (page cache dropped)' if run.cold else 'through the page cache'}; "
          f"pagedkv threads {args.threads}, direct_io {args.direct_io}, direct_read_depth "
          f"{'default' if args.direct_read_depth is None else args.direct_read_depth}; "
          f"{args.step_pause_ms} ms between promotion steps")
    for name, (stored, promoted) in rate.items():
        print(f"  {name:8s} stored {stored:8.1f} chunks/s   promoted {promoted:8.1f} chunks/s")
    print(f"pagedkv / fs: stored {rate['pagedkv'][0] / rate['fs'][0]:.2f}x, "
          f"promoted {rate['pagedkv'][1] / rate['fs'][1]:.2f}x (goal >= 1.0x both)")


if __name__ == "__main__":
    main()
