"""The package around the extension: config as a dataclass or keywords, the type stubs cover
every public name of pagedkv._C, and the exported names resolve."""
from __future__ import annotations

import dataclasses
import pathlib

import pagedkv
from conftest import make_cache


def test_config_as_dataclass_or_keywords_gives_the_same_cache():
    config = pagedkv.CacheConfig(num_layers=3, num_kv_heads=1, head_dim=16, block_size=8,
                                 num_device_blocks=10, dtype="bf16", page_layout="HND",
                                 backend=pagedkv.BackendKind.CPU)
    a = pagedkv.KvCache(config)
    b = pagedkv.KvCache(**dataclasses.asdict(config))
    c = pagedkv.KvCache(config, head_dim=32)  # keywords override the dataclass
    for cache in (a, b):
        assert cache.config.dtype == pagedkv.DType.BFLOAT16
        assert cache.config.page_layout == pagedkv.PageLayout.HND
        assert cache.config.num_layers == 3 and cache.config.head_dim == 16
        assert cache.pool_info["device_bytes"] == 10 * 3 * 2 * 8 * 1 * 16 * 2
    assert c.config.head_dim == 32 and c.cache_config.head_dim == 32
    assert a.cache_config == config


def test_stubs_declare_every_public_name_of_the_extension():
    stub = (pathlib.Path(pagedkv.__file__).parent / "_C.pyi").read_text()
    assert (pathlib.Path(pagedkv.__file__).parent / "py.typed").exists()
    classes = [pagedkv._C._KvCache, pagedkv.Batch, pagedkv.BatchArrays, pagedkv.ControlEvent,
               pagedkv._C._ModelKvCache, pagedkv.ModelBatch, pagedkv.ModelGroup,
               pagedkv._C._KvGroup, pagedkv._C._CacheConfig, pagedkv.StorageLayout,
               pagedkv.StorageTier, pagedkv.FileTier, pagedkv.RedisTier, pagedkv.BlockGeometry]
    if pagedkv.HAS_EVENT_PUBLISHER:  # the stubs are made from an extension with it
        classes.append(pagedkv.EventPublisher)
    for cls in classes:
        assert f"class {cls.__name__}" in stub
        for name in vars(cls):
            if not name.startswith("__"):
                assert f"def {name}(" in stub, f"{cls.__name__}.{name} missing from _C.pyi"
    for name in pagedkv.__all__:
        assert getattr(pagedkv, name) is not None


def test_the_cpu_backend_is_chosen_through_the_config():
    assert make_cache(backend="cpu").backend_description.startswith("cpu")


def test_the_null_backend_sizes_a_pool_far_above_this_machine_without_bytes():
    # 256 GiB of device pool on a machine of 24 GiB: the null backend maps it and never touches
    # it (pagedkv-sim --no-data); the decisions are the CPU backend's.
    blocks = (256 << 30) // (32 * 2 * 16 * 8 * 128 * 2)
    null = pagedkv.KvCache(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16,
                           num_device_blocks=blocks, backend="null")
    assert null.backend_description.startswith("null")
    assert null.pool_info["device_bytes"] == blocks * 32 * 2 * 16 * 8 * 128 * 2
    cpu = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16,
                          num_device_blocks=blocks, backend="cpu")
    for cache in (null, cpu):
        assert cache.add_sequence(1, list(range(100))) == 0
        cache.reserve(1, 100)
        cache.commit(1, list(range(100)))
        assert cache.add_sequence(2, list(range(90))) == 80
        cache.check_invariants()
    assert null.block_locations(1) == cpu.block_locations(1)


def test_a_sliding_window_cache_keeps_only_the_window():
    # Window 16 over blocks of 4: after 40 single-token steps the first blocks are released
    # (reported as block -1) and at most ceil(16 / 4) + 1 blocks are held.
    cache = pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=4,
                            num_device_blocks=32, sliding_window=16, backend="cpu")
    cache.add_sequence(1, [])
    for t in range(40):
        cache.reserve(1, 1)
        cache.commit(1, [t])
        held = [b for _, b in cache.block_locations(1) if b >= 0]
        assert len(held) <= 16 // 4 + 1
        cache.check_invariants()
    assert cache.block_locations(1)[0][1] == -1
    assert cache.stats()["window_released_blocks"] == 40 // 4 - 16 // 4


def test_a_window_smaller_than_a_block_is_refused():
    import pytest

    with pytest.raises(pagedkv.InvalidArgumentError, match="sliding_window"):
        pagedkv.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16,
                        sliding_window=8, backend="cpu")
