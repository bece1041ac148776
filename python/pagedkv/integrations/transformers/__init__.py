"""pagedkv as the KV cache of a Hugging Face transformers model (docs/transformers.md).

    from pagedkv.integrations.transformers import PagedCache, kv_cache_for
    kv = kv_cache_for(model.config, num_device_blocks=4096, dtype="fp32")   # shared by requests
    cache = PagedCache(model, kv)
    cache.add(input_ids)                   # prefix hit: generate() computes only the suffix
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32)
    cache.finish()                         # full blocks stay cached for the next request

Each row of the batch is one pagedkv sequence. A forward step reserves the step's slots of
every row in one `reserve_batch`, each layer writes its new K/V through one `write_kv_batch`
and reads the layer's K/V back from the pool (a gather over a zero-copy DLPack view of it),
and the step ends with one `commit_batch` of the tokens the model read. The token ids come
from a forward pre-hook on the model: transformers hands a cache K/V but never the tokens,
and pagedkv's prefix index is keyed by tokens. Beam search and repeated rows are pagedkv's
fork (rows share blocks, copy-on-write); PagedGenerator recomputes a request whose sequence
pagedkv dropped to make room.

Needs torch and transformers (tested: torch 2.14.0, transformers 5.20.2, scripts/test-integrations).

One job a module: shape (model config -> pool shape, kv_cache_for), layer (PagedLayer), cache
(PagedCache), attention (the "pagedkv" attention function), driver (PagedGenerator).
"""
from .attention import ATTENTION, paged_attention, register_attention
from .cache import PagedCache, SequenceEvictedError
from .driver import PagedGenerator
from .layer import PagedLayer
from .shape import kv_cache_for, model_shape, pool_dtype

__all__ = ["ATTENTION", "PagedCache", "PagedGenerator", "PagedLayer", "SequenceEvictedError",
           "kv_cache_for", "model_shape", "paged_attention", "pool_dtype", "register_attention"]
