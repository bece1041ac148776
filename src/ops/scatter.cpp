// scatter_head_range: a head-major [heads, tokens, dim] slice of one sequence into the pool.
#include <string>

#include "common/nvtx.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv {

Status scatter_head_range(Backend& backend, const PoolRef& pool, const ScatterHeadRangeArgs& a,
                          Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::scatter_head_range");
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pool(pool));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_dtype(a.input_dtype, "input_dtype"));
  if (a.input_dtype == DType::kFloat8E4M3 && pool.dtype != DType::kFloat8E4M3) {
    return invalid_argument("input_dtype: fp8 input needs an fp8 pool");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_scales(pool, a.input_dtype, a.scales));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, a.value, /*needed=*/false, 1));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_layer(pool, a.layer, "layer"));
  const PoolLayout& l = pool.layout;
  if (a.head_begin < 0 || a.num_heads < 0 || a.head_begin > l.num_kv_heads - a.num_heads) {
    return out_of_range("head_begin + num_heads: heads [" + std::to_string(a.head_begin) + ", " +
                        std::to_string(static_cast<int64_t>(a.head_begin) + a.num_heads) +
                        ") outside [0, " + std::to_string(l.num_kv_heads) + ")");
  }
  if (a.num_tokens < 0) return invalid_argument("num_tokens: negative");
  if (a.position_begin < 0) return out_of_range("position_begin: negative");
  if (a.block_table_len < 0) return invalid_argument("block_table_len: negative");
  const int64_t capacity = static_cast<int64_t>(a.block_table_len) * l.block_size;
  if (a.position_begin > capacity - a.num_tokens) {
    return out_of_range(
        // The sum is not formatted: it can overflow int64 for the values that land here.
        "position_begin + num_tokens (" + std::to_string(a.position_begin) + " + " +
        std::to_string(a.num_tokens) +
        ") exceeds block_table_len * block_size = " + std::to_string(capacity));
  }
  if (a.num_tokens == 0 || a.num_heads == 0) return ok_status();
  const size_t es = dtype_size(a.input_dtype);
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(a.key, es, "key"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, a.value, /*needed=*/true, es));
  PAGEDKV_RETURN_IF_ERROR(
      ops_detail::validate_pointer(a.block_table, alignof(int32_t), "block_table"));
  // The input is [num_heads, num_tokens, head_dim]: its head stride and last element must be
  // formed without overflow.
  int64_t head_stride = 0;
  int64_t reach = 0;
  if (__builtin_mul_overflow(a.num_tokens, int64_t{l.head_dim}, &head_stride) ||
      !ops_detail::add_reach(a.num_heads, head_stride, &reach) ||
      !ops_detail::add_reach(a.num_tokens, l.head_dim, &reach) ||
      !ops_detail::add_reach(l.head_dim, 1, &reach)) {
    return invalid_argument("num_tokens: num_heads * num_tokens * head_dim (" +
                            std::to_string(a.num_heads) + " * " + std::to_string(a.num_tokens) +
                            " * " + std::to_string(l.head_dim) +
                            ") overflows 64-bit element offsets");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_reach(a.key, a.value, es, reach, "num_tokens"));

  kernels::PagedRowBody b = ops_detail::make_row_body(pool);
  b.lin_k = const_cast<void*>(a.key);
  b.lin_v = const_cast<void*>(a.value);
  b.lin_dtype = a.input_dtype;
  b.lin_token_stride = l.head_dim;
  b.lin_head_stride = head_stride;
  b.mapping = kernels::RowMapping::kTable;
  b.block_tables = a.block_table;
  b.max_blocks = a.block_table_len;
  b.pos0 = a.position_begin;
  b.layer0 = a.layer;
  b.num_layers_op = 1;
  b.head0 = a.head_begin;
  b.num_heads_op = a.num_heads;
  b.num_tokens = a.num_tokens;
  b.to_pool = 1;
  b.scales = a.scales;
  return ops_detail::launch_paged_rows(backend, b, stream);
}

}  // namespace pagedkv
