#include "core/eviction_queue.hpp"

#include <cassert>

namespace pagedkv {
namespace core {

EvictionQueue::Key EvictionQueue::key_of(LogicalId id) const {
  const BlockInfo& b = (*blocks_)[id];
  return Key(b.retention, b.last_access, id);
}

void EvictionQueue::push(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  assert(!b.listed);
  set_.insert(key_of(id));
  b.listed = true;
}

void EvictionQueue::erase(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  assert(b.listed);
  const size_t n = set_.erase(key_of(id));
  assert(n == 1);
  (void)n;
  b.listed = false;
}

bool EvictionQueue::contains(LogicalId id) const { return set_.count(key_of(id)) == 1; }

void EvictionQueue::schedule_expiry(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  ++b.expiry_gen;  // an earlier deadline of this block no longer applies
  if (b.expiry_ns > 0 && b.retention != kDefaultRetentionPriority) {
    deadlines_.emplace(b.expiry_ns, b.expiry_gen, id);
  }
}

void EvictionQueue::expire(int64_t now_ns) {
  while (!deadlines_.empty() && std::get<0>(deadlines_.top()) <= now_ns) {
    const LogicalId id = std::get<2>(deadlines_.top());
    const uint64_t gen = std::get<1>(deadlines_.top());
    deadlines_.pop();
    BlockInfo& b = (*blocks_)[id];
    if (b.phys < 0 || b.expiry_gen != gen) continue;  // freed or re-prioritised since
    const bool listed = b.listed;
    if (listed) erase(id);
    b.retention = kDefaultRetentionPriority;
    b.expiry_ns = 0;
    if (listed) push(id);
  }
}

}  // namespace core
}  // namespace pagedkv
