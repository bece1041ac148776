"""PagedGenerator: serves many greedy requests through one model and one pagedkv cache (each
prefilled alone, all decoded in one ragged batch) and recomputes the ones evicted or preempted
under memory pressure."""
from __future__ import annotations

from collections import deque
from typing import Any, Optional, Sequence

import torch

import pagedkv

from .cache import PagedCache
from .shape import kv_cache_for, pool_dtype


class _Request:
    """One prompt in PagedGenerator: what it generated, and the cache row holding its K/V."""

    def __init__(self, index: int, prompt: list) -> None:
        self.index = index
        self.prompt = prompt
        self.tokens: list[int] = []
        self.logits: list[torch.Tensor] = []
        self.row: Optional[int] = None
        self.admissions = 0


class PagedGenerator:
    """Serves many prompts through one model and one pagedkv cache, greedy. Requests are
    admitted in order, each prefilled alone (computing only what its cached prefix lacks), and
    every admitted request decodes in one batch whatever its length (one reserve_batch,
    build_batch and commit_batch a step, one write_kv_batch a layer), with the masks and
    positions that rows of different lengths need. PagedGenerator(model, kv=None,
    **kv_fields), as PagedCache.

    Under memory pressure a pool smaller than the requests together is enough: a request whose
    sequence pagedkv dropped to make room (drain_evicted_sequences) goes back to the queue, and
    so does the latest admitted one when a decode step does not fit (it is finished, so its
    full blocks stay cached); either is recomputed later by prefilling its prompt and what it
    generated so far, with any prefix hit. `stats` counts what happened in the last generate().
    """

    def __init__(self, model: torch.nn.Module, kv: Any = None, **kv_fields: Any) -> None:
        if kv is None:
            kv_fields.setdefault("dtype", pool_dtype(model.dtype))
            kv = kv_cache_for(model.config, **kv_fields)
        self.model = model
        self.kv = kv
        self.prefix_hits: list[int] = []  # tokens each prompt of the last generate() reused
        self.stats: dict = {}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 return_logits: bool = False) -> Any:
        """The max_new_tokens greedy tokens of every prompt (a list of lists); with
        return_logits, also each request's [max_new_tokens, vocab] logits. Every request ends
        with finish(): its full blocks stay cached for later prompts. ResourceExhaustedError
        when one request alone does not fit the pool."""
        if max_new_tokens < 1:
            raise ValueError("PagedGenerator.generate: max_new_tokens must be at least 1")
        requests = [_Request(i, list(p)) for i, p in enumerate(prompts)]
        self.prefix_hits = [0] * len(requests)
        # evicted: dropped by pagedkv; preempted: taken out by the driver when a decode step
        # did not fit; recomputed: prefills of either kind, with the tokens they computed.
        self.stats = dict(evicted=0, preempted=0, recomputed=0, recomputed_tokens=0,
                          recompute_hit_tokens=0)
        waiting, running = deque(requests), []
        # Once the pool is full (a request dropped or preempted), admitting more before one
        # finishes would only push another out: each re-admission recomputes a request.
        self._full = False
        cache = PagedCache(self.model, self.kv)
        try:
            with torch.no_grad():
                while waiting or running:
                    if not (self._full and running):
                        self._admit(cache, waiting, running, max_new_tokens)
                    if running:
                        self._decode(cache, waiting, running, max_new_tokens)
        finally:
            cache.finish()
        tokens = [r.tokens for r in requests]
        if return_logits:
            return tokens, [torch.stack(r.logits) for r in requests]
        return tokens

    def _admit(self, cache: PagedCache, waiting: deque, running: list, max_new: int) -> None:
        """Prefills waiting requests in order until one does not fit or one's reserve made
        pagedkv drop another (then the running ones decode before more are admitted)."""
        while waiting:
            request = waiting[0]
            context = request.prompt + request.tokens
            row, hit = cache.add_row(context)
            cache.select([row])
            try:
                cache.reserve(len(context) - hit)
            except pagedkv.ResourceExhaustedError:
                cache.end_row(row)
                if not running:
                    raise  # alone it does not fit the pool
                self._full = True
                return
            waiting.popleft()
            if request.admissions:
                self.stats["recomputed"] += 1
                self.stats["recomputed_tokens"] += len(context) - hit
                self.stats["recompute_hit_tokens"] += hit
            else:
                self.prefix_hits[request.index] = hit
            request.admissions += 1
            request.row = row
            running.append(request)
            out = self.model(input_ids=torch.tensor([context[hit:]]), past_key_values=cache,
                             use_cache=True)
            self._emit(cache, request, out.logits[0, -1], running, max_new)
            if self._requeue_lost(cache, waiting, running):
                return

    def _decode(self, cache: PagedCache, waiting: deque, running: list, max_new: int) -> None:
        """One batched decode step of every running request. When it does not fit, the latest
        admitted request goes back to the queue (finished: its full blocks stay cached and
        evictable) until it does."""
        while True:
            self._requeue_lost(cache, waiting, running)
            if not running:
                return
            cache.select([r.row for r in running])
            try:
                cache.reserve(1)
                break
            except pagedkv.ResourceExhaustedError:
                if len(running) == 1:
                    raise
                victim = running.pop()
                cache.end_row(victim.row)
                self.stats["preempted"] += 1
                self._full = True
                _requeue(waiting, victim)
        input_ids = torch.tensor([[r.tokens[-1]] for r in running])
        positions = torch.tensor([[cache.lengths[r]] for r in cache.rows])
        out = self.model(input_ids=input_ids, position_ids=positions,
                         attention_mask=self._masks(cache), past_key_values=cache, use_cache=True)
        for request, logits in zip(list(running), out.logits[:, -1]):
            self._emit(cache, request, logits, running, max_new)

    def _emit(self, cache: PagedCache, request: _Request, logits: torch.Tensor, running: list,
              max_new: int) -> None:
        """Appends the step's greedy token; a request with all its tokens is finished."""
        request.logits.append(logits)
        request.tokens.append(int(logits.argmax()))
        if len(request.tokens) == max_new:
            cache.end_row(request.row)
            running.remove(request)
            self._full = False

    def _requeue_lost(self, cache: PagedCache, waiting: deque, running: list) -> bool:
        """Sends the running requests whose sequences pagedkv dropped back to the queue."""
        lost = set(cache.lost_rows())
        for request in [r for r in running if r.row in lost]:
            running.remove(request)
            self.stats["evicted"] += 1
            _requeue(waiting, request)
        self._full = self._full or bool(lost)
        return bool(lost)

    def _masks(self, cache: PagedCache) -> Any:
        """Additive 4D masks [batch, 1, 1, longest] of a decode step, one per layer type (a
        dict, as hybrid models take it; one tensor for a one-type model): 0 over each row's
        visible positions, the dtype's minimum over its padding. transformers uses a 4D mask
        as given, so it never needs one length for the whole batch."""
        dtype = self.model.dtype
        masks = {}
        for layer in cache.layers:
            if layer.layer_type in masks:
                continue
            counts = torch.tensor([count for _, count in cache.visible(layer.layer, 1)])
            longest = int(counts.max())
            padding = torch.arange(longest)[None, :] >= counts[:, None]
            mask = torch.zeros(len(counts), 1, 1, longest, dtype=dtype)
            masks[layer.layer_type] = mask.masked_fill(padding[:, None, None, :],
                                                       torch.finfo(dtype).min)
        return masks.popitem()[1] if len(masks) == 1 else masks


def _requeue(waiting: deque, request: _Request) -> None:
    """Puts a request back in the queue in arrival order (ahead of the ones never admitted)."""
    request.row = None
    at = next((i for i, w in enumerate(waiting) if w.index > request.index), len(waiting))
    waiting.insert(at, request)
