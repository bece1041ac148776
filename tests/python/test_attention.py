"""A numpy decode attention over layer_kv + the CSR arrays equals the C++ reference kernel of
examples/paged_decode_attention (kernels/decode_attention.hpp, DecodeAttentionBody, launched on
the cache's backend over the same batch through KvCache.device_view)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import make_cache

LENS = [1, 37, 100, 16]  # the C++ example's sequences
Q_HEADS, KV_HEADS, D, BS = 8, 2, 128, 16


def numpy_decode_attention(k_pool, v_pool, nhd, indptr, indices, last_page_len, q, scale):
    """float64 attention of one query token per row over the row's pages, read through the
    zero-copy pool views; grouped-query heads (kv_head = q_head // group)."""
    out = np.zeros(q.shape, np.float64)
    group = q.shape[1] // k_pool.shape[2 if nhd else 1]
    for r in range(q.shape[0]):
        pages = indices[indptr[r]:indptr[r + 1]]
        k, v = k_pool[pages], v_pool[pages]           # [pages, BS, H, D] or [pages, H, BS, D]
        if not nhd:
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        n = (len(pages) - 1) * BS + last_page_len[r]
        k = k.reshape(-1, k.shape[2], D)[:n].astype(np.float64)  # [tokens, H, D]
        v = v.reshape(-1, v.shape[2], D)[:n].astype(np.float64)
        for h in range(q.shape[1]):
            s = k[:, h // group] @ q[r, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[r, h] = (w / w.sum()) @ v[:, h // group]
    return out


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_numpy_decode_attention_equals_the_cpp_reference_kernel(layout, dtype, rng):
    cache = make_cache(num_layers=2, num_kv_heads=KV_HEADS, head_dim=D, block_size=BS,
                       num_device_blocks=64, dtype=dtype, page_layout=layout)
    layer, ids = 1, list(range(1, len(LENS) + 1))
    cache.add_sequence(99, list(range(40)))  # shuffles which blocks the batch gets
    cache.reserve(99, 40)
    for sid, n in zip(ids, LENS):
        cache.add_sequence(sid, list(rng.integers(0, 1000, size=n)))
        cache.reserve(sid, n)
        for lay in range(2):
            k = rng.uniform(-1, 1, (n, KV_HEADS, D)).astype(np.float32)
            v = rng.uniform(-1, 1, (n, KV_HEADS, D)).astype(np.float32)
            cache.write_kv(sid, lay, k, v)
    cache.erase(99)
    batch = cache.build_batch(ids, csr=True)
    q = rng.uniform(-1, 1, (len(ids), Q_HEADS, D)).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    cpp = np.from_dlpack(cache._decode_attention(batch, q, layer, scale))
    k_pool, v_pool = (np.from_dlpack(a) for a in cache.layer_kv(layer))
    h = batch.host
    ref = numpy_decode_attention(k_pool, v_pool, layout == "nhd", h.kv_indptr, h.kv_indices,
                                 h.kv_last_page_len, q, scale)
    np.testing.assert_allclose(cpp, ref, atol=1e-4, rtol=0)
    assert np.abs(ref).max() > 0.01  # not a vacuous comparison of zeros
