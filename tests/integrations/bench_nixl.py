"""How fast pagedkv.nixl moves blocks between two processes (DRAM over UCX on this machine),
against the ceiling measured in the same run: one READ of a whole region of the same pools.

Prints blocks/s and GB/s of a 256-block move with scattered ids (one descriptor per block) and
with consecutive ids (one run), each as a ratio to the whole-region read's GB/s.

    python tests/integrations/bench_nixl.py [--blocks 256] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import pagedkv  # noqa: E402
from pagedkv.nixl import Peer  # noqa: E402
from test_nixl import PrefillProcess  # noqa: E402

# 128 KiB blocks (8 layers x K/V x 16 tokens x 4 heads x 64 dims x fp16), 1,024 per pool.
FIELDS = dict(num_layers=8, num_kv_heads=4, head_dim=64, block_size=16, num_device_blocks=1024,
              dtype="fp16", backend="cpu")


def timed(peer, remote, src, dst, repeats):
    peer.read_blocks(remote, src, dst)  # warm: connection, registration caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        peer.read_blocks(remote, src, dst)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = args.blocks
    with tempfile.TemporaryDirectory() as tmp:
        prefill = PrefillProcess(FIELDS, pathlib.Path(tmp) / "endpoint")
        try:
            cache = pagedkv.KvCache(**FIELDS)
            peer = Peer(cache, "decode", model_id="m")
            remote = peer.connect(prefill.ask("hello", metadata=peer.metadata().decode())
                                  ["metadata"].encode())
            block_bytes = peer.geometry.block_bytes
            rng = np.random.default_rng(1)
            scattered_src = [int(b) for b in rng.permutation(FIELDS["num_device_blocks"])[:n]]
            scattered_dst = [int(b) for b in rng.permutation(FIELDS["num_device_blocks"])[:n]]
            runs = len(pagedkv.pair_block_runs(remote.geometry, scattered_src, peer.geometry,
                                               scattered_dst))
            whole = list(range(FIELDS["num_device_blocks"]))
            t_whole = timed(peer, remote, whole, whole, args.repeats)
            ceiling = len(whole) * block_bytes / t_whole / 1e9
            print(f"whole region: {len(whole)} blocks of {block_bytes // 1024} KiB in one READ: "
                  f"{ceiling:.2f} GB/s (the ceiling)")
            for name, src, dst, nruns in [
                    ("scattered", scattered_src, scattered_dst, runs),
                    ("consecutive", list(range(n)), list(range(100, 100 + n)), 1)]:
                t = timed(peer, remote, src, dst, args.repeats)
                gbps = n * block_bytes / t / 1e9
                print(f"{n} blocks, {name} ({nruns} runs): {n / t:,.0f} blocks/s, {gbps:.2f} GB/s, "
                      f"{gbps / ceiling:.2f} of the whole-region read")
            peer.close()
        finally:
            prefill.stop()
    os._exit(0)  # NIXL's agent can crash at interpreter exit


if __name__ == "__main__":
    main()
