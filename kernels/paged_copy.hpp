// Kernel bodies that move K/V rows between the paged pool and contiguous tensors, and whole
// blocks inside the pool.
//
// One body (PagedRowBody) serves write_kv, write_kv_all_layers, scatter_head_range, gather and
// import. A row is the heads [head0, head0 + nh) of one (layer, K/V, token); it is cut into
// chunks (a whole row on the CPU, one 16-byte vector or 8 converted elements on the GPU) and
// handed to a power-of-two group of consecutive indices, its lanes: lane l moves chunks l,
// l + lanes, l + 2 * lanes, ... On the GPU a group of up to 32 lanes is one warp (or a part of
// one: a short row leaves the warp's other lanes to the next rows), so consecutive threads touch
// consecutive 16 bytes (coalesced) and a thread finds its row's place (token, slot, block, the
// pool and tensor offsets) once per row, not once per 16 bytes; from chunk to chunk it only adds
// a step fixed on the host. When rows are too few to fill the device (a decode step), a row gets
// more lanes, whole warps up to one lane per chunk, so that more threads wait on memory at once.
// On the CPU a row has one lane. The body reads nothing but its own index, so the mapping holds
// for any grid, block size and execution order; a warp-aligned group is what makes it fast, not
// what makes it correct. Same code, two launch shapes; the tests run both on the CPU backend.
// PagedRowRawBody is the raw path (same dtype, no scale) alone, with its loads batched. The
// remaining divisions (by tokens, block size, head dim) go through precomputed FastDivmod
// multipliers: no 64-bit division on the GPU.
//
// Device-resident indices (slots, block tables, indptr) cannot be checked on the host without a
// synchronisation, so the body bounds-checks them and skips an out-of-range entry like a -1 slot.
#pragma once

#include <cstdint>
#include <cstring>
#if !defined(__CUDA_ARCH__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/fast_divmod.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/kv_scales.hpp"
#include "pagedkv/layout.hpp"
#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

namespace detail {

/// A trivially copyable chunk of N bytes, moved with one load and one store where N <= 16.
template <int N>
struct Bytes;
#if defined(__CUDA_ARCH__)
template <>
struct Bytes<16> {
  using Type = uint4;
};
template <>
struct Bytes<8> {
  using Type = uint2;
};
#else
struct alignas(16) HostVec16 {
  uint64_t lo, hi;
};
template <>
struct Bytes<16> {
  using Type = HostVec16;
};
template <>
struct Bytes<8> {
  using Type = uint64_t;
};
#endif
template <>
struct Bytes<4> {
  using Type = uint32_t;
};
template <>
struct Bytes<2> {
  using Type = uint16_t;
};
template <>
struct Bytes<1> {
  using Type = uint8_t;
};

/// Segments at least this long are copied with memcpy on the host (see copy_row_segment).
inline constexpr int64_t kMemcpySegmentBytes = 64;

#if !defined(__CUDA_ARCH__)
/// memcpy with non-temporal stores where the destination is whole 64-byte lines (else plain
/// memcpy). Rows written to scattered places of a pool far larger than the caches: an ordinary
/// store first reads each destination line from memory (1.5x the traffic of the copy); a
/// streaming store does not. Its stores are weakly ordered: whoever runs the body fences them
/// (fence_streaming) before another thread may read the bytes (the CPU backend, per launch).
inline void copy_streaming(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) | bytes) % 64 == 0) {
    for (size_t i = 0; i < bytes; i += 64) {
      const auto* in = reinterpret_cast<const __m128i*>(src + i);
      auto* out = reinterpret_cast<__m128i*>(dst + i);
      const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1);
      const __m128i c = _mm_loadu_si128(in + 2), d = _mm_loadu_si128(in + 3);
      _mm_stream_si128(out, a);
      _mm_stream_si128(out + 1, b);
      _mm_stream_si128(out + 2, c);
      _mm_stream_si128(out + 3, d);
    }
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

/// Orders the streaming stores this thread has issued before its later stores (sfence): before
/// another thread is told the bytes are there.
inline void fence_streaming() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// Host copy of one run of a row: streaming (copy_streaming) or memcpy.
inline void copy_run(char* dst, const char* src, int64_t bytes, bool stream) {
  if (stream) {
    copy_streaming(dst, src, static_cast<size_t>(bytes));
  } else {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
}
#endif

/// Copies `seg_bytes` bytes of a row in N-byte vectors, starting at (head h, byte d of the head
/// vector) and walking heads incrementally so that no division happens inside the loop. On the
/// host, `stream` asks for streaming stores (copy_streaming) where memcpy would be used.
template <int N>
PAGEDKV_HOST_DEVICE void copy_row_segment(char* PAGEDKV_RESTRICT dst, int64_t dst_head_stride,
                                          const char* PAGEDKV_RESTRICT src, int64_t src_head_stride,
                                          int64_t h, int64_t d, int64_t head_bytes,
                                          int64_t seg_bytes, bool stream = false) {
#if !defined(__CUDA_ARCH__)
  // The CPU launch shape hands a body whole rows: copy them one head run at a time (the whole
  // row at once when both sides are contiguous), which the C library does at full speed. Same
  // bytes as the loop below; short segments (the GPU shape, also run on the CPU in tests) keep
  // the loop, so it stays tested.
  if (seg_bytes >= kMemcpySegmentBytes) {
    if (dst_head_stride == head_bytes && src_head_stride == head_bytes) {
      copy_run(dst + h * head_bytes + d, src + h * head_bytes + d, seg_bytes, stream);
      return;
    }
    for (int64_t k = 0; k < seg_bytes;) {
      const int64_t run = seg_bytes - k < head_bytes - d ? seg_bytes - k : head_bytes - d;
      copy_run(dst + h * dst_head_stride + d, src + h * src_head_stride + d, run, stream);
      k += run;
      d = 0;
      ++h;
    }
    return;
  }
#endif
  (void)stream;
  using V = typename Bytes<N>::Type;
  for (int64_t k = 0; k < seg_bytes; k += N) {
    *reinterpret_cast<V*>(dst + h * dst_head_stride + d) =
        *reinterpret_cast<const V*>(src + h * src_head_stride + d);
    d += N;
    if (d == head_bytes) {
      d = 0;
      ++h;
    }
  }
}

/// The chunks of one row that one lane moves: its first, then every `lanes`-th after it. A
/// position is (head, element of the head); the step between two of a lane's chunks, in heads
/// and elements, is fixed on the host, so the walk divides nothing. A chunk never crosses a
/// head except when it is the whole row (one chunk, no step).
struct ChunkWalk {
  int32_t h;         // head of the current chunk (from head0)
  int32_t d;         // its first element within that head
  int64_t count;     // chunks left, the current one included
  int32_t step_h;    // (lanes * seg_elems) / head_dim
  int32_t step_d;    // (lanes * seg_elems) % head_dim
  int32_t head_dim;  // elements per head

  PAGEDKV_HOST_DEVICE void next() {
    h += step_h;
    d += step_d;
    if (d >= head_dim) {
      d -= head_dim;
      ++h;
    }
  }
};

/// Copies a lane's chunks of a row, each `seg_bytes` long in N-byte vectors. `es` is the element
/// size (the walk counts elements, the pointers bytes).
template <int N>
PAGEDKV_HOST_DEVICE void copy_row_chunks(char* PAGEDKV_RESTRICT dst, int64_t dst_head_stride,
                                         const char* PAGEDKV_RESTRICT src, int64_t src_head_stride,
                                         ChunkWalk w, int64_t es, int64_t head_bytes,
                                         int64_t seg_bytes, bool stream = false) {
  for (; w.count > 0; --w.count, w.next()) {
    copy_row_segment<N>(dst, dst_head_stride, src, src_head_stride, w.h, w.d * es, head_bytes,
                        seg_bytes, stream);
  }
}

/// The most vectors a lane of PagedRowRawBody loads before it stores any.
inline constexpr int kRawVectorsInFlight = 4;

/// Copies the vectors of walk `w` (each chunk one N-byte vector) issuing up to
/// kRawVectorsInFlight loads before the first of their stores, so a lane waits for memory once
/// per batch instead of once per vector (loads and stores that alternate cannot overlap: the
/// compiler cannot prove that the next load reads nothing the store wrote).
template <int N>
PAGEDKV_HOST_DEVICE void copy_vectors_batched(char* PAGEDKV_RESTRICT dst, int64_t dst_head_stride,
                                              const char* PAGEDKV_RESTRICT src,
                                              int64_t src_head_stride, ChunkWalk w, int64_t es) {
  using V = typename Bytes<N>::Type;
  for (; w.count >= kRawVectorsInFlight; w.count -= kRawVectorsInFlight) {
    const ChunkWalk first = w;
    V v[kRawVectorsInFlight];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < kRawVectorsInFlight; ++k) {
      v[k] = *reinterpret_cast<const V*>(src + w.h * src_head_stride + w.d * es);
      w.next();
    }
    w = first;  // the same positions again, for the stores
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < kRawVectorsInFlight; ++k) {
      *reinterpret_cast<V*>(dst + w.h * dst_head_stride + w.d * es) = v[k];
      w.next();
    }
  }
  // The last few, one at a time.
  for (; w.count > 0; --w.count, w.next()) {
    *reinterpret_cast<V*>(dst + w.h * dst_head_stride + w.d * es) =
        *reinterpret_cast<const V*>(src + w.h * src_head_stride + w.d * es);
  }
}

/// A lane's chunks of a row in N-byte vectors, batched (copy_vectors_batched). A chunk longer
/// than one vector (the wide shape's whole row) is walked vector by vector; on the host one of
/// kMemcpySegmentBytes or more goes to memcpy, as in copy_row_segment.
template <int N>
PAGEDKV_HOST_DEVICE void copy_row_vectors(char* PAGEDKV_RESTRICT dst, int64_t dst_head_stride,
                                          const char* PAGEDKV_RESTRICT src, int64_t src_head_stride,
                                          ChunkWalk w, int64_t es, int64_t head_bytes,
                                          int64_t seg_bytes, bool stream = false) {
  if (seg_bytes == N) {
    return copy_vectors_batched<N>(dst, dst_head_stride, src, src_head_stride, w, es);
  }
#if !defined(__CUDA_ARCH__)
  if (seg_bytes >= kMemcpySegmentBytes) {
    return copy_row_chunks<N>(dst, dst_head_stride, src, src_head_stride, w, es, head_bytes,
                              seg_bytes, stream);
  }
#endif
  (void)head_bytes;
  (void)stream;
  for (; w.count > 0; --w.count, w.next()) {
    // The chunk's vectors: N / es elements apart, crossing heads (N divides a head's bytes).
    const ChunkWalk vectors{w.h, w.d, seg_bytes / N, 0, static_cast<int32_t>(N / es), w.head_dim};
    copy_vectors_batched<N>(dst, dst_head_stride, src, src_head_stride, vectors, es);
  }
}

/// The storage type of one element of T.
template <DType T>
struct Storage {
  using Type = uint16_t;
};
template <>
struct Storage<DType::kFloat32> {
  using Type = float;
};
template <>
struct Storage<DType::kFloat8E4M3> {
  using Type = uint8_t;
};

/// Moves N bytes (8, 16 or a multiple of 16) with vector loads and stores; both sides aligned
/// to min(N, 16). The host compiler gets memcpy (the same moves, without type punning of the
/// caller's local arrays).
template <int N>
PAGEDKV_HOST_DEVICE void move_vectors(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  using V = typename Bytes<(N < 16 ? N : 16)>::Type;
  constexpr int kStep = N < 16 ? N : 16;
#pragma unroll
  for (int k = 0; k < N; k += kStep) {
    *reinterpret_cast<V*>(static_cast<char*>(dst) + k) =
        *reinterpret_cast<const V*>(static_cast<const char*>(src) + k);
  }
#else
  std::memcpy(dst, src, static_cast<size_t>(N));
#endif
}

/// Elements per chunk of the vectorised conversion path.
inline constexpr int kConvertVecElems = 8;

/// The scales of one row's heads, resolved once per row: head h (from head0) has p[h * per_head]
/// (per_head 0: one scale per layer); 1 where p is null (unscaled). The values KvScales::get
/// gives, with the part, layer and head0 arithmetic done once.
struct RowScales {
  const float* p;
  int64_t per_head;

  PAGEDKV_HOST_DEVICE static RowScales of(const KvScales& s, KvPart part, int32_t layer,
                                          int32_t head0, int32_t num_kv_heads) {
    if (s.granularity == ScaleGranularity::kNone) return {nullptr, 0};
    const float* base = part == KvPart::kKey ? s.k : s.v;
    if (s.granularity == ScaleGranularity::kPerLayer) return {base + layer, 0};
    return {base + static_cast<int64_t>(layer) * num_kv_heads + head0, 1};
  }
  PAGEDKV_HOST_DEVICE float at(int64_t h) const { return p == nullptr ? 1.0f : p[h * per_head]; }
};

/// Same walk, element by element, converting Src to Dst through float with a per-head scale:
/// x / scale when quantising into the pool, x * scale when reading out of it. With `vec8` (the
/// host checked that the segment is 8 elements of one head and that both sides are aligned to
/// them), the 8 source elements are loaded with vectors into registers, converted there by the
/// same per-element functions, and stored with vectors: same bytes, 1 or 2 memory accesses a side
/// instead of 8.
template <DType Src, DType Dst>
PAGEDKV_HOST_DEVICE void convert_row_segment(void* dst, int64_t dst_head_stride, const void* src,
                                             int64_t src_head_stride, int64_t h, int64_t d,
                                             int64_t head_dim, int64_t seg_elems,
                                             const RowScales& scales, bool divide, bool vec8) {
  float scale = scales.at(h);
  if (vec8) {
    using S = typename Storage<Src>::Type;
    using D = typename Storage<Dst>::Type;
    constexpr int kN = kConvertVecElems;
    constexpr int kInBytes = kN * static_cast<int>(sizeof(S));
    constexpr int kOutBytes = kN * static_cast<int>(sizeof(D));
    alignas(16) S in[kN];
    alignas(16) D out[kN];
    move_vectors<kInBytes>(in, static_cast<const S*>(src) + h * src_head_stride + d);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < kN; ++k) {
      const float x = load_as_float(in, Src, k);
      store_from_float(out, Dst, k, divide ? x / scale : x * scale);
    }
    move_vectors<kOutBytes>(static_cast<D*>(dst) + h * dst_head_stride + d, out);
    return;
  }
  for (int64_t k = 0; k < seg_elems; ++k) {
    const float x = load_as_float(src, Src, h * src_head_stride + d);
    store_from_float(dst, Dst, h * dst_head_stride + d, divide ? x / scale : x * scale);
    if (++d == head_dim && k + 1 < seg_elems) {
      d = 0;
      ++h;
      scale = scales.at(h);
    }
  }
}

/// convert_row_segment over a lane's chunks of a row.
template <DType Src, DType Dst>
PAGEDKV_HOST_DEVICE void convert_row_chunks(void* dst, int64_t dhs, const void* src, int64_t shs,
                                            ChunkWalk w, int64_t n, const RowScales& s, bool divide,
                                            bool vec8) {
  for (; w.count > 0; --w.count, w.next()) {
    convert_row_segment<Src, Dst>(dst, dhs, src, shs, w.h, w.d, w.head_dim, n, s, divide, vec8);
  }
}

template <DType Src>
PAGEDKV_HOST_DEVICE void convert_row_chunks_to(DType dst_type, void* dst, int64_t dhs,
                                               const void* src, int64_t shs, const ChunkWalk& w,
                                               int64_t n, const RowScales& s, bool divide,
                                               bool vec8) {
  switch (dst_type) {
    case DType::kFloat16:
      return convert_row_chunks<Src, DType::kFloat16>(dst, dhs, src, shs, w, n, s, divide, vec8);
    case DType::kBFloat16:
      return convert_row_chunks<Src, DType::kBFloat16>(dst, dhs, src, shs, w, n, s, divide, vec8);
    case DType::kFloat32:
      return convert_row_chunks<Src, DType::kFloat32>(dst, dhs, src, shs, w, n, s, divide, vec8);
    case DType::kFloat8E4M3:
    default:
      return convert_row_chunks<Src, DType::kFloat8E4M3>(dst, dhs, src, shs, w, n, s, divide, vec8);
  }
}

}  // namespace detail

/// How a row index of PagedRowBody finds its place in the pool.
enum class RowMapping : int32_t {
  kSlots = 0,  // slot = slots[t] (-1 or out of range: skipped), t = token of the op
  kTable = 1,  // one sequence: position pos0 + t through block_tables[0 .. max_blocks)
  kBatch = 2,  // ragged batch: sequence s holds t in [indptr[s], indptr[s+1]), table row s
};

/// The lanes (consecutive indices) a row gets at most while rows fill the device: one warp. A
/// power of two that divides 32, so a row's lanes never straddle two warps of a block of whole
/// warps.
inline constexpr int kWarpRowLanes = 32;
/// The lanes a row gets at most when rows are few: whole warps, at most one CUDA block (256
/// threads), so a row still sits in one block.
inline constexpr int kMaxRowLanes = 256;

/// Moves rows between the pool and a contiguous ("linear") tensor, in either direction,
/// converting dtype and applying fp8 scales when the two element types differ.
///
/// Index space: num_layers_op * layout.num_parts * num_tokens rows of 2^lane_shift lanes each,
/// ordered (layer, part, token, lane); lane l of a row moves its chunks l, l + lanes, ... (of
/// segs_per_row), so that consecutive indices touch consecutive bytes of a row. A latent pool
/// (num_parts 1) moves keys only and never reads lin_v.
struct PagedRowBody {
  // Pool side.
  void* pool;
  PoolLayout layout;
  DType pool_dtype;
  int64_t num_blocks;
  // Linear side: element offsets from lin_k / lin_v. Token-major: t * lin_token_stride +
  // h * lin_head_stride. Head-major ragged (kBatch only): per sequence a [nh, len, head_dim]
  // block starting at indptr[s] * nh * head_dim.
  void* lin_k;
  void* lin_v;
  DType lin_dtype;
  int32_t lin_head_major_ragged;
  int64_t lin_token_stride;
  int64_t lin_head_stride;
  int64_t lin_layer_stride;
  // Mapping.
  RowMapping mapping;
  const int64_t* slots;
  const int32_t* block_tables;
  int64_t table_stride;
  int32_t max_blocks;
  const int32_t* indptr;
  int32_t batch_size;
  int64_t pos0;
  // Extent.
  int32_t layer0;
  int32_t num_layers_op;
  int32_t head0;
  int32_t num_heads_op;
  int64_t num_tokens;
  // Direction and conversion.
  int32_t to_pool;
  int32_t convert;      // 0: same dtype, unscaled: raw vector copy
  int32_t convert_vec;  // convert path, chunks of 8 aligned elements of one head: vectors
  KvScales scales;
  // Launch shape (chosen on the host).
  int32_t vec_bytes;      // raw path: 16, 8, 4, 2 or 1
  int32_t stream_stores;  // raw path on the host: streaming stores (copy_streaming)
  int64_t seg_elems;      // elements per chunk; divides num_heads_op * head_dim (and head_dim
                          // unless it is the whole row)
  int64_t segs_per_row;   // chunks per row
  int32_t lane_shift;     // log2 of the lanes (indices) per row: 0 on the CPU, up to 8
  int32_t step_heads;     // (lanes * seg_elems) / head_dim: from a lane's chunk to its next one
  int32_t step_elems;     // (lanes * seg_elems) % head_dim
  // Dividers by num_tokens, layout.block_size and layout.head_dim (set with the launch shape, by
  // ops_detail::launch_paged_rows).
  FastDivmod tokens_div;
  FastDivmod block_div;
  FastDivmod head_dim_div;

  /// Index of the sequence holding batch token t: the last s with indptr[s] <= t.
  PAGEDKV_HOST_DEVICE int32_t find_sequence(int64_t t) const {
    int32_t lo = 0;
    int32_t hi = batch_size;  // invariant: indptr[lo] <= t < indptr[hi] (when t is in range)
    while (hi - lo > 1) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (indptr[mid] <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  /// Where index i's row lies and which of its chunks the index moves, found once per row.
  struct RowPlace {
    int64_t lane;      // the index's lane in its row
    int64_t pool_off;  // element offset of the row's first (head, element) in the pool
    int64_t lin;       // element offset of the same in the linear tensor (from lin_base)
    int64_t lin_hs;    // the linear tensor's head stride (elements) for this row
    const void* lin_base;
    KvPart part;
    int32_t layer;
  };

  /// Fills `p` for index i; false when the index moves nothing (an idle lane, a -1 or
  /// out-of-range slot, position or block id).
  PAGEDKV_HOST_DEVICE bool locate(int64_t i, RowPlace& p) const {
    const int64_t lane = i & ((int64_t{1} << lane_shift) - 1);
    if (lane >= segs_per_row) return false;  // a short row leaves its group's last lanes idle
    int64_t r = i >> lane_shift;
    int64_t t = 0;
    tokens_div.divmod(r, r, t);
    // r = (layer - layer0) * num_parts + part; a latent pool has one part (keys) per layer.
    const bool latent = layout.num_parts == 1;
    const KvPart part = latent ? KvPart::kKey : static_cast<KvPart>(r & 1);
    const int32_t layer = layer0 + static_cast<int32_t>(latent ? r : r >> 1);
    const int32_t bs = layout.block_size;
    const int32_t head_dim = layout.head_dim;

    int64_t block = 0;
    int64_t off = 0;
    int64_t lin = 0;
    int64_t lin_hs = lin_head_stride;
    if (mapping == RowMapping::kSlots) {
      const int64_t slot = slots[t];
      if (slot < 0) return false;
      block_div.divmod(slot, block, off);
      if (block >= num_blocks) return false;
      lin = t * lin_token_stride;
    } else if (mapping == RowMapping::kTable) {
      const int64_t pos = pos0 + t;
      if (pos < 0) return false;
      const int64_t bi = block_div.div(pos);
      if (bi >= max_blocks) return false;
      block = block_tables[bi];
      off = pos - bi * bs;
      lin = t * lin_token_stride;
    } else {
      const int32_t s = find_sequence(t);
      const int64_t start = indptr[s];
      const int64_t len = static_cast<int64_t>(indptr[s + 1]) - start;
      const int64_t pos = t - start;
      if (pos < 0 || pos >= len) return false;
      const int64_t bi = block_div.div(pos);
      if (bi >= max_blocks) return false;
      block = block_tables[s * table_stride + bi];
      off = pos - bi * bs;
      if (lin_head_major_ragged) {
        lin = start * num_heads_op * head_dim + pos * head_dim;
        lin_hs = len * head_dim;
      } else {
        lin = t * lin_token_stride;
      }
    }
    if (block < 0 || block >= num_blocks) return false;

    p.lane = lane;
    p.pool_off = layout.element_offset(block, layer, part, static_cast<int32_t>(off), head0, 0);
    p.lin = lin + static_cast<int64_t>(layer - layer0) * lin_layer_stride;
    p.lin_hs = lin_hs;
    p.lin_base = part == KvPart::kKey ? lin_k : lin_v;
    p.part = part;
    p.layer = layer;
    return true;
  }

  /// The chunks of its row that `lane` moves: its first, then every lanes-th.
  PAGEDKV_HOST_DEVICE detail::ChunkWalk walk(int64_t lane) const {
    detail::ChunkWalk w;
    int64_t h0 = 0;
    int64_t d0 = 0;
    head_dim_div.divmod(lane * seg_elems, h0, d0);
    w.h = static_cast<int32_t>(h0);
    w.d = static_cast<int32_t>(d0);
    w.count = ((segs_per_row - 1 - lane) >> lane_shift) + 1;
    w.step_h = step_heads;
    w.step_d = step_elems;
    w.head_dim = layout.head_dim;
    return w;
  }

  /// A located row's two ends for the raw path (same dtype, no scale): byte pointers to its
  /// first element and byte head strides, source and destination by direction.
  struct RawEnds {
    char* dst;
    const char* src;
    int64_t dhs;
    int64_t shs;
    int64_t es;  // element size
  };
  PAGEDKV_HOST_DEVICE RawEnds raw_ends(const RowPlace& rp) const {
    const int64_t es = static_cast<int64_t>(dtype_size(pool_dtype));
    const int64_t pool_hs = layout.head_stride() * es;
    char* p = static_cast<char*>(pool) + rp.pool_off * es;
    char* l = static_cast<char*>(const_cast<void*>(rp.lin_base)) + rp.lin * es;
    if (to_pool) return {p, l, pool_hs, rp.lin_hs * es, es};
    return {l, p, rp.lin_hs * es, pool_hs, es};
  }

  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const {
    RowPlace rp;
    if (!locate(i, rp)) return;
    const detail::ChunkWalk w = walk(rp.lane);

    if (!convert) {
      const RawEnds e = raw_ends(rp);
      const int64_t hb = layout.head_dim * e.es;
      const int64_t sb = seg_elems * e.es;
      const bool st = stream_stores != 0;
      switch (vec_bytes) {
        case 16:
          return detail::copy_row_chunks<16>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
        case 8:
          return detail::copy_row_chunks<8>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
        case 4:
          return detail::copy_row_chunks<4>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
        case 2:
          return detail::copy_row_chunks<2>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
        default:
          return detail::copy_row_chunks<1>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
      }
    }

    const int64_t pool_hs = layout.head_stride();
    const int64_t pes = static_cast<int64_t>(dtype_size(pool_dtype));
    const int64_t les = static_cast<int64_t>(dtype_size(lin_dtype));
    char* p = static_cast<char*>(pool) + rp.pool_off * pes;
    char* l = static_cast<char*>(const_cast<void*>(rp.lin_base)) + rp.lin * les;
    void* dst = to_pool ? p : l;
    const void* src = to_pool ? l : p;
    const DType st = to_pool ? lin_dtype : pool_dtype;
    const DType dt = to_pool ? pool_dtype : lin_dtype;
    const int64_t dhs = to_pool ? pool_hs : rp.lin_hs;
    const int64_t shs = to_pool ? rp.lin_hs : pool_hs;
    const bool divide = to_pool != 0;
    const detail::RowScales rs =
        detail::RowScales::of(scales, rp.part, rp.layer, head0, layout.num_kv_heads);
    switch (st) {
      case DType::kFloat16:
        return detail::convert_row_chunks_to<DType::kFloat16>(dt, dst, dhs, src, shs, w, seg_elems,
                                                              rs, divide, convert_vec != 0);
      case DType::kBFloat16:
        return detail::convert_row_chunks_to<DType::kBFloat16>(dt, dst, dhs, src, shs, w, seg_elems,
                                                               rs, divide, convert_vec != 0);
      case DType::kFloat32:
        return detail::convert_row_chunks_to<DType::kFloat32>(dt, dst, dhs, src, shs, w, seg_elems,
                                                              rs, divide, convert_vec != 0);
      case DType::kFloat8E4M3:
      default:
        return detail::convert_row_chunks_to<DType::kFloat8E4M3>(
            dt, dst, dhs, src, shs, w, seg_elems, rs, divide, convert_vec != 0);
    }
  }
};

/// PagedRowBody's raw path (same dtype, no scale) alone, as its own kernel: each lane loads up
/// to kRawVectorsInFlight of its vectors before storing them (copy_row_vectors). Kept apart so
/// that the extra registers of the batch cost occupancy here only, not in the generic body,
/// whose register count is set by its conversion paths. The ops launch it whenever no
/// conversion is needed; the params are a PagedRowBody with `convert` 0.
struct PagedRowRawBody {
  PagedRowBody row;

  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const {
    PagedRowBody::RowPlace rp;
    if (!row.locate(i, rp)) return;
    const detail::ChunkWalk w = row.walk(rp.lane);
    const PagedRowBody::RawEnds e = row.raw_ends(rp);
    const int64_t hb = row.layout.head_dim * e.es;
    const int64_t sb = row.seg_elems * e.es;
    const bool st = row.stream_stores != 0;
    switch (row.vec_bytes) {
      case 16:
        return detail::copy_row_vectors<16>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
      case 8:
        return detail::copy_row_vectors<8>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
      case 4:
        return detail::copy_row_vectors<4>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
      case 2:
        return detail::copy_row_vectors<2>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
      default:
        return detail::copy_row_vectors<1>(e.dst, e.dhs, e.src, e.shs, w, e.es, hb, sb, st);
    }
  }
};

/// Copies whole blocks (all layers and parts: one contiguous range each) for a batch of
/// (src, dst) pairs, from the pool at `src_pool` into the one at `dst_pool`: the same pool for
/// copy-on-write, the device pool and the mapped pinned host pool for the transfer engine's
/// offloads and restores. Index space: num_pairs * chunks_per_block. A pair whose ids are out
/// of range, or equal within one pool, is skipped.
struct CopyBlocksBody {
  char* dst_pool;
  const char* src_pool;
  const void* pairs;  // [num_pairs][2] int32 or int64: (src, dst)
  int32_t pairs_int64;
  int64_t src_blocks;  // blocks in each pool, for the bounds check
  int64_t dst_blocks;
  int64_t block_bytes;
  int64_t chunk_bytes;  // bytes per index; divides block_bytes
  int64_t chunks_per_block;
  int32_t vec_bytes;
  FastDivmod chunks_div;  // by chunks_per_block

  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const {
    int64_t pair = 0;
    int64_t chunk = 0;
    chunks_div.divmod(i, pair, chunk);
    int64_t src;
    int64_t dst;
    if (pairs_int64) {
      src = static_cast<const int64_t*>(pairs)[2 * pair];
      dst = static_cast<const int64_t*>(pairs)[2 * pair + 1];
    } else {
      src = static_cast<const int32_t*>(pairs)[2 * pair];
      dst = static_cast<const int32_t*>(pairs)[2 * pair + 1];
    }
    if (src < 0 || dst < 0 || src >= src_blocks || dst >= dst_blocks) return;
    if (src == dst && src_pool == dst_pool) return;
    const int64_t o = chunk * chunk_bytes;
    char* d = dst_pool + dst * block_bytes + o;
    const char* s = src_pool + src * block_bytes + o;
    // A contiguous range: the row walk with one "head" as long as the chunk.
    switch (vec_bytes) {
      case 16:
        return detail::copy_row_segment<16>(d, 0, s, 0, 0, 0, chunk_bytes, chunk_bytes);
      case 8:
        return detail::copy_row_segment<8>(d, 0, s, 0, 0, 0, chunk_bytes, chunk_bytes);
      case 4:
        return detail::copy_row_segment<4>(d, 0, s, 0, 0, 0, chunk_bytes, chunk_bytes);
      case 2:
        return detail::copy_row_segment<2>(d, 0, s, 0, 0, 0, chunk_bytes, chunk_bytes);
      default:
        return detail::copy_row_segment<1>(d, 0, s, 0, 0, 0, chunk_bytes, chunk_bytes);
    }
  }
};

}  // namespace pagedkv::kernels
