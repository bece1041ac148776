"""Storage tiers from Python (docs/python.md, Storage tiers; docs/storage.md): a cache writes the
cached host blocks its host LRU drops back to a FileTier; a second cache on a new FileTier over
the same directory (a restart) fetches a prompt's blocks, a sequence added afterwards hits them
and gather_layer reads exactly the bytes the first cache wrote. The same for a ModelKvCache with
a store per group (the window group only its window). Stores of another layout, one store for
two groups or two caches, and bad arguments are refused and claim nothing; a cache keeps its
store alive. K/V values are a function of (token, position, layer, K or V, head, dim), exact in
fp16, so every expected value comes from the inputs. check_invariants() after every step."""
from __future__ import annotations

import gc
import os
import pathlib
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

import pagedkv


def kv_values(tokens, first_pos, layer, part, heads, dim):
    """[len(tokens), heads, dim] fp16: a multiple of 1/8 in [-32, 32), exact in fp16."""
    t = np.asarray(tokens, dtype=np.int64)[:, None, None]
    pos = (first_pos + np.arange(len(tokens), dtype=np.int64))[:, None, None]
    h = np.arange(heads, dtype=np.int64)[None, :, None]
    d = np.arange(dim, dtype=np.int64)[None, None, :]
    raw = (t * 7 + pos * 13 + layer * 31 + part * 17 + h * 5 + d * 3) % 512
    return (raw / 8.0 - 32.0).astype(np.float16)


# ---- KvCache: 4 device and 4 host blocks of 4 tokens (tests/runtime/storage_cache_test.cpp):
# a few 9-token prompts push the first ones' blocks device -> host -> storage.

LAYERS, HEADS, DIM, BS = 2, 2, 8, 4
BLOCK_BYTES = 2 * LAYERS * BS * HEADS * DIM * 2  # K and V, fp16


def small_config(**fields) -> pagedkv.CacheConfig:
    config = dict(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, block_size=BS,
                  num_device_blocks=4, num_host_blocks=4, dtype="fp16", backend="cpu")
    config.update(fields)
    return pagedkv.CacheConfig(**config)


def prompt(p):
    """9 tokens (two full blocks and one to compute), distinct per p."""
    return [1000 * (p + 1) + i for i in range(9)]


def kv_layers(cache):
    """{layer: (heads, dim)} of a one-group cache."""
    c = cache.config
    return {layer: (c.num_kv_heads, c.head_dim) for layer in range(c.num_layers)}


def write_and_commit(cache, id, tokens, cached, layers, reserved=False):
    """Reserves (unless `reserved`) the tokens after the `cached` ones, writes their K/V into
    every layer ({layer: (heads, dim)}) and commits them."""
    rest = tokens[cached:]
    if not reserved:
        cache.reserve(id, len(rest))
    for layer, (heads, dim) in layers.items():
        cache.write_kv(id, layer, kv_values(rest, cached, layer, 0, heads, dim),
                       kv_values(rest, cached, layer, 1, heads, dim))
    cache.commit(id, rest)
    cache.check_invariants()


def compute_and_finish(cache, id, tokens, layers=None):
    """Adds `id`, writes the K/V of its uncached tokens, commits, finishes it (its full blocks
    stay cached)."""
    cached = cache.add_sequence(id, tokens)
    write_and_commit(cache, id, tokens, cached, layers or kv_layers(cache))
    cache.finish(id)
    cache.check_invariants()


def push_through_to_storage(cache, count=6):
    for p in range(count):
        compute_and_finish(cache, p + 1, prompt(p))
    cache.flush_storage()
    cache.check_invariants()


def check_bytes(cache, id, tokens, layer, heads, dim, begin, end):
    """gather_layer of positions [begin, end) equals what kv_values wrote there."""
    k, v = cache.gather_layer(id, layer, begin=begin, num_tokens=end - begin)
    for part, got in enumerate((k, v)):
        want = kv_values(tokens[begin:end], begin, layer, part, heads, dim)
        got = np.from_dlpack(got)
        assert got.dtype == np.float16 and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), f"layer {layer} part {part}"


def block_records(directory, layout):
    """The live block records in a store's segments (docs/storage.md, FileTier): a 32-byte
    segment header, then records of a 40-byte header (type at 4, body bytes at 24) and a body."""
    root = pathlib.Path(directory) / f"{layout.fingerprint():016x}"
    records = []
    for segment in sorted(root.glob("*.seg")):
        data = segment.read_bytes()
        off = 32
        while off + 40 <= len(data) and data[off:off + 4] == b"PKSR":
            kind = int.from_bytes(data[off + 4:off + 6], "little")
            body = int.from_bytes(data[off + 24:off + 32], "little")
            if kind == 1:
                records.append((segment.name, off))
            off += 40 + body
    return records


def restart_round_trip(make_store, check_files=None):
    """Cache A writes prompts 0..5 and is pushed through to storage; cache B on a new store
    (make_store()) fetches prompt 0 and reads back A's bytes."""
    store = make_store()
    assert store.medium in ("DISK", "REDIS") and not store.in_use
    cache = pagedkv.KvCache(small_config(), storage=store)
    assert store.in_use and cache.storage is store
    push_through_to_storage(cache)
    st = cache.stats()
    assert st["host_blocks_dropped"] >= 2
    assert st["storage_blocks_written"] == st["host_blocks_dropped"]
    assert st["storage_bytes_written"] == st["storage_blocks_written"] * BLOCK_BYTES
    assert st["storage_failed_blocks"] == 0
    assert store.stats()["puts"] == st["storage_blocks_written"]
    stored = [e for e in cache.drain_events()
              if e.kind == pagedkv.EventKind.BLOCK_STORED and e.tier == pagedkv.Tier.STORAGE]
    assert len(stored) == st["storage_blocks_written"]
    assert all(len(e.tokens) == BS for e in stored)
    if check_files is not None:
        check_files(store, st["storage_blocks_written"])
    del cache, store  # the restart: nothing of cache A is left
    gc.collect()

    store = make_store()
    cache = pagedkv.KvCache(small_config(), storage=store)
    p0 = prompt(0)
    assert cache.fetch_from_storage(p0) == 2  # both full blocks of prompt 0
    assert cache.storage_in_flight() <= 2
    cache.check_invariants()
    cache.flush_storage()
    assert cache.storage_in_flight() == 0
    cache.check_invariants()
    st = cache.stats()
    assert st["storage_hit_blocks"] == 2
    assert st["storage_bytes_read"] == 2 * BLOCK_BYTES
    assert st["host"]["cached_blocks"] == 2
    assert store.stats()["gets"] == 2 and store.stats()["bytes_read"] == 2 * BLOCK_BYTES

    assert cache.add_sequence(42, p0) == 8  # both full blocks hit on the host tier
    assert cache.stats()["prefix_host_hit_blocks"] == 2
    cache.check_invariants()
    write_and_commit(cache, 42, p0, 8, kv_layers(cache))  # the reserve onboards the hit
    for layer in range(LAYERS):  # positions 0..7 as cache A wrote them, 8 as B did
        check_bytes(cache, 42, p0, layer, HEADS, DIM, 0, 9)
    assert cache.fetch_from_storage(prompt(99)) == 0  # a prompt the store never saw


def test_a_restarted_kv_cache_fetches_a_prompt_from_a_file_tier_and_reads_the_same_bytes(
        tmp_path):
    layout = pagedkv.StorageLayout.from_config(small_config(), "test-model")

    def check_files(store, written):
        assert store.layout == layout and store.directory == str(tmp_path)
        # Each write-back is one block record (all of the prompts' blocks differ).
        assert len(block_records(tmp_path, layout)) == written

    restart_round_trip(lambda: pagedkv.FileTier(small_config(), str(tmp_path),
                                                model_id="test-model"), check_files)


def test_a_fetch_bounded_by_max_cached_says_how_far_the_hit_reaches(tmp_path):
    def store():
        return pagedkv.FileTier(small_config(), str(tmp_path), model_id="test-model")

    restart_round_trip(store)
    cache = pagedkv.KvCache(small_config(), storage=store())
    # A hit of at most 4 tokens needs prompt 0's first block only.
    assert cache.fetch_prefix_from_storage(prompt(0), max_cached=4) == (1, 4)
    cache.flush_storage()
    assert cache.add_sequence(1, prompt(0)) == 4
    write_and_commit(cache, 1, prompt(0), 4, kv_layers(cache))
    check_bytes(cache, 1, prompt(0), 0, HEADS, DIM, 0, 9)
    with pytest.raises(pagedkv.InvalidArgumentError, match="max_cached"):
        cache.fetch_prefix_from_storage(prompt(0), max_cached=-2)


def test_a_store_of_another_model_id_in_the_same_directory_never_hits(tmp_path):
    restart_round_trip(lambda: pagedkv.FileTier(small_config(), str(tmp_path), model_id="a"))
    cache = pagedkv.KvCache(small_config(),
                            storage=pagedkv.FileTier(small_config(), str(tmp_path), model_id="b"))
    assert cache.fetch_from_storage(prompt(0)) == 0
    assert cache.storage_in_flight() == 0
    assert cache.add_sequence(1, prompt(0)) == 0


def test_a_cache_without_a_storage_tier_fetches_nothing():
    cache = pagedkv.KvCache(small_config())
    assert cache.storage is None
    assert cache.fetch_from_storage(prompt(0)) == 0
    cache.poll_storage()
    cache.flush_storage()
    assert cache.storage_in_flight() == 0


# ---- ModelKvCache: layers 0, 2 full attention (group 0), 1, 3 sliding window 32 (group 1),
# block 16; 12 device and 6 host blocks per group (tests/runtime/model_cache_storage_test.cpp).

MBS, W = 16, 32
SHAPES = {0: (2, 16), 2: (2, 16), 1: (1, 24), 3: (1, 24)}  # layer: (heads, dim)


def model_config(window_heads=1, window_dim=24) -> pagedkv.CacheConfig:
    full = pagedkv.KvGroup(name="full", layers=[0, 2], num_kv_heads=2, head_dim=16,
                           num_device_blocks=12, num_host_blocks=6)
    window = pagedkv.KvGroup(name="window", layers=[1, 3], num_kv_heads=window_heads,
                             head_dim=window_dim, sliding_window=W, num_device_blocks=12,
                             num_host_blocks=6)
    return pagedkv.CacheConfig(num_layers=4, block_size=MBS, backend="cpu",
                               groups=[full, window])


def model_stores(directory, ids=("model/full", "model/window"), config=None):
    config = config or model_config()
    return [pagedkv.FileTier(config, str(directory), model_id=ids[g], group=g) for g in (0, 1)]


def iota(n, first):
    return list(range(first, first + n))


P = iota(96, 1000)  # six blocks


def test_a_restarted_model_cache_hits_what_each_group_fetched_from_its_file_tier(tmp_path):
    # Both groups' stores share one directory: each works under its own layout fingerprint. One
    # cache writes and fetches both groups' pages.
    stores = model_stores(tmp_path)
    assert stores[0].layout.fingerprint() != stores[1].layout.fingerprint()
    model = pagedkv.ModelKvCache(model_config(), storage=stores)
    assert model.storage == stores and all(s.in_use for s in stores)
    compute_and_finish(model, 1, P, SHAPES)
    for id in range(10, 15):  # push P past both groups' host tiers
        compute_and_finish(model, id, iota(96, 100000 * id), SHAPES)
    model.flush_storage()
    model.check_invariants()
    for g in (0, 1):
        written = stores[g].stats()["puts"]
        assert written >= 6, f"group {g}"
        assert len(block_records(tmp_path, stores[g].layout)) == written
    del model, stores
    gc.collect()

    stores = model_stores(tmp_path)
    model = pagedkv.ModelKvCache(model_config(), storage=stores)
    # The hit is at most 95 tokens (the last one is computed). The full group fetches its six
    # blocks; the window group the blocks covering [95 - 32, 95): blocks 3, 4 and 5 (the one
    # cache counts its blocks, whose window pages come with them).
    assert model.fetch_from_storage(P) == 6
    model.check_invariants()
    model.flush_storage()
    assert model.storage_in_flight() == 0
    model.check_invariants()
    assert [s.stats()["gets"] for s in stores] == [6, 3]
    assert model.stats()["storage_hit_blocks"] == 6
    assert model.add_sequence(2, P) == 95
    model.check_invariants()
    model.reserve(2, 1)  # onboards the hit to the device
    model.check_invariants()
    for layer in (0, 2):  # every hit position as cache A wrote it
        check_bytes(model, 2, P, layer, *SHAPES[layer], 0, 95)
    for layer in (1, 3):  # the window of the hit
        check_bytes(model, 2, P, layer, *SHAPES[layer], 95 - W, 95)
        with pytest.raises(pagedkv.OutOfRangeError):  # block 0 was never fetched
            model.gather_layer(2, layer, begin=0, num_tokens=1)
    write_and_commit(model, 2, P, 95, SHAPES, reserved=True)
    for layer in (0, 2):
        check_bytes(model, 2, P, layer, *SHAPES[layer], 0, 96)


# ---- refusals: nothing created, no store claimed


def test_a_store_of_another_layout_is_refused_by_name(tmp_path):
    store = pagedkv.FileTier(small_config(head_dim=16), str(tmp_path), model_id="test-model")
    with pytest.raises(pagedkv.InvalidArgumentError, match="storage: the store's layout"):
        pagedkv.KvCache(small_config(), storage=store)
    assert not store.in_use and store.stats()["puts"] == 0
    pagedkv.KvCache(small_config(head_dim=16), storage=store)  # free for a cache of its layout

    # A group's store of the other group's layout; the message names the group.
    other = model_stores(tmp_path, ids=("m/full", "m/window"))
    with pytest.raises(pagedkv.InvalidArgumentError,
                       match=r"storage \(group 0\): the store's layout"):
        pagedkv.ModelKvCache(model_config(), storage=[other[1], other[0]])
    assert not any(s.in_use for s in other)

    # A cache with a store needs a host tier.
    store = pagedkv.FileTier(small_config(num_host_blocks=0), str(tmp_path), model_id="x")
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_host_blocks"):
        pagedkv.KvCache(small_config(num_host_blocks=0), storage=store)
    assert not store.in_use


def test_groups_may_not_share_a_store_or_a_layout_fingerprint(tmp_path):
    # The window group of the full group's shape: a store of one fits both.
    config = model_config(window_heads=2, window_dim=16)
    same = model_stores(tmp_path, ids=("model", "model"), config=config)
    assert same[0].layout.fingerprint() == same[1].layout.fingerprint()
    for stores, text in (([same[0], same[0]], "has the same store"),
                         (same, "has a store of the same layout")):
        with pytest.raises(pagedkv.InvalidArgumentError,
                           match=r"storage \(group 1\): group 0 " + text):
            pagedkv.ModelKvCache(config, storage=stores)
        assert not any(s.in_use for s in same)
    own = pagedkv.FileTier(config, str(tmp_path), model_id="model/window", group=1)
    model = pagedkv.ModelKvCache(config, storage=[same[0], own])
    assert model.storage == [same[0], own]
    with pytest.raises(pagedkv.InvalidArgumentError, match="1 storage tiers for 2 groups"):
        pagedkv.ModelKvCache(config, storage=[same[1]])
    assert not same[1].in_use
    # The group that owns the blocks (the full one) decides what a fetch brings: it needs a store.
    with pytest.raises(pagedkv.InvalidArgumentError, match="owns the blocks .* needs a store"):
        pagedkv.ModelKvCache(config, storage=[None, same[1]])
    assert not same[1].in_use


def test_a_store_serves_one_cache_at_a_time(tmp_path):
    store = pagedkv.FileTier(small_config(), str(tmp_path), model_id="m")
    first = pagedkv.KvCache(small_config(), storage=store)
    with pytest.raises(pagedkv.InvalidArgumentError, match="already serves another cache"):
        pagedkv.KvCache(small_config(), storage=store)
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"storage\[0\]: .*already serves"):
        pagedkv.ModelKvCache(small_config(), storage=[store])
    del first
    gc.collect()
    assert not store.in_use
    second = pagedkv.KvCache(small_config(), storage=store)
    assert store.in_use and second.storage is store


def test_bad_storage_arguments_are_refused(tmp_path):
    with pytest.raises(pagedkv.InvalidArgumentError, match="storage: expected a pagedkv.FileTier"):
        pagedkv.KvCache(small_config(), storage="disk")
    with pytest.raises(pagedkv.InvalidArgumentError, match="storage: a list"):
        pagedkv.ModelKvCache(model_config(), storage=model_stores(tmp_path)[0])
    with pytest.raises(pagedkv.InvalidArgumentError, match="model_id: required"):
        pagedkv.FileTier(small_config(), str(tmp_path))
    with pytest.raises(pagedkv.InvalidArgumentError, match="group: the config has 2 KV groups"):
        pagedkv.FileTier(model_config(), str(tmp_path), model_id="m")
    with pytest.raises(pagedkv.OutOfRangeError, match="group: 2"):
        pagedkv.FileTier(model_config(), str(tmp_path), model_id="m", group=2)
    with pytest.raises(pagedkv.InvalidArgumentError, match="threads"):
        pagedkv.FileTier(small_config(), str(tmp_path), model_id="m", threads=0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="layout_or_config"):
        pagedkv.FileTier(42, str(tmp_path), model_id="m")
    with pytest.raises(pagedkv.InvalidArgumentError, match="storage_staging_blocks"):
        pagedkv.KvCache(small_config(), storage_staging_blocks=0,
                        storage=pagedkv.FileTier(small_config(), str(tmp_path), model_id="m"))


def test_a_storage_layout_names_the_config_it_came_from(tmp_path):
    layout = pagedkv.StorageLayout.from_config(model_config(), "model/window", group=1)
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size) == \
        (2, 1, 24, MBS)
    assert layout.model_id == "model/window" and layout.dtype == pagedkv.DType.FLOAT16
    assert layout.block_bytes == 2 * 2 * MBS * 1 * 24 * 2
    # A store made from the layout (model id replaced when given) has that layout.
    store = pagedkv.FileTier(layout, str(tmp_path), model_id="other")
    assert store.layout.model_id == "other" and store.layout.head_dim == 24
    assert store.layout != layout
    # docs/storage.md's example fingerprint.
    example = pagedkv.StorageLayout()
    example.num_layers, example.num_kv_heads, example.head_dim, example.block_size = 1, 27, 19, 4
    example.dtype, example.page_layout = pagedkv.DType.FLOAT8_E4M3, pagedkv.PageLayout.HND
    example.block_bytes, example.model_id = 4104, "tiny-model/rev7"
    assert example.fingerprint() == 0x18f83f09c4edebbe


# ---- lifetimes


def test_a_cache_keeps_its_store_alive(tmp_path):
    store = pagedkv.FileTier(small_config(), str(tmp_path), model_id="m")
    cache = pagedkv.KvCache(small_config(), storage=store)
    del store
    gc.collect()
    push_through_to_storage(cache)  # writes back through the store Python no longer names
    written = cache.stats()["storage_blocks_written"]
    assert written >= 2 and cache.storage.stats()["puts"] == written
    assert cache.storage.in_use

    stores = model_stores(tmp_path / "model")
    model = pagedkv.ModelKvCache(model_config(), storage=stores)
    del stores
    gc.collect()
    compute_and_finish(model, 1, P, SHAPES)
    for id in range(10, 15):
        compute_and_finish(model, id, iota(96, 100000 * id), SHAPES)
    model.flush_storage()
    for g, store in enumerate(model.storage):
        assert store.stats()["puts"] == model.group(g).stats()["storage_blocks_written"] >= 6


# ---- RedisTier


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_tier_or_skip(**kwargs):
    try:
        return pagedkv.RedisTier(small_config(), model_id="test-model", **kwargs)
    except pagedkv.UnimplementedError as e:
        assert "hiredis" in e.message
        pytest.skip("this build has no hiredis")


def test_a_redis_tier_is_created_without_a_server_or_unimplemented_without_hiredis():
    port = free_port()  # nobody listens there
    store = redis_tier_or_skip(port=port)
    assert store.medium == "REDIS" and store.address == f"127.0.0.1:{port}"
    cache = pagedkv.KvCache(small_config(), storage=store)
    assert cache.fetch_from_storage(prompt(0)) == 0  # an unreachable store: every lookup misses
    with pytest.raises(pagedkv.InvalidArgumentError, match="port"):
        pagedkv.RedisTier(small_config(), model_id="m", port=0)


@pytest.fixture
def redis_port():
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.skip("redis-server did not start")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_restarted_kv_cache_fetches_a_prompt_from_a_redis_tier(redis_port):
    redis_tier_or_skip(port=redis_port)
    prefix = f"pagedkv-test-{os.getpid()}"
    restart_round_trip(lambda: pagedkv.RedisTier(small_config(), model_id="test-model",
                                                 port=redis_port, key_prefix=prefix))
