"""Hybrid models from Python: a ModelKvCache of a full-attention group and a sliding-window group
(window 64, blocks of 16), and an MLA latent model. K/V written through the model come back
byte-exact through gather_layer and the pool views, a window group refuses positions outside
its window, and bad input raises its exception class and changes nothing. check_invariants()
after every step. Expected values come from the inputs and the documented rules
(docs/hybrid-models.md), never from the cache."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import pagedkv

BS = 16  # block_size
W = 64   # the window group's sliding_window
NP_DTYPE = {"fp32": np.float32, "fp16": np.float16}


def full_group(**fields) -> pagedkv.KvGroup:
    return pagedkv.KvGroup(**{**dict(name="full", layers=[0, 2], num_kv_heads=2, head_dim=8,
                                     dtype="fp32", num_device_blocks=64), **fields})


def window_group(**fields) -> pagedkv.KvGroup:
    return pagedkv.KvGroup(**{**dict(name="window", layers=[1, 3], num_kv_heads=1, head_dim=16,
                                     dtype="fp16", sliding_window=W, num_device_blocks=32),
                              **fields})


def mla_group(**fields) -> pagedkv.KvGroup:
    import dataclasses

    group = pagedkv.KvGroup.latent("mla", [0, 1, 2], latent_dim=72, rope_dim=8, dtype="fp32",
                                   num_device_blocks=24)
    return dataclasses.replace(group, **fields)


def two_group_config(**fields) -> pagedkv.CacheConfig:
    groups = fields.pop("groups", None) or [full_group(), window_group()]
    return pagedkv.CacheConfig(num_layers=4, block_size=BS, backend="cpu", groups=groups,
                               **fields)


def mla_config(**fields) -> pagedkv.CacheConfig:
    groups = fields.pop("groups", None) or [mla_group()]
    return pagedkv.CacheConfig(num_layers=3, block_size=BS, backend="cpu", groups=groups,
                               **fields)


class Model:
    """A ModelKvCache with the test's own record of every layer's shape (from the KvGroups the
    test wrote) and of every committed K/V row, per sequence and layer."""

    def __init__(self, config: pagedkv.CacheConfig, rng: np.random.Generator):
        self.cache = pagedkv.ModelKvCache(config)
        self.rng = rng
        self.groups = list(config.groups)
        self.group_of = {layer: g for g, group in enumerate(self.groups) for layer in group.layers}
        self.num_layers = config.num_layers
        self.rows: dict = {}      # (id, layer) -> list of (k, v) rows, committed order
        self.pending: dict = {}   # (id, layer) -> (k, v) written to the reservation
        self.tokens: dict = {}    # id -> committed tokens

    def spec(self, layer):
        group = self.groups[self.group_of[layer]]
        latent = group.kv_kind in (pagedkv.KvKind.LATENT, "latent")
        return group.num_kv_heads, group.head_dim, NP_DTYPE[group.dtype], latent

    def random(self, layer, n):
        heads, dim, dtype, latent = self.spec(layer)
        k = self.rng.standard_normal((n, heads, dim)).astype(dtype)
        v = None if latent else self.rng.standard_normal((n, heads, dim)).astype(dtype)
        return k, v

    def expected(self, id, layer, begin=0, end=None):
        rows = self.rows[(id, layer)][begin:end]
        k = np.stack([r[0] for r in rows])
        v = None if rows[0][1] is None else np.stack([r[1] for r in rows])
        return k, v

    # The step loop, recording what goes in.

    def add(self, id, prompt, expect_cached=0):
        cached = self.cache.add_sequence(id, prompt)
        assert cached == expect_cached
        self.tokens[id] = list(prompt[:cached])
        for layer in range(self.num_layers):
            self.rows[(id, layer)] = []
        self.cache.check_invariants()
        return cached

    def prefill(self, id, tokens):
        n = len(tokens)
        slots = self.cache.reserve(id, n)
        assert len(slots) == len(self.groups)
        assert all(s.dtype == np.int64 and s.shape == (n,) for s in slots)
        self.cache.check_invariants()
        for layer in range(self.num_layers):
            k, v = self.random(layer, n)
            self.cache.write_kv(id, layer, k, v)
            self.cache.check_invariants()
            self.check_pool_at_slots(layer, slots[self.group_of[layer]], k, v)
            self.rows[(id, layer)] += list(zip(k, [None] * n if v is None else v))
        self.cache.commit(id, tokens)
        self.tokens[id] += list(tokens)
        self.cache.check_invariants()

    def decode_step(self, ids, tokens):
        self.cache.reserve_batch(ids, 1)
        self.cache.check_invariants()
        batch = self.cache.build_batch(ids, csr=True)
        assert len(batch) == len(self.groups) and batch.is_current and batch.ids == ids
        for layer in range(self.num_layers):
            g = self.group_of[layer]
            part = batch[g]
            assert part.group == g and part.is_current and part.batch_size == len(ids)
            slots = part.host.slot_mapping
            assert len(slots) == len(ids)
            assert np.array_equal(np.from_dlpack(part.device.slot_mapping), slots)
            k, v = self.random(layer, len(ids))
            self.cache.write_kv_batch(batch, layer, k, v)
            self.cache.check_invariants()
            self.check_pool_at_slots(layer, slots, k, v)
            for i, id in enumerate(ids):
                self.rows[(id, layer)].append((k[i], None if v is None else v[i]))
        self.cache.commit_batch(ids, tokens)
        for id, t in zip(ids, tokens):
            self.tokens[id].append(t)
        self.cache.check_invariants()
        return batch

    def decode_step_all_layers(self, ids, tokens):
        """decode_step with each group's layers written in one write_kv_batch_all_layers call,
        the inputs stacked in the order the group lists its layers."""
        self.cache.reserve_batch(ids, 1)
        batch = self.cache.build_batch(ids)
        for g, group in enumerate(self.groups):
            rows = [self.random(layer, len(ids)) for layer in group.layers]
            k = np.stack([r[0] for r in rows])
            v = None if rows[0][1] is None else np.stack([r[1] for r in rows])
            self.cache.write_kv_batch_all_layers(batch, g, k, v)
            self.cache.check_invariants()
            for j, layer in enumerate(group.layers):
                self.check_pool_at_slots(layer, batch[g].host.slot_mapping, k[j],
                                         None if v is None else v[j])
                for i, id in enumerate(ids):
                    self.rows[(id, layer)].append((k[j][i], None if v is None else v[j][i]))
        self.cache.commit_batch(ids, tokens)
        for id, t in zip(ids, tokens):
            self.tokens[id].append(t)
        self.cache.check_invariants()

    def check_pool_at_slots(self, layer, slots, k, v):
        """The layer's pool views hold what was written, at the slots the cache gave."""
        self.cache.synchronize()
        pool_k, pool_v = (None if p is None else np.from_dlpack(p)
                          for p in self.cache.layer_kv(layer))
        block, offset = slots // BS, slots % BS
        assert np.array_equal(pool_k[block, offset], k)
        if v is None:
            assert pool_v is None
        else:
            assert np.array_equal(pool_v[block, offset], v)

    def check_gather(self, id, layer, begin=0):
        k, v = self.cache.gather_layer(id, layer, begin=begin)
        want_k, want_v = self.expected(id, layer, begin)
        got_k = np.from_dlpack(k)
        assert got_k.dtype == want_k.dtype and got_k.tobytes() == want_k.tobytes()
        if want_v is None:
            assert v is None
        else:
            assert np.from_dlpack(v).tobytes() == want_v.tobytes()

    def snapshot(self, ids):
        """What a failed call must leave as it was: each sequence's lengths and blocks in every
        group, every group's stats, and the bytes of every layer's pool."""
        self.cache.synchronize()
        pool = hashlib.sha256()
        for layer in range(self.num_layers):
            for part in self.cache.layer_kv(layer):
                if part is not None:
                    pool.update(np.ascontiguousarray(np.from_dlpack(part)).tobytes())
        groups = self.cache.groups
        return {
            "contains": {i: self.cache.contains(i) for i in ids},
            "lengths": {i: (self.cache.length(i), self.cache.pending(i)) for i in ids
                        if self.cache.contains(i)},
            "blocks": {(g.index, i): g.block_locations(i) for g in groups for i in ids
                       if self.cache.contains(i)},
            "stats": [g.stats() for g in groups],
            "pool": pool.hexdigest(),
        }


def first_held_position(length):
    """The first position a window group still holds after a commit to `length` tokens: blocks
    before floor(max(0, length - W) / BS) are released (docs/hybrid-models.md)."""
    return max(0, length - W) // BS * BS


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def two_group(rng):
    """Three sequences of 40, 100 and 150 prompt tokens, then 20 decode steps."""
    m = Model(two_group_config(), rng)
    prompts = {1: 40, 2: 100, 3: 150}
    for id, n in prompts.items():
        prompt = [1000 * id + t for t in range(n)]
        m.add(id, prompt)
        m.prefill(id, prompt)
    ids = list(prompts)
    for step in range(20):
        m.decode_step(ids, [1000 * id + 500 + step for id in ids])
    return m


def test_layers_route_to_their_groups(two_group):
    cache = two_group.cache
    assert cache.num_groups == 2
    assert [cache.layer_group(l) for l in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    full, window = cache.groups
    assert (full.index, full.name, full.layers) == (0, "full", [0, 2])
    assert (window.index, window.name, window.layers) == (1, "window", [1, 3])
    assert window.config.sliding_window == W and window.config.num_layers == 2
    assert full.config.num_kv_heads == 2 and window.config.head_dim == 16
    # The group view's layer_kv is the model layer's: group 1's layer 1 is model layer 3.
    k_model, _ = cache.layer_kv(3)
    k_group, _ = window.layer_kv(1)
    assert np.from_dlpack(k_model).tobytes() == np.from_dlpack(k_group).tobytes()
    assert np.from_dlpack(k_group).shape == (32, BS, 1, 16)


def test_written_kv_reads_back_byte_exact(two_group):
    m = two_group
    for id, length in ((1, 60), (2, 120), (3, 170)):
        assert m.cache.length(id) == length and m.cache.pending(id) == 0
        for layer in (0, 2):  # full attention: every position
            m.check_gather(id, layer)
        for layer in (1, 3):  # the window: from its first held block on
            m.check_gather(id, layer, begin=first_held_position(length))


def test_a_window_group_holds_only_its_window(two_group):
    m = two_group
    for id, length in ((1, 60), (2, 120), (3, 170)):
        assert m.cache.held_blocks(id, 0) == -(-length // BS)
        # A decoding sequence holds at most ceil(W / BS) + 1 blocks of a window group.
        assert m.cache.held_blocks(id, 1) <= W // BS + 1
        begin = first_held_position(length)
        locations = m.cache.group(1).block_locations(id)
        assert [b for _, b in locations[:begin // BS]] == [-1] * (begin // BS)
        assert all(b >= 0 for _, b in locations[begin // BS:])
        if begin > 0:
            before = m.snapshot([1, 2, 3])
            with pytest.raises(pagedkv.OutOfRangeError, match="sliding window"):
                m.cache.gather_layer(id, 1, begin=begin - 1)
            with pytest.raises(pagedkv.OutOfRangeError):
                m.cache.gather_layer(id, 3)  # from position 0
            assert m.snapshot([1, 2, 3]) == before
            m.cache.check_invariants()
        m.check_gather(id, 0)  # the full group still has position 0


def test_window_batch_tables_mark_released_blocks(two_group, rng):
    m = two_group
    ids = [1, 2, 3]
    m.cache.reserve_batch(ids, 1)
    batch = m.cache.build_batch(ids)
    for row, id in enumerate(ids):
        length = m.cache.length(id)
        released = first_held_position(length) // BS
        window_row = batch[1].host.block_tables[row]
        assert list(window_row[:released]) == [-1] * released
        assert all(b >= 0 for b in window_row[released:length // BS + 1])
        full_row = batch[0].host.block_tables[row]
        assert all(b >= 0 for b in full_row[:length // BS + 1])
    # A later build_batch retires both groups' device arrays; host copies remain.
    later = m.cache.build_batch(ids)
    assert not batch.is_current and not batch[0].is_current and not batch[1].is_current
    with pytest.raises(pagedkv.FailedPreconditionError):
        batch[1].device.slot_mapping
    assert len(batch[1].host.slot_mapping) == 3 and later.is_current
    m.cache.check_invariants()


def test_ring_window_tables_hold_each_window_block_in_its_column(two_group):
    # build_batch(ring_window_tables=True): the window group's rows are rings as wide as the
    # blocks a row holds (block i at column i % max_blocks), the full group's stay plain; the
    # slot mappings are the plain build's.
    m = two_group
    ids = [1, 2, 3]
    m.cache.reserve_batch(ids, 1)
    plain = m.cache.build_batch(ids)
    plain_slots = [list(plain[g].host.slot_mapping) for g in (0, 1)]
    plain_tables = [[list(r) for r in plain[g].host.block_tables] for g in (0, 1)]
    ring = m.cache.build_batch(ids, ring_window_tables=True)
    assert not ring[0].ring_table and ring[1].ring_table and not plain[1].ring_table
    assert ring[1].max_blocks <= W // BS + 2 < plain[1].max_blocks
    assert [list(r) for r in ring[0].host.block_tables] == plain_tables[0]
    for g in (0, 1):
        assert list(ring[g].host.slot_mapping) == plain_slots[g]
    width = ring[1].max_blocks
    for row, id in enumerate(ids):
        locations = m.cache.group(1).block_locations(id)
        want = [-1] * width
        for i, (_, block) in enumerate(locations):
            if block >= 0:
                want[i % width] = block
        assert list(ring[1].host.block_tables[row]) == want
        held = [b for b in plain_tables[1][row] if b >= 0]
        assert sorted(b for b in want if b >= 0) == sorted(held)
    m.cache.check_invariants()


def test_a_shared_prefix_hits_in_both_groups(two_group):
    # Sequence 1 (60 tokens, none released: 60 <= W) is finished: its 3 full blocks stay cached
    # in both groups, so a prompt sharing its first 50 tokens gets 48 of them.
    m = two_group
    m.cache.finish(1)
    m.cache.check_invariants()
    prompt = m.tokens[1][:50] + [7000 + t for t in range(20)]
    m.add(4, prompt, expect_cached=48)
    for layer in range(4):
        m.rows[(4, layer)] = list(m.rows[(1, layer)][:48])
    m.prefill(4, prompt[48:])
    assert m.cache.length(4) == 70
    for layer in range(4):  # 70 - W < BS: the window group still holds every block
        m.check_gather(4, layer)


def prefill_and_decode_two(m):
    """Sequences 1 and 2: prompts of 40 and 150 tokens, then 30 decode steps (70 and 180)."""
    for id, n in ((1, 40), (2, 150)):
        prompt = [1000 * id + t for t in range(n)]
        m.add(id, prompt)
        m.prefill(id, prompt)
    for step in range(30):
        m.decode_step([1, 2], [1500 + step, 2500 + step])


def check_windows(m, windows):
    """Each layer of `windows` ({layer: window}) of sequences 1 and 2 reads back from its
    window's first block on and refuses the position before it."""
    for id, length in ((1, 70), (2, 180)):
        for layer, window in windows.items():
            begin = max(0, length - window) // BS * BS
            m.check_gather(id, layer, begin=begin)
            if begin > 0:
                with pytest.raises(pagedkv.OutOfRangeError):
                    m.cache.gather_layer(id, layer, begin=begin - 1)


def test_groups_that_all_have_a_window_share_the_widest_ones_blocks(rng):
    # The "full" group given a window of 96: every group has one, and the wider owns the blocks.
    # Each keeps only its own window (blocks before it are released, positions refused), both
    # read back what was written, and a prompt sharing a finished one's tokens hits in both.
    wide = 96
    m = Model(two_group_config(groups=[full_group(sliding_window=wide), window_group()]), rng)
    prefill_and_decode_two(m)
    check_windows(m, {0: wide, 2: wide, 1: W, 3: W})
    for id, length in ((1, 70), (2, 180)):
        assert m.cache.length(id) == length
        assert m.cache.held_blocks(id, 0) <= wide // BS + 1
        assert m.cache.held_blocks(id, 1) <= W // BS + 1
    m.cache.finish(1)
    m.cache.check_invariants()
    prompt = m.tokens[1][:50] + [7000 + t for t in range(20)]
    m.add(3, prompt, expect_cached=48)
    m.prefill(3, prompt[48:])
    for layer in range(4):
        m.rows[(3, layer)] = m.rows[(1, layer)][:48] + m.rows[(3, layer)]
        m.check_gather(3, layer)


def test_more_window_sizes_than_a_sequence_record_keeps_inline(rng):
    # Five window groups of four sizes beside the full group (two of window 32 share a bound;
    # the fourth size's bound lives outside the lines a decode step reads): each group keeps
    # its own window and reads back what was written.
    windows = {1: 16, 2: 32, 3: 48, 4: 64, 5: 32}
    groups = [full_group(layers=[0])] + [
        window_group(name=f"w{layer}", layers=[layer], sliding_window=window)
        for layer, window in windows.items()]
    m = Model(pagedkv.CacheConfig(num_layers=6, block_size=BS, backend="cpu", groups=groups), rng)
    prefill_and_decode_two(m)
    m.cache.check_invariants()
    check_windows(m, windows)
    for id in (1, 2):
        m.check_gather(id, 0)
        for layer, window in windows.items():  # group g is layer g's
            assert m.cache.held_blocks(id, layer) <= -(-window // BS) + 1


def test_fork_rollback_offload_restore(rng):
    groups = [full_group(num_host_blocks=32), window_group(num_host_blocks=32)]
    m = Model(two_group_config(groups=groups), rng)
    prompt = list(range(100))
    m.add(1, prompt)
    m.prefill(1, prompt)
    m.cache.fork(1, 2)
    m.cache.check_invariants()
    for layer in range(4):
        m.rows[(2, layer)] = list(m.rows[(1, layer)])
    m.tokens[2] = list(m.tokens[1])
    m.decode_step([1, 2], [5, 6])
    for id in (1, 2):
        m.check_gather(id, 0)
        m.check_gather(id, 1, begin=first_held_position(101))
    # Rolling back within the window works; to a length whose window needs a released block
    # it is refused and changes nothing.
    before = m.snapshot([1, 2])
    with pytest.raises(pagedkv.FailedPreconditionError):
        m.cache.rollback(2, 20)
    assert m.snapshot([1, 2]) == before
    m.cache.rollback(2, 99)
    m.cache.check_invariants()
    for layer in range(4):
        del m.rows[(2, layer)][99:]
    assert m.cache.length(2) == 99
    m.check_gather(2, 2)
    # Offload moves every group's blocks (the window's only) to the host; restore brings them
    # back with their bytes.
    m.cache.offload(1)
    m.cache.synchronize()
    m.cache.check_invariants()
    assert m.cache.residency(1) == pagedkv.SequenceResidency.HOST
    with pytest.raises(pagedkv.FailedPreconditionError):
        m.cache.gather_layer(1, 0)
    m.cache.restore(1)
    m.cache.synchronize()
    m.cache.check_invariants()
    assert m.cache.residency(1) == pagedkv.SequenceResidency.DEVICE
    for layer in range(4):
        m.check_gather(1, layer, begin=0 if layer % 2 == 0 else first_held_position(101))
    assert m.cache.drain_evicted_sequences() == []
    m.cache.erase(2)
    m.cache.check_invariants()
    assert not m.cache.contains(2)


def test_mla_latents_read_back_and_have_no_values(rng):
    m = Model(mla_config(), rng)
    for id, n in ((1, 30), (2, 50)):
        prompt = [100 * id + t for t in range(n)]
        m.add(id, prompt)
        m.prefill(id, prompt)  # checks each layer's latent view at the slots, V is None
    for step in range(5):
        m.decode_step([1, 2], [9000 + step, 9100 + step])
    for id in (1, 2):
        for layer in range(3):
            m.check_gather(id, layer)
    views = [m.cache.layer_kv(layer) for layer in range(3)]
    assert all(v is None for _, v in views)
    assert np.from_dlpack(views[2][0]).shape == (24, BS, 1, 72)
    # The group's view of the last layer stays inside the pool (the old V view was past it).
    assert np.from_dlpack(m.cache.group(0).layer_kv(2)[0]).shape == (24, BS, 1, 72)
    assert m.cache.held_bytes(1) == m.cache.held_blocks(1, 0) * 3 * BS * 72 * 4


def test_a_latent_kvcache_layer_kv_is_each_layers_latents(rng):
    # A one-group latent KvCache: layer l's view is layer l's latents, never layer l + 1's, and
    # there is no value view.
    cache = pagedkv.KvCache(num_layers=2, num_kv_heads=1, head_dim=24, rope_dim=8,
                            kv_kind="latent", block_size=4, num_device_blocks=8, dtype="fp32",
                            backend="cpu")
    cache.add_sequence(1, list(range(6)))
    slots = cache.reserve(1, 6)
    latents = [rng.standard_normal((6, 1, 24)).astype(np.float32) for _ in range(2)]
    for layer in range(2):
        cache.write_kv(1, layer, latents[layer])
    cache.commit(1, list(range(6)))
    cache.synchronize()
    cache.check_invariants()
    for layer in range(2):
        k, v = cache.layer_kv(layer)
        assert v is None
        pool = np.from_dlpack(k)
        assert pool.shape == (8, 4, 1, 24)
        assert np.array_equal(pool[slots // 4, slots % 4], latents[layer])
        got, none = cache.gather_layer(1, layer)
        assert none is None and np.array_equal(np.from_dlpack(got), latents[layer])
    with pytest.raises(pagedkv.InvalidArgumentError, match="latent"):
        cache.write_kv(1, 0, latents[0], latents[0])
    with pytest.raises(pagedkv.OutOfRangeError):
        cache.layer_kv(2)


# ---- bad input: the right exception, and nothing changes ----

BAD_CONFIGS = [
    # (groups, num_layers, message the C++ validation gives: group and field)
    ([full_group(), window_group(layers=[1, 2, 3])], 4,
     r"groups\[1\] \(window\): layers: layer 2 is in groups\[0\] too"),
    ([full_group(), window_group(layers=[1])], 4, r"groups: layer 3 is in no group"),
    ([full_group(), window_group(sliding_window=8)], 4,
     r"groups\[1\] \(window\): sliding_window"),
    ([mla_group(num_kv_heads=2)], 3, r"groups\[0\] \(mla\): num_kv_heads"),
    ([full_group(), window_group(head_dim=0)], 4, r"groups\[1\] \(window\): head_dim"),
]


@pytest.mark.parametrize("groups,num_layers,message", BAD_CONFIGS)
def test_a_malformed_model_names_the_group_and_field(groups, num_layers, message):
    config = pagedkv.CacheConfig(num_layers=num_layers, block_size=BS, backend="cpu",
                                 groups=groups)
    with pytest.raises(pagedkv.InvalidArgumentError, match=message):
        pagedkv.ModelKvCache(config)


def test_config_groups_accept_names_and_dicts():
    import dataclasses

    config = two_group_config()
    a = pagedkv.ModelKvCache(config)
    b = pagedkv.ModelKvCache(**dataclasses.asdict(config))  # the groups as dicts
    for cache in (a, b):
        assert [g.name for g in cache.config.groups] == ["full", "window"]
        assert cache.config.groups[1].dtype == pagedkv.DType.FLOAT16
        assert cache.config.groups[1].kv_kind == pagedkv.KvKind.KEY_VALUE
    assert a.cache_config == config
    mla = pagedkv.ModelKvCache(mla_config())
    assert mla.config.groups[0].kv_kind == pagedkv.KvKind.LATENT
    assert mla.config.groups[0].rope_dim == 8
    with pytest.raises(pagedkv.InvalidArgumentError, match="KvKind"):
        two_group_config(groups=[full_group(kv_kind="sparse"), window_group()])._to_cpp()
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"groups\[1\]"):
        two_group_config(groups=[full_group(), "window"])._to_cpp()


@pytest.fixture
def busy(rng):
    """A two-group model with a committed sequence (1, 100 tokens), a reserved one (2, 6
    tokens) and a finished prefix; the window group's pool is small and never evicts."""
    groups = [full_group(), window_group(num_device_blocks=12)]
    m = Model(two_group_config(groups=groups, eviction_policy="none"), rng)
    m.add(1, list(range(100)))
    m.prefill(1, list(range(100)))
    m.add(2, list(range(500, 506)))
    m.cache.reserve(2, 6)
    m.add(3, list(range(900, 932)))
    m.prefill(3, list(range(900, 932)))
    m.cache.finish(3)
    m.cache.drain_events()
    return m


def other_model_batch(m):
    other = pagedkv.ModelKvCache(two_group_config())
    other.add_sequence(2, list(range(6)))
    other.reserve(2, 6)
    return other, other.build_batch([2])


def kv_cache_batch(m):
    cache = pagedkv.KvCache(num_layers=2, num_kv_heads=2, head_dim=8, block_size=BS,
                            dtype="fp32", backend="cpu")
    cache.add_sequence(2, list(range(6)))
    cache.reserve(2, 6)
    return cache, cache.build_batch([2])


def write_batch_of(make):
    def call(m):
        keep, batch = make(m)  # `keep` holds the other cache while its batch is used
        k, v = m.random(0, 6)
        m.cache.write_kv_batch(batch, 0, k, v)
    return call


BAD_CALLS = {
    pagedkv.InvalidArgumentError: [
        lambda m: m.cache.write_kv(2, 1, *m.random(0, 6)),           # the full shape, window layer
        lambda m: m.cache.write_kv(2, 0, *m.random(0, 5)),           # 5 rows, 6 reserved
        lambda m: m.cache.write_kv(2, 0, m.random(0, 6)[0]),         # no value for a K/V group
        lambda m: m.cache.write_kv(2, 0, *m.random(0, 6)[:1], "no"),  # a value that is no array
        write_batch_of(other_model_batch),                          # a batch of another model
        write_batch_of(kv_cache_batch),                             # a KvCache's batch
        lambda m: m.cache.write_kv_batch("batch", 0, *m.random(0, 6)),
        lambda m: m.cache.reserve_batch([1, 1], 1),                  # duplicate ids
        lambda m: m.cache.gather_layer(1, 0, layout="diagonal"),
    ],
    pagedkv.NotFoundError: [
        lambda m: m.cache.reserve(99, 1),
        lambda m: m.cache.commit(99, [1]),
        lambda m: m.cache.fork(99, 100),
        lambda m: m.cache.build_batch([1, 99]),
        lambda m: m.cache.residency(99),
        lambda m: m.cache.gather_layer(99, 0),
    ],
    pagedkv.AlreadyExistsError: [
        lambda m: m.cache.add_sequence(1, [5, 6, 7]),
        lambda m: m.cache.fork(1, 2),
    ],
    pagedkv.OutOfRangeError: [
        lambda m: m.cache.write_kv(2, 4, *m.random(0, 6)),           # layer past the model
        lambda m: m.cache.gather_layer(1, -1),
        lambda m: m.cache.gather_layer(1, 1),                        # 1..35 left the window
        lambda m: m.cache.layer_kv(4),
        lambda m: m.cache.layer_group(4),
        lambda m: m.cache.group(2),
        lambda m: m.cache.group(0).layer_kv(2),                      # the group has 2 layers
        lambda m: m.cache.held_blocks(1, 2),
        lambda m: m.cache.rollback(1, 101),
    ],
    pagedkv.FailedPreconditionError: [
        lambda m: m.cache.commit(1, [1]),                            # nothing reserved
        lambda m: m.cache.rollback(1, 10),                           # its window is released
        lambda m: m.cache.offload(1),                                # no host tier
    ],
    pagedkv.ResourceExhaustedError: [
        # Positions 100..249: the full group (64 blocks, 10 taken) can, the window group (12
        # blocks, 6 taken, 9 more needed) cannot: the full group's reservation is taken back.
        lambda m: m.cache.reserve(1, 150),
    ],
}


@pytest.mark.parametrize(
    "error,call",
    [(e, c) for e, calls in BAD_CALLS.items() for c in calls],
    ids=[f"{e.__name__}-{i}" for e, calls in BAD_CALLS.items() for i in range(len(calls))])
def test_bad_input_raises_its_class_and_changes_nothing(busy, error, call):
    ids = [1, 2, 3, 99]
    before = busy.snapshot(ids)
    assert before["lengths"] == {1: (100, 0), 2: (0, 6)}
    with pytest.raises(error) as info:
        call(busy)
    assert info.value.code == error.code and info.value.message
    assert busy.snapshot(ids) == before
    assert busy.cache.drain_events() == []
    busy.cache.check_invariants()


@pytest.mark.parametrize("how", ["write_kv", "write_kv_batch"])
def test_a_value_for_a_latent_group_is_refused(rng, how):
    # An MLA group next to a K/V group: the latent layers take keys only.
    groups = [full_group(layers=[0]), mla_group(layers=[1, 2])]
    m = Model(pagedkv.CacheConfig(num_layers=3, block_size=BS, backend="cpu", groups=groups), rng)
    m.add(1, list(range(20)))
    m.prefill(1, list(range(20)))
    m.cache.reserve(1, 1)
    batch = m.cache.build_batch([1])
    before = m.snapshot([1])
    latent = m.random(1, 1)[0]
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"group 1 \(mla\): value: a latent"):
        if how == "write_kv":
            m.cache.write_kv(1, 1, latent, latent)
        else:
            m.cache.write_kv_batch(batch, 1, latent, latent)
    assert m.snapshot([1]) == before
    assert (m.cache.length(1), m.cache.pending(1)) == (20, 1)
    m.cache.check_invariants()
    for layer in range(3):
        m.check_gather(1, layer)


def test_group_views_keep_the_model_alive(rng):
    m = Model(two_group_config(), rng)
    m.add(1, list(range(20)))
    m.prefill(1, list(range(20)))
    group = m.cache.group(0)
    k, v = m.cache.layer_kv(0)
    batch = m.cache.build_batch([1])
    want = m.expected(1, 0)[0]
    slots = batch[0].host.block_tables[0]
    del m.cache
    m.__dict__.clear()
    import gc

    gc.collect()
    pool = np.from_dlpack(k)
    got = np.concatenate([pool[b] for b in slots])[:20]
    assert np.array_equal(got, want)
    assert group.stats()["sequences"] == 1 and group.name == "full"
    assert len(batch[0].host.seq_lens) == 1 and batch.is_current


@pytest.mark.parametrize("make_config", [
    # The full group lists its layers out of the model's order: the input follows the list.
    lambda: two_group_config(groups=[full_group(layers=[2, 0]), window_group()]),
    mla_config,
])
def test_write_kv_batch_all_layers_writes_a_groups_layers_in_one_call(make_config, rng):
    m = Model(make_config(), rng)
    for id, n in ((1, 30), (2, 70)):
        prompt = [1000 * id + t for t in range(n)]
        m.add(id, prompt)
        m.prefill(id, prompt)
    for step in range(20):
        m.decode_step_all_layers([2, 1], [500 + step, 600 + step])
    for id in (1, 2):
        length = m.cache.length(id)
        for layer in range(m.num_layers):
            window = m.groups[m.group_of[layer]].sliding_window
            m.check_gather(id, layer, begin=first_held_position(length) if window else 0)


def test_write_kv_batch_all_layers_refusals_change_nothing(two_group, rng):
    m = two_group
    cache = m.cache
    cache.reserve_batch([1, 2, 3], 1)
    batch = cache.build_batch([1, 2, 3])
    k = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)  # the full group's shape
    before = m.snapshot([1, 2, 3])
    with pytest.raises(pagedkv.OutOfRangeError, match="outside the model's 2 groups"):
        cache.write_kv_batch_all_layers(batch, 2, k, k)
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"shape must be \[2 layers, tokens"):
        cache.write_kv_batch_all_layers(batch, 0, k[:1], k[:1])
    with pytest.raises(pagedkv.InvalidArgumentError, match="3 slots"):
        cache.write_kv_batch_all_layers(batch, 0, k[:, :2], k[:, :2])
    with pytest.raises(pagedkv.InvalidArgumentError, match="value: required"):
        cache.write_kv_batch_all_layers(batch, 0, k, None)
    with pytest.raises(pagedkv.InvalidArgumentError, match="shape must be"):
        cache.write_kv_batch_all_layers(batch, 1, k, k)  # the window group is 1 x 16, fp16
    overlapping = np.lib.stride_tricks.as_strided(k, shape=k.shape,
                                                  strides=(16 * 4,) + k.strides[1:])
    with pytest.raises(pagedkv.InvalidArgumentError, match="layers overlap"):
        cache.write_kv_batch_all_layers(batch, 0, overlapping, overlapping)
    assert m.snapshot([1, 2, 3]) == before
    cache.check_invariants()
