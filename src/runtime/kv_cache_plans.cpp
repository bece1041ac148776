// Split-process tensor parallelism (step_plan.hpp): the scheduler's cache records the moves,
// copies and batches of its calls; a worker's cache, holding one rank's part of the model,
// applies them to its pools in the same block ids.
#include <string>
#include <utility>

#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {
namespace {

// kInvalidArgument naming record `i` and `what` unless -1 <= v < limit (or 0 <= v without
// `allow_none`).
Status check_index(int64_t v, int64_t limit, bool allow_none, size_t i, const std::string& what) {
  if ((allow_none && v == -1) || (v >= 0 && v < limit)) return ok_status();
  return invalid_argument("apply_step_plan: record " + std::to_string(i) + ": " + what + " " +
                          std::to_string(v) + " outside [0, " + std::to_string(limit) + ")");
}

template <typename T>
Status check_all(const std::vector<T>& values, int64_t limit, size_t i, const std::string& what) {
  for (T v : values) PAGEDKV_RETURN_IF_ERROR(check_index(v, limit, true, i, what));
  return ok_status();
}

}  // namespace

void KvCache::Impl::record_transfers(const Transfers& t) {
  if (t.moves.empty() && t.copies.empty()) return;
  StepRecord rec;
  rec.kind = StepRecord::Kind::kTransfers;
  rec.moves = t.moves;
  rec.copies = t.copies;
  recorded.records.push_back(std::move(rec));
}

void KvCache::Impl::record_batch(int32_t g, const BatchMetadata& m, const BatchOptions& options,
                                 bool same_build) {
  StepRecord rec;
  rec.kind = StepRecord::Kind::kBatch;
  rec.group = g;
  rec.build_csr = options.build_csr;
  rec.same_build = same_build;
  rec.batch = m;
  recorded.records.push_back(std::move(rec));
}

Status KvCache::Impl::refuse_if_applying_plans(const char* what) const {
  if (!applies_plans) return ok_status();
  return failed_precondition(std::string(what) +
                             ": this cache applies another cache's step plans "
                             "(apply_step_plan): it makes no decisions of its own");
}

Status KvCache::Impl::check_step_record(const StepRecord& rec, const StepRecord* before,
                                        size_t i) const {
  const std::string at = "apply_step_plan: record " + std::to_string(i);
  auto group_ok = [&](int32_t g) {
    return g >= 0 && g < num_groups()
               ? ok_status()
               : invalid_argument(at + ": group " + std::to_string(g) + " of a cache of " +
                                  std::to_string(num_groups()) + " groups");
  };
  if (rec.kind == StepRecord::Kind::kTransfers) {
    for (const BlockMove& m : rec.moves) {
      PAGEDKV_RETURN_IF_ERROR(group_ok(m.group));
      const CacheConfig& c = shard_config(m.group);
      const bool offload = m.src_tier == Tier::kDevice && m.dst_tier == Tier::kHost;
      const bool restore = m.src_tier == Tier::kHost && m.dst_tier == Tier::kDevice;
      if (!offload && !restore) {
        return invalid_argument(at + ": a move between tiers " +
                                std::to_string(static_cast<int>(m.src_tier)) + " and " +
                                std::to_string(static_cast<int>(m.dst_tier)) +
                                " (device to host or host to device)");
      }
      const int64_t device = c.num_device_blocks, host = c.num_host_blocks;
      PAGEDKV_RETURN_IF_ERROR(
          check_index(m.src_block, offload ? device : host, false, i, "a move's source block"));
      PAGEDKV_RETURN_IF_ERROR(
          check_index(m.dst_block, offload ? host : device, false, i, "a move's target block"));
    }
    for (const BlockCopy& cp : rec.copies) {
      PAGEDKV_RETURN_IF_ERROR(group_ok(cp.group));
      const int64_t device = shard_config(cp.group).num_device_blocks;
      PAGEDKV_RETURN_IF_ERROR(check_index(cp.src_block, device, false, i, "a copy's source"));
      PAGEDKV_RETURN_IF_ERROR(check_index(cp.dst_block, device, false, i, "a copy's target"));
    }
    return ok_status();
  }
  if (rec.kind != StepRecord::Kind::kBatch) {
    return invalid_argument(at + ": kind " + std::to_string(static_cast<int>(rec.kind)));
  }
  PAGEDKV_RETURN_IF_ERROR(group_ok(rec.group));
  const CacheConfig& c = shard_config(rec.group);
  const BatchMetadata& m = rec.batch;
  const int64_t rows = m.batch_size, stride = m.max_blocks;
  if (rows < 0 || stride < 0 || static_cast<int64_t>(m.block_tables.size()) != rows * stride ||
      static_cast<int64_t>(m.seq_lens.size()) != rows) {
    return invalid_argument(at + ": a batch of " + std::to_string(rows) + " rows of " +
                            std::to_string(stride) + " blocks with " +
                            std::to_string(m.block_tables.size()) + " table entries and " +
                            std::to_string(m.seq_lens.size()) + " lengths");
  }
  if (m.ring_table && (c.sliding_window <= 0 || (rows > 0 && stride == 0))) {
    return invalid_argument(at + ": a ring table of " + std::to_string(stride) +
                            " columns in a group with window " + std::to_string(c.sliding_window));
  }
  PAGEDKV_RETURN_IF_ERROR(check_all(m.block_tables, c.num_device_blocks, i, "a table's block"));
  PAGEDKV_RETURN_IF_ERROR(
      check_all(m.slot_mapping, c.num_device_blocks * c.block_size, i, "a slot"));
  // A ring's row covers the window, not the length (BatchMetadata::ring_table).
  const int64_t longest = m.ring_table ? c.max_sequence_length : stride * c.block_size;
  for (int32_t len : m.seq_lens) {
    PAGEDKV_RETURN_IF_ERROR(check_index(len, longest + 1, false, i, "a row's length"));
  }
  if (rec.build_csr) {
    bool ok = static_cast<int64_t>(m.indptr.size()) == rows + 1 &&
              static_cast<int64_t>(m.last_page_len.size()) == rows && m.indptr.front() == 0 &&
              m.indptr.back() == static_cast<int32_t>(m.indices.size());
    for (size_t r = 0; ok && r + 1 < m.indptr.size(); ++r) ok = m.indptr[r] <= m.indptr[r + 1];
    if (!ok) return invalid_argument(at + ": a CSR form whose indptr does not cover its indices");
    PAGEDKV_RETURN_IF_ERROR(check_all(m.indices, c.num_device_blocks, i, "a CSR block"));
    for (int32_t len : m.last_page_len) {
      PAGEDKV_RETURN_IF_ERROR(check_index(len, c.block_size + 1, false, i, "a last page length"));
    }
  }
  // build_batches records its groups in order, the first one starting the build.
  if (rec.same_build) {
    if (before == nullptr || before->kind != StepRecord::Kind::kBatch ||
        before->group >= rec.group) {
      return invalid_argument(at +
                              ": a batch of the same build as the record before it, which "
                              "is not a batch of an earlier group");
    }
  }
  return ok_status();
}

StepPlan KvCache::take_step_plan() {
  StepPlan out;
  std::swap(out, impl_->recorded);
  return out;
}

StatusOr<std::vector<DeviceBatch>> KvCache::apply_step_plan(const StepPlan& plan) {
  PAGEDKV_KV_CACHE_CALL(apply_step_plan);
  Impl& c = *impl_;
  if (!c.applies_plans) {
    const ControlStats s = c.control->stats();
    const int64_t held =
        s.device.used_blocks + s.device.cached_blocks + s.host.used_blocks + s.host.cached_blocks;
    if (s.sequences > 0 || held > 0) {
      return failed_precondition(
          "apply_step_plan: this cache holds " + std::to_string(s.sequences) + " sequences and " +
          std::to_string(held) + " blocks of its own; a worker's cache only applies plans");
    }
  }
  for (size_t i = 0; i < plan.records.size(); ++i) {
    const StepRecord* before = i > 0 ? &plan.records[i - 1] : nullptr;
    PAGEDKV_RETURN_IF_ERROR(c.check_step_record(plan.records[i], before, i));
  }
  c.applies_plans = true;
  c.applied.resize(static_cast<size_t>(c.num_groups()));
  std::vector<DeviceBatch> out;
  Transfers transfers;
  for (size_t i = 0; i < plan.records.size(); ++i) {
    const StepRecord& rec = plan.records[i];
    Status s;
    if (rec.kind == StepRecord::Kind::kTransfers) {
      ++c.generation;  // as carry_out: batches built before the moves are stale
      transfers.moves = rec.moves;
      transfers.copies = rec.copies;
      s = c.run_transfers(transfers, &c.submitted);
    } else {
      if (!rec.same_build) ++c.generation;
      BatchMetadata& m = c.applied[static_cast<size_t>(rec.group)];
      m = rec.batch;
      BatchOptions options;
      options.build_csr = rec.build_csr;
      DeviceBatch b;
      s = c.upload_batch(rec.group, m, options, &b);
      out.push_back(b);
    }
    if (!s.ok()) {
      c.broken =
          Status(s.code(), "apply_step_plan: record " + std::to_string(i) + ": " + s.message() +
                               " (the pools are part way through the plan: create the "
                               "worker's cache again)");
      return c.broken;
    }
  }
  return out;
}

}  // namespace pagedkv
