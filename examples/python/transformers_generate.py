"""Greedy generation of a transformers model through pagedkv, next to transformers' own cache.

    python examples/python/transformers_generate.py [--layers 4 --hidden 256 --batch 4 ...]

Builds a Llama-shaped model with random weights from a small LlamaConfig (nothing is
downloaded), generates with transformers' default DynamicCache and with a pagedkv PagedCache
in alternating rounds of the same run, checks that the tokens are identical, and prints the
tokens/s of each (best round) and their ratio. Then runs a second request that shares the first
prompt's prefix and shows it computing only its suffix, and serves prompts of different lengths
with PagedGenerator (one batched decode) next to transformers' left-padded batched generation.
Needs torch and transformers
(scripts/test-integrations installs the pinned versions).
"""
import argparse
import os
import time

import torch
import transformers

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")
from pagedkv.integrations.transformers import (ATTENTION, PagedCache, PagedGenerator,
                                               kv_cache_for, register_attention)


def build_model(args):
    """A random-weight Llama (seeded) that never stops early."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def timed_generate(model, input_ids, new_tokens, **kwargs):
    """(tokens, seconds) of one greedy generation."""
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False, **kwargs)
    return out, time.perf_counter() - start


def compare(model, kv, input_ids, args):
    """Alternating rounds of DynamicCache, PagedCache (sdpa over K/V read back from the pool)
    and PagedCache with pagedkv's decode attention (K/V read in place); the best round of
    each."""
    best = {}
    for _ in range(args.rounds):
        for name in ("transformers", "pagedkv", "pagedkv+attn"):
            model.set_attn_implementation(ATTENTION if name == "pagedkv+attn" else "sdpa")
            cache = None if name == "transformers" else PagedCache(model, kv)
            out, seconds = timed_generate(model, input_ids, args.new_tokens,
                                          past_key_values=cache)
            if cache is None:
                ref = out
            else:
                cache.finish()
            best[name] = min(best.get(name, float("inf")), seconds)
            if not torch.equal(out, ref):
                raise SystemExit(f"FAIL: {name} generated other tokens than transformers")
    model.set_attn_implementation("sdpa")
    return best


def prefix_demo(model, kv, input_ids, args):
    """A second request sharing the first prompt's prefix: only its suffix is computed."""
    second = torch.cat([input_ids[:1, : args.prompt - 5], input_ids[:1, :5].flip(1)], dim=1)
    ref, _ = timed_generate(model, second, args.new_tokens)
    cache = PagedCache(model, kv)
    hit = cache.add(second)
    out, _ = timed_generate(model, second, args.new_tokens, past_key_values=cache)
    cache.finish()
    same = torch.equal(out, ref)
    print(f"prefix hit: {hit} of {second.shape[1]} prompt tokens cached, "
          f"{cache.computed_tokens - (args.new_tokens - 1)} computed; tokens identical: {same}")
    if not same:
        raise SystemExit("FAIL: the prefix-hit request generated other tokens")


def many_requests(model, kv, args):
    """Prompts of different lengths: transformers' batched generate (left-padded, DynamicCache)
    against PagedGenerator (each prompt prefilled alone, one ragged batched decode)."""
    gen = torch.Generator().manual_seed(2)
    lengths = [args.prompt // 2 + (i * args.prompt) // (2 * args.requests)
               for i in range(args.requests)]
    prompts = [torch.randint(3, args.vocab, (n,), generator=gen).tolist() for n in lengths]
    longest = max(lengths)
    padded = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(padded)
    for i, p in enumerate(prompts):
        padded[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    best = {"transformers": float("inf"), "pagedkv": float("inf")}
    for _ in range(args.rounds):
        ref, seconds = timed_generate(model, padded, args.new_tokens, attention_mask=mask)
        best["transformers"] = min(best["transformers"], seconds)
        start = time.perf_counter()
        tokens = PagedGenerator(model, kv).generate(prompts, args.new_tokens)
        best["pagedkv"] = min(best["pagedkv"], time.perf_counter() - start)
    same = all(ref[i, longest:].tolist() == t for i, t in enumerate(tokens))
    total = len(prompts) * args.new_tokens
    print(f"{len(prompts)} requests, prompts of {min(lengths)}-{longest} tokens, "
          f"{args.new_tokens} new tokens each:")
    for name, seconds in best.items():
        print(f"  {name:13s} {total / seconds:8.1f} tokens/s ({seconds * 1e3:.0f} ms)")
    print(f"  pagedkv / transformers: {best['transformers'] / best['pagedkv']:.2f}x; "
          f"tokens identical to the padded batch: {same}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    register_attention()
    model = build_model(args)
    rows = max(args.batch, args.requests)
    blocks = rows * ((args.prompt + args.new_tokens) // 16 + 2) * 2
    kv = kv_cache_for(model.config, num_device_blocks=blocks, dtype="fp32")
    input_ids = torch.randint(3, args.vocab, (args.batch, args.prompt),
                              generator=torch.Generator().manual_seed(1))
    best = compare(model, kv, input_ids, args)
    tokens = args.batch * args.new_tokens
    print(f"model: Llama {args.layers} layers, hidden {args.hidden}, fp32, CPU "
          f"({torch.get_num_threads()} threads); batch {args.batch}, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens; best of {args.rounds} rounds")
    for name, seconds in best.items():
        print(f"  {name:13s} {tokens / seconds:8.1f} tokens/s ({seconds * 1e3:.0f} ms)")
    for name in ("pagedkv", "pagedkv+attn"):
        print(f"  {name} / transformers: {best['transformers'] / best[name]:.2f}x")
    print("  tokens identical")
    prefix_demo(model, kv, input_ids, args)
    many_requests(model, kv, args)


if __name__ == "__main__":
    main()
