#!/usr/bin/env python3
"""A vLLM-style consumer (pyzmq + msgspec) of pagedkv's KV events.

Starts pagedkv_events_peer on 127.0.0.1 and checks, with vLLM's own struct layout
(vllm_types.py):
  * more than 10,000 events decode with a strict msgspec decoder, re-encode to the same bytes,
    and carry sequence numbers 0..N with no gap once missed ranges are replayed;
  * a subscriber that disconnects and comes back gets exactly the missed range from the replay
    socket (contiguous from the start it asked for, byte-identical to the live copies);
  * the stream is consistent: every removal names a block stored on that medium, every stored
    block's parent is held on some tier, every hash follows the documented formula, and
    demotions show as BlockStored(CPU) then BlockRemoved(GPU);
  * a reader asking for messages the bounded buffer dropped gets AllBlocksCleared first.
"""

import sys
import time

from peer import Peer, peer_binary, whole_test_timeout
from stream import fill_gaps, join, receive_until, replay, subscribe
from vllm_types import (
    DECODER,
    ENCODER,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    block_hash,
    root_hash,
)

class Model:
    """What a router knows: which block hashes each medium holds."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.held = {"GPU": set(), "CPU": set()}
        self.counts = {"stored": 0, "removed": 0, "cleared": 0, "demotions": 0, "cpu_stored": 0}
        self.last_stored_cpu = set()

    def apply(self, seq, batch):
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self.counts["stored"] += 1
                assert ev.block_size == self.block_size
                assert len(ev.token_ids) == self.block_size * len(ev.block_hashes)
                assert ev.medium in ("GPU", "CPU"), ev.medium
                assert ev.lora_name is None
                ns = ev.lora_id or 0
                parent = ev.parent_block_hash
                if parent is not None:
                    assert parent in self.held["GPU"] or parent in self.held["CPU"], (
                        f"message {seq}: parent {parent:#x} is held on no tier")
                chain = root_hash(ns) if parent is None else parent
                for i, h in enumerate(ev.block_hashes):
                    toks = ev.token_ids[i * self.block_size:(i + 1) * self.block_size]
                    assert h == block_hash(chain, toks), f"message {seq}: hash {h:#x} off formula"
                    chain = h
                    assert h not in self.held[ev.medium], f"message {seq}: {h:#x} stored twice"
                    self.held[ev.medium].add(h)
                    if ev.medium == "CPU":
                        self.counts["cpu_stored"] += 1
                        self.last_stored_cpu.add(h)
            elif isinstance(ev, BlockRemoved):
                self.counts["removed"] += 1
                for h in ev.block_hashes:
                    assert h in self.held[ev.medium], (
                        f"message {seq}: removes {h:#x} from {ev.medium}, which does not hold it")
                    self.held[ev.medium].discard(h)
                    if ev.medium == "GPU" and h in self.held["CPU"] and h in self.last_stored_cpu:
                        self.counts["demotions"] += 1
                    self.last_stored_cpu.discard(h)
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.counts["cleared"] += 1
                self.held = {"GPU": set(), "CPU": set()}


def main():
    whole_test_timeout(240)
    binary = peer_binary()
    with Peer(binary, "--replay-buffer", 100000) as peer:
        received = {}
        replayed = []
        published = 0

        # Phase A: a subscriber from the start (what it misses while joining comes by replay).
        sub = subscribe(peer.endpoint)
        published += join(peer, sub, received, 100)
        a = peer.cmd("workload 1 6000")
        published += a["events"]
        receive_until(sub, received, a["last_seq"])
        live_a = len(received)
        assert live_a > 0
        fill_gaps(peer, received, a["last_seq"], replayed)

        # Phase B: the subscriber is gone; everything published now is missed.
        sub.close()
        b = peer.cmd("workload 2 2500")
        published += b["events"]

        # Phase C: it comes back, sees a gap, and asks for the missed range.
        sub = subscribe(peer.endpoint)
        published += join(peer, sub, received, 200)
        c = peer.cmd("workload 3 2500")
        published += c["events"]
        last = c["last_seq"]
        receive_until(sub, received, last)
        missed_b = set(range(a["last_seq"] + 1, b["last_seq"] + 1))
        assert not (missed_b & set(received)), "messages of phase B arrived while unsubscribed"
        n = fill_gaps(peer, received, last, replayed)
        assert n >= len(missed_b), (n, len(missed_b))
        assert replayed[-1][0] <= a["last_seq"] + 1, replayed
        sub.close()

        # Every message, in order: decoded strictly, same bytes again, consistent.
        assert sorted(received) == list(range(last + 1)), "a sequence gap remains"
        model = Model(peer.block_size)
        events = 0
        t0 = time.perf_counter()
        decoded = [(s, DECODER.decode(received[s])) for s in range(last + 1)]
        decode_s = time.perf_counter() - t0
        for s, batch in decoded:
            assert ENCODER.encode(batch) == received[s], f"message {s} is not msgspec's encoding"
            assert batch.data_parallel_rank == 0
            events += len(batch.events)
            model.apply(s, batch)
        assert events == published, (events, published)
        assert events >= 10000, events
        assert model.counts["cleared"] == 0
        assert model.counts["demotions"] > 0, model.counts
        print(f"subscriber: {events} events in {last + 1} messages, no gap; "
              f"{live_a} live in phase A; replays {replayed}; {model.counts}; "
              f"decoded at {events / decode_s:,.0f} events/s")

    # A reader that asks for messages the bounded buffer dropped is told to resync.
    with Peer(binary, "--replay-buffer", 50) as peer:
        w = peer.cmd("workload 5 800")
        frames = replay(peer.replay, 0)
        assert len(frames) == 51, len(frames)
        assert frames[0][0] == 0
        first = DECODER.decode(frames[0][1])
        assert len(first.events) == 1 and isinstance(first.events[0], AllBlocksCleared)
        assert [s for s, _ in frames[1:]] == list(range(w["last_seq"] - 49, w["last_seq"] + 1))
        print(f"subscriber: resync answer for dropped messages, then seqs "
              f"{frames[1][0]}..{frames[-1][0]}")
    print("subscriber: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
