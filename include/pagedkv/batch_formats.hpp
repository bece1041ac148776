// A step's batch in the exact argument formats of the attention kernels a server plugs in:
// FlashInfer's CUDA-graph mode (CSR into caller-owned fixed-address buffers, host copies for
// plan()), FlashInfer's append path (batch_indices / positions) and vLLM's (block_table,
// slot_mapping padded with -1). Free functions over the public KvCache API: each one calls
// KvCache::build_batch (or reads the DeviceBatch it returned) and queues its copies on the
// cache's compute stream, so the arrays are ready for work queued on that stream afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// Caller-owned int32 device buffers at fixed addresses (a captured CUDA graph reads them).
struct CsrBuffers {
  int32_t* kv_indptr = nullptr;         // [max_batch + 1]
  int32_t* kv_indices = nullptr;        // [max_pages]
  int32_t* kv_last_page_len = nullptr;  // [max_batch]
  int32_t max_batch = 0;
  int64_t max_pages = 0;
  /// Optional: the slot mapping, [num_slots] int64, -1 past the batch's tokens. When set, the
  /// returned batch's slot_mapping is this buffer (DeviceBatch::caller_owned_slots), so
  /// write_kv_batch over it may be captured in a CUDA graph.
  int64_t* slot_mapping = nullptr;
  int64_t num_slots = 0;
};

/// Host copies of the CSR arrays that FlashInfer's plan() reads on the host.
struct CsrHostCopy {
  std::vector<int32_t> kv_indptr;         // [batch + 1], kv_indptr[0] = 0
  std::vector<int32_t> kv_last_page_len;  // [batch], 1 .. block_size for a non-empty row
};

/// Builds the step's batch of `ids` (KvCache::build_batch with build_csr) and copies its CSR
/// arrays (and, when given, its slot mapping padded to num_slots) into `buffers` on the compute
/// stream; fills `host` (may be null). Entries past the batch are left as they were.
/// kInvalidArgument for a null buffer or a capacity too small for the batch, kNotFound for an
/// unknown id: both checked before build_batch, so the cache is unchanged; otherwise
/// build_batch's own errors.
StatusOr<DeviceBatch> build_batch_into(KvCache& cache, const std::vector<SequenceId>& ids,
                                       const CsrBuffers& buffers, CsrHostCopy* host);

/// FlashInfer's append-path indices of a built batch (get_batch_indices_positions): row r
/// appends a_r tokens (its reserved ones) to a kv length L_r (its seq_len, appended included).
struct AppendIndices {
  std::vector<int32_t> append_indptr;  // [batch + 1]: append_indptr[r+1] = append_indptr[r] + a_r
  std::vector<int32_t> batch_indices;  // [nnz]: r for each appended token of row r
  std::vector<int32_t> positions;      // [nnz]: L_r - a_r + j for the j-th appended token
};

/// The append indices of `batch`, which build_batch(ids) returned. kInvalidArgument when the
/// batch does not describe `ids` as they are now (another size, or a call changed a row since),
/// kNotFound for an unknown id.
StatusOr<AppendIndices> append_indices(const KvCache& cache, const std::vector<SequenceId>& ids,
                                       const DeviceBatch& batch);

/// Copies `host`'s batch_indices and positions into caller-owned int32 device buffers of
/// `capacity` entries on the compute stream, staged through the cache's pinned upload arena
/// (KvCache::upload_to_device): `host` may change or go away once this returns, and no host
/// function is queued. kInvalidArgument for a null pointer or a capacity below nnz;
/// kFailedPrecondition while the compute stream captures a CUDA graph (call it before).
Status upload_append_indices(KvCache& cache, std::shared_ptr<const AppendIndices> host,
                             int32_t* batch_indices, int32_t* positions, int64_t capacity);

/// Caller-owned vLLM-style device buffers.
struct VllmBuffers {
  int32_t* block_table = nullptr;  // [max_reqs, max_blocks] int32
  int32_t max_reqs = 0;
  int32_t max_blocks = 0;
  int64_t* slot_mapping = nullptr;  // [num_slots] int64, -1 past the batch's tokens
  int64_t num_slots = 0;
};

/// Builds the step's batch of `ids` (slot mapping padded with -1 to num_slots) and writes it in
/// vLLM's form on the compute stream: row r of block_table holds sequence r's blocks then -1
/// up to max_blocks; rows past the batch are left as they were. The table is re-pitched on the
/// host and goes through the cache's pinned upload arena (KvCache::upload_to_device): no
/// pageable copy, no host function, and with a step_shape that covers the buffers no
/// allocation. The returned batch's
/// slot_mapping is buffers.slot_mapping (DeviceBatch::caller_owned_slots): write_kv_batch over
/// it may be captured in a CUDA graph, replayed after each step's build. kInvalidArgument for a
/// null buffer or a capacity too small, kNotFound for an unknown id: checked before build_batch, so
/// the cache is unchanged; otherwise build_batch's own errors.
StatusOr<DeviceBatch> build_vllm_batch_into(KvCache& cache, const std::vector<SequenceId>& ids,
                                            const VllmBuffers& buffers);

}  // namespace pagedkv
