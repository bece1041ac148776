// gather_layer / import_layer (one sequence) and their batch forms: one layer between the pool
// and packed [heads, len, dim] or [len, heads, dim] buffers.
#include <cstdint>
#include <string>

#include "common/nvtx.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv {
namespace {

Status validate_packed_side(const PoolRef& pool, const void* value, DType packed_dtype,
                            PackedLayout packed_layout, const KvScales& scales, int32_t layer) {
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pool(pool));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_dtype(packed_dtype, "packed_dtype"));
  if (packed_layout != PackedLayout::kHeadMajor && packed_layout != PackedLayout::kTokenMajor) {
    return invalid_argument("packed_layout: unknown value");
  }
  if (packed_dtype == DType::kFloat8E4M3 && pool.dtype != DType::kFloat8E4M3) {
    return invalid_argument("packed_dtype: fp8 packed data needs an fp8 pool");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_scales(pool, packed_dtype, scales));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, value, /*needed=*/false, 1));
  return ops_detail::validate_layer(pool, layer, "layer");
}

// A packed layer of `num_tokens` positions is num_tokens * num_kv_heads * head_dim elements in
// either order; every offset into it (and the head-major head stride) must fit int64, in bytes.
Status validate_packed_reach(const PoolRef& pool, const void* key, const void* value,
                             DType packed_dtype, int64_t num_tokens, const char* name) {
  const int64_t row = static_cast<int64_t>(pool.layout.num_kv_heads) * pool.layout.head_dim;
  int64_t reach = 0;
  if (!ops_detail::add_reach(num_tokens, row, &reach) || !ops_detail::add_reach(row, 1, &reach)) {
    return invalid_argument(std::string(name) + ": " + std::to_string(num_tokens) + " tokens of " +
                            std::to_string(row) + " elements overflow 64-bit element offsets");
  }
  return ops_detail::validate_reach(key, value, dtype_size(packed_dtype), reach, name);
}

Status validate_single(const PoolRef& pool, const PackedLayerArgs& a) {
  PAGEDKV_RETURN_IF_ERROR(
      validate_packed_side(pool, a.value, a.packed_dtype, a.packed_layout, a.scales, a.layer));
  if (a.num_tokens < 0) return invalid_argument("num_tokens: negative");
  if (a.position_begin < 0) return out_of_range("position_begin: negative");
  if (a.block_table_len < 0) return invalid_argument("block_table_len: negative");
  const int64_t capacity = static_cast<int64_t>(a.block_table_len) * pool.layout.block_size;
  if (a.position_begin > capacity - a.num_tokens) {
    return out_of_range(
        // The sum is not formatted: it can overflow int64 for the values that land here.
        "position_begin + num_tokens (" + std::to_string(a.position_begin) + " + " +
        std::to_string(a.num_tokens) +
        ") exceeds block_table_len * block_size = " + std::to_string(capacity));
  }
  if (a.num_tokens == 0) return ok_status();
  const size_t es = dtype_size(a.packed_dtype);
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(a.key, es, "key"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, a.value, /*needed=*/true, es));
  PAGEDKV_RETURN_IF_ERROR(
      ops_detail::validate_pointer(a.block_table, alignof(int32_t), "block_table"));
  return validate_packed_reach(pool, a.key, a.value, a.packed_dtype, a.num_tokens, "num_tokens");
}

Status run_single(Backend& backend, const PoolRef& pool, const PackedLayerArgs& a, bool to_pool,
                  Stream stream) {
  PAGEDKV_RETURN_IF_ERROR(validate_single(pool, a));
  if (a.num_tokens == 0) return ok_status();
  const PoolLayout& l = pool.layout;
  kernels::PagedRowBody b = ops_detail::make_row_body(pool);
  b.lin_k = a.key;
  b.lin_v = a.value;
  b.lin_dtype = a.packed_dtype;
  if (a.packed_layout == PackedLayout::kHeadMajor) {
    b.lin_token_stride = l.head_dim;
    b.lin_head_stride = a.num_tokens * l.head_dim;
  } else {
    b.lin_token_stride = static_cast<int64_t>(l.num_kv_heads) * l.head_dim;
    b.lin_head_stride = l.head_dim;
  }
  b.mapping = kernels::RowMapping::kTable;
  b.block_tables = a.block_table;
  b.max_blocks = a.block_table_len;
  b.pos0 = a.position_begin;
  b.layer0 = a.layer;
  b.num_layers_op = 1;
  b.num_heads_op = l.num_kv_heads;
  b.num_tokens = a.num_tokens;
  b.to_pool = to_pool ? 1 : 0;
  b.scales = a.scales;
  return ops_detail::launch_paged_rows(backend, b, stream);
}

Status validate_batch(const PoolRef& pool, const PackedBatchArgs& a) {
  PAGEDKV_RETURN_IF_ERROR(
      validate_packed_side(pool, a.value, a.packed_dtype, a.packed_layout, a.scales, a.layer));
  if (a.batch_size < 0) return invalid_argument("batch_size: negative");
  if (a.total_tokens < 0) return invalid_argument("total_tokens: negative");
  if (a.total_tokens > INT32_MAX) {
    return out_of_range("total_tokens: " + std::to_string(a.total_tokens) +
                        " does not fit the int32 indptr");
  }
  if (a.total_tokens > 0 && a.batch_size == 0) {
    return invalid_argument("total_tokens: positive with an empty batch");
  }
  if (a.batch_size == 0 || a.total_tokens == 0) return ok_status();
  if (a.max_blocks_per_seq <= 0) return invalid_argument("max_blocks_per_seq: must be positive");
  const size_t es = dtype_size(a.packed_dtype);
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(a.key, es, "key"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, a.value, /*needed=*/true, es));
  PAGEDKV_RETURN_IF_ERROR(
      ops_detail::validate_pointer(a.block_tables, alignof(int32_t), "block_tables"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(a.indptr, alignof(int32_t), "indptr"));
  // Table row s starts at s * max_blocks_per_seq.
  int64_t table_reach = 0;
  if (!ops_detail::add_reach(a.batch_size, a.max_blocks_per_seq, &table_reach) ||
      !ops_detail::add_reach(a.max_blocks_per_seq, 1, &table_reach)) {
    return invalid_argument("max_blocks_per_seq: block_tables overflow 64-bit offsets");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_reach(a.block_tables, a.block_tables,
                                                     sizeof(int32_t), table_reach,
                                                     "max_blocks_per_seq", "block_tables"));
  return validate_packed_reach(pool, a.key, a.value, a.packed_dtype, a.total_tokens,
                               "total_tokens");
}

Status run_batch(Backend& backend, const PoolRef& pool, const PackedBatchArgs& a, bool to_pool,
                 Stream stream) {
  PAGEDKV_RETURN_IF_ERROR(validate_batch(pool, a));
  if (a.batch_size == 0 || a.total_tokens == 0) return ok_status();
  const PoolLayout& l = pool.layout;
  kernels::PagedRowBody b = ops_detail::make_row_body(pool);
  b.lin_k = a.key;
  b.lin_v = a.value;
  b.lin_dtype = a.packed_dtype;
  if (a.packed_layout == PackedLayout::kHeadMajor) {
    b.lin_head_major_ragged = 1;
    b.lin_token_stride = l.head_dim;  // for the vector-width choice; the body derives the rest
    b.lin_head_stride = l.head_dim;
  } else {
    b.lin_token_stride = static_cast<int64_t>(l.num_kv_heads) * l.head_dim;
    b.lin_head_stride = l.head_dim;
  }
  b.mapping = kernels::RowMapping::kBatch;
  b.block_tables = a.block_tables;
  b.table_stride = a.max_blocks_per_seq;
  b.max_blocks = a.max_blocks_per_seq;
  b.indptr = a.indptr;
  b.batch_size = a.batch_size;
  b.layer0 = a.layer;
  b.num_layers_op = 1;
  b.num_heads_op = l.num_kv_heads;
  b.num_tokens = a.total_tokens;
  b.to_pool = to_pool ? 1 : 0;
  b.scales = a.scales;
  return ops_detail::launch_paged_rows(backend, b, stream);
}

}  // namespace

Status gather_layer(Backend& backend, const PoolRef& pool, const PackedLayerArgs& args,
                    Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::gather_layer");
  return run_single(backend, pool, args, /*to_pool=*/false, stream);
}

Status import_layer(Backend& backend, const PoolRef& pool, const PackedLayerArgs& args,
                    Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::import_layer");
  return run_single(backend, pool, args, /*to_pool=*/true, stream);
}

Status gather_layer_batch(Backend& backend, const PoolRef& pool, const PackedBatchArgs& args,
                          Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::gather_layer_batch");
  return run_batch(backend, pool, args, /*to_pool=*/false, stream);
}

Status import_layer_batch(Backend& backend, const PoolRef& pool, const PackedBatchArgs& args,
                          Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::import_layer_batch");
  return run_batch(backend, pool, args, /*to_pool=*/true, stream);
}

}  // namespace pagedkv
