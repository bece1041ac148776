// Dense mode (the seed's default): each sequence owns one contiguous buffer whose capacity starts
// at dense_initial_length and doubles up to max_sequence_length; finished buffers wait on a free
// list capped at dense_max_free_buffers. Bookkeeping only: buffer ids and capacities, no bytes.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace core {

/// A sequence's buffer as the data plane sees it.
struct DenseBuffer {
  int64_t buffer_id = -1;
  int64_t capacity = 0;  // token positions
};

/// The outcome of ensure(): when `grew`, the data plane reallocates buffer_id to new_capacity
/// and copies the first old_capacity positions.
struct DenseGrowth {
  int64_t buffer_id = -1;
  int64_t old_capacity = 0;
  int64_t new_capacity = 0;
  bool grew = false;
};

/// Capacity decisions of dense mode.
class DenseAllocator {
 public:
  /// Validates the config's dense knobs (any mode is accepted, so it can be tested alone).
  static StatusOr<DenseAllocator> create(const CacheConfig& config);

  /// Gives a new sequence a buffer: a recycled one from the free list (largest first) or a new
  /// id of the initial capacity. kAlreadyExists.
  StatusOr<DenseBuffer> add(SequenceId id);
  /// Makes the capacity hold `length` positions, doubling. kNotFound, kOutOfRange (past max).
  StatusOr<DenseGrowth> ensure(SequenceId id, int64_t length);
  /// Ensures capacity for `n` more tokens and advances the length. kNotFound, kOutOfRange.
  StatusOr<DenseGrowth> append(SequenceId id, int64_t n);
  /// Shortens the length (capacity is kept). kNotFound, kOutOfRange.
  Status rollback(SequenceId id, int64_t length);
  /// Retires a sequence: its buffer joins the free list, or is released past the cap. kNotFound.
  Status finish(SequenceId id);
  /// The sequence's buffer. kNotFound.
  StatusOr<DenseBuffer> buffer(SequenceId id) const;
  /// The sequence's length. kNotFound.
  StatusOr<int64_t> length(SequenceId id) const;
  /// Buffers on the free list.
  int64_t free_buffers() const { return static_cast<int64_t>(free_.size()); }
  /// Sequences with a buffer.
  int64_t sequences() const { return static_cast<int64_t>(seqs_.size()); }
  /// Returns and clears the ids of buffers the data plane may now free.
  std::vector<int64_t> drain_released();

 private:
  DenseAllocator(int64_t initial, int64_t max_len, int64_t max_free)
      : initial_(initial), max_len_(max_len), max_free_(max_free) {}

  struct Entry {
    DenseBuffer buffer;
    int64_t length = 0;
  };
  int64_t initial_;
  int64_t max_len_;
  int64_t max_free_;
  int64_t next_id_ = 0;
  std::unordered_map<SequenceId, Entry> seqs_;
  std::vector<DenseBuffer> free_;  // sorted by capacity, largest last
  std::vector<int64_t> released_;
};

}  // namespace core
}  // namespace pagedkv
