"""pagedkv as a transformers Cache: greedy generation through pagedkv against transformers' own
DynamicCache, computed in the same test from the same random-weight model (no weights are
downloaded). Run by scripts/test-integrations (pinned torch and transformers)."""
import os

import pytest

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pagedkv  # noqa: E402
from pagedkv.integrations.transformers import (  # noqa: E402
    ATTENTION, PagedCache, PagedGenerator, SequenceEvictedError, kv_cache_for, pool_dtype,
    register_attention)

LOGIT_TOLERANCE = 1e-5


def tiny(config_class, model_class, dtype=torch.float32, **fields):
    """A small random-weight causal LM (seeded) that never stops early (no EOS)."""
    torch.manual_seed(0)
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    base.update(fields)
    model = model_class(config_class(**base)).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def llama(dtype=torch.float32):
    return tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM, dtype)


def mistral():
    """Every layer slides, over a window shorter than prompt + generation."""
    return tiny(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=24)


def gemma3():
    """Sliding layers next to a full one (pattern 2), head_dim set apart from hidden/heads."""
    return tiny(transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, head_dim=32,
                query_pre_attn_scalar=32, sliding_window=20, num_hidden_layers=4,
                sliding_window_pattern=2)


def prompt(length, batch=1, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (batch, length), generator=gen)


def generate(model, input_ids, new_tokens, **kwargs):
    """Greedy generation with the per-step logits."""
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.logits)


def assert_same_generation(reference, paged, tolerance=LOGIT_TOLERANCE):
    (ref_tokens, ref_logits), (tokens, logits) = reference, paged
    assert torch.equal(tokens, ref_tokens), f"tokens differ:\n{tokens}\n{ref_tokens}"
    diff = (logits.float() - ref_logits.float()).abs().max().item()
    assert diff <= tolerance, f"logits differ by {diff}"


def poison(kv, num_layers):
    """Fills the whole device pool with NaN: a position read before it is written shows."""
    for layer in range(num_layers):
        for part in kv.layer_kv(layer):
            torch.from_dlpack(part).fill_(float("nan"))


def paged_generate(model, kv, input_ids, new_tokens, **kwargs):
    cache = PagedCache(model, kv)
    try:
        return generate(model, input_ids, new_tokens, past_key_values=cache, **kwargs), cache
    finally:
        cache.finish()


@pytest.mark.parametrize("make", [llama, mistral, gemma3], ids=["llama", "mistral", "gemma3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_equals_dynamic_cache(make, batch):
    model = make()
    kv = kv_cache_for(model.config, num_device_blocks=64, dtype="fp32")
    input_ids = prompt(21, batch)  # crosses blocks of 16 and the windows of 20 and 24
    reference = generate(model, input_ids, 24)
    paged, cache = paged_generate(model, kv, input_ids, 24)
    assert_same_generation(reference, paged)
    assert cache.computed_tokens == 21 + 23  # the prompt, then one token per decode forward
    kv.check_invariants()


def test_left_padded_batch_equals_dynamic_cache():
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    input_ids = prompt(19, 2)
    mask = torch.ones_like(input_ids)
    mask[1, :5] = 0  # row 1 is a shorter prompt, left-padded
    reference = generate(model, input_ids, 20, attention_mask=mask)
    paged, _ = paged_generate(model, kv, input_ids, 20, attention_mask=mask)
    assert_same_generation(reference, paged)


@pytest.mark.parametrize("make", [llama, gemma3], ids=["llama", "gemma3"])
def test_a_prompt_sharing_a_cached_prefix_computes_only_its_suffix(make):
    model = make()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    first = prompt(40)
    paged_generate(model, kv, first, 8)  # finish() leaves its two full blocks cached

    second = torch.cat([first[:, :35], prompt(10, seed=7)], dim=1)  # 45 tokens, 32 shared
    reference = generate(model, second, 12)
    cache = PagedCache(model, kv)
    assert cache.add(second) == 32
    paged = generate(model, second, 12, past_key_values=cache)
    cache.finish()
    assert_same_generation(reference, paged)
    assert cache.computed_tokens == (45 - 32) + 11
    stats = kv.group(0).stats() if isinstance(kv, pagedkv.ModelKvCache) else kv.stats()
    assert stats["prefix_hit_tokens"] >= 32


def test_without_add_the_first_forward_admits_and_computes_every_token():
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    first = prompt(40)
    paged_generate(model, kv, first, 4)
    reference = generate(model, first, 6)
    paged, cache = paged_generate(model, kv, first, 6)  # the same prompt, all of it cached
    assert_same_generation(reference, paged)
    assert cache.computed_tokens == 40 + 5


def test_rows_offloaded_and_restored_between_decode_steps_give_the_same_generation():
    """A preemption mid-generation: before two decode forwards every row goes to the host tier,
    the device pool is overwritten with NaN, and the rows come back (to whatever blocks are
    free). Tokens and logits must not change: the K/V came back from the host copies."""
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=64, num_host_blocks=64)
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 16)
    cache = PagedCache(model, kv)
    forwards, preempted = [0], []

    def preempt(module, args, kwargs):
        forwards[0] += 1
        if forwards[0] not in (4, 9):
            return
        for seq in cache.ids:
            kv.offload(seq)
        kv.synchronize()
        assert all(kv.residency(seq) == pagedkv.SequenceResidency.HOST for seq in cache.ids)
        for layer in range(model.config.num_hidden_layers):
            for part in kv.layer_kv(layer):
                torch.from_dlpack(part).fill_(float("nan"))
        for seq in cache.ids:
            kv.restore(seq)
        preempted.append(forwards[0])

    hook = model.register_forward_pre_hook(preempt, with_kwargs=True)
    try:
        paged = generate(model, input_ids, 16, past_key_values=cache)
    finally:
        hook.remove()
        cache.finish()
    assert preempted == [4, 9]
    assert_same_generation(reference, paged)
    assert kv.stats()["sequences_offloaded"] == 4
    kv.check_invariants()


def test_assisted_decoding_rolls_back_rejected_draft_tokens():
    """Assisted (speculative) decoding: a small draft model proposes tokens, the model checks
    several at once and crop()s the rejected ones, which rolls them back in pagedkv. The same
    run over transformers' own cache is the reference, token for token."""
    model = llama()
    draft = tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM, num_hidden_layers=1)
    kv = kv_cache_for(model.config, num_device_blocks=64)
    input_ids = prompt(21)
    reference = generate(model, input_ids, 20, assistant_model=draft)
    paged, cache = paged_generate(model, kv, input_ids, 20, assistant_model=draft)
    assert_same_generation(reference, paged)
    assert cache.computed_tokens > 21 + 19, "no draft token was ever rejected and rolled back"
    kv.check_invariants()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_pools_match_transformers_run_in_the_same_dtype(dtype):
    model = llama(dtype)
    kv = kv_cache_for(model.config, num_device_blocks=64, dtype=pool_dtype(dtype))
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 16)
    paged, _ = paged_generate(model, kv, input_ids, 16)
    assert_same_generation(reference, paged, tolerance=0.0)  # stored as computed: no rounding


def test_a_cache_made_from_the_model_takes_its_dtype():
    model = llama()
    cache = PagedCache(model, num_device_blocks=32)
    assert cache.kv.config.dtype.name == "FLOAT32"
    reference = generate(model, prompt(9), 5)
    assert_same_generation(reference, generate(model, prompt(9), 5, past_key_values=cache))
    cache.finish()


def test_generation_fails_loudly_when_the_pool_is_too_small():
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=2)  # 32 tokens per row at most
    with pytest.raises(Exception, match="(?i)exhausted|room|blocks"):
        paged_generate(model, kv, prompt(21), 20)


def test_head_major_pages_give_the_same_generation():
    model = gemma3()
    kv = kv_cache_for(model.config, num_device_blocks=64, page_layout="hnd")
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 20)
    paged, _ = paged_generate(model, kv, input_ids, 20)
    assert_same_generation(reference, paged)


def test_sliding_layers_live_in_window_groups_that_release_old_blocks():
    model = mistral()  # window 24, blocks of 16: at most ceil(24 / 16) + 1 = 3 blocks a row
    kv = kv_cache_for(model.config, num_device_blocks=64)
    assert isinstance(kv, pagedkv.ModelKvCache) and kv.num_groups == 1
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 60)
    cache = PagedCache(model, kv)
    paged = generate(model, input_ids, 60, past_key_values=cache)
    held = [kv.held_blocks(i, 0) for i in cache.ids]
    cache.finish()
    assert_same_generation(reference, paged)
    assert max(held) <= 3, held  # 81 tokens, 6 blocks with full attention
    assert kv.group(0).stats()["window_released_blocks"] > 0


def test_gemma3_has_a_full_group_and_a_window_group():
    model = gemma3()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    assert [g.name for g in kv.groups] == ["full", f"window{model.config.sliding_window}"]
    assert kv.layer_group(1)[0] == 0 and kv.layer_group(0)[0] == 1  # pattern 2: odd layers full


def test_windows_kept_whole_in_one_cache_give_the_same_generation():
    model = gemma3()
    kv = kv_cache_for(model.config, num_device_blocks=64, paged_windows=False)
    assert isinstance(kv, pagedkv.KvCache)
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 30)
    paged, _ = paged_generate(model, kv, input_ids, 30)
    assert_same_generation(reference, paged)


@pytest.mark.parametrize("make", [llama, gemma3], ids=["llama", "gemma3"])
def test_the_driver_serves_prompts_of_different_lengths_in_one_batch(make):
    model = make()
    kv = kv_cache_for(model.config, num_device_blocks=128)
    base = prompt(40)[0].tolist()
    prompts = [prompt(21, seed=2)[0].tolist(), base, base[:35] + [5, 6, 7],
               prompt(9, seed=3)[0].tolist()]
    references = [generate(model, torch.tensor([p]), 14) for p in prompts]
    poison(kv, model.config.num_hidden_layers)  # the ragged reads' padding must not read it
    generator = PagedGenerator(model, kv)
    tokens, logits = generator.generate(prompts, 14, return_logits=True)
    assert generator.prefix_hits == [0, 0, 32, 0]  # the third prompt reuses the second's blocks
    for p, reference, new, step_logits in zip(prompts, references, tokens, logits):
        assert_same_generation(reference, (torch.tensor([p + new]), step_logits[:, None]))
    kv.check_invariants()


@pytest.mark.parametrize("batch", [1, 3])
def test_paged_decode_attention_gives_the_same_generation(batch):
    register_attention()
    model = llama()
    input_ids = prompt(21, batch)
    reference = generate(model, input_ids, 20)
    model.set_attn_implementation(ATTENTION)  # prefill: sdpa; decode: pagedkv's kernel
    kv = kv_cache_for(model.config, num_device_blocks=64)
    paged, _ = paged_generate(model, kv, input_ids, 20)
    assert_same_generation(reference, paged)


def test_the_driver_decodes_ragged_rows_with_paged_attention():
    register_attention()
    model = llama()
    prompts = [prompt(21, seed=2)[0].tolist(), prompt(40)[0].tolist(),
               prompt(9, seed=3)[0].tolist()]
    references = [generate(model, torch.tensor([p]), 12) for p in prompts]
    model.set_attn_implementation(ATTENTION)
    generator = PagedGenerator(model, kv_cache_for(model.config, num_device_blocks=64))
    tokens, logits = generator.generate(prompts, 12, return_logits=True)
    for p, reference, new, step_logits in zip(prompts, references, tokens, logits):
        assert_same_generation(reference, (torch.tensor([p + new]), step_logits[:, None]))


def test_paged_attention_leaves_other_caches_to_sdpa():
    register_attention()
    model = llama()
    input_ids = prompt(21, 2)
    reference = generate(model, input_ids, 10)
    model.set_attn_implementation(ATTENTION)
    assert_same_generation(reference, generate(model, input_ids, 10))  # DynamicCache


def blocks_used_and_held(kv, ids):
    """(device blocks in use, blocks the sequences hold counted per sequence) of the pool that
    holds the full-attention layers (a window model's first group): used < held means shared."""
    if isinstance(kv, pagedkv.ModelKvCache):
        return (kv.group(0).stats()["device"]["used_blocks"],
                sum(kv.held_blocks(i, 0) for i in ids))
    return kv.stats()["device"]["used_blocks"], sum(len(kv.block_locations(i)) for i in ids)


@pytest.mark.parametrize("make", [llama, mistral], ids=["llama", "mistral"])
def test_beam_search_forks_rows_and_equals_dynamic_cache(make):
    """num_beams=3: generate() repeats each prompt three times (the rows share one prefill
    through fork) and reorders the beams every step (reorder_cache: a fork of each chosen
    parent, an erase of each dropped beam). Same sequences and scores as DynamicCache."""
    model = make()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    input_ids = prompt(21, 2)

    def beams(**kwargs):
        with torch.no_grad():
            out = model.generate(input_ids, max_new_tokens=10, do_sample=False, num_beams=3,
                                 num_return_sequences=2, output_scores=True,
                                 return_dict_in_generate=True, **kwargs)
        return out.sequences, out.sequences_scores

    ref_tokens, ref_scores = beams()
    cache = PagedCache(model, kv)
    tokens, scores = beams(past_key_values=cache)
    used, held = blocks_used_and_held(kv, cache.ids)
    cache.finish()
    assert torch.equal(tokens, ref_tokens), f"tokens differ:\n{tokens}\n{ref_tokens}"
    assert (scores - ref_scores).abs().max().item() <= LOGIT_TOLERANCE
    assert len(cache.ids) == 0 and held == 6 * 2  # 6 beams of 31 tokens: 2 blocks each
    assert used < held, (used, held)  # the prompt's full block is one block for 3 beams
    assert cache.computed_tokens == 21 + 9
    kv.check_invariants()


def test_sampled_return_sequences_share_the_prompt_blocks():
    """num_return_sequences=3 (sampling, seeded: transformers refuses it greedy): the three
    copies of a prompt are written once and forked, so after the prefill each prompt's rows
    hold the same two blocks. Same tokens and logits as DynamicCache under the same seed."""
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    input_ids = prompt(21, 2)

    def sample(**kwargs):
        torch.manual_seed(5)
        with torch.no_grad():
            out = model.generate(input_ids, max_new_tokens=12, do_sample=True, top_k=0,
                                 num_return_sequences=3, output_logits=True,
                                 return_dict_in_generate=True, **kwargs)
        return out.sequences, torch.stack(out.logits)

    reference = sample()
    cache = PagedCache(model, kv)
    after_prefill = []

    def look(module, args, kwargs):
        if not after_prefill and cache.lengths and cache.lengths[0] == 21:
            after_prefill.append(blocks_used_and_held(kv, cache.ids))

    hook = model.register_forward_pre_hook(look, with_kwargs=True)
    try:
        paged = sample(past_key_values=cache)
    finally:
        hook.remove()
        cache.finish()
    assert_same_generation(reference, paged)
    assert after_prefill == [(2 * 2, 6 * 2)]  # 2 blocks a prompt, held by its 3 rows
    assert kv.stats()["copy_on_write"] > 0  # the rows diverged in the shared partial block
    kv.check_invariants()


def test_batch_repeat_interleave_and_select_equal_dynamic_cache():
    """The Cache API by hand: a prefilled row repeated three times, a step where the copies
    read the same token (written once), one where they diverge (copy-on-write), a selection
    that drops a row and repeats another (erase, fork); logits as DynamicCache's each step."""
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=64)
    steps = [torch.tensor([[5], [5], [5]]), torch.tensor([[6], [7], [8]]),
             torch.tensor([[9], [9], [10]])]

    def run(cache):
        logits, shared = [], []
        with torch.no_grad():
            logits.append(model(input_ids=prompt(21), past_key_values=cache).logits[:, -1])
            cache.batch_repeat_interleave(3)
            for i, step in enumerate(steps):
                if i == 2:
                    cache.batch_select_indices(torch.tensor([2, 0, 0]))
                logits.append(model(input_ids=step, past_key_values=cache).logits[:, -1])
                if isinstance(cache, PagedCache):
                    shared.append(blocks_used_and_held(kv, cache.ids))
        return logits, shared

    reference, _ = run(transformers.DynamicCache(config=model.config))
    cache = PagedCache(model, kv)
    paged, shared = run(cache)
    cache.finish()
    for ref, got in zip(reference, paged):
        assert (ref.expand_as(got) - got).abs().max().item() <= LOGIT_TOLERANCE
    # 22 tokens in all three rows, one write: 2 blocks; then each row's second block its own
    # (copy-on-write); then rows 1 and 2 continue row 0 and diverge, and the sequence of the
    # row left out is erased: still 1 shared + 3 (5 if the dropped row had been kept).
    assert shared == [(2, 6), (4, 6), (4, 6)], shared
    kv.check_invariants()


def test_generate_raises_when_pagedkv_drops_a_row_it_cannot_recompute():
    """Another request on the shared cache needs the whole pool mid-generation: pagedkv drops
    the inactive row. generate() cannot recompute it, so the next step raises, naming the
    way out, instead of attending over missing K/V."""
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=8)
    cache = PagedCache(model, kv)
    forwards = [0]

    def other_request(module, args, kwargs):
        forwards[0] += 1
        if forwards[0] == 3:
            kv.add_sequence(7, list(range(8 * 16)))
            kv.reserve(7, 8 * 16)

    hook = model.register_forward_pre_hook(other_request, with_kwargs=True)
    try:
        with pytest.raises(SequenceEvictedError, match="dropped by pagedkv.*PagedGenerator"):
            generate(model, prompt(21), 10, past_key_values=cache)
    finally:
        hook.remove()
        cache.finish()
    assert kv.stats()["sequences_evicted"] == 1
    kv.erase(7)
    kv.check_invariants()


@pytest.mark.parametrize("make, blocks", [(llama, 8), (mistral, 5), (gemma3, 6)],
                         ids=["llama", "mistral", "gemma3"])
def test_the_driver_recomputes_the_requests_pagedkv_evicted(make, blocks):
    """8 requests through a pool that holds about two: admitting one makes pagedkv drop
    another (drain_evicted_sequences), a decode step that does not fit sends the latest back
    (preempted); both are recomputed from their prompt and the tokens they had. Every request
    still gets exactly transformers' own generation."""
    model = make()
    kv = kv_cache_for(model.config, num_device_blocks=blocks)
    prompts = [prompt(9 + 5 * i, seed=10 + i)[0].tolist() for i in range(8)]
    poison(kv, model.config.num_hidden_layers)
    references = [generate(model, torch.tensor([p]), 20) for p in prompts]
    generator = PagedGenerator(model, kv)
    tokens, logits = generator.generate(prompts, 20, return_logits=True)
    for p, reference, new, step_logits in zip(prompts, references, tokens, logits):
        assert_same_generation(reference, (torch.tensor([p + new]), step_logits[:, None]))
    stats = generator.stats
    assert stats["evicted"] > 0 and stats["recomputed"] >= stats["evicted"], stats
    assert stats["recomputed"] == stats["evicted"] + stats["preempted"], stats
    counts = kv.group(0).stats() if isinstance(kv, pagedkv.ModelKvCache) else kv.stats()
    assert counts["sequences_evicted"] == stats["evicted"]
    kv.check_invariants()


def test_the_driver_under_pressure_with_a_host_tier_offloads_and_restores():
    model = llama()
    kv = kv_cache_for(model.config, num_device_blocks=8, num_host_blocks=16)
    prompts = [prompt(9 + 5 * i, seed=10 + i)[0].tolist() for i in range(8)]
    poison(kv, model.config.num_hidden_layers)
    references = [generate(model, torch.tensor([p]), 20) for p in prompts]
    generator = PagedGenerator(model, kv)
    tokens = generator.generate(prompts, 20)
    for p, reference, new in zip(prompts, references, tokens):
        assert torch.equal(torch.tensor([p + new]), reference[0])
    assert kv.stats()["sequences_offloaded"] > 0 and kv.stats()["sequences_restored"] > 0
    assert generator.stats["evicted"] == 0  # moved to the host, not dropped
    kv.check_invariants()
