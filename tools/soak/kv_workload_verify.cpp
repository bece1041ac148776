// KvWorkload's verification: a sequence's length, batch row and every gathered K/V byte
// against the model (kv_workload.hpp).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "kv_workload.hpp"

namespace pagedkv::soak {
namespace {

std::string hex16(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%04x", v);
  return buf;
}

}  // namespace

bool KvWorkload::verify_sequence(SequenceId id) {
  const Op saved = op_;
  op_ = Op::kVerify;
  const bool verified = verify_one(id);
  op_ = saved;
  return verified;
}

bool KvWorkload::verify_one(SequenceId id) {
  auto it = index_of_.find(id);
  if (it == index_of_.end()) return false;
  const bool verified = verify_index(it->second);
  drain_evicted();
  return verified;
}

void KvWorkload::verify_all() {
  const Op saved = op_;
  op_ = Op::kVerifyAll;
  std::vector<SequenceId> ids = live_sequences();
  std::sort(ids.begin(), ids.end());
  for (SequenceId id : ids) {
    if (options_.stop_at_first_problem && has_problem()) break;
    verify_one(id);  // an earlier restore may have dropped it: then it is skipped
  }
  check_invariants();
  op_ = saved;
}

bool KvWorkload::verify_index(size_t index) {
  const SequenceId id = live_[index].id;
  const std::vector<TokenId>& model = live_[index].tokens;
  const int64_t n = static_cast<int64_t>(model.size());
  const std::string seq = "seq " + std::to_string(id);

  // An offloaded sequence is restored first (as a server would before reading it). The
  // decision uses residency() but the restore's answer settles it, so the ops stay the same
  // whatever the copies' timing: kFailedPrecondition means "not offloaded" (a restore in
  // flight), and the compute stream already waits for it.
  StatusOr<SequenceResidency> where = SequenceResidency::kDevice;
  const Status rs = retry([&]() -> Status {
    where = cache_->residency(id);
    return where.status();
  });
  if (!rs.ok()) {
    record_error(id, "residency", rs);
    return false;
  }
  if (*where != SequenceResidency::kDevice) {
    const Status s = retry([&] { return cache_->restore(id); });
    if (s.ok()) {
      ++counters_.restore_calls;
    } else if (s.code() == StatusCode::kResourceExhausted) {
      ++counters_.exhausted;
      ++counters_.unverifiable;
      return false;
    } else if (s.code() != StatusCode::kFailedPrecondition) {
      record_error(id, "restore (to verify)", s);
      return false;
    }
  }

  const StatusOr<int64_t> length = cache_->length(id);
  const StatusOr<int64_t> pending = cache_->pending(id);
  if (!length.ok() || !pending.ok()) {
    record_error(id, "length/pending", length.ok() ? pending.status() : length.status());
    return false;
  }
  if (*length != n || *pending != 0) {
    record_problem(&counters_.mismatches, seq + ": the cache has " + std::to_string(*length) +
                                              " committed and " + std::to_string(*pending) +
                                              " pending tokens, the model " + std::to_string(n) +
                                              " and 0");
    return false;
  }
  if (n == 0) return true;

  // The batch metadata an attention kernel would read: the row's length and block table must be
  // the sequence's.
  ids_scratch_.assign(1, id);
  const StatusOr<DeviceBatch> batch = cache_->build_batch(ids_scratch_);
  if (!batch.ok()) {
    record_error(id, "build_batch", batch.status());
    return false;
  }
  const StatusOr<std::vector<BlockLocation>> blocks = cache_->block_locations(id);
  if (!blocks.ok()) {
    record_error(id, "block_locations", blocks.status());
    return false;
  }
  const BatchMetadata& m = *batch->host;
  const int64_t num_blocks = (n + config_.block_size - 1) / config_.block_size;
  bool batch_ok = m.batch_size == 1 && m.seq_lens.size() == 1 && m.seq_lens[0] == n &&
                  static_cast<int64_t>(blocks->size()) == num_blocks && m.max_blocks >= num_blocks;
  for (int64_t b = 0; batch_ok && b < num_blocks; ++b) {
    const BlockLocation& loc = (*blocks)[static_cast<size_t>(b)];
    batch_ok = loc.tier == Tier::kDevice && m.block_tables[static_cast<size_t>(b)] == loc.block;
  }
  if (!batch_ok) {
    record_problem(&counters_.mismatches,
                   seq + ": build_batch's row (length " +
                       std::to_string(m.seq_lens.empty() ? -1 : m.seq_lens[0]) +
                       ") or block table disagrees with the model (length " + std::to_string(n) +
                       ") or block_locations()");
    return false;
  }

  // Poison, gather every layer into [layer][K, V][n][heads][dim], download once.
  const int64_t row = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const size_t part_bytes = static_cast<size_t>(n * row) * 2;
  const size_t bytes = part_bytes * 2 * static_cast<size_t>(config_.num_layers);
  if (bytes > gather_bytes_) {
    record_problem(&counters_.errors, seq + " is longer than the device pool holds");
    return false;
  }
  const Stream stream = cache_->compute_stream();
  Status s = retry([&] {
    return io_->copy_async(gather_device_, poison_host_, bytes, CopyKind::kHostToDevice, stream);
  });
  if (!s.ok()) {
    record_error(id, "poisoning the gather buffer", s);
    return false;
  }
  char* out = static_cast<char*>(gather_device_);
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    char* k = out + static_cast<size_t>(2 * l) * part_bytes;
    s = retry([&] {
      return cache_->gather_layer(id, l, k, k + part_bytes, DType::kFloat16,
                                  PackedLayout::kTokenMajor, 0, n);
    });
    if (!s.ok()) {
      record_error(id, "gather_layer " + std::to_string(l), s);
      return false;
    }
  }
  s = retry([&] {
    return io_->copy_async(gather_host_, gather_device_, bytes, CopyKind::kDeviceToHost, stream);
  });
  if (s.ok()) s = sync_io();
  if (!s.ok()) {
    record_error(id, "download of the gathered K/V", s);
    return false;
  }

  // Compared a token's row (heads x dim) at a time with the model's row; one mismatch counted
  // per (sequence, layer).
  const int32_t dim = config_.head_dim;
  row_scratch_.resize(static_cast<size_t>(row));
  bool all_equal = true;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    bool layer_equal = true;
    for (int32_t part = 0; part < 2 && layer_equal; ++part) {
      const uint16_t* got = gather_host_ + static_cast<size_t>(2 * l + part) * (part_bytes / 2);
      for (int64_t t = 0; t < n && layer_equal; ++t, got += row) {
        values_.row(t, model[static_cast<size_t>(t)], l, part, config_.num_kv_heads, dim,
                    row_scratch_.data());
        if (std::memcmp(got, row_scratch_.data(), static_cast<size_t>(row) * 2) == 0) continue;
        layer_equal = false;
        int64_t e = 0;
        while (got[e] == row_scratch_[static_cast<size_t>(e)]) ++e;
        record_problem(&counters_.mismatches,
                       seq + " layer " + std::to_string(l) + (part == 0 ? " key" : " value") +
                           " position " + std::to_string(t) + " head " + std::to_string(e / dim) +
                           " dim " + std::to_string(e % dim) + ": expected " +
                           hex16(row_scratch_[static_cast<size_t>(e)]) + ", gathered " +
                           hex16(got[e]) + " (length " + std::to_string(n) + ")");
      }
    }
    all_equal = all_equal && layer_equal;
  }
  if (!all_equal) return false;
  ++counters_.verified_sequences;
  counters_.verified_bytes += static_cast<int64_t>(bytes);
  return true;
}

}  // namespace pagedkv::soak
