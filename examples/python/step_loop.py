"""A complete decode loop driven from Python, with prefix sharing (run in CI).

Four requests share a system prompt. Each step the "model" (here: random K/V from numpy)
produces one token per running request; the cache reserves one slot per request in one call,
writes K/V for every layer through the batch's slot mapping, commits the tokens, and builds the
batch a FlashInfer- or vLLM-style attention kernel would read. Requests finish at different
lengths; a late request reuses the shared prefix from the cache. The program checks itself:
every token's K/V, read back with gather_layer, equals what the model wrote, and it exits 1
otherwise.

    python examples/python/step_loop.py [--backend cpu] [--steps 24]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import pagedkv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()

    config = pagedkv.CacheConfig(num_layers=4, num_kv_heads=2, head_dim=32, block_size=8,
                                 num_device_blocks=128, dtype="fp32", backend=args.backend)
    cache = pagedkv.KvCache(config)
    print(f"backend: {cache.backend_description}")
    rng = np.random.default_rng(0)
    heads, dim, layers = config.num_kv_heads, config.head_dim, config.num_layers
    written = {}  # (sequence, position) -> [layers, 2, heads, dim]: what the model wrote

    def model_kv(n):  # the K/V of n new tokens for every layer
        return rng.standard_normal((layers, 2, n, heads, dim)).astype(np.float32)

    def prefill(sid, prompt):
        cached = cache.add_sequence(sid, prompt)  # full blocks of a known prefix are reused
        todo = prompt[cached:]
        cache.reserve(sid, len(todo))
        kv = model_kv(len(todo))
        for layer in range(layers):
            cache.write_kv(sid, layer, kv[layer, 0], kv[layer, 1])
        cache.commit(sid, todo)
        for i in range(cached):  # cached blocks hold what request 1 wrote for the system prompt
            written[sid, i] = written[1, i]
        for i in range(len(todo)):
            written[sid, cached + i] = kv[:, :, i]
        return cached

    system = list(rng.integers(0, 32000, size=20))  # 2 full blocks + 4 tokens are shared
    running = {}
    for sid, extra in zip([1, 2, 3, 4], [3, 9, 5, 12]):
        prompt = system + list(rng.integers(0, 32000, size=extra))
        cached = prefill(sid, prompt)
        running[sid] = 6 + 3 * sid  # tokens to generate
        print(f"request {sid}: prompt {len(prompt)} tokens, {cached} from the prefix cache")

    # The fixed-size buffers a captured step would read (vLLM style), reused every step.
    block_table = np.empty((8, 16), np.int32)
    slot_mapping = np.empty(8, np.int64)
    for step in range(args.steps):
        if step == 6:  # a late request: the shared prefix is still cached
            cached = prefill(5, system + [7, 7, 7])
            assert cached == 16, cached
            running[5] = 5
        ids = sorted(running)
        cache.set_active(ids)
        cache.reserve_batch(ids, 1)
        batch = cache.build_batch(ids, csr=True, pad_slots_to=8)
        kv = model_kv(8)  # one row per slot of the padded slot mapping; padding rows skipped
        for layer in range(layers):
            cache.write_kv_batch(batch, layer, kv[layer, 0], kv[layer, 1])
        # ... attention over batch.device.kv_indptr / kv_indices / kv_last_page_len here ...
        cache.build_vllm_batch_into(ids, block_table, slot_mapping)
        for row, sid in enumerate(ids):
            written[sid, int(batch.host.seq_lens[row]) - 1] = kv[:, :, row]
        tokens = list(rng.integers(0, 32000, size=len(ids)))
        cache.commit_batch(ids, tokens)
        for sid in ids:
            running[sid] -= 1
            if running[sid] == 0:
                check(cache, sid, written, layers)
                cache.finish(sid)  # its full blocks stay cached for later prompts
                del running[sid]
                print(f"step {step}: request {sid} finished at {cache_len(written, sid)} tokens")
        cache.check_invariants()
        if not running:
            break
    for sid in list(running):
        check(cache, sid, written, layers)
        cache.finish(sid)
    stats = cache.stats()
    stored = sum(e.kind == pagedkv.EventKind.BLOCK_STORED for e in cache.drain_events())
    print(f"prefix hits: {stats['prefix_hit_tokens']} of {stats['prefix_query_tokens']} prompt "
          f"tokens; {stored} blocks stored; device blocks used {stats['device']['used_blocks']}, "
          f"cached {stats['device']['cached_blocks']}")
    assert stats["prefix_hit_tokens"] == 4 * 16, stats  # requests 2, 3, 4 and 5
    print("OK")
    return 0


def cache_len(written, sid):
    return sum(1 for s, _ in written if s == sid)


def check(cache, sid, written, layers):
    """Every position's K/V read back through gather_layer equals what the model wrote."""
    n = cache.length(sid)
    for layer in range(layers):
        k, v = (np.from_dlpack(a) for a in cache.gather_layer(sid, layer))
        for pos in range(n):
            want = written[sid, pos][layer]
            if not (np.array_equal(k[pos], want[0]) and np.array_equal(v[pos], want[1])):
                print(f"MISMATCH: sequence {sid} layer {layer} position {pos}", file=sys.stderr)
                sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
