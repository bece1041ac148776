#!/usr/bin/env python3
"""A router's model of a cache with a storage tier, built from the wire (pyzmq + msgspec).

Starts pagedkv_events_peer with a FileTier behind a small host tier (--storage-dir, a fresh
directory), runs a random workload under pressure whose prompts are fetched from storage before
they are added, and follows the stream with vLLM's struct layout (vllm_types.py), keeping per
medium (GPU, CPU, DISK) the set of block hashes held there. It checks that:
  * every message decodes strictly and re-encodes to the same bytes, with no sequence gap;
  * a block announced on DISK names a parent the router knows on some medium (or none, for a
    prompt's first block), at the moment it is announced;
  * no block is announced on DISK twice, and nothing is removed from DISK (the store's own
    evictions are not reported);
  * every removal names a block held on that medium, every hash follows the formula;
  * the storage tier was really used: blocks announced on DISK, and prompts hit blocks fetched
    back from it.
Then a second peer on the same directory (a restart) is checked the same way.
"""

import shutil
import sys
import tempfile

from peer import Peer, peer_binary, whole_test_timeout
from stream import follow_workload
from vllm_types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    block_hash,
    root_hash,
)

MEDIUMS = ("GPU", "CPU", "DISK")


class TieredModel:
    """What a router knows: per medium, the block hashes held there."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.held = {m: set() for m in MEDIUMS}
        self.counts = {"disk_stored": 0, "disk_first_blocks": 0, "stored": 0, "removed": 0}

    def known(self, h):
        return any(h in self.held[m] for m in MEDIUMS)

    def apply(self, seq, batch):
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                assert ev.medium in MEDIUMS, ev.medium
                assert ev.block_size == self.block_size
                self.counts["stored"] += 1
                parent = ev.parent_block_hash
                if ev.medium == "DISK":
                    self.counts["disk_stored"] += 1
                    if parent is None:
                        self.counts["disk_first_blocks"] += 1
                if parent is not None:
                    assert self.known(parent), (
                        f"message {seq}: {ev.medium} block names parent {parent:#x}, which no "
                        f"medium holds")
                chain = root_hash(ev.lora_id or 0) if parent is None else parent
                for i, h in enumerate(ev.block_hashes):
                    toks = ev.token_ids[i * self.block_size:(i + 1) * self.block_size]
                    assert h == block_hash(chain, toks), f"message {seq}: hash {h:#x} off formula"
                    chain = h
                    assert h not in self.held[ev.medium], (
                        f"message {seq}: {h:#x} announced on {ev.medium} twice")
                    self.held[ev.medium].add(h)
            elif isinstance(ev, BlockRemoved):
                assert ev.medium in ("GPU", "CPU"), f"message {seq}: removal from {ev.medium}"
                self.counts["removed"] += 1
                for h in ev.block_hashes:
                    assert h in self.held[ev.medium], (
                        f"message {seq}: removes {h:#x} from {ev.medium}, which does not hold it")
                    self.held[ev.medium].discard(h)
            else:
                assert isinstance(ev, AllBlocksCleared), ev
                raise AssertionError(f"message {seq}: AllBlocksCleared (events were lost)")


def follow(binary, directory, seed, min_events):
    """Runs a workload on a peer over `directory`; returns the router model's counts and the
    peer's last answer."""
    with Peer(binary, "--storage-dir", directory, "--device-blocks", 16, "--host-blocks", 8,
              "--replay-buffer", 100000) as peer:
        batches, w, _ = follow_workload(peer, seed, f"workload {seed + 1000} {min_events}")
        model = TieredModel(peer.block_size)
        for s, batch in enumerate(batches):
            model.apply(s, batch)
        return model.counts, w


def main():
    whole_test_timeout(240)
    binary = peer_binary()
    directory = tempfile.mkdtemp(prefix="pagedkv-storage-events-")
    try:
        first, w1 = follow(binary, directory, 11, 6000)
        print(f"storage_subscriber: first run {first}, peer {w1}")
        assert first["disk_stored"] > 100, first
        assert first["disk_first_blocks"] > 0, first
        assert w1["storage_hits"] > 0, "no prompt hit a block fetched back from storage"
        second, w2 = follow(binary, directory, 23, 3000)  # a restart over the same directory
        print(f"storage_subscriber: restart {second}, peer {w2}")
        assert w2["storage_hits"] > 0, "the restarted cache hit nothing in the store"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print("storage_subscriber: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
