"""The step loop surface end to end: the example program, tiers (offload, restore, prefetch,
residency), typed events with their tier, stats as a dict, several Python threads on one cache
(the GIL is released and the cache locked per call), and the overhead benchmark's own check."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_example(name, *args):
    env = dict(os.environ, PAGEDKV_LOG_LEVEL="warn")
    return subprocess.run([sys.executable, str(ROOT / "examples" / "python" / name), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_step_loop_example_runs_and_checks_itself():
    r = run_example("step_loop.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "16 from the prefix cache" in r.stdout
    assert r.stdout.rstrip().endswith("OK")


def test_overhead_benchmark_runs_both_loops_to_the_same_state():
    r = run_example("bench_step_overhead.py", "--batch", "32", "--steps", "10", "--rounds", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ratio" in r.stdout


def test_offload_restore_and_prefetch_keep_the_bytes(rng):
    cache = make_cache(num_host_blocks=32)
    cache.add_sequence(1, list(range(10)))
    cache.reserve(1, 10)
    k, v = random_kv(rng, 10, cache)
    cache.write_kv(1, 0, k, v)
    cache.commit(1, list(range(10)))
    cache.drain_events()
    cache.offload(1)
    cache.synchronize()
    assert cache.residency(1) == pagedkv.SequenceResidency.HOST
    assert all(tier == pagedkv.Tier.HOST for tier, _ in cache.block_locations(1))
    events = cache.drain_events()
    assert pagedkv.EventKind.SEQUENCE_OFFLOADED in [e.kind for e in events]
    stored = [e for e in events if e.kind == pagedkv.EventKind.BLOCK_STORED]
    assert stored and all(e.tier == pagedkv.Tier.HOST for e in stored)
    assert all(isinstance(e, pagedkv.ControlEvent) and len(e.tokens) == 4 for e in stored)
    assert cache.stats()["sequences_offloaded"] == 1
    cache.restore(1)
    cache.synchronize()
    assert cache.residency(1) == pagedkv.SequenceResidency.DEVICE
    gk, gv = (np.from_dlpack(a) for a in cache.gather_layer(1, 0))
    np.testing.assert_array_equal(gk, k)
    np.testing.assert_array_equal(gv, v)
    cache.offload(1)
    cache.prefetch([1])
    cache.synchronize()
    assert cache.residency(1) == pagedkv.SequenceResidency.DEVICE
    cache.check_invariants()


def test_fork_rollback_priorities_and_stats_dict(rng):
    cache = make_cache()
    cache.add_sequence(1, list(range(9)), priority=3)
    cache.reserve(1, 9)
    cache.commit(1, list(range(9)))
    cache.fork(1, 2)
    assert cache.length(2) == 9
    cache.rollback(2, 5)
    assert cache.length(2) == 5 and cache.length(1) == 9
    cache.set_priority(2, 7)
    cache.set_active([1, 2])
    stats = cache.stats()
    assert stats["sequences"] == 2 and stats["active_sequences"] == 2
    assert set(stats["device"]) >= {"total_blocks", "free_blocks", "cached_blocks", "used_blocks"}
    cache.set_active([])
    cache.erase(2)
    cache.finish(1)
    assert not cache.contains(1) and cache.stats()["device"]["cached_blocks"] == 2
    assert cache.drain_evicted_sequences() == []
    cache.check_invariants()


def test_python_threads_may_share_a_cache():
    cache = make_cache(num_device_blocks=512)
    errors = []

    def worker(base):
        try:
            for i in range(40):
                sid = base + i
                cache.add_sequence(sid, [sid % 100] * 5)
                cache.reserve(sid, 5)
                cache.commit(sid, [sid % 100] * 5)
                cache.stats()
                cache.erase(sid)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(1000 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.stats()["sequences"] == 0
    cache.check_invariants()


def test_long_calls_release_the_gil():
    ids = list(range(256))

    def cache_for(steps):  # every step adds a token to each sequence: room for all of them
        blocks = len(ids) * ((4 + steps + 15) // 16 + 1)
        c = make_cache(num_layers=1, head_dim=4, block_size=16, num_device_blocks=blocks,
                       max_sequence_length=steps + 64)
        for sid in ids:
            c.add_sequence(sid, [sid] * 4)
        return c

    # One C++ call of at least 100 ms, sized by a measurement: a Release build runs a step of
    # 256 sequences in tens of microseconds, a sanitizer build far slower.
    probe = cache_for(800)
    probe._bench_step_cpp(ids, 400)  # warm: the first call allocates
    per_step = probe._bench_step_cpp(ids, 400) / 400
    steps = max(400, int(0.15 / max(per_step, 1e-9)) + 1)

    def call_beside_a_spinner(steps):
        """(seconds the call took, spinner iterations during it)."""
        cache = cache_for(steps)
        counter, stop = [0], [False]

        def spin():  # runs only while the main thread does not hold the GIL
            while not stop[0]:
                counter[0] += 1

        # A long switch interval: a thread that holds the GIL keeps it for 0.2 s, so the spinner
        # can only run during the call if the call released the GIL.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.2)
        thread = threading.Thread(target=spin)
        thread.start()
        try:
            while counter[0] == 0:  # sleeping releases the GIL: wait until the spinner runs
                time.sleep(0.001)
            before = counter[0]
            start = time.perf_counter()
            cache._bench_step_cpp(ids, steps)
            took = time.perf_counter() - start
            return took, counter[0] - before
        finally:
            stop[0] = True
            thread.join()
            sys.setswitchinterval(interval)

    # The probe may have run in a burst of load and sized the call too short: double it then.
    took, during = call_beside_a_spinner(steps)
    for _ in range(3):
        if took >= 0.05:
            break
        steps *= 2
        took, during = call_beside_a_spinner(steps)
    assert took >= 0.05, f"the call took {took * 1e3:.1f} ms, too short to tell"
    assert during > 0, "the Python thread never ran while the C++ call was in progress"
