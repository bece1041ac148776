// Validation and launch helpers shared by the data-plane ops (internal).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/paged_copy.hpp"
#include "pagedkv/ops.hpp"

namespace pagedkv::ops_detail {

/// The pool itself: non-null, aligned data, a valid layout, blocks > 0, a known dtype.
Status validate_pool(const PoolRef& pool);
/// A non-null device pointer aligned to `alignment` bytes; `name` goes into the message.
Status validate_pointer(const void* p, size_t alignment, const char* name);
/// 0 <= layer < num_layers.
Status validate_layer(const PoolRef& pool, int32_t layer, const char* name);
/// Scales are for fp8 pools with a non-fp8 other side, with non-null arrays.
Status validate_scales(const PoolRef& pool, DType other, const KvScales& scales);
/// A dtype value that names one of the four element types.
Status validate_dtype(DType t, const char* name);

/// The largest power of two <= 16 that divides every value (byte addresses and byte strides).
int choose_vec_bytes(std::initializer_list<uint64_t> values);

/// Fills the launch-shape and conversion fields of a PagedRowBody whose other fields are set,
/// and launches it. The body must describe a valid, validated op.
Status launch_paged_rows(Backend& backend, kernels::PagedRowBody body, Stream stream);

/// A PagedRowBody with the pool side filled in and everything else zero.
kernels::PagedRowBody make_row_body(const PoolRef& pool);

}  // namespace pagedkv::ops_detail
