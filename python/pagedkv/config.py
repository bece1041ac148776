"""CacheConfig and KvGroup: the cache's shape, pools, element type, layout and policies, and a
hybrid model's KV groups, as dataclasses.

Fields mirror include/pagedkv/config.hpp. Enum fields take the enum or its name, any case
("fp16", "bf16", "fp32", "fp8"; "nhd"/"hnd"; "lru"; "cpu"/"cuda"/"auto"; "kv"/"latent").
Values are checked in C++ when a cache is created: InvalidArgumentError names the field (and
the group: "groups[1] (window): sliding_window: ...").
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Union

from . import _C

DType = _C.DType
PageLayout = _C.PageLayout
EvictionPolicy = _C.EvictionPolicy
BackendKind = _C.BackendKind
CacheMode = _C.CacheMode
KvKind = _C.KvKind

_DTYPE_NAMES = {
    "fp16": DType.FLOAT16, "float16": DType.FLOAT16, "half": DType.FLOAT16,
    "bf16": DType.BFLOAT16, "bfloat16": DType.BFLOAT16,
    "fp32": DType.FLOAT32, "float32": DType.FLOAT32, "float": DType.FLOAT32,
    "fp8": DType.FLOAT8_E4M3, "fp8_e4m3": DType.FLOAT8_E4M3, "float8_e4m3": DType.FLOAT8_E4M3,
}

_KV_KIND_NAMES = {
    "kv": KvKind.KEY_VALUE, "key_value": KvKind.KEY_VALUE,
    "latent": KvKind.LATENT, "mla": KvKind.LATENT,
}


def _invalid(message: str):
    from .errors import InvalidArgumentError, StatusCode

    return InvalidArgumentError(StatusCode.INVALID_ARGUMENT, message)


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
    raise _invalid(f"{kind.__name__}: unknown value {value!r}")


def _fill(cpp, obj, convert, where=""):
    """Copies the dataclass `obj`'s fields into the C++ struct `cpp`; `convert(name, value)`
    maps a field's value (enum names to enums)."""
    for f in dataclasses.fields(obj):
        try:
            setattr(cpp, f.name, convert(f.name, getattr(obj, f.name)))
        except TypeError as e:
            raise _invalid(f"{where}{f.name}: {e}") from None
    return cpp


@dataclasses.dataclass
class KvGroup:
    """One KV group of a model (CacheConfig.groups): layers sharing a page shape and an
    attention window, held in their own pools. See docs/hybrid-models.md."""

    name: str = ""
    #: The model's layer indices in the group; every layer in exactly one group.
    layers: List[int] = dataclasses.field(default_factory=list)
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype: Union[DType, str] = DType.FLOAT16
    #: KvKind.KEY_VALUE ("kv") or KvKind.LATENT ("latent": one MLA vector per token, keys only).
    kv_kind: Union[KvKind, str] = KvKind.KEY_VALUE
    #: Latent groups: the rotary (kpe) part at the end of the latent.
    rope_dim: int = 0
    #: Tokens; 0 = full attention, else at least block_size.
    sliding_window: int = 0
    num_device_blocks: int = 0
    num_host_blocks: int = 0

    @classmethod
    def latent(cls, name: str, layers: Sequence[int], latent_dim: int, rope_dim: int,
               dtype: Union[DType, str] = DType.FLOAT16, **fields: Any) -> "KvGroup":
        """An MLA group: one latent vector of `latent_dim` elements per token (the last
        `rope_dim` the rotary part), keys only."""
        return cls(name=name, layers=list(layers), num_kv_heads=1, head_dim=latent_dim,
                   dtype=dtype, kv_kind=KvKind.LATENT, rope_dim=rope_dim, **fields)

    def _to_cpp(self, where: str = "") -> "_C._KvGroup":
        def convert(name, value):
            if name == "dtype":
                return _enum(DType, value, _DTYPE_NAMES)
            if name == "kv_kind":
                return _enum(KvKind, value, _KV_KIND_NAMES)
            if name == "layers":
                return list(value)
            return value

        return _fill(_C._KvGroup(), self, convert, where)


def _group_to_cpp(group: Any, index: int) -> "_C._KvGroup":
    where = f"groups[{index}]: "
    if isinstance(group, dict):  # dataclasses.asdict(config) turns the groups into dicts
        try:
            group = KvGroup(**group)
        except TypeError as e:
            raise _invalid(f"{where}{e}") from None
    if not isinstance(group, KvGroup):
        raise _invalid(f"{where}not a KvGroup: {group!r}")
    return group._to_cpp(where)


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
    #: KvKind.KEY_VALUE ("kv") or KvKind.LATENT ("latent": MLA, keys only, num_kv_heads 1).
    kv_kind: Union[KvKind, str] = KvKind.KEY_VALUE
    #: Latent caches: the rotary (kpe) part at the end of each latent vector.
    rope_dim: int = 0
    backend: Union[BackendKind, str] = BackendKind.AUTO
    #: The model as KV groups (ModelKvCache); empty: one group with the fields above.
    groups: List[KvGroup] = dataclasses.field(default_factory=list)

    def _to_cpp(self) -> "_C._CacheConfig":
        def convert(name, value):
            if name == "dtype":
                return _enum(DType, value, _DTYPE_NAMES)
            if name == "page_layout":
                return _enum(PageLayout, value)
            if name == "mode":
                return _enum(CacheMode, value)
            if name == "eviction_policy":
                return _enum(EvictionPolicy, value)
            if name == "backend":
                return _enum(BackendKind, value)
            if name == "kv_kind":
                return _enum(KvKind, value, _KV_KIND_NAMES)
            if name == "groups":
                if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                    raise _invalid(f"groups: a list of KvGroup, got {value!r}")
                return [_group_to_cpp(g, i) for i, g in enumerate(value)]
            return value

        return _fill(_C._CacheConfig(), self, convert)

    def with_pools(self, device_bytes: int, host_bytes: int, context: int) -> "CacheConfig":
        """A copy with the pools sized from byte budgets (C++ CacheConfig::with_pools): without
        groups the budgets in whole blocks; with groups each budget split so that every group
        fills at the same number of sequences of `context` tokens (at least one device block
        each). InvalidArgumentError for a negative budget or context < 1."""
        sized = self._to_cpp().with_pools(device_bytes, host_bytes, context)
        groups = [
            dataclasses.replace(g if isinstance(g, KvGroup) else KvGroup(**g),
                                num_device_blocks=cg.num_device_blocks,
                                num_host_blocks=cg.num_host_blocks)
            for g, cg in zip(self.groups, sized.groups)
        ]
        return dataclasses.replace(self, groups=groups,
                                   num_device_blocks=sized.num_device_blocks,
                                   num_host_blocks=sized.num_host_blocks)

    def rank_config(self, tp_size: int) -> "CacheConfig":
        """One tensor-parallel rank's part of the model (C++ rank_config): every K/V group with
        num_kv_heads / tp_size heads (a latent group whole), the same blocks. A worker process
        of a split-process deployment creates its KvCache from it (apply_step_plan).
        InvalidArgumentError for tp_size < 1 or heads that do not split."""
        part = self._to_cpp().rank_config(tp_size)
        groups = [
            dataclasses.replace(g if isinstance(g, KvGroup) else KvGroup(**g),
                                num_kv_heads=cg.num_kv_heads)
            for g, cg in zip(self.groups, part.groups)
        ]
        return dataclasses.replace(self, groups=groups, num_kv_heads=part.num_kv_heads)

    def blocks_per_sequence(self, context: int, group: Optional[int] = None) -> int:
        """Blocks a decoding sequence of `context` tokens holds in the config, or in group
        `group` of a model (a window group only those of its window)."""
        cpp = self._to_cpp()
        if group is None:
            if cpp.num_groups() > 1:
                raise _invalid("blocks_per_sequence: a model of several groups: name the group")
            group = 0
        return cpp.group_config(group).blocks_per_sequence(context)
