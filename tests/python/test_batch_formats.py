"""Batch arrays against formulas written here, on random batches (prefix hits, forks,
copy-on-write, 0 to 6 reserved tokens per row), from the slots reserve() handed out:
build_batch's block tables / slot mapping / CSR (device and host), FlashInfer's CUDA-graph
CSR into fixed buffers, its append-path COO, and vLLM's block_table and padded slot_mapping."""
from __future__ import annotations

import numpy as np
import pytest

import pagedkv
from conftest import make_cache

BS = 4
POISON = 0x7F7F7F7F


class Tracker:
    """What the test knows of each sequence from its own calls: the physical block of every
    logical block (slot // BS of the slots reserve() returned), committed length, reserved slots."""

    def __init__(self, cache, rng):
        self.cache, self.rng = cache, rng
        self.table, self.length, self.pending = {}, {}, {}
        self.next_id, self.prefix_owner = 1, None
        self.shared = list(rng.integers(0, 1000, size=8))

    def note(self, sid, first_pos, slots):
        t = self.table[sid]
        for i, s in enumerate(slots):
            logical = (first_pos + i) // BS
            t.extend([-1] * (logical + 1 - len(t)))
            t[logical] = int(s) // BS

    def batch(self, n):
        ids = []
        for i in range(n):
            sid, self.next_id = self.next_id, self.next_id + 1
            if ids and self.rng.integers(4) == 0:
                parent = ids[self.rng.integers(len(ids))]
                self.cache.fork(parent, sid)
                self.table[sid] = list(self.table[parent])
                self.length[sid] = self.length[parent]
            else:
                shared = self.rng.integers(4) == 0
                prompt = (self.shared if shared else [1000 + int(self.rng.integers(1000))]) + \
                    list(self.rng.integers(0, 1000, size=int(self.rng.integers(1, 24))))
                cached = self.cache.add_sequence(sid, prompt)
                self.table[sid] = list(self.table[self.prefix_owner][:cached // BS]) \
                    if cached else []
                if shared and cached == 0:
                    self.prefix_owner = sid
                slots = self.cache.reserve(sid, len(prompt) - cached)
                self.note(sid, cached, slots)
                self.cache.commit(sid, prompt[cached:])
                self.length[sid] = len(prompt)
            ids.append(sid)
        for sid in ids:
            slots = self.cache.reserve(sid, int(self.rng.integers(0, 7)))
            self.note(sid, self.length[sid], slots)  # copy-on-write moves the last block
            self.pending[sid] = [int(s) for s in slots]
        return ids

    def seq_len(self, sid):
        return self.length[sid] + len(self.pending[sid])

    def pages(self, sid):
        return -(-self.seq_len(sid) // BS)

    def erase(self, ids):
        for sid in ids:
            self.cache.erase(sid)


@pytest.fixture
def tracker(rng):
    return Tracker(make_cache(num_layers=1, head_dim=4, block_size=BS, num_device_blocks=512), rng)


def test_build_batch_arrays_match_the_formulas(tracker):
    cache = tracker.cache
    for step in range(15):
        ids = tracker.batch(int(tracker.rng.integers(1, 12)))
        batch = cache.build_batch(ids, csr=True, pad_slots_to=80)
        host, dev = batch.host, batch.device
        want_slots = [s for sid in ids for s in tracker.pending[sid]]
        want_slots += [-1] * (80 - len(want_slots))
        np.testing.assert_array_equal(host.slot_mapping, want_slots)
        assert host.slot_mapping.dtype == np.int64
        np.testing.assert_array_equal(host.seq_lens, [tracker.seq_len(s) for s in ids])
        assert host.block_tables.shape == (len(ids), batch.max_blocks)
        want_indptr, want_indices, want_last = [0], [], []
        for r, sid in enumerate(ids):
            p = tracker.pages(sid)
            row = host.block_tables[r]
            np.testing.assert_array_equal(row[:p], tracker.table[sid][:p])
            assert (row[p:] == -1).all()
            want_indices += tracker.table[sid][:p]
            want_indptr.append(want_indptr[-1] + p)
            want_last.append(tracker.seq_len(sid) - (p - 1) * BS)
        np.testing.assert_array_equal(host.kv_indptr, want_indptr)
        np.testing.assert_array_equal(host.kv_indices, want_indices)
        np.testing.assert_array_equal(host.kv_last_page_len, want_last)
        assert ((1 <= host.kv_last_page_len) & (host.kv_last_page_len <= BS)).all()
        cache.synchronize()
        for name in ["slot_mapping", "block_tables", "seq_lens", "kv_indptr", "kv_indices",
                     "kv_last_page_len"]:
            np.testing.assert_array_equal(np.from_dlpack(getattr(dev, name)),
                                          getattr(host, name), err_msg=name)
            assert np.from_dlpack(getattr(dev, name)).dtype == \
                (np.int64 if name == "slot_mapping" else np.int32)
        tracker.erase(ids)
        cache.check_invariants()


def test_csr_into_fixed_buffers_and_host_copies_for_plan(tracker):
    cache = tracker.cache
    indptr, indices, last = (np.empty(n, np.int32) for n in (65, 4096, 64))
    addresses = [a.__array_interface__["data"][0] for a in (indptr, indices, last)]
    for step in range(15):
        ids = tracker.batch(int(tracker.rng.integers(1, 12)))
        for a in (indptr, indices, last):
            a.fill(POISON)
        batch, host_indptr, host_last = cache.build_batch_into(ids, indptr, indices, last)
        offset = 0
        assert indptr[0] == 0
        for r, sid in enumerate(ids):
            p = tracker.pages(sid)
            np.testing.assert_array_equal(indices[offset:offset + p], tracker.table[sid][:p])
            offset += p
            assert indptr[r + 1] == offset == host_indptr[r + 1]
            assert last[r] == host_last[r] == tracker.seq_len(sid) - (p - 1) * BS
        assert indptr[len(ids) + 1] == POISON and indices[offset] == POISON
        assert [a.__array_interface__["data"][0] for a in (indptr, indices, last)] == addresses
        tracker.erase(ids)


def test_csr_into_fixed_buffers_with_the_slot_mapping_for_a_captured_write(tracker):
    # With a slot-mapping buffer the batch's slot mapping is that buffer (the same memory every
    # step, padded with -1): write_kv_batch over it may be captured in a CUDA graph.
    cache = tracker.cache
    indptr, indices, last = (np.empty(n, np.int32) for n in (65, 4096, 64))
    slots = np.empty(128, np.int64)
    for step in range(5):
        ids = tracker.batch(int(tracker.rng.integers(1, 12)))
        slots.fill(POISON)
        batch, _, _ = cache.build_batch_into(ids, indptr, indices, last, slot_mapping=slots)
        assert len(batch.host.slot_mapping) == len(slots), "padded to the buffer's length"
        written = [s for sid in ids for s in tracker.pending[sid]]
        np.testing.assert_array_equal(slots[:len(written)], written)
        assert (slots[len(written):] == -1).all()
        assert np.shares_memory(np.from_dlpack(batch.device.slot_mapping), slots)
        tracker.erase(ids)
    with pytest.raises(pagedkv.InvalidArgumentError, match="num_slots"):
        cache.build_batch_into(tracker.batch(3), indptr, indices, last,
                               slot_mapping=np.empty(0, np.int64))


def test_append_indices_follow_get_batch_indices_positions(tracker):
    cache = tracker.cache
    dev_batch, dev_pos = np.empty(512, np.int32), np.empty(512, np.int32)
    for step in range(15):
        ids = tracker.batch(int(tracker.rng.integers(1, 12)))
        batch = cache.build_batch(ids)
        dev_batch.fill(POISON)
        dev_pos.fill(POISON)
        append_indptr, batch_indices, positions = cache.append_indices(batch, dev_batch, dev_pos)
        want_b, want_p, want_indptr = [], [], [0]
        for r, sid in enumerate(ids):
            a, n = len(tracker.pending[sid]), tracker.seq_len(sid)
            want_b += [r] * a
            want_p += [n - a + j for j in range(a)]
            want_indptr.append(want_indptr[-1] + a)
        np.testing.assert_array_equal(append_indptr, want_indptr)
        np.testing.assert_array_equal(batch_indices, want_b)
        np.testing.assert_array_equal(positions, want_p)
        np.testing.assert_array_equal(dev_batch[:len(want_b)], want_b)
        np.testing.assert_array_equal(dev_pos[:len(want_p)], want_p)
        assert dev_batch[len(want_b)] == POISON
        tracker.erase(ids)


def test_vllm_block_table_and_padded_slot_mapping(tracker):
    cache = tracker.cache
    table, slots = np.empty((16, 12), np.int32), np.empty(96, np.int64)
    for step in range(15):
        ids = tracker.batch(int(tracker.rng.integers(1, 12)))
        table.fill(POISON)
        slots.fill(POISON)
        cache.build_vllm_batch_into(ids, table, slots)
        want_slots = [s for sid in ids for s in tracker.pending[sid]]
        np.testing.assert_array_equal(slots, want_slots + [-1] * (96 - len(want_slots)))
        for r, sid in enumerate(ids):
            p = tracker.pages(sid)
            np.testing.assert_array_equal(table[r], tracker.table[sid][:p] + [-1] * (12 - p))
        assert (table[len(ids):] == POISON).all()
        tracker.erase(ids)


def test_a_batch_that_no_longer_describes_its_rows_is_refused(tracker):
    cache = tracker.cache
    ids = tracker.batch(3)
    batch = cache.build_batch(ids)
    cache.reserve(ids[0], 1)
    with pytest.raises(pagedkv.InvalidArgumentError):
        cache.append_indices(batch)
