#!/usr/bin/env bash
# Regenerates python/pagedkv/_C.pyi from a built extension (nanobind's stubgen), then gives the
# calls that return nb::object or a bare tuple their real types.
#   bash bindings/python/make_stubs.sh <dir holding the pagedkv package with _C built in>
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out="$repo/python/pagedkv/_C.pyi"
PYTHONPATH="$1" python3 -m nanobind.stubgen -q -P -m pagedkv._C -o "$out"
sed -i \
  -e 's/\(def build_batch(.*\)) -> object:/\1) -> Batch:/' \
  -e 's/\(def build_vllm_batch_into(.*\)) -> object:/\1) -> Batch:/' \
  -e 's/\(def build_batch_into(.*\)) -> tuple:/\1) -> tuple[Batch, NDArray[numpy.int32], NDArray[numpy.int32]]:/' \
  -e 's/\(def append_indices(.*\)) -> tuple:/\1) -> tuple[NDArray[numpy.int32], NDArray[numpy.int32], NDArray[numpy.int32]]:/' \
  -e 's/\(def stats(self)\) -> dict:/\1 -> dict[str, Any]:/' \
  -e 's/\(def write_kv_batch(self, batch: \)object,/\1ModelBatch,/' \
  -e 's/\(def write_kv_batch_all_layers(self, batch: \)object,/\1ModelBatch,/' \
  -e 's/\(def groups(self)\) -> list\[object\]:/\1 -> list[Batch]:/' \
  -e 's/\(def __getitem__(self, group: int)\) -> object:/\1 -> Batch:/' \
  -e 's/\(def pool_info(self)\) -> dict:/\1 -> dict[str, Any]:/' \
  -e 's/\(def counters(self)\) -> dict:/\1 -> dict[str, int]:/' \
  -e '/^class EventPublisher:/,/^class /s/\(def __enter__(self)\) -> object:/\1 -> EventPublisher:/' \
  -e 's/\(def regions(self)\) -> list:/\1 -> list[dict[str, Any]]:/' \
  -e 's/\(def to_dict(self)\) -> dict:/\1 -> dict[str, Any]:/' \
  -e '/^class _ModelKvCache:/,/^class /s/storage: object | None = None/storage: Sequence[StorageTier | None] | None = None/' \
  -e 's/storage: object | None = None/storage: StorageTier | None = None/' \
  -e 's/\(def storage(self)\) -> object:/\1 -> StorageTier | None:/' \
  -e 's/\(def storage(self)\) -> list:/\1 -> list[StorageTier | None]:/' \
  "$out"
grep -q '^from typing import.*\bAny\b' "$out" || sed -i '0,/^import /s//from typing import Any\nimport /' "$out"
grep -q '^import numpy' "$out" || sed -i '0,/^import /s//import numpy\nimport /' "$out"
echo "wrote $out"
