// Validation and launch helpers shared by the data-plane ops (internal).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/paged_copy.hpp"
#include "pagedkv/ops.hpp"

namespace pagedkv::ops_detail {

/// The pool itself: non-null, aligned data, a valid layout (num_parts 2, or 1 with one head and
/// 0 < rope_dim < head_dim), blocks > 0, a known dtype.
Status validate_pool(const PoolRef& pool);
/// A non-null device pointer aligned to `alignment` bytes; `name` goes into the message.
Status validate_pointer(const void* p, size_t alignment, const char* name);
/// 0 <= layer < num_layers.
Status validate_layer(const PoolRef& pool, int32_t layer, const char* name);
/// Scales are for fp8 pools with a non-fp8 other side, with non-null arrays.
Status validate_scales(const PoolRef& pool, DType other, const KvScales& scales);
/// The value tensor of an op that moves keys and values: a latent (MLA) pool takes none, so a
/// non-null `value` is kInvalidArgument; otherwise, when `needed` (the op moves tokens), a
/// non-null pointer aligned to `alignment` bytes.
Status validate_value(const PoolRef& pool, const void* value, bool needed, size_t alignment);
/// A dtype value that names one of the four element types.
Status validate_dtype(DType t, const char* name);

/// Adds (count - 1) * stride to `*reach`, the largest element offset a walk over a linear tensor
/// forms (count >= 1, stride >= 0; a count of 0 adds nothing). False, with `*reach` unspecified,
/// when a product or the sum overflows int64; nothing that can overflow is computed.
bool add_reach(int64_t count, int64_t stride, int64_t* reach);
/// The tensors at `a` and `b` (elements of `elem_size` bytes; `tensors` names them in the
/// message) are touched up to element offset `reach`: its byte offset must fit int64 and neither
/// pointer may run past the end of the address space. kInvalidArgument starting with `name`, the
/// argument that sets the extent.
Status validate_reach(const void* a, const void* b, size_t elem_size, int64_t reach,
                      const std::string& name, const char* tensors = "key/value");

/// The largest power of two <= 16 that divides every value (byte addresses and byte strides).
int choose_vec_bytes(std::initializer_list<uint64_t> values);

/// A planned PagedRowBody launch: the body with its launch-shape and conversion fields set, the
/// kernel that runs it (kPagedRowsRaw when no conversion applies, else kPagedRows) and the size
/// of its index space (0: nothing to launch).
struct PagedRowsPlan {
  kernels::PagedRowBody body;
  KernelId kernel = KernelId::kPagedRows;
  int64_t items = 0;
};

/// Plans a PagedRowBody whose other fields are set (a valid, validated op): `wide`, a whole row
/// per index; else rows in vector (or 8-element conversion) chunks over row_lanes(chunks, rows,
/// `resident_threads`) lanes. kInvalidArgument when the index space passes int64.
StatusOr<PagedRowsPlan> plan_paged_rows(kernels::PagedRowBody body, bool wide,
                                        int64_t resident_threads);

/// Plans the body for `backend` (its launch shape and resident threads) and launches it.
Status launch_paged_rows(Backend& backend, kernels::PagedRowBody body, Stream stream);

/// Two pools of whole blocks of `block_bytes` bytes: the source and destination of a block copy
/// (the same pool for copy-on-write). Both addresses must be device-accessible.
struct BlockCopyPools {
  char* dst = nullptr;
  int64_t dst_blocks = 0;
  const char* src = nullptr;
  int64_t src_blocks = 0;
  int64_t block_bytes = 0;
};

/// Launches one CopyBlocksBody over `num_pairs` > 0 (src, dst) pairs of `index_type` at `pairs`
/// (device-readable until the launch has run): block src of `pools.src` into block dst of
/// `pools.dst`, on at most `max_blocks` CTAs when positive (KernelLaunch::max_blocks). The caller
/// has validated the arguments. kInvalidArgument when the index space passes int64; else what
/// the backend's launch returns.
Status launch_copy_blocks(Backend& backend, const BlockCopyPools& pools, const void* pairs,
                          IndexType index_type, int64_t num_pairs, Stream stream,
                          int32_t max_blocks = 0);

/// A PagedRowBody with the pool side filled in and everything else zero.
kernels::PagedRowBody make_row_body(const PoolRef& pool);

}  // namespace pagedkv::ops_detail
