#!/usr/bin/env python3
"""Dynamo's own KV router index fed from pagedkv's wire events.

Dynamo's RadixTree (PyPI ai-dynamo-runtime) keys blocks by a hash of their tokens that it computes
itself (compute_block_hash_for_seq), so this checks that token_ids, block_size and the parent
chain on the wire are right: after a scripted mix of stores, demotions to the host tier, host
drops, offloads, restores and removals, find_matches for several prompts must give the block
counts that pagedkv's own prefix index reports for the same prompts (prefix_hit_blocks).

The bridge is what a tier-aware router does with vLLM's `medium`: a block is held while any
tier holds it, so a demotion (BlockStored CPU, then BlockRemoved GPU) keeps it, and only its
last removal reaches the tree. A namespace other than 0 (wire `lora_id`) becomes Dynamo's
cache_namespace, so equal tokens of two namespaces stay apart. Exit code 77 (skip) when
ai-dynamo-runtime is not installed, with the reason.
"""

import json
import os
import sys

from peer import Peer, peer_binary, whole_test_timeout
from stream import fill_gaps, join, receive_until, subscribe
from vllm_types import DECODER, AllBlocksCleared, BlockRemoved, BlockStored, block_hash, root_hash

try:
    from dynamo.llm import RadixTree, compute_block_hash_for_seq
except ImportError as e:
    venv = os.path.dirname(os.path.dirname(sys.executable))
    why = ""
    try:
        with open(os.path.join(venv, "dynamo-unavailable")) as f:
            why = f.read().strip()
    except OSError:
        pass
    print(f"SKIP: ai-dynamo-runtime is not installed ({e}); pip said: {why or 'nothing'}")
    sys.exit(77)

WORKER = 1


def local_hashes(tokens, block_size, ns):
    return compute_block_hash_for_seq(tokens, block_size, cache_namespace=str(ns) if ns else None)


class Bridge:
    """pagedkv's vLLM-format batches -> Dynamo RadixTree events (JSON, as the tree takes them)."""

    def __init__(self, block_size):
        self.tree = RadixTree()
        self.block_size = block_size
        self.media = {}  # block hash -> mediums holding it
        self.event_id = 0
        self.forwarded = {"stored": 0, "removed": 0, "cleared": 0, "kept_by_other_tier": 0}

    def _send(self, data):
        self.event_id += 1
        self.tree.apply_event(WORKER, json.dumps({"event_id": self.event_id, "data": data}).encode())

    def apply(self, batch):
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                ns = ev.lora_id or 0
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    toks = ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size]
                    if not self.media.get(h):
                        (th,) = local_hashes(toks, ev.block_size, ns)
                        self._send({"stored": {"parent_hash": parent,
                                               "blocks": [{"block_hash": h, "tokens_hash": th}]}})
                        self.forwarded["stored"] += 1
                    self.media.setdefault(h, set()).add(ev.medium)
                    parent = h
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    held = self.media.get(h, set())
                    held.discard(ev.medium)
                    if held:
                        self.forwarded["kept_by_other_tier"] += 1
                        continue
                    self.media.pop(h, None)
                    self._send({"removed": {"block_hashes": [h]}})
                    self.forwarded["removed"] += 1
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.tree.clear_all_blocks(WORKER)
                self.media.clear()
                self.forwarded["cleared"] += 1

    def tiers_of(self, tokens, ns):
        """Where the bridge believes each full block of `tokens` is (for failure messages)."""
        h, out = root_hash(ns), []
        for i in range(len(tokens) // self.block_size):
            h = block_hash(h, tokens[i * self.block_size:(i + 1) * self.block_size])
            out.append(sorted(self.media.get(h, ())))
        return out

    def matches(self, tokens, ns):
        scores = self.tree.find_matches(local_hashes(tokens, self.block_size, ns)).scores
        return scores.get((WORKER, 0), 0)


def prefix(n, base):
    return [base + i for i in range(n)]


def main():
    whole_test_timeout(240)
    with Peer(peer_binary(), "--device-blocks", 24, "--host-blocks", 32) as peer:
        bs = peer.block_size
        bridge = Bridge(bs)
        received = {}
        applied = [0]  # next message to apply
        sub = subscribe(peer.endpoint)
        join(peer, sub, received, 500)  # a few random sequences, so the index is not empty

        def sync(last_seq):
            receive_until(sub, received, last_seq)
            fill_gaps(peer, received, last_seq, [])
            while applied[0] <= last_seq:
                bridge.apply(DECODER.decode(received[applied[0]]))
                applied[0] += 1

        # Prompts sharing prefixes: a system prompt of 3 blocks, two documents on top of it.
        system = prefix(12, 1)
        doc_a = system + prefix(8, 100)
        doc_b = system + prefix(10, 200)
        other_ns = prefix(12, 1)  # the system prompt's tokens in namespace 3
        queries = [
            (system + [9, 9], 0), (doc_a + [7], 0), (doc_b + [7], 0), (doc_a[:14], 0),
            (prefix(9, 100), 0), (other_ns + [5], 3), (other_ns + [5], 0), (doc_b + doc_a, 0),
        ]
        compared = []

        def check(step):
            w = peer.cmd("workload 0 0")  # last_seq of what was published so far
            sync(w["last_seq"])
            for tokens, ns in queries:
                want = bridge.matches(tokens, ns)
                got = peer.cmd(f"query {ns} " + " ".join(map(str, tokens)))
                assert got["hit_blocks"] == want, (
                    f"{step}: prompt of {len(tokens)} tokens (ns {ns}): pagedkv's index found "
                    f"{got['hit_blocks']} blocks ({got['host_hit_blocks']} on the host), "
                    f"Dynamo's find_matches {want}; tiers on the wire {bridge.tiers_of(tokens, ns)}")
                compared.append((step, want, got["host_hit_blocks"]))
                sync(peer.cmd("workload 0 0")["last_seq"])  # the query's own events, if any

        seq = 1
        for tokens, ns in ((doc_a + [1, 2], 0), (doc_b + [3], 0), (other_ns + [4], 3)):
            peer.cmd(f"add {seq} {ns} " + " ".join(map(str, tokens)))
            peer.cmd(f"finish {seq}")
            seq += 1
        check("stored")
        # Pressure: more distinct prompts than the device holds demote cached blocks to the
        # host, and the small host tier drops its least recently used ones.
        for k in range(6):
            peer.cmd(f"add {seq} 0 " + " ".join(map(str, prefix(16, 1000 * (k + 1)))))
            peer.cmd(f"finish {seq}")
            seq += 1
        check("demoted")
        # Offload a live sequence that holds a cached prefix, then restore it.
        peer.cmd(f"add {seq} 0 " + " ".join(map(str, doc_a + [5, 6, 7])))
        peer.cmd(f"offload {seq}")
        check("offloaded")
        peer.cmd(f"restore {seq}")
        check("restored")
        peer.cmd(f"erase {seq}")
        seq += 1
        # A random workload under pressure, then the same prompts again.
        peer.cmd("workload 7 3000")
        for tokens, ns in ((doc_a + [1, 2], 0), (system + [8], 0)):
            peer.cmd(f"add {seq} {ns} " + " ".join(map(str, tokens)))
            peer.cmd(f"finish {seq}")
            seq += 1
        check("after workload")
        st = peer.cmd("workload 0 0")
        assert st["demoted"] > 0 and st["host_dropped"] > 0, st
        assert any(host > 0 for _, _, host in compared), "no query hit a block on the host"
        assert any(want >= 3 for _, want, _ in compared), "no query matched a long prefix"
        print(f"dynamo_bridge: {len(compared)} prompts agree; blocks demoted {st['demoted']}, "
              f"host drops {st['host_dropped']}; forwarded {bridge.forwarded}; "
              f"matches {[w for _, w, _ in compared]}")
    print("dynamo_bridge: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
