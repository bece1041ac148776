// Kernel argument formats of a step's batch, over the public KvCache API (batch_formats.hpp).
#include "pagedkv/batch_formats.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace pagedkv {
namespace {

// What a batch of `ids` will need, read from the cache before build_batch changes anything.
struct BatchNeeds {
  int64_t pages = 0;      // sum of the rows' blocks
  int64_t max_pages = 0;  // the longest row's blocks
  int64_t tokens = 0;     // reserved tokens (slot mapping entries before padding)
};

StatusOr<BatchNeeds> batch_needs(const KvCache& cache, const std::vector<SequenceId>& ids) {
  BatchNeeds needs;
  const int64_t block_size = cache.config().block_size;
  for (SequenceId id : ids) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t length, cache.length(id));
    PAGEDKV_ASSIGN_OR_RETURN(int64_t pending, cache.pending(id));
    const int64_t pages = (length + pending + block_size - 1) / block_size;
    needs.pages += pages;
    needs.max_pages = pages > needs.max_pages ? pages : needs.max_pages;
    needs.tokens += pending;
  }
  return needs;
}

Status copy_on_compute(KvCache& cache, void* dst, const void* src, size_t bytes, CopyKind kind) {
  return cache.backend().copy_async(dst, src, bytes, kind, cache.compute_stream());
}

// Copies the batch's slot mapping (padded to num_slots) into the caller's buffer and points the
// batch at it: the same address every step, so a captured write_kv_batch reads each step's.
Status adopt_slot_mapping(KvCache& cache, int64_t* slot_mapping, int64_t num_slots,
                          DeviceBatch* batch) {
  PAGEDKV_RETURN_IF_ERROR(copy_on_compute(cache, slot_mapping, batch->slot_mapping,
                                          static_cast<size_t>(num_slots) * sizeof(int64_t),
                                          CopyKind::kDeviceToDevice));
  batch->slot_mapping = slot_mapping;
  batch->caller_owned_slots = true;
  return ok_status();
}

Status copy_failed(const Status& s) {
  return Status(StatusCode::kInternal,
                "copying the batch into the caller's buffers: " + s.to_string());
}

}  // namespace

StatusOr<DeviceBatch> build_batch_into(KvCache& cache, const std::vector<SequenceId>& ids,
                                       const CsrBuffers& buffers, CsrHostCopy* host) {
  if (buffers.kv_indptr == nullptr || buffers.kv_indices == nullptr ||
      buffers.kv_last_page_len == nullptr) {
    return invalid_argument("buffers: kv_indptr, kv_indices and kv_last_page_len must be set");
  }
  PAGEDKV_ASSIGN_OR_RETURN(BatchNeeds needs, batch_needs(cache, ids));
  if (static_cast<int64_t>(ids.size()) > buffers.max_batch) {
    return invalid_argument("buffers.max_batch: " + std::to_string(buffers.max_batch) +
                            " rows, the batch has " + std::to_string(ids.size()));
  }
  if (needs.pages > buffers.max_pages) {
    return invalid_argument("buffers.max_pages: " + std::to_string(buffers.max_pages) +
                            " pages, the batch has " + std::to_string(needs.pages));
  }
  if (buffers.slot_mapping != nullptr &&
      (needs.tokens > buffers.num_slots || buffers.num_slots <= 0)) {
    return invalid_argument("buffers.num_slots: " + std::to_string(buffers.num_slots) +
                            ", the batch writes " + std::to_string(needs.tokens) + " tokens");
  }
  BatchOptions options;
  options.build_csr = true;
  if (buffers.slot_mapping != nullptr) options.pad_slots_to = buffers.num_slots;
  PAGEDKV_ASSIGN_OR_RETURN(DeviceBatch batch, cache.build_batch(ids, options));
  const BatchMetadata& meta = *batch.host;
  const size_t rows = static_cast<size_t>(meta.batch_size);
  const size_t pages = meta.indices.size();
  Status s = copy_on_compute(cache, buffers.kv_indptr, batch.indptr, (rows + 1) * sizeof(int32_t),
                             CopyKind::kDeviceToDevice);
  if (s.ok() && pages > 0) {
    s = copy_on_compute(cache, buffers.kv_indices, batch.indices, pages * sizeof(int32_t),
                        CopyKind::kDeviceToDevice);
  }
  if (s.ok() && rows > 0) {
    s = copy_on_compute(cache, buffers.kv_last_page_len, batch.last_page_len,
                        rows * sizeof(int32_t), CopyKind::kDeviceToDevice);
  }
  if (s.ok() && buffers.slot_mapping != nullptr) {
    s = adopt_slot_mapping(cache, buffers.slot_mapping, buffers.num_slots, &batch);
  }
  if (!s.ok()) return copy_failed(s);
  if (host != nullptr) {
    host->kv_indptr = meta.indptr;
    host->kv_last_page_len = meta.last_page_len;
  }
  return batch;
}

StatusOr<AppendIndices> append_indices(const KvCache& cache, const std::vector<SequenceId>& ids,
                                       const DeviceBatch& batch) {
  if (batch.host == nullptr) return invalid_argument("batch: not built (no host metadata)");
  const BatchMetadata& meta = *batch.host;
  if (static_cast<size_t>(meta.batch_size) != ids.size()) {
    return invalid_argument("batch: " + std::to_string(meta.batch_size) + " rows, but " +
                            std::to_string(ids.size()) + " ids");
  }
  AppendIndices out;
  out.append_indptr.reserve(ids.size() + 1);
  out.append_indptr.push_back(0);
  for (size_t r = 0; r < ids.size(); ++r) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t length, cache.length(ids[r]));
    PAGEDKV_ASSIGN_OR_RETURN(int64_t pending, cache.pending(ids[r]));
    if (length + pending != meta.seq_lens[r]) {
      return invalid_argument("batch: row " + std::to_string(r) + " (sequence " +
                              std::to_string(ids[r]) + ") changed since build_batch");
    }
    const int32_t a = static_cast<int32_t>(pending);
    for (int32_t j = 0; j < a; ++j) {
      out.batch_indices.push_back(static_cast<int32_t>(r));
      out.positions.push_back(meta.seq_lens[r] - a + j);
    }
    out.append_indptr.push_back(out.append_indptr.back() + a);
  }
  return out;
}

Status upload_append_indices(KvCache& cache, std::shared_ptr<const AppendIndices> host,
                             int32_t* batch_indices, int32_t* positions, int64_t capacity) {
  if (host == nullptr || batch_indices == nullptr || positions == nullptr) {
    return invalid_argument("host, batch_indices and positions must be set");
  }
  const size_t nnz = host->batch_indices.size();
  if (host->positions.size() != nnz) {
    return invalid_argument("host: batch_indices and positions differ in length");
  }
  if (static_cast<int64_t>(nnz) > capacity) {
    return invalid_argument("capacity: " + std::to_string(capacity) + " entries, nnz is " +
                            std::to_string(nnz));
  }
  if (nnz == 0) return ok_status();
  const size_t bytes = nnz * sizeof(int32_t);
  // Through the pinned upload arena: the host arrays are copied out before this returns, so no
  // host function has to keep them alive and no pageable copy is queued.
  const HostUpload arrays[] = {{batch_indices, host->batch_indices.data(), bytes},
                               {positions, host->positions.data(), bytes}};
  Status s = cache.upload_to_device(arrays, 2);
  return s.ok() || s.code() != StatusCode::kInternal ? s : copy_failed(s);
}

StatusOr<DeviceBatch> build_vllm_batch_into(KvCache& cache, const std::vector<SequenceId>& ids,
                                            const VllmBuffers& buffers) {
  if (buffers.block_table == nullptr || buffers.slot_mapping == nullptr) {
    return invalid_argument("buffers: block_table and slot_mapping must be set");
  }
  PAGEDKV_ASSIGN_OR_RETURN(BatchNeeds needs, batch_needs(cache, ids));
  if (static_cast<int64_t>(ids.size()) > buffers.max_reqs) {
    return invalid_argument("buffers.max_reqs: " + std::to_string(buffers.max_reqs) +
                            " rows, the batch has " + std::to_string(ids.size()));
  }
  if (needs.max_pages > buffers.max_blocks) {
    return invalid_argument("buffers.max_blocks: " + std::to_string(buffers.max_blocks) +
                            ", a row has " + std::to_string(needs.max_pages) + " blocks");
  }
  if (needs.tokens > buffers.num_slots || buffers.num_slots <= 0) {
    return invalid_argument("buffers.num_slots: " + std::to_string(buffers.num_slots) +
                            ", the batch writes " + std::to_string(needs.tokens) + " tokens");
  }
  BatchOptions options;
  options.pad_slots_to = buffers.num_slots;
  PAGEDKV_ASSIGN_OR_RETURN(DeviceBatch batch, cache.build_batch(ids, options));
  const BatchMetadata& meta = *batch.host;
  // The cache's row stride grows geometrically; vLLM's is fixed: re-pitch the rows on the host
  // and upload them through the cache's pinned arena, which copies them out before it returns.
  const size_t rows = static_cast<size_t>(meta.batch_size);
  const size_t width = static_cast<size_t>(buffers.max_blocks);
  std::vector<int32_t> table(rows * width, -1);
  const size_t copy_width = std::min(width, static_cast<size_t>(meta.max_blocks));
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < copy_width; ++c) {
      table[r * width + c] = meta.block_tables[r * static_cast<size_t>(meta.max_blocks) + c];
    }
  }
  Status s = adopt_slot_mapping(cache, buffers.slot_mapping, buffers.num_slots, &batch);
  if (s.ok() && rows > 0) {
    const HostUpload upload{buffers.block_table, table.data(), table.size() * sizeof(int32_t)};
    s = cache.upload_to_device(&upload, 1);
  }
  if (!s.ok()) return copy_failed(s);
  return batch;
}

}  // namespace pagedkv
