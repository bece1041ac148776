"""Python overhead of a decode step's control calls, against the same calls from C++.

A step is reserve_batch(ids, 1) + build_batch(ids) + commit_batch(ids, tokens) for 256
sequences. Two identical caches take the same steps: one driven from Python, one by a C++ loop
inside the extension (KvCache._bench_step_cpp), in alternating rounds of the same run; the
ratio of the best round of each is printed (goal: <= 2x). Many short rounds, because on a
shared machine a round can be slowed by other work; the best one is the cost of the calls.

    python examples/python/bench_step_overhead.py [--batch 256] [--steps 50] [--rounds 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")
import pagedkv  # noqa: E402


def make(batch: int, steps: int, rounds: int) -> pagedkv.KvCache:
    tokens = 16 + steps * rounds + 16
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16,
                            num_device_blocks=batch * (tokens // 16 + 2), dtype="fp16",
                            backend="cpu", enable_prefix_caching=False, enable_events=False)
    for sid in range(batch):
        prompt = [sid] * 16
        cache.add_sequence(sid, prompt)
        cache.reserve(sid, 16)
        cache.commit(sid, prompt)
    return cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-ratio", type=float, default=0.0,
                        help="exit 1 when the ratio is above this (0: only report)")
    args = parser.parse_args()
    ids = list(range(args.batch))
    tokens = [1] * args.batch
    py_cache, cpp_cache = (make(args.batch, args.steps, args.rounds) for _ in range(2))

    best_py = best_cpp = float("inf")
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            py_cache.reserve_batch(ids, 1)
            py_cache.build_batch(ids)
            py_cache.commit_batch(ids, tokens)
        best_py = min(best_py, (time.perf_counter() - t0) / args.steps)
        best_cpp = min(best_cpp, cpp_cache._bench_step_cpp(ids, args.steps) / args.steps)
    for cache in (py_cache, cpp_cache):
        cache.check_invariants()
    assert py_cache.stats() == cpp_cache.stats(), "both loops must have done the same work"
    ratio = best_py / best_cpp
    print(f"step of {args.batch} sequences (reserve_batch + build_batch + commit_batch): "
          f"Python {best_py * 1e6:.1f} us, C++ {best_cpp * 1e6:.1f} us, "
          f"ratio {ratio:.2f}x (goal <= 2x)")
    if args.max_ratio and ratio > args.max_ratio:
        print(f"FAIL: ratio above {args.max_ratio}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
