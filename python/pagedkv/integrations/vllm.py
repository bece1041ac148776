"""pagedkv's storage tier as a vLLM secondary offloading tier (docs/integrations.md).

vLLM 0.33's tiered offloading keeps a CPU primary tier and cascades every chunk it stores to its
secondary tiers; a chunk that only a secondary tier holds is promoted back through the primary
tier. `PagedKvTier` is such a tier over a pagedkv store (a `FileTier` directory or a Redis
server): checksummed blocks whose keys carry the layout, so a store written by another model,
dtype, block size or parallelism is never read. vLLM loads it without a fork:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "PagedKvTier", "module_path": "pagedkv.integrations.vllm",
                             "backend": "file", "directory": "/mnt/kv"}]}}'

Every call is cheap on the scheduler thread: `lookup` asks the store's index, stores and loads
are queued on the store's own I/O threads and collected in `get_finished_jobs`. Imported only
where vLLM is installed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterable, List, Optional, Sequence

import numpy as np
from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadingEvent, OffloadKey,
                                     ReqContext, RequestOffloadingContext)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from .. import FileTier, RedisTier, ResourceExhaustedError, StorageLayout
from ..errors import InvalidArgumentError, StatusCode

logger = logging.getLogger(__name__)


def store_key(key: OffloadKey) -> bytes:
    """The store's 128-bit key of a vLLM key (block hash bytes and group index): a BLAKE2b
    digest, so keys of any length fit and 10^9 chunks collide with odds near 10^-21."""
    return hashlib.blake2b(bytes(key), digest_size=16).digest()


def layout_digest(offloading_spec: Any, chunk_bytes: int) -> str:
    """What makes a chunk's bytes what they are, from vLLM's offloading config: model, dtype,
    block and chunk sizes, KV groups, cache layout and parallelism. Chunks of runs whose digests
    differ never meet in one store."""
    try:
        config = offloading_spec.config
        parallel = config.parallel
        fields = {
            "engine": "vllm",
            "model": config.model.name,
            "dtype": str(config.model.dtype),
            "tokens_per_hash": config.cache.tokens_per_hash,
            "blocks_per_chunk": config.cache.blocks_per_chunk,
            "groups": [[g.tokens_per_block, list(g.layer_names)] for g in config.groups],
            "kv_cache_layout": str(config.kv_cache_layout),
            "canonical_layout": bool(config.canonical_layout),
            "parallel": [parallel.tp_size, parallel.pp_size, parallel.pcp_size, parallel.dcp_size],
            "chunk_bytes": chunk_bytes,
        }
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))
    except (AttributeError, TypeError) as e:
        raise InvalidArgumentError(
            StatusCode.INVALID_ARGUMENT,
            f"the offloading config does not describe the chunks' layout ({e}): give the tier a "
            "'digest' naming it") from e


@dataclass
class _Pending:
    job: TransferJob
    keys: List[OffloadKey]  # those the store job moves
    is_store: bool
    started: float


class PagedKvTier(SecondaryTierManager):
    """A vLLM secondary tier over a pagedkv store.

    Tier options (the JSON of its `secondary_tiers` entry): `backend` "file" (with `directory`,
    `max_bytes`, `fsync`, `direct_io`, `direct_read_depth`: 8 by default, so that a promotion of
    chunks the page cache does not hold reads them with O_DIRECT straight into the primary tier's
    page-aligned rows) or "redis" (with `host`, `port`, `key_prefix`, `timeout_ms`);
    `threads` and `max_queued_blocks` for either; `digest` to name the chunks' layout yourself
    (default: from the offloading config); `locality` "LOCAL"/"REMOTE" for the events. Options
    this version does not know are logged and ignored, so a newer vLLM's extra arguments do not
    stop the engine."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, *, backend: str = "file",
                 directory: Optional[str] = None, max_bytes: int = 0, fsync: bool = False,
                 direct_io: bool = False, direct_read_depth: int = 8,
                 host: str = "127.0.0.1", port: int = 6379, key_prefix: str = "pagedkv",
                 timeout_ms: int = 1000, threads: int = 2, max_queued_blocks: int = 4096,
                 digest: Optional[str] = None, locality: Optional[str] = None,
                 **unknown: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        if unknown:
            logger.warning("PagedKvTier: ignoring options it does not know: %s",
                           ", ".join(sorted(unknown)))
        if locality is not None:
            from vllm.v1.kv_offload.base import Locality
            self.locality = Locality(locality)
        rows = np.asarray(primary_kv_view)  # shares the memory: row c is chunk c
        self._base = rows.ctypes.data
        self._stride = rows.strides[0]
        self._num_chunks = rows.shape[0]
        chunk_bytes = self.block_size_bytes
        layout = StorageLayout.opaque(chunk_bytes,
                                      digest or layout_digest(offloading_spec, chunk_bytes))
        if backend == "file":
            if not directory:
                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                           "directory: the file backend needs one")
            self._store = FileTier(layout, directory, max_bytes=max_bytes, fsync=fsync,
                                   max_queued_blocks=max_queued_blocks, threads=threads,
                                   direct_io=direct_io, direct_read_depth=direct_read_depth)
        elif backend == "redis":
            self._store = RedisTier(layout, host=host, port=port, timeout_ms=timeout_ms,
                                    key_prefix=key_prefix, max_queued_blocks=max_queued_blocks,
                                    threads=threads)
        else:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"backend: 'file' or 'redis', not {backend!r}")
        self._pending: Dict[int, _Pending] = {}  # by store job id
        self._finished: List[JobResult] = []  # decided without the store (nothing to move)
        self._events: List[OffloadingEvent] = []

    @property
    def store(self):
        """The pagedkv store (FileTier or RedisTier) under this tier."""
        return self._store

    def _rows(self, chunk_ids: Sequence[int]) -> List[int]:
        ids = [int(c) for c in chunk_ids]
        for c in ids:
            if not 0 <= c < self._num_chunks:
                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                           f"chunk id {c} outside the primary tier's "
                                           f"{self._num_chunks} chunks")
        return [self._base + c * self._stride for c in ids]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self._store.batch_exists([store_key(key)]) else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        chunks = list(job_metadata.chunk_ids)
        # Chunks the store holds already are not written again.
        held = self._store.exists_each([store_key(k) for k in keys])
        todo = [i for i, h in enumerate(held) if not h]
        if not todo:
            self._finished.append(JobResult(job_metadata.job_id, True, transfer_time=0.0,
                                            transfer_bytes=0))
            return
        moved = [keys[i] for i in todo]
        try:
            # Borrowed: the store's threads read the primary tier's rows, which vLLM keeps
            # unchanged until this job's result is reported (get_finished_jobs).
            job = self._store.submit_put_borrowed([store_key(k) for k in moved],
                                                  self._rows([chunks[i] for i in todo]))
        except ResourceExhaustedError:  # the write queue is full: this cascade is dropped
            self._finished.append(JobResult(job_metadata.job_id, False))
            return
        self._pending[job] = _Pending(job_metadata, moved, True, time.monotonic())

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        job = self._store.submit_get([store_key(k) for k in keys],
                                     self._rows(job_metadata.chunk_ids))
        self._pending[job] = _Pending(job_metadata, keys, False, time.monotonic())

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results, self._finished = self._finished, []
        for c in self._store.poll():
            p = self._pending.pop(c["job"], None)
            if p is None:
                continue  # a removal's job
            elapsed = time.monotonic() - p.started
            if p.is_store:
                if c["ok"]:
                    self._events.append(OffloadingEvent(keys=p.keys, medium=self.medium,
                                                        removed=False, locality=self.locality))
                else:
                    logger.warning("PagedKvTier: storing %d chunks failed: %s", len(p.keys),
                                   c["error"])
                results.append(JobResult(p.job.job_id, c["ok"], transfer_time=elapsed,
                                         transfer_bytes=len(p.keys) * self.block_size_bytes
                                         if c["ok"] else 0))
            else:
                good = c["blocks_ok"]
                results.append(JobResult(
                    p.job.job_id, c["ok"],
                    successful_keys=None if c["ok"] else p.keys[:good],
                    transfer_time=elapsed, transfer_bytes=good * self.block_size_bytes))
        return results

    def has_pending_work(self) -> bool:
        return bool(self._pending or self._finished)

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        self._store.drain()

    def shutdown(self) -> None:
        self._store.drain()


__all__ = ["PagedKvTier", "layout_digest", "store_key"]
