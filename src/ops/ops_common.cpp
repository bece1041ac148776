// Validation and launch helpers shared by the data-plane ops.
#include "ops/ops_common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/registry.hpp"
#include "ops/launch_shape.hpp"

namespace pagedkv::ops_detail {
namespace {

LaunchShape g_forced_shape = LaunchShape::kAuto;
int64_t g_forced_resident_threads = 0;

}  // namespace

void set_launch_shape_for_testing(LaunchShape shape, int64_t resident_threads) {
  g_forced_shape = shape;
  g_forced_resident_threads = resident_threads > 0 ? resident_threads : 0;
}

bool wide_launch(const Backend& backend) {
  if (g_forced_shape != LaunchShape::kAuto) return g_forced_shape == LaunchShape::kWide;
  return backend.kind() == BackendKind::kCpu;
}

int64_t resident_threads(const Backend& backend) {
  if (g_forced_resident_threads > 0) return g_forced_resident_threads;
  const int64_t n = backend.max_resident_threads();
  return n > 0 ? n : kModelResidentThreads;
}

int64_t row_lanes(int64_t segs_per_row, int64_t rows, int64_t resident_threads) {
  int64_t lanes = 1;
  while (lanes < kernels::kWarpRowLanes && lanes < segs_per_row) lanes *= 2;
  // Few rows: whole warps per row while the index space stays within the resident threads.
  while (lanes < kernels::kMaxRowLanes && lanes < segs_per_row && rows > 0 &&
         rows <= resident_threads / (2 * lanes)) {
    lanes *= 2;
  }
  return lanes;
}

Status validate_dtype(DType t, const char* name) {
  if (static_cast<int>(t) >= kNumDTypes) {
    return invalid_argument(std::string(name) + ": unknown dtype " +
                            std::to_string(static_cast<int>(t)));
  }
  return ok_status();
}

Status validate_pointer(const void* p, size_t alignment, const char* name) {
  if (p == nullptr) return invalid_argument(std::string(name) + ": null pointer");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    return invalid_argument(std::string(name) + ": pointer not aligned to " +
                            std::to_string(alignment) + " bytes");
  }
  return ok_status();
}

Status validate_pool(const PoolRef& pool) {
  PAGEDKV_RETURN_IF_ERROR(validate_dtype(pool.dtype, "pool.dtype"));
  PAGEDKV_RETURN_IF_ERROR(validate_pointer(pool.data, dtype_size(pool.dtype), "pool.data"));
  const PoolLayout& l = pool.layout;
  if (l.num_layers <= 0 || l.num_kv_heads <= 0 || l.head_dim <= 0 || l.block_size <= 0) {
    return invalid_argument(
        "pool.layout: num_layers, num_kv_heads, head_dim and block_size "
        "must be positive");
  }
  if (l.page_layout != PageLayout::kNHD && l.page_layout != PageLayout::kHND) {
    return invalid_argument("pool.layout: unknown page layout");
  }
  if (l.num_parts == 1) {
    if (l.num_kv_heads != 1) {
      return invalid_argument("pool.layout: a latent (MLA) pool has one head, got " +
                              std::to_string(l.num_kv_heads));
    }
    if (l.rope_dim <= 0 || l.rope_dim >= l.head_dim) {
      return invalid_argument("pool.layout: a latent (MLA) pool needs 0 < rope_dim < head_dim (" +
                              std::to_string(l.head_dim) + "), got " + std::to_string(l.rope_dim));
    }
  } else if (l.num_parts != 2) {
    return invalid_argument("pool.layout: num_parts must be 2 (keys, values) or 1 (latent), got " +
                            std::to_string(l.num_parts));
  } else if (l.rope_dim != 0) {
    return invalid_argument("pool.layout: rope_dim is for latent pools only, got " +
                            std::to_string(l.rope_dim));
  }
  if (pool.num_blocks <= 0) return invalid_argument("pool.num_blocks: must be positive");
  // The kernels form int64 element and byte offsets into the pool: its byte size must fit int64.
  // Each product is checked, so a huge layout fails here instead of overflowing in block_elems().
  int64_t block_bytes = 0;
  if (__builtin_mul_overflow(int64_t{l.block_size}, int64_t{l.num_kv_heads}, &block_bytes) ||
      __builtin_mul_overflow(block_bytes, int64_t{l.head_dim}, &block_bytes) ||
      __builtin_mul_overflow(block_bytes, int64_t{l.num_parts} * l.num_layers, &block_bytes) ||
      __builtin_mul_overflow(block_bytes, static_cast<int64_t>(dtype_size(pool.dtype)),
                             &block_bytes)) {
    return invalid_argument(
        "pool.layout: one block (num_layers * num_parts * block_size * num_kv_heads * head_dim "
        "elements) overflows 64-bit byte offsets");
  }
  int64_t pool_bytes = 0;
  if (__builtin_mul_overflow(block_bytes, pool.num_blocks, &pool_bytes) ||
      reinterpret_cast<uintptr_t>(pool.data) > UINTPTR_MAX - static_cast<uint64_t>(pool_bytes)) {
    return invalid_argument("pool.num_blocks: " + std::to_string(pool.num_blocks) + " blocks of " +
                            std::to_string(block_bytes) + " bytes overflow 64-bit byte offsets");
  }
  return ok_status();
}

bool add_reach(int64_t count, int64_t stride, int64_t* reach) {
  if (count <= 1) return true;
  int64_t span = 0;
  return !__builtin_mul_overflow(count - 1, stride, &span) &&
         !__builtin_add_overflow(*reach, span, reach);
}

Status validate_reach(const void* a, const void* b, size_t elem_size, int64_t reach,
                      const std::string& name, const char* tensors) {
  // Bytes [0, end) from each pointer: end = (reach + 1) * elem_size.
  int64_t end = 0;
  if (__builtin_add_overflow(reach, int64_t{1}, &end) ||
      __builtin_mul_overflow(end, static_cast<int64_t>(elem_size), &end)) {
    return invalid_argument(name + ": the last element of " + tensors + " (element offset " +
                            std::to_string(reach) + ") is past 64-bit byte offsets");
  }
  for (const void* p : {a, b}) {
    if (reinterpret_cast<uintptr_t>(p) > UINTPTR_MAX - static_cast<uint64_t>(end)) {
      return invalid_argument(name + ": " + tensors +
                              " would run past the end of the address space (" +
                              std::to_string(end) + " bytes from the pointer)");
    }
  }
  return ok_status();
}

Status validate_layer(const PoolRef& pool, int32_t layer, const char* name) {
  if (layer < 0 || layer >= pool.layout.num_layers) {
    return out_of_range(std::string(name) + ": layer " + std::to_string(layer) + " outside [0, " +
                        std::to_string(pool.layout.num_layers) + ")");
  }
  return ok_status();
}

Status validate_scales(const PoolRef& pool, DType other, const KvScales& scales) {
  if (scales.granularity == ScaleGranularity::kNone) return ok_status();
  if (scales.granularity != ScaleGranularity::kPerLayer &&
      scales.granularity != ScaleGranularity::kPerHead) {
    return invalid_argument("scales.granularity: unknown value");
  }
  if (pool.dtype != DType::kFloat8E4M3) {
    return invalid_argument("scales: only an fp8 pool takes scales (pool is " +
                            std::string(dtype_name(pool.dtype)) + ")");
  }
  if (other == DType::kFloat8E4M3) {
    return invalid_argument("scales: the tensor side is fp8 too; scales need fp16/bf16/fp32");
  }
  PAGEDKV_RETURN_IF_ERROR(validate_pointer(scales.k, alignof(float), "scales.k"));
  // A latent pool has no values: its scales are scales.k alone, scales.v is never read.
  if (pool.layout.is_latent()) return ok_status();
  PAGEDKV_RETURN_IF_ERROR(validate_pointer(scales.v, alignof(float), "scales.v"));
  return ok_status();
}

Status validate_value(const PoolRef& pool, const void* value, bool needed, size_t alignment) {
  if (pool.layout.is_latent()) {
    if (value != nullptr) {
      return invalid_argument("value: a latent (MLA) cache stores no values; pass null");
    }
    return ok_status();
  }
  return needed ? validate_pointer(value, alignment, "value") : ok_status();
}

int choose_vec_bytes(std::initializer_list<uint64_t> values) {
  int vec = 16;
  for (uint64_t v : values) {
    while (vec > 1 && v % static_cast<uint64_t>(vec) != 0) vec /= 2;
  }
  return vec;
}

kernels::PagedRowBody make_row_body(const PoolRef& pool) {
  kernels::PagedRowBody b;
  std::memset(static_cast<void*>(&b), 0, sizeof(b));
  b.pool = pool.data;
  b.layout = pool.layout;
  b.pool_dtype = pool.dtype;
  b.num_blocks = pool.num_blocks;
  return b;
}

// Streaming stores on the host (plan_paged_rows): into pools from the size of a server CPU's
// last-level cache, out of them for launches from a few MiB (under it a gathered tensor is
// still in the cache when it is read).
constexpr int64_t kStreamIntoPoolsFromBytes = int64_t{32} << 20;
constexpr int64_t kStreamReadsFromBytes = int64_t{4} << 20;

StatusOr<PagedRowsPlan> plan_paged_rows(kernels::PagedRowBody b, bool wide,
                                        int64_t resident_threads) {
  const int64_t head_dim = b.layout.head_dim;
  const int64_t row_elems = static_cast<int64_t>(b.num_heads_op) * head_dim;
  b.convert =
      (b.lin_dtype != b.pool_dtype || b.scales.granularity != ScaleGranularity::kNone) ? 1 : 0;
  if (!b.convert) {
    const uint64_t es = dtype_size(b.pool_dtype);
    // Every byte offset the body forms is a sum of these: the vector width must divide each.
    b.vec_bytes =
        choose_vec_bytes({reinterpret_cast<uintptr_t>(b.pool), reinterpret_cast<uintptr_t>(b.lin_k),
                          reinterpret_cast<uintptr_t>(b.lin_v), head_dim * es,
                          static_cast<uint64_t>(b.lin_token_stride) * es,
                          static_cast<uint64_t>(b.lin_head_stride) * es,
                          static_cast<uint64_t>(b.lin_layer_stride) * es});
  } else {
    b.vec_bytes = 1;
  }
  if (wide) {
    b.seg_elems = row_elems;
  } else if (!b.convert) {
    b.seg_elems = b.vec_bytes / static_cast<int64_t>(dtype_size(b.pool_dtype));
    if (b.seg_elems == 0) b.seg_elems = 1;
  } else {
    // Element-wise conversion: a few elements of one head per chunk.
    int64_t seg = kernels::detail::kConvertVecElems;
    while (head_dim % seg != 0) seg /= 2;
    b.seg_elems = seg;
    // Eight elements of one head per chunk, loaded and stored with vectors when every chunk
    // of both sides is aligned to its size (up to 16 bytes): each segment starts at a multiple
    // of head_dim plus a multiple of 8 elements from a base, on the pool and the linear side.
    if (seg == kernels::detail::kConvertVecElems) {
      const uint64_t pes = dtype_size(b.pool_dtype);
      const uint64_t les = dtype_size(b.lin_dtype);
      const int pool_vec =
          choose_vec_bytes({reinterpret_cast<uintptr_t>(b.pool), head_dim * pes, 8 * pes});
      const int lin_vec = choose_vec_bytes(
          {reinterpret_cast<uintptr_t>(b.lin_k), reinterpret_cast<uintptr_t>(b.lin_v),
           head_dim * les, 8 * les, static_cast<uint64_t>(b.lin_token_stride) * les,
           static_cast<uint64_t>(b.lin_head_stride) * les,
           static_cast<uint64_t>(b.lin_layer_stride) * les});
      b.convert_vec = static_cast<uint64_t>(pool_vec) >= std::min<uint64_t>(16, 8 * pes) &&
                      static_cast<uint64_t>(lin_vec) >= std::min<uint64_t>(16, 8 * les);
    }
  }
  b.segs_per_row = row_elems / b.seg_elems;
  // Lanes per row: one in the wide shape (a whole row per index); in the narrow shape a power of
  // two, a warp or less when rows are many (a short row shares its warp with the next rows, a
  // long one gives each lane several chunks), more when they are few (row_lanes).
  const int64_t rows = static_cast<int64_t>(b.num_layers_op) * b.layout.num_parts;
  int64_t rows_total = 0;
  if (__builtin_mul_overflow(rows, b.num_tokens, &rows_total)) {
    return invalid_argument("num_tokens: " + std::to_string(b.num_tokens) +
                            " tokens make an index space past int64");
  }
  const int64_t lanes = wide ? 1 : row_lanes(b.segs_per_row, rows_total, resident_threads);
  // The host's whole-row shape streams its stores (kernels::detail::copy_streaming) where the
  // lines it writes are unlikely to be in the cache and unlikely to be read again from it soon:
  // into a pool larger than a last-level cache (its rows are scattered over it), and out of the
  // pool when the launch moves more than a core's caches would keep.
  if (wide && !b.convert) {
    const double es = static_cast<double>(dtype_size(b.pool_dtype));
    const double pool_bytes =
        static_cast<double>(b.num_blocks) * static_cast<double>(b.layout.block_elems()) * es;
    const double moved = static_cast<double>(rows_total) * static_cast<double>(row_elems) * es;
    b.stream_stores = b.to_pool ? pool_bytes >= static_cast<double>(kStreamIntoPoolsFromBytes)
                                : moved >= static_cast<double>(kStreamReadsFromBytes);
  }
  b.lane_shift = 0;
  while ((int64_t{1} << b.lane_shift) < lanes) ++b.lane_shift;
  b.step_heads = static_cast<int32_t>(lanes * b.seg_elems / head_dim);
  b.step_elems = static_cast<int32_t>(lanes * b.seg_elems % head_dim);
  // The ops bound num_tokens * row_elems by the linear tensor's reach; the index space adds the
  // layer and part factors and the lanes, so it is checked too.
  PagedRowsPlan plan;
  if (__builtin_mul_overflow(rows_total, lanes, &plan.items)) {
    return invalid_argument("num_tokens: " + std::to_string(b.num_tokens) +
                            " tokens make an index space past int64");
  }
  if (plan.items == 0) {
    plan.body = b;
    return plan;
  }
  // Every divisor of the index decomposition, precomputed once per launch (all positive here).
  b.tokens_div = kernels::FastDivmod::make(static_cast<uint64_t>(b.num_tokens));
  b.block_div = kernels::FastDivmod::make(static_cast<uint64_t>(b.layout.block_size));
  b.head_dim_div = kernels::FastDivmod::make(static_cast<uint64_t>(head_dim));
  plan.body = b;
  plan.kernel = b.convert ? KernelId::kPagedRows : KernelId::kPagedRowsRaw;
  return plan;
}

Status launch_paged_rows(Backend& backend, kernels::PagedRowBody body, Stream stream) {
  PAGEDKV_ASSIGN_OR_RETURN(const PagedRowsPlan plan,
                           plan_paged_rows(body, wide_launch(backend), resident_threads(backend)));
  if (plan.items == 0) return ok_status();
  KernelLaunch launch;
  launch.kernel = plan.kernel;
  launch.num_items = plan.items;
  // The raw body's params are a PagedRowBody (its one member).
  static_assert(sizeof(kernels::PagedRowRawBody) == sizeof(kernels::PagedRowBody),
                "PagedRowRawBody is a PagedRowBody");
  if (plan.kernel == KernelId::kPagedRowsRaw) {
    const kernels::PagedRowRawBody raw{plan.body};
    launch.params = &raw;
    launch.params_size = sizeof(raw);
    return backend.launch(launch, stream);
  }
  launch.params = &plan.body;
  launch.params_size = sizeof(plan.body);
  return backend.launch(launch, stream);
}

}  // namespace pagedkv::ops_detail
