"""A cache's pools as regions and its blocks as addresses (KvCache.regions, block_geometry,
pair_block_runs): what a transfer engine such as NIXL registers and reads, checked against the
pool views and gather_layer; a prompt copied between two caches through them (ctypes.memmove
standing for a peer's READ) decodes on the other side as that side's own prefix."""
from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

import pagedkv
from conftest import make_cache, random_kv


def prefill(cache, seq, tokens, rng):
    cache.add_sequence(seq, tokens)
    cache.reserve(seq, len(tokens))
    for layer in range(cache.config.num_layers):
        k, v = random_kv(rng, len(tokens), cache)
        cache.write_kv(seq, layer, k, v)
    cache.commit(seq, tokens)
    cache.synchronize()


def device_ids(cache, seq):
    locations = cache.block_locations(seq)
    assert all(tier == pagedkv.Tier.DEVICE for tier, _ in locations)
    return [block for _, block in locations]


def test_regions_are_the_pools_the_views_show():
    cache = make_cache(num_host_blocks=8)
    regions = cache.regions()
    assert [r["tier"] for r in regions] == [pagedkv.Tier.DEVICE, pagedkv.Tier.HOST]
    k0, _ = cache.layer_kv(0)
    assert regions[0]["base"] == np.from_dlpack(k0).__array_interface__["data"][0]
    assert regions[0]["bytes"] == cache.pool_info["device_bytes"]
    assert regions[1]["bytes"] == cache.pool_info["host_bytes"]
    assert {r["memory"] for r in regions} == {"DRAM"}  # the CPU backend's pools are host memory


def test_geometry_addresses_the_bytes_of_a_layer_page():
    cache = make_cache(dtype="fp16")
    geo = cache.block_geometry(0, pagedkv.Tier.DEVICE, model_id="m")
    assert geo.block_bytes == geo.layer_bytes * cache.config.num_layers
    assert geo.memory == "DRAM" and geo.num_blocks == 64
    for layer in range(cache.config.num_layers):
        k, v = (np.from_dlpack(p) for p in cache.layer_kv(layer))
        for block in (0, 5, 63):
            k_addr = k[block].__array_interface__["data"][0]
            v_addr = v[block].__array_interface__["data"][0]
            assert k_addr == geo.layer_base[layer] + block * geo.block_bytes
            assert v_addr == k_addr + geo.layer_bytes // 2
            assert geo.block_address(block) == geo.base + block * geo.block_bytes
    with pytest.raises(pagedkv.InvalidArgumentError):
        geo.block_address(64)


def test_geometry_survives_the_wire_and_refuses_a_broken_one():
    cache = make_cache()
    geo = cache.block_geometry(model_id="llama")
    back = pagedkv.BlockGeometry.from_dict(json.loads(json.dumps(geo.to_dict())))
    assert back.to_dict() == geo.to_dict()
    pagedkv.check_same_block_layout(geo, back)
    broken = geo.to_dict()
    del broken["block_bytes"]
    with pytest.raises(pagedkv.InvalidArgumentError, match="block_bytes"):
        pagedkv.BlockGeometry.from_dict(broken)
    too_small = dict(geo.to_dict(), bytes=geo.block_bytes)
    with pytest.raises(pagedkv.InvalidArgumentError, match="fit"):
        pagedkv.BlockGeometry.from_dict(too_small)


def test_another_model_or_layout_is_refused():
    geo = make_cache().block_geometry(model_id="llama")
    for other in (make_cache().block_geometry(model_id="mistral"),
                  make_cache(dtype="fp16").block_geometry(model_id="llama"),
                  make_cache(page_layout="HND").block_geometry(model_id="llama")):
        with pytest.raises(pagedkv.FailedPreconditionError, match="fingerprint"):
            pagedkv.check_same_block_layout(geo, other)
        with pytest.raises(pagedkv.FailedPreconditionError):
            pagedkv.pair_block_runs(geo, [0], other, [0])


def test_bad_ids_and_tiers_are_refused():
    cache = make_cache()
    geo = cache.block_geometry()
    with pytest.raises(pagedkv.InvalidArgumentError, match="src_ids has 2"):
        pagedkv.pair_block_runs(geo, [0, 1], geo, [0])
    with pytest.raises(pagedkv.InvalidArgumentError, match=r"dst_ids\[1\]"):
        pagedkv.pair_block_runs(geo, [0, 1], geo, [0, 64])
    with pytest.raises(pagedkv.FailedPreconditionError, match="num_host_blocks"):
        cache.block_geometry(0, pagedkv.Tier.HOST)
    with pytest.raises(pagedkv.OutOfRangeError):
        cache.block_geometry(1)


def test_a_prompt_moves_to_another_cache_through_its_blocks(rng):
    prefill_side = make_cache()
    decode_side = make_cache()
    prefill(decode_side, 1, list(range(900, 909)), rng)  # the ids no longer run in step
    prompt = list(range(100, 123))  # 5 full blocks and 3 tokens
    prefill(prefill_side, 7, prompt, rng)

    decode_side.add_sequence(9, prompt)
    decode_side.reserve(9, len(prompt))
    decode_side.synchronize()
    runs = pagedkv.pair_block_runs(prefill_side.block_geometry(model_id="m"),
                                   device_ids(prefill_side, 7),
                                   decode_side.block_geometry(model_id="m"),
                                   device_ids(decode_side, 9))
    assert sum(r[2] for r in runs) == 6 and len(runs) < 6
    for _, _, _, src, dst, nbytes in runs:
        ctypes.memmove(dst, src, nbytes)
    decode_side.commit(9, prompt)
    decode_side.check_invariants()
    for layer in range(prefill_side.config.num_layers):
        want = prefill_side.gather_layer(7, layer)
        got = decode_side.gather_layer(9, layer)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    assert decode_side.add_sequence(10, prompt) == 20  # the full blocks are its prefix now


def test_the_nixl_module_says_what_it_needs_when_nixl_is_missing(monkeypatch):
    import importlib
    import sys
    for name in ("nixl_cu13", "nixl"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    monkeypatch.delitem(sys.modules, "pagedkv.nixl", raising=False)
    with pytest.raises(pagedkv.UnimplementedError, match="nixl-cu13==1.5.1"):
        importlib.import_module("pagedkv.nixl")
