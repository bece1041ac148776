"""PagedCache: a transformers Cache over a pagedkv KvCache, one sequence per batch row. It admits
rows (prefix hits), forks repeated and reordered rows, and runs each forward step as one
reserve_batch, a write_kv_batch and a read of the pool a layer, and one commit_batch."""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional, Sequence

import torch
from transformers.cache_utils import Cache

import pagedkv

from .attention import ATTENTION, _tagged
from .layer import PagedLayer
from .shape import kv_cache_for, model_shape, pool_dtype

_next_id = itertools.count(1 << 40)  # far from ids a server picks by hand on a shared KvCache


class SequenceEvictedError(RuntimeError):
    """A row's pagedkv sequence was dropped to make room (its K/V are gone) and the caller cannot
    recompute it: generate() through a PagedCache. PagedGenerator recomputes such requests."""


class PagedCache(Cache):
    """A transformers Cache whose K/V live in a pagedkv KvCache, one sequence per batch row.

    PagedCache(model, kv=None, **kv_fields): `kv` is a KvCache or ModelKvCache made by
    kv_cache_for (shared between requests for prefix hits); None makes one from `kv_fields`
    (kv_cache_for's keywords, dtype defaulting to the model's). add(input_ids) admits the
    rows before generate() and returns the prefix hit; without it the first forward admits
    them and computes every token. finish() ends the rows (full blocks stay cached) and
    unhooks the model. Rows repeated (num_return_sequences, beams) or reordered (beam search)
    are pagedkv forks: they share blocks, copied on write.
    """

    def __init__(self, model: torch.nn.Module, kv: Any = None, **kv_fields: Any) -> None:
        shape = model_shape(model.config)
        if kv is None:
            kv_fields.setdefault("dtype", pool_dtype(model.dtype))
            kv = kv_cache_for(model.config, **kv_fields)
        self.kv = kv
        layers = [PagedLayer(self, i, w, t)
                  for i, (w, t) in enumerate(zip(shape["windows"], shape["types"]))]
        super().__init__(layers=layers)
        self.ids: list[Optional[int]] = []  # one pagedkv sequence per row; None: row ended
        self.lengths: list[int] = []   # committed tokens of each row
        self.rows: list[int] = []      # the rows a forward steps (select()); all by default
        self.prefix_hit = 0            # tokens the last add() took from the prefix cache
        self.computed_tokens = 0       # positions a row's K/V were computed for, over all steps
        self.evicted_rows = 0          # rows whose sequence pagedkv dropped to make room
        # Deferred forks, child row -> parent row: the child shares the parent's blocks from
        # the parent's next step on when both step the same tokens (the repeated rows of
        # num_return_sequences and beams), so that step writes the K/V once.
        self._forks: dict[int, int] = {}
        self._lost: list[int] = []
        self._tokens: Optional[torch.Tensor] = None
        self._mask: Any = None
        self._reserved: Optional[tuple] = None
        self._step = None
        self._in_place = False
        self._commit = None
        self._pools = [self._pool_views(layer) for layer in range(len(layers))]
        self._nhd = kv.config.page_layout == pagedkv.PageLayout.NHD
        model_cache = isinstance(kv, pagedkv.ModelKvCache)
        self._group = [kv.layer_group(i)[0] if model_cache else 0 for i in range(len(layers))]
        self._hook = model.register_forward_pre_hook(_weak_hook(self), with_kwargs=True)
        self._config = model.config
        # The decode kernel reads a uniform KvCache without windows (not a ModelKvCache).
        self._kernel_ok = not model_cache and not any(shape["windows"])

    # -- admission -----------------------------------------------------------------------------

    def add(self, input_ids: torch.Tensor, use_prefix_cache: bool = True) -> int:
        """Admits each row of `input_ids` [batch, len] as a new sequence and returns the tokens
        every row takes from the prefix cache (rows are cut back to the shortest hit, since
        transformers runs one length for the whole batch). generate() then computes only the
        rest. A row equal to an earlier one (generate() repeats each prompt for
        num_return_sequences and beams) becomes a fork of it after the first step, which
        writes its K/V once. Raises if rows are already admitted."""
        if self.ids:
            raise RuntimeError("PagedCache.add: rows already admitted; finish() first")
        rows = input_ids.tolist()
        ids = [self._new_id() for _ in rows]
        first: dict = {}
        hits = []
        for r, (seq, row) in enumerate(zip(ids, rows)):
            parent = first.setdefault(tuple(row), r)
            if parent != r:
                self._forks[r] = parent
            else:
                hits.append((seq, self.kv.add_sequence(seq, row)))
        hit = min(h for _, h in hits) if use_prefix_cache else 0
        for seq, h in hits:
            if h > hit:
                self.kv.rollback(seq, hit)
        self.ids, self.lengths, self.prefix_hit = ids, [hit] * len(ids), hit
        self.rows = list(range(len(ids)))
        return hit

    def add_row(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Admits one more request as a new row (the driver's way: rows of different lengths);
        returns (row, tokens its prompt takes from the prefix cache). select() it to prefill.
        A prompt cached whole is cut back by one token: its forward needs a token to compute."""
        self._flush()
        prompt = list(prompt)
        seq = self._new_id()
        hit = self.kv.add_sequence(seq, prompt)
        if prompt and hit >= len(prompt):
            hit = len(prompt) - 1
            try:
                self.kv.rollback(seq, hit)
            except pagedkv.FailedPreconditionError:  # a window group released what that needs
                hit = 0
                self.kv.rollback(seq, hit)
        self.ids.append(seq)
        self.lengths.append(hit)
        return len(self.ids) - 1, hit

    def select(self, rows: Sequence[int]) -> None:
        """The rows the next forwards step, in this order (input_ids row i is rows[i])."""
        self.rows = list(rows)

    def reserve(self, new: int) -> None:
        """Reserves the next forward's `new` slots of every selected row now, so a caller that
        can recompute learns before running the model whether the step fits
        (ResourceExhaustedError, nothing changed) and which other rows pagedkv dropped to make
        room (lost_rows()). The forward must follow with the same rows."""
        self._reserve_rows(new, None)

    def lost_rows(self) -> list[int]:
        """Rows whose sequence pagedkv dropped to make room since the last call (their K/V are
        gone; the rows are ended). Another owner of the shared KvCache may have drained the
        report, so rows are also checked one by one."""
        self._note_victims(self.kv.drain_evicted_sequences())
        gone = [seq for r, seq in enumerate(self.ids)
                if seq is not None and r not in self._forks and not self.kv.contains(seq)]
        self._note_victims(gone)
        lost, self._lost = self._lost, []
        return lost

    def end_row(self, row: int, keep: bool = True) -> None:
        """Ends one row: finish() (keep: its full blocks stay cached for later prompts) or erase
        its sequence. The row index stays; it is never stepped again."""
        self._flush()
        self._fork_pending(parent=row)
        seq = self.ids[row]
        if row in self._forks:
            del self._forks[row]
        elif seq is not None and self.kv.contains(seq):
            (self.kv.finish if keep else self.kv.erase)(seq)
        self.ids[row] = None

    @property
    def length(self) -> int:
        """Committed tokens of the stepped rows when they agree (what transformers asks for);
        the longest otherwise (then the caller passes position_ids and masks)."""
        return max((self.lengths[r] for r in self.rows), default=0)

    def finish(self) -> None:
        """Ends every row (its full blocks stay in the prefix cache for later prompts) and
        removes the model hook. The cache is empty afterwards and can add() again."""
        self._flush()
        for r, seq in enumerate(self.ids):
            if seq is not None and r not in self._forks and self.kv.contains(seq):
                self.kv.finish(seq)
        self.ids, self.lengths, self.rows, self._step = [], [], [], None
        self._forks, self._reserved = {}, None
        self.close()

    def close(self) -> None:
        """Removes the forward hook (finish() does it too)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _new_id(self) -> int:
        """A sequence id no sequence of the shared KvCache has."""
        while True:
            i = next(_next_id)
            if not self.kv.contains(i):
                return i

    def _see_inputs(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook: keeps the step's token ids (commit needs them) and admits the rows
        on the first forward when add() was not called."""
        if kwargs.get("past_key_values") is not self:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise NotImplementedError("PagedCache needs input_ids (the prefix index is keyed by "
                                      "tokens); inputs_embeds alone are not supported")
        if not self.ids:
            self.add(input_ids, use_prefix_cache=False)
        self._tokens = input_ids
        self._mask = kwargs.get("attention_mask")

    # -- fork ------------------------------------------------------------------------------------

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeats every row `repeats` times in place (row r becomes rows r * repeats ...), as
        transformers' layers do for num_return_sequences: each copy is a fork of the row,
        sharing its blocks (copied on write), made when the rows next step different tokens."""
        if repeats < 1:
            raise ValueError(f"PagedCache.batch_repeat_interleave({repeats})")
        if repeats == 1:
            return
        self._flush()
        ids, lengths, forks = [], [], {}
        for r, seq in enumerate(self.ids):
            if seq is None:
                raise SequenceEvictedError(f"PagedCache: row {r} has no sequence to repeat")
            root = self._forks.get(r, r) * repeats  # the first copy of the row's root
            for copy in range(repeats):
                if len(ids) != root:
                    forks[len(ids)] = root
                ids.append(seq if copy == 0 else self._new_id())
                lengths.append(self.lengths[r])
        self._forks = forks
        self.ids, self.lengths, self.rows = ids, lengths, list(range(len(ids)))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i continues from row beam_idx[i]. The first row that picks a parent
        takes its sequence over, the others fork it (blocks shared, copied on write), and the
        rows no beam picked are erased: no K/V byte moves here."""
        self._select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keeps rows `indices` in that order (as transformers' layers do); the same as
        reorder_cache: repeats are forks, rows left out are erased."""
        self._select(indices)

    def _select(self, indices: Any) -> None:
        order = [int(i) for i in (indices.tolist() if hasattr(indices, "tolist") else indices)]
        if order == list(range(len(self.ids))):
            return
        self._flush()
        self._fork_pending()
        ids, taken = [], set()
        for old in order:
            seq = self.ids[old]
            if seq is None:
                raise SequenceEvictedError(f"PagedCache: row {old} has no sequence to select")
            if old in taken:
                child = self._new_id()
                self.kv.fork(seq, child)
                seq = child
            taken.add(old)
            ids.append(seq)
        for old, seq in enumerate(self.ids):
            if old not in taken and seq is not None and self.kv.contains(seq):
                self.kv.erase(seq)  # a dropped beam: nothing worth keeping cached
        self.lengths = [self.lengths[old] for old in order]
        self.ids, self.rows = ids, list(range(len(ids)))

    def _fork_pending(self, parent: Optional[int] = None, keep: Sequence[int] = ()) -> None:
        """Makes the deferred forks (of `parent` only, when given; but those in `keep`) now: a
        child then shares what its parent holds before the parent changes."""
        for child, p in list(self._forks.items()):
            if child in keep or (parent is not None and p != parent):
                continue
            self.kv.fork(self.ids[p], self.ids[child])
            del self._forks[child]

    def _riders(self, tokens: Optional[torch.Tensor]) -> list[int]:
        """The deferred children that ride this step on their parent's K/V: child and parent
        both stepped, with the same tokens (and attention mask). The others fork now."""
        if not self._forks:
            return []
        if tokens is None or not (self._mask is None or isinstance(self._mask, torch.Tensor)):
            return []
        at = {r: i for i, r in enumerate(self.rows)}
        riders = []
        for child, parent in self._forks.items():
            if child in at and parent in at:
                i, j = at[child], at[parent]
                same = torch.equal(tokens[i], tokens[j])
                if same and self._mask is not None:
                    same = self._mask.dim() == 2 and torch.equal(self._mask[i], self._mask[j])
                if same:
                    riders.append(child)
        return riders

    # -- the step --------------------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the step's K/V [batch, heads, new, dim] of layer `layer_idx` into the pool and
        returns the K/V the layer attends to, [batch, heads, visible, dim], read back from it.
        Layer 0 begins the step (reserve); the last layer ends it (commit)."""
        if layer_idx == 0:
            self._begin_step(key_states.shape[-2])
        self._write(layer_idx, key_states, value_states)
        if self._in_place:
            keys, values = _tagged(key_states, self, layer_idx), value_states
        else:
            keys, values = self._read(layer_idx, key_states.dtype)
        if layer_idx == len(self.layers) - 1:
            self._end_step()
        return keys, values

    def _reserve_rows(self, new: int, tokens: Optional[torch.Tensor]) -> None:
        """One reserve_batch of the stepped rows that own a sequence (riders use their
        parent's), after checking none was dropped; then notes the rows pagedkv dropped."""
        self._flush()
        riders = self._riders(tokens)
        self._fork_pending(keep=riders)
        missing = [r for r in self.rows if self.ids[r] is None
                   or (r not in self._forks and not self.kv.contains(self.ids[r]))]
        if missing:
            raise SequenceEvictedError(
                f"PagedCache: the sequences of rows {missing} were dropped by pagedkv to make "
                "room (another request's reserve on the shared cache); their K/V are gone and "
                "generate() cannot recompute them. Give the cache a host tier "
                "(num_host_blocks: rows are offloaded instead), a larger pool, or serve the "
                "requests through PagedGenerator, which recomputes them")
        owners = [i for i, r in enumerate(self.rows) if r not in self._forks]
        self.kv.reserve_batch([self.ids[self.rows[i]] for i in owners], new)
        self._note_victims(self.kv.drain_evicted_sequences())
        self._reserved = (list(self.rows), new, owners)

    def _note_victims(self, victims: Sequence[int]) -> None:
        """Ends the rows whose sequences are among `victims` (and children deferred on them)."""
        if not victims:
            return
        gone = set(victims)
        for r, seq in enumerate(self.ids):
            if seq in gone and r not in self._forks:
                self.ids[r] = None
                self._lost.append(r)
                self.evicted_rows += 1
        for child, parent in list(self._forks.items()):
            if self.ids[parent] is None:
                del self._forks[child]
                self.ids[child] = None
                self._lost.append(child)

    def _begin_step(self, new: int) -> None:
        """Reserves `new` slots in every row in one call (unless reserve() did) and builds the
        batch whose slot mapping the writes follow and whose block tables the reads follow."""
        if self._tokens is None or tuple(self._tokens.shape) != (len(self.rows), new):
            raise RuntimeError("PagedCache: the step's input_ids were not seen (call the model "
                               "with input_ids=... and past_key_values=cache)")
        reserved = self._reserved
        if reserved is None or reserved[0] != self.rows or reserved[1] != new:
            self._reserve_rows(new, self._tokens)
        owners = self._reserved[2]
        self._reserved = None
        ids = [self.ids[self.rows[i]] for i in owners]
        alone = len(owners) == len(self.rows)
        self._in_place = (alone and new == 1 and self._kernel_ok
                          and getattr(self._config, "_attn_implementation", None) == ATTENTION)
        batch = self.kv.build_batch(ids, csr=self._in_place)
        groups = batch.groups if isinstance(batch, pagedkv.ModelBatch) else [batch]
        tables = [torch.from_numpy(g.host.block_tables).long() for g in groups]
        if not alone:  # a rider reads its parent's table row
            at = {self.rows[i]: k for k, i in enumerate(owners)}
            pick = torch.tensor([at[self._forks.get(r, r)] for r in self.rows])
            tables = [t[pick] for t in tables]
            owners = torch.tensor(owners)
        self._step = (batch, tables, new, None if alone else owners)

    def _write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """One write_kv_batch of every row's new tokens: [batch, heads, new, dim] becomes the
        [tokens, heads, dim] rows the slot mapping lists (sequence after sequence); a rider's
        K/V are its parent's and are not written."""
        batch, _, _, owners = self._step
        if owners is not None:
            key, value = key[owners], value[owners]
        self.kv.write_kv_batch(batch, layer, _token_rows(key), _token_rows(value))

    def _read(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's visible K/V of every row, [batch, heads, visible, dim]: whole pages are
        gathered from the zero-copy pool views (one contiguous copy each), then sliced to the
        visible positions without a further copy."""
        _, tables, new, _ = self._step
        self.kv.synchronize()  # the CPU backend writes on a worker stream
        table = tables[self._group[layer]]
        keys, values = self._pools[layer]
        lengths = {self.lengths[r] for r in self.rows}
        if len(lengths) > 1:
            return (self._ragged(keys, table, layer, new).to(dtype),
                    self._ragged(values, table, layer, new).to(dtype))
        length = lengths.pop()
        start = self.layers[layer].first_visible(length)
        block_size = self.kv.config.block_size
        first, last = start // block_size, (length + new - 1) // block_size
        blocks = table[:, first:last + 1]
        begin = start - first * block_size
        return (self._pages(keys, blocks, begin, length + new - start).to(dtype),
                self._pages(values, blocks, begin, length + new - start).to(dtype))

    def visible(self, layer: int, new: int = 1) -> list[tuple[int, int]]:
        """(first position, count) each stepped row's attention sees at `layer` in a step of
        `new` tokens; rows of a ragged step are padded to the longest count (mask the rest)."""
        out = []
        for r in self.rows:
            start = self.layers[layer].first_visible(self.lengths[r])
            out.append((start, self.lengths[r] + new - start))
        return out

    def _ragged(self, pool: torch.Tensor, table: torch.Tensor, layer: int,
                new: int) -> torch.Tensor:
        """Rows of different lengths: each row's visible positions, left-aligned and padded to
        the longest, as [batch, heads, longest, dim] (the padding is zeros or a copy of a
        position of the row: mask it). When every row starts at the same offset in its first
        page (always for full attention) whole pages are copied; otherwise positions are
        gathered one by one."""
        spans = self.visible(layer, new)
        longest = max(count for _, count in spans)
        block_size = self.kv.config.block_size
        start = torch.tensor([s for s, _ in spans])[:, None]
        last = torch.tensor([s + c - 1 for s, c in spans])[:, None] // block_size
        count = torch.tensor([c for _, c in spans])[:, None]
        if len({s % block_size for s, _ in spans}) == 1:
            begin = spans[0][0] % block_size
            n = (begin + longest + block_size - 1) // block_size
            index = torch.minimum(start // block_size + torch.arange(n)[None, :], last)
            rows = self._pages(pool, table.gather(1, index), begin, longest)
            # A page's tail past the row's length was never written: whatever a reused block
            # held (NaN too) would reach the output through the masked weights (0 * NaN).
            padding = torch.arange(longest)[None, :] >= count
            return rows.masked_fill_(padding[:, None, :, None], 0) if padding.any() else rows
        pos = start + torch.minimum(torch.arange(longest)[None, :], count - 1)
        blocks = table.gather(1, pos // block_size)
        nhd = pool if self._nhd else pool.transpose(1, 2)  # [blocks, block_size, heads, dim]
        return nhd[blocks, pos % block_size].transpose(1, 2)

    def _pages(self, pool: torch.Tensor, blocks: torch.Tensor, begin: int,
               count: int) -> torch.Tensor:
        """Positions [begin, begin + count) of the pages `blocks` [batch, n] of one pool view,
        as [batch, heads, count, dim]."""
        pages = pool[blocks]  # [batch, n, block_size, heads, dim] (NHD) or [.., heads, bs, dim]
        b, n = blocks.shape
        if self._nhd:
            rows = pages.reshape(b, n * pages.shape[2], pages.shape[3], pages.shape[4])
            return rows[:, begin:begin + count].transpose(1, 2)
        heads = pages.transpose(1, 2).reshape(b, pages.shape[2], n * pages.shape[3], -1)
        return heads[:, :, begin:begin + count]

    def _end_step(self) -> None:
        """Commits the tokens the step read, row after row (full blocks enter the prefix index),
        then makes the riders' forks: they share the blocks just written."""
        _, _, new, owners = self._step
        tokens = self._tokens if owners is None else self._tokens[owners]
        stepped = self.rows if owners is None else [self.rows[i] for i in owners.tolist()]
        self._commit = ([self.ids[r] for r in stepped], tokens.reshape(-1).tolist(), new)
        if not self._in_place:  # else the last layer's attention still reads the batch
            self._flush()
        self._fork_pending()  # only riders are left deferred by now
        for r in self.rows:
            self.lengths[r] += new
        self.computed_tokens += new
        self._tokens = None

    def _flush(self) -> None:
        """Commits the last step's tokens if that is still to do (a commit makes the step's
        batch stale, so after in-place attention it waits for the next call)."""
        if self._commit is not None:
            self.kv.commit_batch(*self._commit)
            self._commit, self._step = None, None

    def _pool_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-copy torch views of one layer of the pool, [blocks, block_size, heads, dim] (NHD)
        or [blocks, heads, block_size, dim] (HND); a page is contiguous in either."""
        return tuple(torch.from_dlpack(a) for a in self.kv.layer_kv(layer))

    # -- what transformers asks ------------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens cached in the stepped rows (after add(): the prefix hit)."""
        return self.length

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        """-1: bounded by the pool, not by a fixed shape."""
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last `-tokens_to_remove` tokens of every row (assisted decoding takes back
        the draft tokens the model rejected): pagedkv's rollback, which frees blocks left empty
        and keeps full blocks other sequences share. A positive count is refused, as
        transformers' own layers do; 0 changes nothing."""
        if tokens_to_remove > 0:
            raise ValueError(f"PagedCache.crop({tokens_to_remove}): pass a negative count of "
                             "tokens to remove")
        if tokens_to_remove == 0:
            return
        self._flush()
        self._fork_pending()
        for r, seq in enumerate(self.ids):
            if seq is None:
                continue
            keep = max(0, self.lengths[r] + tokens_to_remove)
            self.kv.rollback(seq, keep)
            self.lengths[r] = keep


def _weak_hook(cache: PagedCache):
    """A forward pre-hook that calls cache._see_inputs while the cache lives: the model must not
    keep a cache (and its pool) alive after the caller dropped it without finish()."""
    ref = weakref.ref(cache)

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        target = ref()
        if target is not None:
            target._see_inputs(module, args, kwargs)

    return hook


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """[batch, heads, new, dim] as [batch * new, heads, dim] with each token's [heads, dim]
    contiguous (what write_kv_batch reads); a copy only when the strides are not already so."""
    b, h, n, d = x.shape
    rows = x.transpose(1, 2).reshape(b * n, h, d)
    if rows.stride(2) != 1 or rows.stride(1) != d:
        rows = rows.contiguous()
    return rows
