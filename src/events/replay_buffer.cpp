#include "events/replay_buffer.hpp"

namespace pagedkv::events {

void ReplayBuffer::push(int64_t seq, std::string payload) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (messages_.size() == capacity_) messages_.pop_front();
  messages_.emplace_back(seq, std::move(payload));
  next_seq_ = seq + 1;
}

ReplayBuffer::Reply ReplayBuffer::from(int64_t start) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Reply r;
  const int64_t oldest = messages_.empty() ? next_seq_ : messages_.front().first;
  // Anything in [start, oldest) was published and has been dropped since.
  r.resync = start < oldest;
  for (const auto& m : messages_) {
    if (m.first >= start) r.messages.push_back(m);
  }
  return r;
}

}  // namespace pagedkv::events
