"""Control events of a hybrid model from Python: ModelKvCache.drain_events() gives every group's
events with the group's index in ControlEvent.group, group 0's first (docs/events.md, "KV
groups"); a ModelGroup view's drain_events() gives the same index; a KvCache's events say group
0. The model: group 0 full attention, group 1 sliding window 64, blocks of 16, prefix caching on,
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


def test_stores_of_both_groups_carry_their_group_group_0_first():
    cache = model()
    prefill(cache, 1, PROMPT_A)
    cache.finish(1)
    events = cache.drain_events()
    n = full_blocks(PROMPT_A)
    # The window group released blocks 0..2 at commit and the rest at finish into its prefix
    # cache: nothing is removed, both groups stored every full block.
    assert [e.group for e in events] == [FULL] * n + [WINDOW] * n
    check_stores(events[:n], PROMPT_A, FULL)
    check_stores(events[n:], PROMPT_A, WINDOW)
    # The same tokens in the same namespace: the same hashes, naming two groups' blocks.
    assert [e.block_hash for e in events[:n]] == [e.block_hash for e in events[n:]]
    assert cache.drain_events() == []


def test_evictions_in_the_window_group_are_removed_with_group_1():
    # The window group's pool fits A exactly while it is reserved; after A finishes it holds
    # A's full blocks as prefix cache and one free block. B then evicts what it lacks there;
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
    assert [e.group for e in events] == [FULL] * nb + [WINDOW] * (evicted + nb)
    check_stores(events[:nb], PROMPT_B, FULL)
    # Group 1 in order: the removals (B's reserve) before the stores (B's commit).
    removed = events[nb:nb + evicted]
    assert all(e.kind == EventKind.BLOCK_REMOVED and e.group == WINDOW and e.tier == Tier.DEVICE
               for e in removed)
    assert len({e.block_hash for e in removed}) == evicted
    assert {e.block_hash for e in removed} <= window_a
    check_stores(events[nb + evicted:], PROMPT_B, WINDOW)
    assert not any(e.kind == EventKind.BLOCK_REMOVED and e.group == FULL for e in events)
    assert cache.drain_evicted_sequences() == []
    cache.check_invariants()


def test_a_group_view_drains_its_events_with_its_own_index():
    cache = model()
    prefill(cache, 1, PROMPT_A)
    window = cache.group(WINDOW).drain_events()
    check_stores(window, PROMPT_A, WINDOW)
    assert cache.group(WINDOW).drain_events() == []
    # The model drains the same rings: what the view took is gone from it, the rest is there.
    rest = cache.drain_events()
    check_stores(rest, PROMPT_A, FULL)
    assert cache.group(FULL).drain_events() == []
    assert "group=1" in repr(window[0])


def test_one_cache_for_both_groups_drains_their_events_from_the_model_only():
    # share_blocks: one cache records both groups' events in one stream, each naming its group;
    # a group view cannot drain its own without losing the other's, so it refuses.
    cache = model(share_blocks=True)
    assert cache.shares_blocks
    prefill(cache, 1, PROMPT_A)
    with pytest.raises(pagedkv.FailedPreconditionError, match="ModelKvCache.drain_events"):
        cache.group(WINDOW).drain_events()
    events = cache.drain_events()
    stores = [e for e in events if e.kind == EventKind.BLOCK_STORED]
    check_stores([e for e in stores if e.group == FULL], PROMPT_A, FULL)
    check_stores([e for e in stores if e.group == WINDOW], PROMPT_A, WINDOW)
    assert cache.drain_events() == []


def test_an_overflowed_group_resyncs_with_its_group_ahead_of_the_rest():
    capacity = 4
    cache = model(event_capacity=capacity)
    prefill(cache, 1, PROMPT_A)
    events = cache.drain_events()
    n = full_blocks(PROMPT_A)
    lost = n - capacity
    assert [(e.kind, e.group, e.dropped_events) for e in events[:2]] == [
        (EventKind.EVENTS_DROPPED, FULL, lost), (EventKind.EVENTS_DROPPED, WINDOW, lost)]
    assert [e.group for e in events[2:]] == [FULL] * capacity + [WINDOW] * capacity
    assert [list(e.tokens) for e in events[2:2 + capacity]] == block_tokens(PROMPT_A)[lost:]


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
