"""A vLLM-style subscriber's plumbing: SUB socket, replay requests, gap filling."""

import zmq

from vllm_types import END_SEQ, seq_of

CTX = zmq.Context.instance()


def subscribe(endpoint):
    s = CTX.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    return s


def replay(endpoint, start):
    """Every (seq, payload) the replay socket sends for `start`, up to its end marker."""
    d = CTX.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        if not d.poll(10000):
            raise AssertionError(f"replay from {start} timed out")
        empty, seq, payload = d.recv_multipart()
        assert empty == b""
        if seq_of(seq) == END_SEQ:
            assert payload == b"", "end marker with a payload"
            d.close()
            return out
        out.append((seq_of(seq), payload))


def receive_until(sub, received, last_seq, quiet_s=1.0):
    """Live messages into `received` until `last_seq` arrives or nothing comes for quiet_s."""
    while last_seq not in received:
        if not sub.poll(int(quiet_s * 1000)):
            return
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"", topic
        assert len(seq) == 8
        received[seq_of(seq)] = payload


def fill_gaps(peer, received, last_seq, replayed_ranges):
    """Asks the replay socket for everything from the first missing number; checks the answer
    is exactly [first missing, last_seq] and agrees byte for byte with what came live."""
    missing = [s for s in range(last_seq + 1) if s not in received]
    if not missing:
        return 0
    start = missing[0]
    frames = replay(peer.replay, start)
    seqs = [s for s, _ in frames]
    assert seqs == list(range(start, last_seq + 1)), (
        f"replay from {start}: got {seqs[:3]}..{seqs[-3:]}, want {start}..{last_seq}")
    for s, payload in frames:
        if s in received:
            assert received[s] == payload, f"replayed message {s} differs from the live one"
        received[s] = payload
    replayed_ranges.append((start, last_seq, len(missing)))
    return len(missing)


def join(peer, sub, received, first_seed):
    """Runs small workloads until `sub` receives a live message (a new subscription takes a
    moment to reach the publisher). Returns the number of wire events published meanwhile."""
    published = 0
    for i in range(100):
        w = peer.cmd(f"workload {first_seed + i} 20")
        published += w["events"]
        before = len(received)
        receive_until(sub, received, w["last_seq"], quiet_s=0.3)
        if len(received) > before:
            return published
    raise AssertionError("the subscriber never received a live message")


def follow_workload(peer, first_seed, command):
    """Subscribes to `peer`, runs the workload `command` ("workload SEED MIN_EVENTS") and returns
    (every message from 0 on as a decoded batch, in order; the workload's answer; the ranges
    replayed). Checks on the way that no number is missing once replayed, that every message is
    msgspec's encoding of what it decodes to (a strict decode), and that the batches hold as many
    events as the peer says it published."""
    from vllm_types import DECODER, ENCODER

    received, replayed = {}, []
    sub = subscribe(peer.endpoint)
    published = join(peer, sub, received, first_seed)
    w = peer.cmd(command)
    published += w["events"]
    last = w["last_seq"]
    receive_until(sub, received, last)
    fill_gaps(peer, received, last, replayed)
    sub.close()
    assert sorted(received) == list(range(last + 1)), "a sequence gap remains"
    batches = []
    for s in range(last + 1):
        batch = DECODER.decode(received[s])
        assert ENCODER.encode(batch) == received[s], f"message {s} is not msgspec's encoding"
        batches.append(batch)
    events = sum(len(b.events) for b in batches)
    assert events == published, (events, published)
    return batches, w, replayed
