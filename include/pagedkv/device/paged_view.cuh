// The device-side view of a paged pool, for custom attention kernels.
//
// PagedKvView is a trivially copyable struct passed by value to a kernel: the pool pointer, its
// PoolLayout (the one place where address arithmetic lives), dtype, fp8 scales and the batch's
// metadata, either vLLM style (block table [batch, max_blocks] int32 + seq_lens) or FlashInfer
// style CSR (indptr, indices, last_page_len). Its accessors are PAGEDKV_HOST_DEVICE, so the same
// kernel body compiles with nvcc and with a plain C++ compiler (the CPU backend runs it).
//
// flashinfer_args() and vllm_args() present one layer of the pool in the argument shapes those
// libraries' paged kernels take (pointer + strides + page metadata); flashinfer_mla_args() does
// the same for a latent (MLA) pool, as FlashInfer's paged_kv_mla_t takes it: `ckv` and `kpe` as
// two slices of one page, kpe starting layout.ckv_dim() elements into each latent vector.
#pragma once

#include <cstdint>

#include "pagedkv/dtype.hpp"
#include "pagedkv/kv_scales.hpp"
#include "pagedkv/layout.hpp"
#include "pagedkv/macros.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace pagedkv::device {

/// Read-only load of batch metadata; through the read-only data cache on the GPU.
template <typename T>
PAGEDKV_HOST_DEVICE T load_metadata(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

/// A paged pool and one step's batch, as a kernel sees them. Set either the block-table fields
/// or the CSR fields (indptr != nullptr selects CSR).
struct PagedKvView {
  void* pool = nullptr;
  PoolLayout layout;
  DType dtype = DType::kFloat16;
  int64_t num_blocks = 0;
  KvScales scales;
  int32_t batch_size = 0;
  // vLLM style: sequence s's logical block i is block_tables[s * max_blocks_per_seq + i].
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  // FlashInfer style: sequence s's pages are indices[indptr[s] .. indptr[s+1]); its last page
  // holds last_page_len[s] tokens (1 .. block_size).
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
  /// Sliding window of the layers this view holds, in tokens (0: full attention). Blocks before
  /// the window have no page: their block-table and CSR entries are -1, and a kernel reads only
  /// positions from window_begin(seq) on.
  int32_t sliding_window = 0;
  /// The block table's rows are rings (BatchMetadata::ring_table): logical block i of a row is
  /// at column i % max_blocks_per_seq. Only positions inside the window may be asked for.
  bool ring_table = false;

  /// True when the batch is described in CSR form.
  PAGEDKV_HOST_DEVICE bool is_csr() const { return indptr != nullptr; }

  /// Number of cached positions of sequence `seq`.
  PAGEDKV_HOST_DEVICE int64_t seq_len(int32_t seq) const {
    if (is_csr()) {
      const int32_t pages = load_metadata(indptr + seq + 1) - load_metadata(indptr + seq);
      if (pages == 0) return 0;
      return static_cast<int64_t>(pages - 1) * layout.block_size +
             load_metadata(last_page_len + seq);
    }
    return load_metadata(seq_lens + seq);
  }

  /// The first position of sequence `seq` that its last token attends to and the cache holds:
  /// seq_len - sliding_window (at least 0) with a window, else 0.
  PAGEDKV_HOST_DEVICE int64_t window_begin(int32_t seq) const {
    if (sliding_window <= 0) return 0;
    const int64_t begin = seq_len(seq) - sliding_window;
    return begin > 0 ? begin : 0;
  }

  /// Physical block holding position `pos` of sequence `seq` (-1 before its window).
  PAGEDKV_HOST_DEVICE int64_t block_of(int32_t seq, int64_t pos) const {
    const int64_t logical = pos / layout.block_size;
    if (is_csr()) return load_metadata(indices + load_metadata(indptr + seq) + logical);
    const int64_t column = ring_table ? logical % max_blocks_per_seq : logical;
    return load_metadata(block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq + column);
  }

  /// Element offset (from `pool`) of the head vector of (seq, layer, part, head, pos).
  PAGEDKV_HOST_DEVICE int64_t offset(int32_t seq, int32_t layer, KvPart part, int32_t head,
                                     int64_t pos) const {
    return layout.element_offset(block_of(seq, pos), layer, part,
                                 static_cast<int32_t>(pos % layout.block_size), head, 0);
  }

  /// Address of the head vector of (seq, layer, part, head, pos); elements of `dtype`.
  PAGEDKV_HOST_DEVICE void* address(int32_t seq, int32_t layer, KvPart part, int32_t head,
                                    int64_t pos) const {
    return static_cast<char*>(pool) +
           offset(seq, layer, part, head, pos) * static_cast<int64_t>(dtype_size(dtype));
  }

  /// Latent (MLA) pools: element offset of the latent vector of (seq, layer, pos), which is its
  /// `ckv` part (layout.ckv_dim() elements) followed by its `kpe` part (layout.rope_dim).
  PAGEDKV_HOST_DEVICE int64_t latent_offset(int32_t seq, int32_t layer, int64_t pos) const {
    return offset(seq, layer, KvPart::kKey, 0, pos);
  }
  /// Latent pools: element offset of the `kpe` (rotary) part of (seq, layer, pos).
  PAGEDKV_HOST_DEVICE int64_t kpe_offset(int32_t seq, int32_t layer, int64_t pos) const {
    return latent_offset(seq, layer, pos) + layout.ckv_dim();
  }
  /// Latent pools: address of the latent vector (= its `ckv` part) of (seq, layer, pos).
  PAGEDKV_HOST_DEVICE void* latent_address(int32_t seq, int32_t layer, int64_t pos) const {
    return static_cast<char*>(pool) +
           latent_offset(seq, layer, pos) * static_cast<int64_t>(dtype_size(dtype));
  }
  /// Latent pools: address of the `kpe` part of (seq, layer, pos).
  PAGEDKV_HOST_DEVICE void* kpe_address(int32_t seq, int32_t layer, int64_t pos) const {
    return static_cast<char*>(pool) +
           kpe_offset(seq, layer, pos) * static_cast<int64_t>(dtype_size(dtype));
  }
  /// Latent pools: element `dim` (0 .. head_dim) of the latent vector of (seq, layer, pos) as
  /// float, fp8 dequantised with the key scale.
  PAGEDKV_HOST_DEVICE float load_latent(int32_t seq, int32_t layer, int64_t pos,
                                        int32_t dim) const {
    return load(seq, layer, KvPart::kKey, 0, pos, dim);
  }

  /// Element `dim` of (seq, layer, part, head, pos) as float, fp8 dequantised with its scale.
  PAGEDKV_HOST_DEVICE float load(int32_t seq, int32_t layer, KvPart part, int32_t head, int64_t pos,
                                 int32_t dim) const {
    const float x = load_as_float(pool, dtype, offset(seq, layer, part, head, pos) + dim);
    return dtype == DType::kFloat8E4M3 ? x * scales.get(part, layer, head, layout.num_kv_heads) : x;
  }
};

/// One layer of the pool as FlashInfer's paged_kv_t takes it: data pointers with strides in
/// elements (page, token, head) and the CSR page metadata.
struct FlashInferPagedArgs {
  void* k_data = nullptr;
  void* v_data = nullptr;
  int64_t stride_page = 0;  // between pages of this layer: the block stride
  int64_t stride_n = 0;     // between tokens inside a page
  int64_t stride_h = 0;     // between heads inside a page
  int32_t page_size = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  int32_t batch_size = 0;
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
};

/// One layer of a latent (MLA) pool as FlashInfer's paged_kv_mla_t takes it: the `ckv` and
/// `kpe` slices of the layer's pages, strides in elements, and the CSR page metadata. Both slices
/// live in the same pages: kpe_data = ckv_data + head_dim_ckv, with the same strides.
struct FlashInferMlaPagedArgs {
  void* ckv_data = nullptr;     // element 0 of the ckv part of (page 0, token 0)
  void* kpe_data = nullptr;     // element 0 of the kpe part of (page 0, token 0)
  int64_t stride_page_ckv = 0;  // between pages of this layer: the block stride
  int64_t stride_page_kpe = 0;  // the same
  int64_t stride_n_ckv = 0;     // between tokens inside a page: the latent width (head_dim)
  int64_t stride_n_kpe = 0;     // the same
  int64_t kpe_offset = 0;       // kpe_data - ckv_data in elements: head_dim_ckv
  int32_t page_size = 0;
  int32_t head_dim_ckv = 0;  // head_dim - rope_dim (DeepSeek: 512)
  int32_t head_dim_kpe = 0;  // rope_dim (DeepSeek: 64)
  int32_t batch_size = 0;
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
};

/// One layer of the pool as vLLM's paged attention takes it: key/value cache pointers with
/// strides in elements, block tables and sequence lengths.
struct VllmPagedArgs {
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  int64_t block_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t batch_size = 0;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
};

/// Layer `layer` of a CSR view in FlashInfer's shape (needs view.is_csr()). A latent pool gives
/// its latent pages as k_data and a null v_data.
PAGEDKV_HOST_DEVICE FlashInferPagedArgs flashinfer_args(const PagedKvView& view, int32_t layer) {
  FlashInferPagedArgs a;
  const int64_t es = static_cast<int64_t>(dtype_size(view.dtype));
  char* base = static_cast<char*>(view.pool);
  a.k_data = base + view.layout.page_offset(0, layer, KvPart::kKey) * es;
  a.v_data = view.layout.is_latent()
                 ? nullptr
                 : base + view.layout.page_offset(0, layer, KvPart::kValue) * es;
  a.stride_page = view.layout.block_elems();
  a.stride_n = view.layout.token_stride();
  a.stride_h = view.layout.head_stride();
  a.page_size = view.layout.block_size;
  a.num_heads = view.layout.num_kv_heads;
  a.head_dim = view.layout.head_dim;
  a.batch_size = view.batch_size;
  a.indptr = view.indptr;
  a.indices = view.indices;
  a.last_page_len = view.last_page_len;
  return a;
}

/// Layer `layer` of a block-table view in vLLM's shape (needs !view.is_csr() and no ring
/// table). A latent pool gives its latent pages as key_cache (FlashMLA's kv cache) and a null
/// value_cache.
PAGEDKV_HOST_DEVICE VllmPagedArgs vllm_args(const PagedKvView& view, int32_t layer) {
  VllmPagedArgs a;
  const int64_t es = static_cast<int64_t>(dtype_size(view.dtype));
  char* base = static_cast<char*>(view.pool);
  a.key_cache = base + view.layout.page_offset(0, layer, KvPart::kKey) * es;
  a.value_cache = view.layout.is_latent()
                      ? nullptr
                      : base + view.layout.page_offset(0, layer, KvPart::kValue) * es;
  a.block_stride = view.layout.block_elems();
  a.token_stride = view.layout.token_stride();
  a.head_stride = view.layout.head_stride();
  a.block_size = view.layout.block_size;
  a.num_kv_heads = view.layout.num_kv_heads;
  a.head_dim = view.layout.head_dim;
  a.batch_size = view.batch_size;
  a.block_tables = view.block_tables;
  a.max_blocks_per_seq = view.max_blocks_per_seq;
  a.seq_lens = view.seq_lens;
  return a;
}

/// Layer `layer` of a CSR view of a latent (MLA) pool in FlashInfer's MLA shape (needs
/// view.is_csr() and view.layout.is_latent()).
PAGEDKV_HOST_DEVICE FlashInferMlaPagedArgs flashinfer_mla_args(const PagedKvView& view,
                                                               int32_t layer) {
  FlashInferMlaPagedArgs a;
  const PoolLayout& l = view.layout;
  const int64_t es = static_cast<int64_t>(dtype_size(view.dtype));
  char* ckv = static_cast<char*>(view.pool) + l.page_offset(0, layer, KvPart::kKey) * es;
  a.ckv_data = ckv;
  a.kpe_data = ckv + static_cast<int64_t>(l.ckv_dim()) * es;
  a.stride_page_ckv = l.block_elems();
  a.stride_page_kpe = l.block_elems();
  a.stride_n_ckv = l.token_stride();
  a.stride_n_kpe = l.token_stride();
  a.kpe_offset = l.ckv_dim();
  a.page_size = l.block_size;
  a.head_dim_ckv = l.ckv_dim();
  a.head_dim_kpe = l.rope_dim;
  a.batch_size = view.batch_size;
  a.indptr = view.indptr;
  a.indices = view.indices;
  a.last_page_len = view.last_page_len;
  return a;
}

/// A block-table (vLLM style) view; all pointers are device pointers.
inline PagedKvView make_block_table_view(void* pool, const PoolLayout& layout, DType dtype,
                                         int64_t num_blocks, const int32_t* block_tables,
                                         int32_t max_blocks_per_seq, const int32_t* seq_lens,
                                         int32_t batch_size, KvScales scales = {}) {
  PagedKvView v;
  v.pool = pool;
  v.layout = layout;
  v.dtype = dtype;
  v.num_blocks = num_blocks;
  v.scales = scales;
  v.batch_size = batch_size;
  v.block_tables = block_tables;
  v.max_blocks_per_seq = max_blocks_per_seq;
  v.seq_lens = seq_lens;
  return v;
}

/// A CSR (FlashInfer style) view; all pointers are device pointers.
inline PagedKvView make_csr_view(void* pool, const PoolLayout& layout, DType dtype,
                                 int64_t num_blocks, const int32_t* indptr, const int32_t* indices,
                                 const int32_t* last_page_len, int32_t batch_size,
                                 KvScales scales = {}) {
  PagedKvView v;
  v.pool = pool;
  v.layout = layout;
  v.dtype = dtype;
  v.num_blocks = num_blocks;
  v.scales = scales;
  v.batch_size = batch_size;
  v.indptr = indptr;
  v.indices = indices;
  v.last_page_len = last_page_len;
  return v;
}

}  // namespace pagedkv::device
