#include "core/dense_allocator.hpp"

#include <algorithm>
#include <string>

#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

StatusOr<DenseAllocator> DenseAllocator::create(const CacheConfig& config) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  const int64_t max_len = config.max_sequence_length;
  return DenseAllocator(std::min<int64_t>(config.dense_initial_length, max_len), max_len,
                        config.dense_max_free_buffers);
}

StatusOr<DenseBuffer> DenseAllocator::add(SequenceId id) {
  if (seqs_.count(id) != 0) return already_exists("sequence " + std::to_string(id) + " exists");
  Entry e;
  if (!free_.empty()) {
    e.buffer = free_.back();  // the largest: most likely to avoid a later growth
    free_.pop_back();
  } else {
    e.buffer.buffer_id = next_id_++;
    e.buffer.capacity = initial_;
  }
  seqs_.emplace(id, e);
  return e.buffer;
}

StatusOr<DenseGrowth> DenseAllocator::ensure(SequenceId id, int64_t length) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  if (length < 0 || length > max_len_) {
    return out_of_range("length " + std::to_string(length) + " outside [0, " +
                        std::to_string(max_len_) + "]");
  }
  DenseBuffer& b = it->second.buffer;
  DenseGrowth g;
  g.buffer_id = b.buffer_id;
  g.old_capacity = b.capacity;
  int64_t cap = b.capacity;
  while (cap < length) cap = std::min(cap * 2, max_len_);
  g.new_capacity = cap;
  g.grew = cap != b.capacity;
  b.capacity = cap;
  return g;
}

StatusOr<DenseGrowth> DenseAllocator::append(SequenceId id, int64_t n) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  if (n < 0) return invalid_argument("append: n must be >= 0");
  PAGEDKV_ASSIGN_OR_RETURN(DenseGrowth g, ensure(id, it->second.length + n));
  it->second.length += n;
  return g;
}

Status DenseAllocator::rollback(SequenceId id, int64_t length) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  if (length < 0 || length > it->second.length) {
    return out_of_range("rollback: length " + std::to_string(length) + " outside [0, " +
                        std::to_string(it->second.length) + "]");
  }
  it->second.length = length;
  return ok_status();
}

Status DenseAllocator::finish(SequenceId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  const DenseBuffer b = it->second.buffer;
  seqs_.erase(it);
  if (static_cast<int64_t>(free_.size()) < max_free_) {
    auto pos = std::upper_bound(
        free_.begin(), free_.end(), b,
        [](const DenseBuffer& x, const DenseBuffer& y) { return x.capacity < y.capacity; });
    free_.insert(pos, b);
  } else {
    released_.push_back(b.buffer_id);
  }
  return ok_status();
}

StatusOr<DenseBuffer> DenseAllocator::buffer(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  return it->second.buffer;
}

StatusOr<int64_t> DenseAllocator::length(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return unknown(id);
  return it->second.length;
}

std::vector<int64_t> DenseAllocator::drain_released() {
  std::vector<int64_t> out;
  out.swap(released_);
  return out;
}

}  // namespace core
}  // namespace pagedkv
