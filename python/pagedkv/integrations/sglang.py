"""pagedkv's storage tier as an SGLang HiCache storage backend (docs/integrations.md).

SGLang 0.5.23 loads out-of-tree storage without a fork:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "pagedkv",
        "module_path": "pagedkv.integrations.sglang", "class_name": "PagedKvStorage",
        "interface_v1": 1, "backend": "file", "directory": "/mnt/kv"}'

With `interface_v1` SGLang hands the backend host-pool page indices, and the pool turns them
into pointers (`get_page_buffer_meta`): one or more equal-sized pieces per page (K and V of a
page-first MHA pool, one latent piece for MLA). Each piece is one pagedkv block of an opaque
layout, so pages are read and written in place, checksummed, under a digest of the model,
pool shape and parallelism. Every call is synchronous, as SGLang's backup and prefetch threads
expect; the I/O itself runs on the store's threads. Imported only where SGLang is installed.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from .. import FileTier, RedisTier, StorageLayout
from ..errors import FailedPreconditionError, InvalidArgumentError, StatusCode


class PagedKvStorage(HiCacheStorage):
    """A HiCache storage backend over a pagedkv store. Extra-config keys: `backend` "file"
    (`directory`, `max_bytes`, `fsync`, `direct_io`, `direct_read_depth`) or "redis" (`host`,
    `port`, `key_prefix`, `timeout_ms`), `threads`, `max_queued_blocks`, `digest` (names the page layout yourself)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        self.options: Dict[str, Any] = dict(storage_config.extra_config or {})
        if self.options.get("backend", "file") not in ("file", "redis"):
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"backend: 'file' or 'redis', not "
                                       f"{self.options['backend']!r}")
        if self.options.get("backend", "file") == "file" and not self.options.get("directory"):
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       "directory: the file backend needs one")
        self._store = None  # made when the host pool is registered: it fixes the block size
        self._pieces = 0  # pointers per page

    # ---- set-up ----

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        page = mem_pool_host.page_size
        import torch
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
        if not sizes or len(set(sizes)) != 1:
            raise InvalidArgumentError(
                StatusCode.INVALID_ARGUMENT,
                f"the host pool's pages are pieces of sizes {sorted(set(sizes))}: pagedkv stores "
                "pages whose pieces have one size")
        self._pieces = len(ptrs)
        layout = StorageLayout.opaque(int(sizes[0]), self.options.get("digest")
                                      or self._digest(mem_pool_host, int(sizes[0])))
        o = self.options
        common = dict(max_queued_blocks=o.get("max_queued_blocks", 4096),
                      threads=o.get("threads", 2))
        if o.get("backend", "file") == "file":
            self._store = FileTier(layout, o["directory"], max_bytes=o.get("max_bytes", 0),
                                   fsync=o.get("fsync", False),
                                   direct_io=o.get("direct_io", False),
                                   direct_read_depth=o.get("direct_read_depth", 0), **common)
        else:
            self._store = RedisTier(layout, host=o.get("host", "127.0.0.1"),
                                    port=o.get("port", 6379),
                                    key_prefix=o.get("key_prefix", "pagedkv"),
                                    timeout_ms=o.get("timeout_ms", 1000), **common)

    def _digest(self, pool: Any, piece_bytes: int) -> str:
        c = self.config
        fields = {
            "engine": "sglang", "model": c.model_name, "layout": getattr(pool, "layout", None),
            "page_size": pool.page_size, "dtype": str(getattr(pool, "dtype", None)),
            "layers": getattr(pool, "layer_num", None), "heads": getattr(pool, "head_num", None),
            "head_dim": getattr(pool, "head_dim", None), "pieces": self._pieces,
            "piece_bytes": piece_bytes, "mla": c.is_mla_model,
            # An MHA rank holds its own heads; MLA ranks hold the same latents (one writer).
            "tp": [c.tp_size, None if c.is_mla_model else c.tp_rank],
            "pp": [c.pp_size, c.pp_rank], "dcp": [c.dcp_size, c.dcp_rank],
        }
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)

    @property
    def store(self):
        """The pagedkv store (FileTier or RedisTier), once the host pool is registered."""
        return self._store

    # ---- interface_v1 ----

    def _keys(self, keys: List[str]) -> List[bytes]:
        # 128 bits per piece: SGLang's page hash (64 hex digits) and the piece's index.
        return [hashlib.blake2b(f"{k}\0{piece}".encode(), digest_size=16).digest()
                for k in keys for piece in range(self._pieces)]

    def _ready(self) -> None:
        if self._store is None:
            raise FailedPreconditionError(StatusCode.FAILED_PRECONDITION,
                                          "register_mem_pool_host first: the host pool fixes "
                                          "the page size")

    def _wait(self, job: int) -> dict:
        """The completion of `job`: the store's wait blocks without the GIL and takes this job's
        completion only (never poll(), so other threads' jobs stay theirs)."""
        return self._store.wait([job])[0]

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        self._ready()
        return self._store.batch_exists(self._keys(keys)) // self._pieces

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        self._ready()
        if not keys:
            return []
        if not self.config.is_storage_writer:
            return [True] * len(keys)  # an MLA replica: the writer rank stores the latents
        ptrs, _ = self.mem_pool_host.get_page_buffer_meta(host_indices)
        # Borrowed: the call waits for the job, so the pages stay as they are until it is done.
        done = self._wait(self._store.submit_put_borrowed(self._keys(keys), list(ptrs)))
        return [done["ok"]] * len(keys)

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Any = None) -> List[bool]:
        self._ready()
        if not keys:
            return []
        ptrs, _ = self.mem_pool_host.get_page_buffer_meta(host_indices)
        done = self._wait(self._store.submit_get(self._keys(keys), list(ptrs)))
        good_pages = done["blocks_ok"] // self._pieces
        return [i < good_pages for i in range(len(keys))]

    # ---- the tensor interface SGLang calls without interface_v1 ----

    def _v1_only(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("PagedKvStorage serves interface_v1 only: set "
                                  "\"interface_v1\": 1 in the backend's extra config")

    get = batch_get = set = batch_set = _v1_only

    def clear(self) -> None:
        """SGLang's cache reset: the store keeps its blocks (they stay valid: keys carry the
        layout and every block its checksum)."""

    def get_stats(self):
        return None


__all__ = ["PagedKvStorage"]
