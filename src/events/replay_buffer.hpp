// ReplayBuffer: the last N published messages, for readers that missed some. The publisher's
// owner thread appends; the replay thread reads; one mutex between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv::events {

class ReplayBuffer {
 public:
  /// Keeps at most `capacity` (>= 1) messages, dropping the oldest.
  explicit ReplayBuffer(size_t capacity) : capacity_(capacity) {}

  /// Appends message `seq` (one more than the last one appended).
  void push(int64_t seq, std::string payload);

  /// What a request for everything from `start` gets.
  struct Reply {
    /// The reader asked for messages that are no longer buffered: it must resync.
    bool resync = false;
    std::vector<std::pair<int64_t, std::string>> messages;  // in sequence order
  };
  Reply from(int64_t start) const;

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<std::pair<int64_t, std::string>> messages_;
  int64_t next_seq_ = 0;  // one past the last appended
};

}  // namespace pagedkv::events
