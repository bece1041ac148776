"""CacheConfig.with_pools and blocks_per_sequence from Python: a budget of n sequences of a
context gives every group n sequences' blocks (expected counts from the window arithmetic, not
from the code under test), a one-group config gets whole blocks, the result makes a working
ModelKvCache, and bad budgets raise InvalidArgumentError."""
import pytest

import pagedkv


def blocks_kept(context: int, block_size: int, window: int) -> int:
    """Blocks holding positions max(0, context - window) .. context (the next token's slot)."""
    first = 0 if window == 0 else max(0, context - window)
    return len({p // block_size for p in range(first, context + 1)})


def gemma_like() -> pagedkv.CacheConfig:
    local = pagedkv.KvGroup(name="local", layers=[0, 1, 2, 3, 4], num_kv_heads=2, head_dim=32,
                            sliding_window=1024)
    glob = pagedkv.KvGroup(name="global", layers=[5], num_kv_heads=2, head_dim=32)
    return pagedkv.CacheConfig(num_layers=6, block_size=16, groups=[local, glob],
                               backend="cpu")


def test_groups_fill_together_at_the_context():
    c = gemma_like()
    page = 2 * 16 * 2 * 32 * 2  # K and V, 16 tokens, 2 heads x 32 dims, fp16: one layer's block
    local_per_seq = blocks_kept(4096, 16, 1024)
    global_per_seq = blocks_kept(4096, 16, 0)
    assert (local_per_seq, global_per_seq) == (65, 257)
    seq_bytes = local_per_seq * 5 * page + global_per_seq * page
    sized = c.with_pools(device_bytes=3 * seq_bytes, host_bytes=0, context=4096)
    assert [g.num_device_blocks for g in sized.groups] == [3 * 65, 3 * 257]
    assert sized.num_device_blocks == 3 * (65 + 257)
    assert [g.num_device_blocks for g in c.groups] == [0, 0], "the config itself is unchanged"
    assert sized.blocks_per_sequence(4096, group=0) == local_per_seq
    assert sized.blocks_per_sequence(4096, group=1) == global_per_seq
    # Three sequences of 4096 tokens, prefilled a block at a time (a window group holds its
    # window's blocks at every step) and their next slot reserved, fit; a fourth does not.
    cache = pagedkv.ModelKvCache(sized, enable_events=False)
    for i in range(3):
        cache.add_sequence(i, [])
        for start in range(0, 4096, 16):
            cache.reserve(i, 16)
            cache.commit(i, list(range(i * 10000 + start, i * 10000 + start + 16)))
        cache.reserve(i, 1)
        cache.check_invariants()
    assert [cache.held_blocks(i, 0) for i in range(3)] == [local_per_seq] * 3
    assert [cache.held_blocks(i, 1) for i in range(3)] == [global_per_seq] * 3
    cache.set_active([0, 1, 2])
    cache.add_sequence(9, [])
    with pytest.raises(pagedkv.ResourceExhaustedError):
        cache.reserve(9, 16)
    cache.check_invariants()


def test_one_group_takes_whole_blocks():
    c = pagedkv.CacheConfig(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4)
    block = 2 * 2 * 4 * 2 * 8 * 2
    sized = c.with_pools(device_bytes=7 * block + block - 1, host_bytes=2 * block, context=100)
    assert (sized.num_device_blocks, sized.num_host_blocks) == (7, 2)
    assert c.blocks_per_sequence(10) == blocks_kept(10, 4, 0)


@pytest.mark.parametrize("window", [16, 24, 100])
def test_blocks_per_sequence_follows_the_window(window):
    c = pagedkv.CacheConfig(block_size=16, sliding_window=window)
    for context in (0, 1, 15, 16, 17, 99, 100, 101, 1000):
        assert c.blocks_per_sequence(context) == blocks_kept(context, 16, window), context


def test_bad_input_is_refused():
    c = gemma_like()
    with pytest.raises(pagedkv.InvalidArgumentError, match="budgets must be >= 0"):
        c.with_pools(-1, 0, 100)
    with pytest.raises(pagedkv.InvalidArgumentError, match="context must be >= 1"):
        c.with_pools(1 << 20, 0, 0)
    with pytest.raises(pagedkv.InvalidArgumentError, match="name the group"):
        c.blocks_per_sequence(100)
    with pytest.raises(pagedkv.OutOfRangeError, match="group 2 outside"):
        c.blocks_per_sequence(100, group=2)
    with pytest.raises(pagedkv.InvalidArgumentError, match="block_size >= 1"):
        pagedkv.CacheConfig(block_size=0).blocks_per_sequence(10)
    with pytest.raises(pagedkv.InvalidArgumentError, match="context >= 0"):
        pagedkv.CacheConfig().blocks_per_sequence(-1)
    bad_window = gemma_like()
    bad_window.groups[0].sliding_window = -16
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"groups\[0\]: sliding_window"):
        bad_window.with_pools(1 << 20, 0, 16)
