// write_kv and write_kv_all_layers: K/V (or latents) of new tokens into the pool at their slots.
#include <string>

#include "common/nvtx.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv {
namespace {

struct WriteCommon {
  const void* key;
  const void* value;
  DType input_dtype;
  int64_t row_stride;
  int64_t num_tokens;
  const int64_t* slot_mapping;
  KvScales scales;
};

// Validates what write_kv and write_kv_all_layers share. Sets the effective row stride and, when
// there are tokens, `reach`: the largest element offset one layer's rows touch in key/value.
Status validate_write(const PoolRef& pool, const WriteCommon& w, int64_t* row_stride,
                      int64_t* reach) {
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pool(pool));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_dtype(w.input_dtype, "input_dtype"));
  if (w.num_tokens < 0) return invalid_argument("num_tokens: negative");
  if (w.input_dtype == DType::kFloat8E4M3 && pool.dtype != DType::kFloat8E4M3) {
    return invalid_argument("input_dtype: fp8 input needs an fp8 pool");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_scales(pool, w.input_dtype, w.scales));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, w.value, /*needed=*/false, 1));
  const int64_t row = static_cast<int64_t>(pool.layout.num_kv_heads) * pool.layout.head_dim;
  *row_stride = w.row_stride == 0 ? row : w.row_stride;
  if (*row_stride < row) {
    return invalid_argument("row_stride: " + std::to_string(*row_stride) +
                            " is less than num_kv_heads * head_dim = " + std::to_string(row));
  }
  *reach = 0;
  if (w.num_tokens == 0) return ok_status();
  const size_t es = dtype_size(w.input_dtype);
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(w.key, es, "key"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_value(pool, w.value, /*needed=*/true, es));
  PAGEDKV_RETURN_IF_ERROR(
      ops_detail::validate_pointer(w.slot_mapping, alignof(int64_t), "slot_mapping"));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_reach(w.slot_mapping, w.slot_mapping,
                                                     sizeof(int64_t), w.num_tokens - 1,
                                                     "num_tokens", "slot_mapping"));
  // The last row starts at (num_tokens - 1) * row_stride; a stride the caller cannot have
  // allocated must fail here, not overflow (or read outside the input) in the kernel.
  if (!ops_detail::add_reach(w.num_tokens, *row_stride, reach) ||
      !ops_detail::add_reach(row, 1, reach)) {
    return invalid_argument("row_stride: " + std::to_string(*row_stride) + " over " +
                            std::to_string(w.num_tokens) +
                            " tokens overflows 64-bit element offsets");
  }
  return ops_detail::validate_reach(w.key, w.value, es, *reach, "row_stride");
}

kernels::PagedRowBody make_write_body(const PoolRef& pool, const WriteCommon& w,
                                      int64_t row_stride) {
  kernels::PagedRowBody b = ops_detail::make_row_body(pool);
  b.lin_k = const_cast<void*>(w.key);
  b.lin_v = const_cast<void*>(w.value);
  b.lin_dtype = w.input_dtype;
  b.lin_token_stride = row_stride;
  b.lin_head_stride = pool.layout.head_dim;
  b.mapping = kernels::RowMapping::kSlots;
  b.slots = w.slot_mapping;
  b.head0 = 0;
  b.num_heads_op = pool.layout.num_kv_heads;
  b.num_tokens = w.num_tokens;
  b.to_pool = 1;
  b.scales = w.scales;
  return b;
}

}  // namespace

Status write_kv(Backend& backend, const PoolRef& pool, const WriteKvArgs& args, Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::write_kv");
  const WriteCommon w{args.key,        args.value,        args.input_dtype, args.row_stride,
                      args.num_tokens, args.slot_mapping, args.scales};
  int64_t row_stride = 0;
  int64_t reach = 0;
  PAGEDKV_RETURN_IF_ERROR(validate_write(pool, w, &row_stride, &reach));
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_layer(pool, args.layer, "layer"));
  if (args.num_tokens == 0) return ok_status();
  kernels::PagedRowBody b = make_write_body(pool, w, row_stride);
  b.layer0 = args.layer;
  b.num_layers_op = 1;
  return ops_detail::launch_paged_rows(backend, b, stream);
}

Status write_kv_all_layers(Backend& backend, const PoolRef& pool, const WriteKvAllLayersArgs& args,
                           Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::write_kv_all_layers");
  const WriteCommon w{args.key,        args.value,        args.input_dtype, args.row_stride,
                      args.num_tokens, args.slot_mapping, args.scales};
  int64_t row_stride = 0;
  int64_t reach = 0;  // of one layer's rows: (num_tokens - 1) * row_stride + row - 1
  PAGEDKV_RETURN_IF_ERROR(validate_write(pool, w, &row_stride, &reach));
  if (args.num_tokens == 0) return ok_status();
  int64_t layer_stride = args.layer_stride;
  if (layer_stride == 0 && __builtin_mul_overflow(args.num_tokens, row_stride, &layer_stride)) {
    return invalid_argument("layer_stride: the default num_tokens * row_stride (" +
                            std::to_string(args.num_tokens) + " * " + std::to_string(row_stride) +
                            ") overflows int64");
  }
  // Layers must not overlap: each starts past the last element of the previous one's rows.
  if (layer_stride <= reach) {
    return invalid_argument("layer_stride: " + std::to_string(layer_stride) +
                            " is shorter than one layer's rows (" + std::to_string(reach + 1) +
                            " elements)");
  }
  if (!ops_detail::add_reach(pool.layout.num_layers, layer_stride, &reach)) {
    return invalid_argument("layer_stride: " + std::to_string(layer_stride) + " over " +
                            std::to_string(pool.layout.num_layers) +
                            " layers overflows 64-bit element offsets");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_reach(
      args.key, args.value, dtype_size(args.input_dtype), reach, "layer_stride"));
  kernels::PagedRowBody b = make_write_body(pool, w, row_stride);
  b.lin_layer_stride = layer_stride;
  b.layer0 = 0;
  b.num_layers_op = pool.layout.num_layers;
  return ops_detail::launch_paged_rows(backend, b, stream);
}

}  // namespace pagedkv
