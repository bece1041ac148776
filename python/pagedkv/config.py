"""CacheConfig: the cache's shape, pools, element type, layout and policies, as a dataclass.

Fields mirror include/pagedkv/config.hpp. Enum fields take the enum or its name, any case
("fp16", "bf16", "fp32", "fp8"; "nhd"/"hnd"; "lru"; "cpu"/"cuda"/"auto").
"""
from __future__ import annotations

import dataclasses
from typing import Union

from . import _C

DType = _C.DType
PageLayout = _C.PageLayout
EvictionPolicy = _C.EvictionPolicy
BackendKind = _C.BackendKind
CacheMode = _C.CacheMode

_DTYPE_NAMES = {
    "fp16": DType.FLOAT16, "float16": DType.FLOAT16, "half": DType.FLOAT16,
    "bf16": DType.BFLOAT16, "bfloat16": DType.BFLOAT16,
    "fp32": DType.FLOAT32, "float32": DType.FLOAT32, "float": DType.FLOAT32,
    "fp8": DType.FLOAT8_E4M3, "fp8_e4m3": DType.FLOAT8_E4M3, "float8_e4m3": DType.FLOAT8_E4M3,
}


def _enum(kind, value, names=None):
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        key = value.lower()
        if names and key in names:
            return names[key]
        for member in kind.__members__.values():
            if member.name.lower() == key:
                return member
    from .errors import InvalidArgumentError, StatusCode

    raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                               f"{kind.__name__}: unknown value {value!r}")


@dataclasses.dataclass
class CacheConfig:
    """Everything needed to create a cache; KvCache(config) or KvCache(**fields)."""

    num_layers: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    block_size: int = 16
    num_device_blocks: int = 256
    num_host_blocks: int = 0
    dtype: Union[DType, str] = DType.FLOAT16
    page_layout: Union[PageLayout, str] = PageLayout.NHD
    mode: Union[CacheMode, str] = CacheMode.PAGED
    eviction_policy: Union[EvictionPolicy, str] = EvictionPolicy.LRU
    enable_prefix_caching: bool = True
    cache_prefixes_on_host: bool = True
    max_sequence_length: int = 1 << 20
    #: Tokens the next token attends to (0: full attention); blocks that fall out are released.
    sliding_window: int = 0
    backend: Union[BackendKind, str] = BackendKind.AUTO

    def _to_cpp(self) -> "_C._CacheConfig":
        c = _C._CacheConfig()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "dtype":
                value = _enum(DType, value, _DTYPE_NAMES)
            elif f.name == "page_layout":
                value = _enum(PageLayout, value)
            elif f.name == "mode":
                value = _enum(CacheMode, value)
            elif f.name == "eviction_policy":
                value = _enum(EvictionPolicy, value)
            elif f.name == "backend":
                value = _enum(BackendKind, value)
            try:
                setattr(c, f.name, value)
            except TypeError as e:
                from .errors import InvalidArgumentError, StatusCode

                raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                           f"{f.name}: {e}") from None
        return c
