"""pagedkv.EventPublisher from Python: a real ZeroMQ subscriber on 127.0.0.1 reads what publish()
sends for calls on a KvCache and a two-group ModelKvCache, and the replay socket answers a
DEALER. Every message is checked against docs/events.md: frames [topic, 8-byte big-endian
sequence number, msgpack KVEventBatch], numbers 0, 1, ... without gaps, each event's map keys
in vLLM's order. Expected hashes come from the formula of docs/events.md ("Block hashes"),
checked here against its test vector, never from the publisher's output."""
from __future__ import annotations

import threading
import time

import pytest

import pagedkv

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
from zmq.utils.monitor import recv_monitor_message  # noqa: E402

needs_publisher = pytest.mark.skipif(
    not pagedkv.HAS_EVENT_PUBLISHER,
    reason="pagedkv built without the event library (ZeroMQ, msgpack-cxx)")

TIMEOUT_MS = 5000  # every receive: a lost message fails the test instead of hanging it
END = b"\xff" * 8  # the replay's end marker (sequence -1)
STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
               "medium", "lora_name"]
REMOVED_KEYS = ["type", "block_hashes", "medium"]

# ---- the block hash of docs/events.md, written from the document ----

M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _fold(x: int) -> int:
    p = x * 0xA0761D6478BD642F
    return (p & M64) ^ (p >> 64)


def root_hash(ns: int) -> int:
    return _mix(ns ^ 0x70616765646B7630)


def block_hash(parent: int, tokens) -> int:
    t = [v & 0xFFFFFFFF for v in tokens] + [0]
    digest = 0
    for j in range((len(tokens) + 1) // 2):
        word = t[2 * j] | (t[2 * j + 1] << 32)
        digest = (digest + _fold((word + (j + 1) * 0x9E3779B97F4A7C15) & M64)) & M64
    return _mix(parent ^ ((digest + len(tokens)) & M64))


def chain(prompt, block_size: int, ns: int = 0):
    """[(hash, parent hash or None, tokens)] of `prompt`'s full blocks, as BlockStored has them."""
    out, parent = [], root_hash(ns)
    for b in range(len(prompt) // block_size):
        tokens = list(prompt[b * block_size:(b + 1) * block_size])
        h = block_hash(parent, tokens)
        out.append((h, None if b == 0 else parent, tokens))
        parent = h
    return out


def test_the_hash_written_here_matches_the_documented_test_vector():
    assert root_hash(0) == 0x142F68D4AB3E773E
    assert root_hash(42) == 0x1078D5FC0EF1FA02
    b0 = block_hash(root_hash(0), [1, 2, 3, 4])
    assert b0 == 0xFADF8D5F13FF6C55
    assert block_hash(b0, [5, 6, 7, 8]) == 0xF42BB2B817F5178D
    assert block_hash(root_hash(0), [1, 2, 3]) == 0x8C8B0947E677E827
    assert block_hash(root_hash(0), list(range(1, 17))) == 0x4C0505F43D60D444


# ---- sockets: every one closed at teardown, also when the test fails ----


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)  # closes every socket the test opened


@pytest.fixture
def publishers():
    """make(block_size, **options): an EventPublisher closed at teardown."""
    made = []

    def make(block_size, **options):
        pub = pagedkv.EventPublisher(block_size, **options)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


def subscribe(ctx, endpoint: str, topic: bytes = b""):
    """A SUB socket on `endpoint`, returned once its handshake with the publisher is done (and a
    moment for the subscription to reach it), so the first message is not lost."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    monitor.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    try:
        sub.connect(endpoint)
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)
    time.sleep(0.2)
    return sub


def receive(sub, topic: bytes = b""):
    """The next message: (sequence number, decoded batch, payload bytes)."""
    frames = sub.recv_multipart()  # zmq.Again after TIMEOUT_MS
    assert len(frames) == 3
    assert frames[0] == topic
    assert len(frames[1]) == 8
    return int.from_bytes(frames[1], "big", signed=True), decode(frames[2]), frames[2]


def decode(payload: bytes):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3  # KVEventBatch: [ts, events, dp rank]
    assert payload[1] == 0xCB  # ts is always a float64
    return batch


def check_stored(event, expected, block_size, medium="GPU", ns=0):
    h, parent, tokens = expected
    assert list(event)[:8] == STORED_KEYS
    assert event["type"] == "BlockStored"
    assert event["block_hashes"] == [h]
    assert event["parent_block_hash"] == parent
    assert event["token_ids"] == tokens
    assert event["block_size"] == block_size
    assert event["lora_id"] == (None if ns == 0 else ns)
    assert event["medium"] == medium
    assert event["lora_name"] is None


def no_message(sub) -> bool:
    return sub.poll(300) == 0


# ---- a KvCache ----

BS = 4
PROMPT_A = [100 + t for t in range(10)]  # 2 full blocks and 2 tokens
PROMPT_B = [900 + 3 * t for t in range(16)]  # 4 full blocks, none of A's
PROMPT_C = [7, 7, 7, 7, 8]  # namespace 5: 1 full block


@needs_publisher
def test_a_caches_calls_arrive_as_documented_batches_numbered_without_gaps(zctx, publishers):
    topic = b"kv@test"
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=BS,
                            num_device_blocks=4, dtype="fp32", backend="cpu")
    pub = publishers(BS, topic=topic.decode(), data_parallel_rank=3)
    assert pub.endpoint.startswith("tcp://127.0.0.1:") and not pub.endpoint.endswith(":*")
    assert pub.replay_endpoint == ""
    sub = subscribe(zctx, pub.endpoint, topic)

    # Message 0: A's two full blocks committed, chained, the first without a parent.
    before = time.time()
    cache.add_sequence(1, PROMPT_A)
    cache.reserve(1, len(PROMPT_A))
    cache.commit(1, PROMPT_A)
    assert pub.publish(cache) == 2
    seq, (ts, events, rank), payload0 = receive(sub, topic)
    assert seq == 0 and rank == 3
    assert isinstance(ts, float) and before - 1 <= ts <= time.time() + 1
    a = chain(PROMPT_A, BS)
    assert len(events) == 2
    for event, expected in zip(events, a):
        assert len(event) == 8
        check_stored(event, expected, BS)

    # finish keeps the blocks cached: no event, no message, no number used.
    cache.finish(1)
    assert pub.publish(cache) == 0
    assert no_message(sub)

    # Message 1: B needs the whole pool, so A's two cached blocks are evicted (no host tier:
    # removed from the GPU) before B's four blocks are stored.
    cache.add_sequence(2, PROMPT_B)
    cache.reserve(2, len(PROMPT_B))
    cache.commit(2, PROMPT_B)
    assert pub.publish(cache) == 6
    seq, (_, events, rank), payload1 = receive(sub, topic)
    assert seq == 1 and rank == 3
    removed, stored = events[:2], events[2:]
    for event in removed:
        assert list(event) == REMOVED_KEYS
        assert event["type"] == "BlockRemoved" and event["medium"] == "GPU"
    assert sorted(e["block_hashes"][0] for e in removed) == sorted(h for h, _, _ in a)
    assert len(stored) == len(PROMPT_B) // BS
    for event, expected in zip(stored, chain(PROMPT_B, BS)):
        check_stored(event, expected, BS)

    # Message 2: erase drops B's blocks; C in namespace 5 is stored with lora_id 5, its hash
    # seeded by the namespace and its parent nil.
    cache.erase(2)
    cache.add_sequence(3, PROMPT_C, ns=5)
    cache.reserve(3, len(PROMPT_C))
    cache.commit(3, PROMPT_C)
    assert pub.publish(cache) == 5
    seq, (_, events, _), payload2 = receive(sub, topic)
    assert seq == 2
    assert [e["type"] for e in events] == ["BlockRemoved"] * 4 + ["BlockStored"]
    assert {e["block_hashes"][0] for e in events[:4]} == {h for h, _, _ in chain(PROMPT_B, BS)}
    check_stored(events[4], chain(PROMPT_C, BS, ns=5)[0], BS, ns=5)
    assert no_message(sub)

    counters = pub.counters()
    assert counters == {"messages": 3, "events": 13,
                        "bytes": len(payload0) + len(payload1) + len(payload2), "skipped": 0,
                        "replay_requests": 0, "replay_resyncs": 0, "bad_requests": 0}
    assert cache.drain_events() == []  # publish drained them


@needs_publisher
def test_an_offload_is_stored_on_the_host_then_removed_from_the_gpu(zctx, publishers):
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=BS,
                            num_device_blocks=8, num_host_blocks=8, dtype="fp32", backend="cpu")
    pub = publishers(BS)
    sub = subscribe(zctx, pub.endpoint)
    cache.add_sequence(1, PROMPT_B)
    cache.reserve(1, len(PROMPT_B))
    cache.commit(1, PROMPT_B)
    cache.offload(1)
    cache.synchronize()
    b = chain(PROMPT_B, BS)
    assert pub.publish(cache) == 4 + 2 * 4  # the offload event itself is not on the wire
    seq, (_, events, rank), _ = receive(sub)
    assert seq == 0 and rank == 0
    for event, expected in zip(events[:4], b):
        check_stored(event, expected, BS)
    moved = events[4:]
    host = [e for e in moved if e["type"] == "BlockStored"]
    assert len(host) == len(b)
    for event, expected in zip(host, b):
        check_stored(event, expected, BS, medium="CPU")
    # Each block on its new tier before it leaves the old one.
    for h, _, _ in b:
        kinds = [(e["type"], e["medium"]) for e in moved if e["block_hashes"] == [h]]
        assert kinds == [("BlockStored", "CPU"), ("BlockRemoved", "GPU")]
    assert pub.counters()["skipped"] == 1


# ---- a two-group ModelKvCache (docs/events.md, "KV groups") ----

MBS = 16
W = 64
FULL, WINDOW = 0, 1
MODEL_A = [1000 + 7 * t for t in range(120)]  # 7 full blocks and 8 tokens
MODEL_B = [50000 + 3 * t for t in range(50)]  # 3 full blocks and 2 tokens


def two_groups(window_blocks):
    groups = [
        pagedkv.KvGroup(name="full", layers=[0, 2], num_kv_heads=1, head_dim=8, dtype="fp32",
                        num_device_blocks=64),
        pagedkv.KvGroup(name="window", layers=[1, 3], num_kv_heads=1, head_dim=8, dtype="fp32",
                        sliding_window=W, num_device_blocks=window_blocks),
    ]
    return pagedkv.ModelKvCache(num_layers=4, block_size=MBS, backend="cpu", groups=groups,
                                enable_prefix_caching=True, enable_events=True)


def prefill(cache, id, prompt):
    assert cache.add_sequence(id, prompt) == 0
    cache.reserve(id, len(prompt))
    cache.commit(id, prompt)


def check_group_stores(events, prompt, group):
    """`events` are the GPU stores of `prompt`'s full blocks in `group`, in order."""
    assert len(events) == len(prompt) // MBS
    for event, expected in zip(events, chain(prompt, MBS)):
        check_stored(event, expected, MBS)
        assert event["group_idx"] == group
        if group == FULL:
            assert list(event)[8:] == ["group_idx", "kv_cache_spec_kind"]
            assert event["kv_cache_spec_kind"] == "full_attention"
        else:
            assert list(event)[8:] == ["group_idx", "kv_cache_spec_kind",
                                       "kv_cache_spec_sliding_window"]
            assert event["kv_cache_spec_kind"] == "sliding_window"
            assert event["kv_cache_spec_sliding_window"] == W


@needs_publisher
def test_a_two_group_model_tags_every_block_event_with_its_group(zctx, publishers):
    # The window group's pool fits A exactly; after A finishes it holds A's full blocks as
    # prefix cache and one free page, so B evicts what it lacks there (blocks(B) - 1), while
    # the full group (64 blocks) evicts nothing.
    a_blocks, b_blocks = -(-len(MODEL_A) // MBS), -(-len(MODEL_B) // MBS)
    cache = two_groups(window_blocks=a_blocks)
    pub = publishers(MBS)
    sub = subscribe(zctx, pub.endpoint)

    prefill(cache, 1, MODEL_A)
    cache.finish(1)
    with pytest.raises(pagedkv.InvalidArgumentError, match="block_size"):
        publishers(MBS // 2).publish(cache)  # another block size: refused, nothing drained
    n = len(MODEL_A) // MBS
    assert pub.publish(cache) == 2 * n
    seq, (_, events, _), _ = receive(sub)
    assert seq == 0
    check_group_stores([e for e in events if e["group_idx"] == FULL], MODEL_A, FULL)
    check_group_stores([e for e in events if e["group_idx"] == WINDOW], MODEL_A, WINDOW)

    prefill(cache, 2, MODEL_B)
    evicted = b_blocks - (a_blocks - n)
    assert pub.publish(cache) == evicted + 2 * (len(MODEL_B) // MBS)
    seq, (_, events, _), _ = receive(sub)
    assert seq == 1
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert len(removed) == evicted
    for event in removed:
        assert list(event) == REMOVED_KEYS + ["group_idx"]
        assert event["group_idx"] == WINDOW and event["medium"] == "GPU"
    assert {e["block_hashes"][0] for e in removed} <= {h for h, _, _ in chain(MODEL_A, MBS)}
    stored = [e for e in events if e["type"] == "BlockStored"]
    check_group_stores([e for e in stored if e["group_idx"] == FULL], MODEL_B, FULL)
    check_group_stores([e for e in stored if e["group_idx"] == WINDOW], MODEL_B, WINDOW)
    assert no_message(sub)


@needs_publisher
def test_threads_sharing_a_publisher_get_one_gap_free_sequence(zctx, publishers):
    # publish() releases the GIL and serializes on the publisher: two threads, each driving its
    # own cache, interleave whole messages numbered 0..39 in the order they were sent.
    pub = publishers(BS)
    sub = subscribe(zctx, pub.endpoint)
    caches = [pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=BS,
                              num_device_blocks=64, dtype="fp32", backend="cpu")
              for _ in range(2)]
    prompts = {(c, i): [10000 * c + 10 * i + t for t in range(BS)]
               for c in range(2) for i in range(20)}
    errors = []

    def drive(c):
        try:
            for i in range(20):
                prefill(caches[c], i + 1, prompts[(c, i)])
                assert pub.publish(caches[c]) == 1
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    got = [receive(sub) for _ in range(40)]
    assert [seq for seq, _, _ in got] == list(range(40))
    expected = {chain(p, BS)[0][0]: p for p in prompts.values()}
    seen = {}
    for _, (_, events, _), _ in got:
        assert len(events) == 1
        seen[events[0]["block_hashes"][0]] = events[0]["token_ids"]
    assert seen == expected
    assert no_message(sub)


# ---- replay ----


def replay(dealer, start: int):
    """Sends a replay request for `start` and returns the replies up to the end marker, as
    (sequence number, payload)."""
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    replies = []
    while True:
        frames = dealer.recv_multipart()  # zmq.Again after TIMEOUT_MS
        assert len(frames) == 3 and frames[0] == b""
        if frames[1] == END:
            assert frames[2] == b""
            return replies
        replies.append((int.from_bytes(frames[1], "big"), frames[2]))


@needs_publisher
def test_the_replay_socket_serves_buffered_messages_and_a_resync(zctx, publishers):
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=BS,
                            num_device_blocks=16, dtype="fp32", backend="cpu")
    pub = publishers(BS, replay_endpoint="tcp://127.0.0.1:*", replay_buffer=2)
    assert pub.replay_endpoint.startswith("tcp://127.0.0.1:")
    assert pub.replay_endpoint != pub.endpoint
    sub = subscribe(zctx, pub.endpoint)
    live = []
    for i in range(3):  # three messages of one block each; the buffer keeps the last two
        prompt = [10 * i + t for t in range(BS)]
        prefill(cache, i + 1, prompt)
        assert pub.publish(cache) == 1
        seq, batch, payload = receive(sub)
        assert seq == i
        check_stored(batch[1][0], chain(prompt, BS)[0], BS)
        live.append(payload)

    dealer = zctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    dealer.connect(pub.replay_endpoint)
    # Buffered: byte-identical to the live messages, then the end marker.
    assert replay(dealer, 1) == [(1, live[1]), (2, live[2])]
    assert replay(dealer, 3) == []
    # A malformed request (a 3-byte start) is ignored; the socket goes on serving.
    dealer.send_multipart([b"", b"\x00\x00\x01"])
    # Message 0 is gone: first a batch holding one AllBlocksCleared, then what is buffered.
    replies = replay(dealer, 0)
    assert [s for s, _ in replies] == [0, 1, 2]
    _, events, _ = decode(replies[0][1])
    assert events == [{"type": "AllBlocksCleared"}]
    assert [p for _, p in replies[1:]] == live[1:]
    counters = pub.counters()
    assert (counters["replay_requests"], counters["replay_resyncs"],
            counters["bad_requests"]) == (3, 1, 1)
    assert counters["messages"] == 3


# ---- options, errors, lifetime ----


@needs_publisher
def test_bad_options_raise_the_projects_errors(publishers):
    with pytest.raises(pagedkv.InvalidArgumentError, match="block_size must be >= 1, got 0"):
        pagedkv.EventPublisher(0)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        pagedkv.EventPublisher(-4)
    with pytest.raises(pagedkv.InvalidArgumentError, match="data_parallel_rank"):
        pagedkv.EventPublisher(4, data_parallel_rank=-1)
    with pytest.raises(pagedkv.InvalidArgumentError, match="send_hwm"):
        pagedkv.EventPublisher(4, send_hwm=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="replay_buffer"):
        pagedkv.EventPublisher(4, replay_endpoint="tcp://127.0.0.1:*", replay_buffer=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="replay_buffer"):
        pagedkv.EventPublisher(4, replay_buffer=-1)
    with pytest.raises(pagedkv.UnavailableError, match="cannot bind"):
        pagedkv.EventPublisher(4, endpoint="nonsense://here")
    taken = publishers(4)
    with pytest.raises(pagedkv.UnavailableError, match="cannot bind"):
        pagedkv.EventPublisher(4, endpoint=taken.endpoint)  # the port is bound already


@needs_publisher
def test_a_refused_publish_keeps_the_events_and_a_closed_publisher_refuses(publishers):
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=BS,
                            num_device_blocks=4, dtype="fp32", backend="cpu")
    prefill(cache, 1, PROMPT_A)
    with pytest.raises(pagedkv.InvalidArgumentError, match="block_size"):
        publishers(BS + 1).publish(cache)
    assert [e.block_hash for e in cache.drain_events()] == [h for h, _, _ in chain(PROMPT_A, BS)]
    with publishers(BS) as pub:
        assert not pub.closed
        endpoint = pub.endpoint
    assert pub.closed and pub.endpoint == endpoint
    pub.close()  # idempotent
    with pytest.raises(pagedkv.FailedPreconditionError, match="closed"):
        pub.publish(cache)
    with pytest.raises(pagedkv.FailedPreconditionError, match="closed"):
        pub.counters()
    # Its port is free again.
    again = publishers(BS, endpoint=endpoint)
    assert again.endpoint == endpoint


@pytest.mark.skipif(pagedkv.HAS_EVENT_PUBLISHER, reason="the extension has the publisher")
def test_without_the_event_library_the_publisher_says_so():
    with pytest.raises(pagedkv.UnimplementedError, match="built without the event library"):
        pagedkv.EventPublisher(16)
