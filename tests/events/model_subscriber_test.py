#!/usr/bin/env python3
"""A vLLM-style consumer (pyzmq + msgspec) of a hybrid model's KV events.

Starts pagedkv_events_peer --model (a two-group ModelKvCache: group 0 full attention, group 1 a
sliding window of 4 blocks) and checks, with vLLM's struct layout (vllm_types.py):
  * every message decodes strictly and re-encodes to the same bytes, with no sequence gap;
  * every block event carries group_idx 0 or 1; stored events carry the group's
    kv_cache_spec_kind ("full_attention" / "sliding_window") and the window (group 1 only);
  * keyed by (group, medium, hash), every removal names a block its group holds there and no
    block is stored twice: the same hash is held by both groups as two blocks, and a removal
    in one group leaves the other's copy (checked to happen, so keying by hash alone would fail);
  * both groups' events are seen: stores and removals in each, window-group removals while the
    full group keeps the block.
"""

import sys

from peer import Peer, peer_binary, whole_test_timeout
from stream import follow_workload
from vllm_types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    block_hash,
    root_hash,
)

KINDS = {0: ("full_attention", None), 1: ("sliding_window", None)}  # window filled in below


class GroupedModel:
    """What a router following a hybrid model knows: per (group, medium), the hashes held."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.held = {}
        self.counts = {"stored": [0, 0], "removed": [0, 0], "cleared": 0,
                       "removed_while_other_group_holds": [0, 0]}

    def holds(self, group, medium):
        return self.held.setdefault((group, medium), set())

    def apply(self, seq, batch):
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                g = ev.group_idx
                assert g in (0, 1), f"message {seq}: group_idx {g!r}"
                kind, window = KINDS[g]
                assert ev.kv_cache_spec_kind == kind, (seq, g, ev.kv_cache_spec_kind)
                assert ev.kv_cache_spec_sliding_window == window, (seq, g, ev)
                assert ev.block_size == self.block_size
                assert ev.extra_keys is None
                self.counts["stored"][g] += 1
                chain = root_hash(ev.lora_id or 0) if ev.parent_block_hash is None \
                    else ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    toks = ev.token_ids[i * self.block_size:(i + 1) * self.block_size]
                    assert h == block_hash(chain, toks), f"message {seq}: hash off formula"
                    chain = h
                    held = self.holds(g, ev.medium)
                    assert h not in held, f"message {seq}: {h:#x} stored twice in group {g}"
                    held.add(h)
            elif isinstance(ev, BlockRemoved):
                g = ev.group_idx
                assert g in (0, 1), f"message {seq}: group_idx {g!r}"
                self.counts["removed"][g] += 1
                for h in ev.block_hashes:
                    held = self.holds(g, ev.medium)
                    assert h in held, (f"message {seq}: group {g} removes {h:#x} from "
                                       f"{ev.medium}, which it does not hold there")
                    held.discard(h)
                    other = 1 - g
                    if any(h in self.holds(other, m) for m in ("GPU", "CPU")):
                        self.counts["removed_while_other_group_holds"][g] += 1
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.counts["cleared"] += 1
                self.held = {}


def main():
    whole_test_timeout(240)
    binary = peer_binary()
    with Peer(binary, "--model", "--replay-buffer", 100000) as peer:
        KINDS[1] = ("sliding_window", 4 * peer.block_size)
        batches, w, replayed = follow_workload(peer, 100, "workload 7 4000")
        last = w["last_seq"]
        model = GroupedModel(peer.block_size)
        events = 0
        for s, batch in enumerate(batches):
            events += len(batch.events)
            model.apply(s, batch)
        c = model.counts
        assert c["cleared"] == 0, c
        assert min(c["stored"]) > 0 and min(c["removed"]) > 0, c
        # The window group drops blocks the full group keeps: the reason for the tag.
        assert c["removed_while_other_group_holds"][1] > 0, c
        print(f"model_subscriber: {events} events in {last + 1} messages; replays {replayed}; "
              f"{c}")
    print("model_subscriber: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
