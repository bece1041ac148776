// KvWorkload's batched decode step: the server's usual step (reserve_batch, build_batch,
// write_kv_batch, commit_batch) on a few random sequences at once, under the same pressure,
// faults and byte-exact verification as every other op.
#include <algorithm>
#include <string>

#include "kv_workload.hpp"

namespace pagedkv::soak {
namespace {
constexpr int kMaxDecodeBatch = 6;
constexpr TokenId kDecodeVocabulary = 50;  // as the other ops: prompts share blocks often
}  // namespace

void KvWorkload::decode_batch() {
  std::vector<SequenceId>& ids = ids_scratch_;
  ids.clear();
  std::vector<size_t> indices;
  const int want = 1 + static_cast<int>(rng_() % kMaxDecodeBatch);
  for (int attempt = 0; attempt < 2 * want && static_cast<int>(ids.size()) < want; ++attempt) {
    const size_t index = pick();
    const Entry& e = live_[index];
    if (static_cast<int64_t>(e.tokens.size()) + 1 > config_.max_sequence_length) continue;
    if (std::find(ids.begin(), ids.end(), e.id) != ids.end()) continue;
    ids.push_back(e.id);
    indices.push_back(index);
  }
  if (ids.empty()) return;
  std::vector<TokenId> tokens(ids.size());
  std::vector<int64_t> positions(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    tokens[i] = static_cast<TokenId>(rng_() % kDecodeVocabulary);
    positions[i] = static_cast<int64_t>(live_[indices[i]].tokens.size());
  }
  const bool all_layers = rng_() % 2 == 0;

  const StatusOr<std::vector<int64_t>> slots = cache_->reserve_batch(ids, 1);
  if (!slots.ok()) {
    if (slots.status().code() == StatusCode::kResourceExhausted) {
      ++counters_.exhausted;
    } else {
      record_error(ids.front(), "reserve_batch", slots.status());
    }
    return;
  }
  // Anything failing from here on drops the reservations: the model then still holds.
  auto drop = [&] {
    for (size_t i = 0; i < ids.size(); ++i) {
      const Status s = retry([&] { return cache_->rollback(ids[i], positions[i]); });
      if (!s.ok()) record_error(ids[i], "rollback of a batch reservation", s);
    }
  };
  StatusOr<DeviceBatch> batch = cache_->build_batch(ids);
  for (int attempt = 0; !batch.ok() && is_injected(batch.status()) && attempt < kMaxInjectedRetries;
       ++attempt) {
    ++counters_.injected_faults;
    batch = cache_->build_batch(ids);
  }
  if (!batch.ok()) {
    record_error(ids.front(), "build_batch of a decode step", batch.status());
    drop();
    return;
  }
  // The batch's slot mapping is the reservation, row by row.
  if (batch->host->slot_mapping != *slots) {
    record_problem(&counters_.errors,
                   "decode step: build_batch's slot mapping differs from "
                   "reserve_batch's slots");
    drop();
    return;
  }
  const StatusOr<char*> staged = stage_kv(positions, tokens);
  if (!staged.ok()) {
    record_error(ids.front(), "staging K/V of a decode step", staged.status());
    drop();
    return;
  }
  const int64_t rows = static_cast<int64_t>(ids.size());
  const int64_t part_elems = rows * config_.num_kv_heads * config_.head_dim;
  const char* k = *staged;
  const char* v = k + part_elems * 2;
  auto write = [&](int32_t layer) -> Status {
    if (all_layers) {
      return cache_->write_kv_batch_all_layers(*batch, k, v, DType::kFloat16, 0, 2 * part_elems);
    }
    const char* lk = k + 2 * layer * part_elems * 2;
    return cache_->write_kv_batch(*batch, layer, lk, lk + part_elems * 2, DType::kFloat16);
  };
  for (int32_t layer = 0; layer < (all_layers ? 1 : config_.num_layers); ++layer) {
    Status s = write(layer);
    if (!s.ok() && is_injected(s)) {  // a failed write changes nothing: try once more
      ++counters_.injected_faults;
      s = write(layer);
    }
    if (!s.ok()) {
      record_error(ids.front(), "write_kv_batch layer " + std::to_string(layer), s);
      drop();
      return;
    }
  }
  const Status c = cache_->commit_batch(ids, tokens);
  if (!c.ok()) {
    record_error(ids.front(), "commit_batch", c);
    drop();
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) live_[indices[i]].tokens.push_back(tokens[i]);
}

}  // namespace pagedkv::soak
