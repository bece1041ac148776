"""Control events of a hybrid model from Python: ModelKvCache.drain_events() gives one stream of
every group's events, oldest first, with the group's index in ControlEvent.group (docs/events.md,
"KV groups"); a KvCache's events say group 0. The model: group 0 full attention, group 1 sliding window 64, blocks of 16, prefix caching on,
no host tier. Expected counts come from the prompt lengths, block size, window and pool sizes
(docs/hybrid-models.md: a window group registers every full block of a prompt and releases the
blocks that fall out of its window into its prefix cache), never from the cache."""
from __future__ import annotations

import pytest

import pagedkv
from pagedkv import EventKind, Tier

BS = 16                # block_size
W = 64                 # group 1's sliding_window
FULL, WINDOW = 0, 1    # group indices
PROMPT_A = [1000 + 7 * t for t in range(120)]   # 7 full blocks and 8 tokens
PROMPT_B = [50000 + 3 * t for t in range(50)]   # 3 full blocks and 2 tokens; no block of A


def full_blocks(prompt):
    return len(prompt) // BS


def blocks(prompt):
    return -(-len(prompt) // BS)


def model(window_blocks=64, **options) -> pagedkv.ModelKvCache:
    groups = [
        pagedkv.KvGroup(name="full", layers=[0, 2], num_kv_heads=1, head_dim=8, dtype="fp32",
                        num_device_blocks=64),
        pagedkv.KvGroup(name="window", layers=[1, 3], num_kv_heads=1, head_dim=8, dtype="fp32",
                        sliding_window=W, num_device_blocks=window_blocks),
    ]
    return pagedkv.ModelKvCache(num_layers=4, block_size=BS, backend="cpu", groups=groups,
                                enable_prefix_caching=True, enable_events=True, **options)


def prefill(cache, id, prompt):
    """add_sequence, reserve and commit of the whole prompt (nothing cached is expected)."""
    assert cache.add_sequence(id, prompt) == 0
    cache.reserve(id, len(prompt))
    cache.commit(id, prompt)
    cache.check_invariants()


def block_tokens(prompt):
    return [prompt[b * BS:(b + 1) * BS] for b in range(full_blocks(prompt))]


def check_stores(events, prompt, group):
    """`events` are the device-tier stores of `prompt`'s full blocks in `group`, in order, each
    chained to the one before."""
    assert [e.kind for e in events] == [EventKind.BLOCK_STORED] * full_blocks(prompt)
    assert all(e.group == group and e.tier == Tier.DEVICE for e in events)
    assert [list(e.tokens) for e in events] == block_tokens(prompt)
    assert all(e.parent_hash == p.block_hash for p, e in zip(events, events[1:]))


def test_stores_of_both_groups_carry_their_group_block_by_block():
    cache = model()
    prefill(cache, 1, PROMPT_A)
    cache.finish(1)
    events = cache.drain_events()
    n = full_blocks(PROMPT_A)
    # The window group released blocks 0..2 at commit and the rest at finish into its prefix
    # cache: nothing is removed, both groups stored every full block, the full group's store of
    # a block first.
    assert [e.group for e in events] == [FULL, WINDOW] * n
    check_stores(events[0::2], PROMPT_A, FULL)
    check_stores(events[1::2], PROMPT_A, WINDOW)
    # The same tokens in the same namespace: the same hashes, naming two groups' blocks.
    assert [e.block_hash for e in events[0::2]] == [e.block_hash for e in events[1::2]]
    assert cache.drain_events() == []


def test_evictions_in_the_window_group_are_removed_with_group_1():
    # The window group's pool fits A exactly while it is reserved; after A finishes it holds
    # A's full blocks as prefix cache and one free page. B then evicts what it lacks there;
    # the full group (64 blocks) evicts nothing.
    window_blocks = blocks(PROMPT_A)
    cache = model(window_blocks=window_blocks)
    prefill(cache, 1, PROMPT_A)
    cache.finish(1)
    stored_a = cache.drain_events()
    window_a = {e.block_hash for e in stored_a if e.group == WINDOW}
    assert len(window_a) == full_blocks(PROMPT_A)

    prefill(cache, 2, PROMPT_B)
    events = cache.drain_events()
    free = window_blocks - full_blocks(PROMPT_A)
    evicted = blocks(PROMPT_B) - free
    assert evicted > 0
    nb = full_blocks(PROMPT_B)
    # The removals (B's reserve) before the stores (B's commit).
    assert [e.group for e in events] == [WINDOW] * evicted + [FULL, WINDOW] * nb
    removed = events[:evicted]
    assert all(e.kind == EventKind.BLOCK_REMOVED and e.tier == Tier.DEVICE for e in removed)
    assert len({e.block_hash for e in removed}) == evicted
    assert {e.block_hash for e in removed} <= window_a
    check_stores(events[evicted::2], PROMPT_B, FULL)
    check_stores(events[evicted + 1::2], PROMPT_B, WINDOW)
    assert cache.drain_evicted_sequences() == []
    cache.check_invariants()


def test_events_are_drained_from_the_model_only():
    # One stream holds every group's events, each naming its group: a group view has none of
    # its own to drain.
    cache = model()
    prefill(cache, 1, PROMPT_A)
    assert not hasattr(cache.group(WINDOW), "drain_events")
    events = cache.drain_events()
    check_stores([e for e in events if e.group == FULL], PROMPT_A, FULL)
    check_stores([e for e in events if e.group == WINDOW], PROMPT_A, WINDOW)
    assert "group=1" in repr(events[1])
    assert cache.drain_events() == []


def test_an_overflowed_ring_resyncs_ahead_of_the_newest_events():
    capacity = 4
    cache = model(event_capacity=capacity)
    prefill(cache, 1, PROMPT_A)
    events = cache.drain_events()
    n = full_blocks(PROMPT_A)
    lost = 2 * n - capacity
    assert (events[0].kind, events[0].dropped_events) == (EventKind.EVENTS_DROPPED, lost)
    # The newest four: the last two blocks' stores in both groups.
    assert [e.group for e in events[1:]] == [FULL, WINDOW] * 2
    assert [list(e.tokens) for e in events[1::2]] == block_tokens(PROMPT_A)[n - 2:]


def test_one_group_caches_say_group_0():
    fields = dict(num_layers=2, num_kv_heads=1, head_dim=8, block_size=BS, dtype="fp32",
                  num_device_blocks=16, backend="cpu")
    kv = pagedkv.KvCache(**fields)
    one = pagedkv.ModelKvCache(**fields)
    for cache in (kv, one):
        prefill(cache, 1, PROMPT_A)
        cache.finish(1)
    kv_events, model_events = kv.drain_events(), one.drain_events()
    check_stores(kv_events, PROMPT_A, 0)
    assert ([(e.kind, e.group, e.block_hash, e.parent_hash) for e in model_events] ==
            [(e.kind, e.group, e.block_hash, e.parent_hash) for e in kv_events])
    assert "group=0" in repr(kv_events[0])
