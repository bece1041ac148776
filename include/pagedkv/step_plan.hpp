// What one tensor-parallel rank's data plane must do for the decisions a KvCache made, as a
// message another process can apply (the split-process form, vLLM's shape: the control plane in
// the scheduler's process, each rank's pools in a worker process).
//
// A KvCache created with KvCacheOptions::record_step_plans records, in call order, every plan it
// carried out (the block moves between tiers and the copy-on-write copies) and every batch it
// built (the metadata its kernels read); take_step_plan() hands over what was recorded since the
// last take. A worker process holds a KvCache of its rank's part of the model
// (rank_config(model, N)) that makes no decisions of its own: apply_step_plan() queues the same
// moves and copies on its pools, in the same block ids, and uploads each batch, whose
// DeviceBatch its model then writes and reads through (write_kv_batch, device_view).
//
// encode() / decode() give the plan as bytes: a fixed header, then the records, each number in
// the host's byte order (the scheduler and its workers run on one host, or on hosts of one byte
// order). decode() checks every length against the bytes it has, so a truncated or corrupted
// message is an error (kInvalidArgument), never a read past the end; apply_step_plan() checks
// every block id and slot against the worker's pools before it queues anything.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// One step of a StepPlan: the moves and copies of one plan, or one group's batch.
struct StepRecord {
  enum class Kind : uint8_t {
    kTransfers = 1,  // `moves` (in order), then `copies`
    kBatch = 2,      // `batch` of group `group`, uploaded
  };
  Kind kind = Kind::kTransfers;
  std::vector<BlockMove> moves;
  std::vector<BlockCopy> copies;
  /// kBatch: the KV group whose pool the batch indexes.
  int32_t group = 0;
  /// kBatch: whether the batch has its CSR form (BatchOptions::build_csr).
  bool build_csr = false;
  /// kBatch: block ids, tables and slots, as the control plane built them.
  BatchMetadata batch;
  /// kBatch: a batch built in the same call (build_batches) as the record before it, so it is
  /// current together with it; false starts a new build, which makes the earlier batches stale.
  bool same_build = false;
};

/// The data-plane steps of a stretch of KvCache calls, in order.
struct StepPlan {
  std::vector<StepRecord> records;

  bool empty() const { return records.empty(); }
  /// The plan as bytes (see the file comment).
  std::string encode() const;
  /// A plan from encode()'s bytes; kInvalidArgument naming what is wrong (the header, a record
  /// kind, a length past the end, bytes left over).
  static StatusOr<StepPlan> decode(std::string_view bytes);
};

}  // namespace pagedkv
