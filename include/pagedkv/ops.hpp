// The data plane: asynchronous ops that move K/V bytes in and out of a paged pool.
//
// Every op validates its arguments on the host before anything is queued (a failed call has no
// effect, and the error message names the offending argument), then launches one kernel body on
// `stream`. No op synchronises the host or allocates, so a decode step can be captured in a CUDA
// graph. Pointers are device pointers of the backend (host memory on the CPU backend).
//
// Device-resident indices (slot mappings, block tables, indptr, block pairs) cannot be checked on
// the host without a synchronisation: the kernels skip an out-of-range entry as they skip a -1
// slot, so bad metadata never writes outside the pool.
//
// fp8 (e4m3) pools: stored = fp8(x / scale), read = fp8 * scale, with scales per layer or per
// (layer, head) given as device float arrays covering every layer (KvScales).
//
// Latent (MLA) pools (layout.num_parts == 1, CacheConfig::kv_kind == kLatent) hold keys only:
// every op takes the latent vectors [tokens, 1, head_dim] as `key` and needs a null `value`
// (non-null is kInvalidArgument: "value: a latent (MLA) cache stores no values; pass null");
// fp8 scales are `scales.k` alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagedkv/backend.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/kv_scales.hpp"
#include "pagedkv/layout.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// A pool as the data plane sees it: `num_blocks` blocks of `layout` with elements of `dtype`.
struct PoolRef {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
  PoolLayout layout;
  int64_t num_blocks = 0;
};

/// Arguments of write_kv: K and V of `num_tokens` new tokens written at their slots in one layer.
struct WriteKvArgs {
  /// [num_tokens, num_kv_heads, head_dim] of `input_dtype`, `row_stride` elements between
  /// tokens (0: packed, num_kv_heads * head_dim); may be slices of a fused QKV output.
  const void* key = nullptr;
  const void* value = nullptr;
  DType input_dtype = DType::kFloat16;
  int64_t row_stride = 0;
  int64_t num_tokens = 0;
  /// Device int64 [num_tokens]: slot = block_id * block_size + offset; -1 skips the token.
  const int64_t* slot_mapping = nullptr;
  int32_t layer = 0;
  /// fp8 pools only.
  KvScales scales;
};

/// Writes K/V of new tokens into one layer at their slots (vLLM reshape_and_cache). Converts to
/// the pool dtype (fp16/bf16/fp32 input). kInvalidArgument / kOutOfRange name the argument.
Status write_kv(Backend& backend, const PoolRef& pool, const WriteKvArgs& args, Stream stream = {});

/// Arguments of write_kv_all_layers: as WriteKvArgs, for every layer of the pool at once.
struct WriteKvAllLayersArgs {
  /// [num_layers][num_tokens, num_kv_heads, head_dim]; `layer_stride` elements between layers
  /// (0: num_tokens * row_stride).
  const void* key = nullptr;
  const void* value = nullptr;
  DType input_dtype = DType::kFloat16;
  int64_t row_stride = 0;
  int64_t layer_stride = 0;
  int64_t num_tokens = 0;
  const int64_t* slot_mapping = nullptr;
  KvScales scales;
};

/// Writes K/V of new tokens into every layer in one launch.
Status write_kv_all_layers(Backend& backend, const PoolRef& pool, const WriteKvAllLayersArgs& args,
                           Stream stream = {});

/// Arguments of scatter_head_range: heads [head_begin, head_begin + num_heads) of positions
/// [position_begin, position_begin + num_tokens) of one sequence, one layer.
struct ScatterHeadRangeArgs {
  /// Head-major [num_heads, num_tokens, head_dim], packed.
  const void* key = nullptr;
  const void* value = nullptr;
  DType input_dtype = DType::kFloat16;
  /// Device int32: the sequence's physical block ids, `block_table_len` of them.
  const int32_t* block_table = nullptr;
  int32_t block_table_len = 0;
  int32_t layer = 0;
  int32_t head_begin = 0;
  int32_t num_heads = 0;
  int64_t position_begin = 0;
  int64_t num_tokens = 0;
  KvScales scales;
};

/// Scatters a head-major prefill output into the pool (seed append_head_range_seq_first).
Status scatter_head_range(Backend& backend, const PoolRef& pool, const ScatterHeadRangeArgs& args,
                          Stream stream = {});

/// Order of a packed (contiguous) layer.
enum class PackedLayout : uint8_t {
  kHeadMajor = 0,   // [heads, len, head_dim] (ONNX past key/value, without the batch axis)
  kTokenMajor = 1,  // [len, heads, head_dim]
};

/// One layer of one sequence, packed: gather writes `key`/`value`, import reads them.
struct PackedLayerArgs {
  void* key = nullptr;
  void* value = nullptr;
  DType packed_dtype = DType::kFloat16;
  PackedLayout packed_layout = PackedLayout::kHeadMajor;
  /// Device int32: the sequence's physical block ids.
  const int32_t* block_table = nullptr;
  int32_t block_table_len = 0;
  int32_t layer = 0;
  /// Positions [position_begin, position_begin + num_tokens) of the sequence.
  int64_t position_begin = 0;
  int64_t num_tokens = 0;
  KvScales scales;
};

/// Packs one layer of a sequence (keys and values) into contiguous buffers, converting (and
/// dequantising fp8) to `packed_dtype`.
Status gather_layer(Backend& backend, const PoolRef& pool, const PackedLayerArgs& args,
                    Stream stream = {});

/// Writes a packed layer of a sequence into its pages: only that layer's pages, every other
/// layer and every other block untouched (seed set_packed_layer / overwrite_layer, fixed).
Status import_layer(Backend& backend, const PoolRef& pool, const PackedLayerArgs& args,
                    Stream stream = {});

/// One layer of a ragged batch, packed. Sequence s covers packed tokens [indptr[s], indptr[s+1])
/// and positions [0, indptr[s+1] - indptr[s]); head-major packing stores each sequence as its
/// own [heads, len_s, head_dim] block starting at element indptr[s] * heads * head_dim.
struct PackedBatchArgs {
  void* key = nullptr;
  void* value = nullptr;
  DType packed_dtype = DType::kFloat16;
  PackedLayout packed_layout = PackedLayout::kHeadMajor;
  /// Device int32 [batch_size, max_blocks_per_seq].
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  /// Device int32 [batch_size + 1], non-decreasing, indptr[0] = 0.
  const int32_t* indptr = nullptr;
  int32_t batch_size = 0;
  /// indptr[batch_size], known to the host (the op cannot read device memory).
  int64_t total_tokens = 0;
  int32_t layer = 0;
  KvScales scales;
};

/// Packs one layer of every sequence of a batch in one launch.
Status gather_layer_batch(Backend& backend, const PoolRef& pool, const PackedBatchArgs& args,
                          Stream stream = {});

/// Imports one packed layer for every sequence of a batch in one launch.
Status import_layer_batch(Backend& backend, const PoolRef& pool, const PackedBatchArgs& args,
                          Stream stream = {});

/// Element type of device index arrays.
enum class IndexType : uint8_t { kInt32 = 0, kInt64 = 1 };

/// Arguments of copy_blocks.
struct CopyBlocksArgs {
  /// Device [num_pairs][2] (src, dst) block ids of `index_type`. Destinations must be distinct
  /// and must not be sources of other pairs.
  const void* pairs = nullptr;
  IndexType index_type = IndexType::kInt32;
  int64_t num_pairs = 0;
};

/// Copies whole blocks (every layer, keys and values or latents) for a batch of pairs in one launch
/// (copy-on-write, fork). A pair with an id outside the pool is skipped.
Status copy_blocks(Backend& backend, const PoolRef& pool, const CopyBlocksArgs& args,
                   Stream stream = {});

/// Scratch bytes build_indptr needs for `batch_size` sequences on this backend (CUB's
/// requirement on CUDA, 0 on the CPU). kInvalidArgument for a negative batch.
StatusOr<size_t> build_indptr_scratch_bytes(Backend& backend, int32_t batch_size);

/// Arguments of build_indptr.
struct BuildIndptrArgs {
  const int32_t* seq_lens = nullptr;  // device [batch_size]
  int32_t* indptr = nullptr;          // device [batch_size + 1]
  int32_t batch_size = 0;
  void* scratch = nullptr;  // caller-owned, build_indptr_scratch_bytes() bytes
  size_t scratch_bytes = 0;
};

/// indptr[0] = 0, indptr[s + 1] = indptr[s] + seq_lens[s], on the device (CUB DeviceScan on
/// CUDA). The sum must fit in int32 (not checkable on the host).
Status build_indptr(Backend& backend, const BuildIndptrArgs& args, Stream stream = {});

}  // namespace pagedkv
