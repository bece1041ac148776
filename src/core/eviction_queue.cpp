#include "core/eviction_queue.hpp"

#include <cassert>

namespace pagedkv {
namespace core {

bool EvictionQueue::before(LogicalId a, LogicalId b) const {
  const BlockInfo& x = (*blocks_)[a];
  const BlockInfo& y = (*blocks_)[b];
  if (x.retention != y.retention) return x.retention < y.retention;
  if (x.last_access != y.last_access) return x.last_access < y.last_access;
  return a < b;
}

void EvictionQueue::link_head(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  List& l = list_of(b);
  b.q_prev = kNoBlock;
  b.q_next = l.head;
  if (l.head == kNoBlock) {
    l.tail = id;
    const int r = b.retention - kMinRetentionPriority;
    nonempty_[r / 64] |= uint64_t{1} << (r % 64);
  } else {
    (*blocks_)[l.head].q_prev = id;
  }
  l.head = id;
}

void EvictionQueue::link_tail(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  List& l = list_of(b);
  b.q_next = kNoBlock;
  b.q_prev = l.tail;
  if (l.tail == kNoBlock) {
    l.head = id;
    const int r = b.retention - kMinRetentionPriority;
    nonempty_[r / 64] |= uint64_t{1} << (r % 64);
  } else {
    (*blocks_)[l.tail].q_next = id;
  }
  l.tail = id;
}

void EvictionQueue::unlink(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  List& l = list_of(b);
  if (b.q_prev == kNoBlock) {
    l.head = b.q_next;
  } else {
    (*blocks_)[b.q_prev].q_next = b.q_next;
  }
  if (b.q_next == kNoBlock) {
    l.tail = b.q_prev;
  } else {
    (*blocks_)[b.q_next].q_prev = b.q_prev;
  }
  if (l.head == kNoBlock) {
    const int r = b.retention - kMinRetentionPriority;
    nonempty_[r / 64] &= ~(uint64_t{1} << (r % 64));
  }
  b.q_prev = kNoBlock;
  b.q_next = kNoBlock;
}

void EvictionQueue::heap_place(size_t pos, LogicalId id) {
  heap_[pos] = id;
  (*blocks_)[id].q_prev = static_cast<int32_t>(pos);
}

void EvictionQueue::sift_up(size_t pos) {
  const LogicalId id = heap_[pos];
  while (pos > 0) {
    const size_t parent = (pos - 1) / 2;
    if (!before(id, heap_[parent])) break;
    heap_place(pos, heap_[parent]);
    pos = parent;
  }
  heap_place(pos, id);
}

void EvictionQueue::sift_down(size_t pos) {
  const LogicalId id = heap_[pos];
  const size_t n = heap_.size();
  while (true) {
    size_t child = 2 * pos + 1;
    if (child >= n) break;
    if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
    if (!before(heap_[child], id)) break;
    heap_place(pos, heap_[child]);
    pos = child;
  }
  heap_place(pos, id);
}

void EvictionQueue::heap_push(LogicalId id) {
  (*blocks_)[id].in_heap = true;
  heap_.push_back(id);
  sift_up(heap_.size() - 1);
}

void EvictionQueue::heap_erase(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  const size_t pos = static_cast<size_t>(b.q_prev);
  assert(b.in_heap && heap_[pos] == id);
  const LogicalId last = heap_.back();
  heap_.pop_back();
  if (last != id) {
    heap_place(pos, last);
    sift_down(pos);
    sift_up(static_cast<size_t>((*blocks_)[last].q_prev));
  }
  b.in_heap = false;
  b.q_prev = kNoBlock;
}

void EvictionQueue::push(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  assert(!b.listed && b.tier == tier_);
  b.listed = true;
  ++size_;
  const List& l = list_of(b);
  // A release is the newest tick: the tail. A late leaf usually sits at one end of its list too
  // (its chain was released together); only a block strictly inside goes to the heap.
  if (l.tail == kNoBlock || before(l.tail, id)) {
    link_tail(id);
  } else if (before(id, l.head)) {
    link_head(id);
  } else {
    heap_push(id);
  }
}

void EvictionQueue::erase(LogicalId id) {
  BlockInfo& b = (*blocks_)[id];
  assert(b.listed);
  if (b.in_heap) {
    heap_erase(id);
  } else {
    unlink(id);
  }
  b.listed = false;
  --size_;
}

LogicalId EvictionQueue::front() const {
  LogicalId best = kNoBlock;
  for (int w = 0; w < kWords; ++w) {
    if (nonempty_[w] != 0) {
      best = lists_[static_cast<size_t>(w * 64 + __builtin_ctzll(nonempty_[w]))].head;
      break;
    }
  }
  if (!heap_.empty() && (best == kNoBlock || before(heap_.front(), best))) best = heap_.front();
  return best;
}

bool EvictionQueue::contains(LogicalId id) const {
  const BlockInfo& b = (*blocks_)[id];
  if (!b.listed) return false;
  if (b.in_heap) {
    const size_t pos = static_cast<size_t>(b.q_prev);
    if (b.q_prev < 0 || pos >= heap_.size() || heap_[pos] != id) return false;
    return pos == 0 || !before(id, heap_[(pos - 1) / 2]);
  }
  const List& l = lists_[static_cast<size_t>(b.retention - kMinRetentionPriority)];
  if (b.q_prev == kNoBlock ? l.head != id
                           : ((*blocks_)[b.q_prev].q_next != id || !before(b.q_prev, id) ||
                              (*blocks_)[b.q_prev].retention != b.retention)) {
    return false;
  }
  if (b.q_next == kNoBlock ? l.tail != id
                           : ((*blocks_)[b.q_next].q_prev != id || !before(id, b.q_next) ||
                              (*blocks_)[b.q_next].retention != b.retention)) {
    return false;
  }
  return true;
}

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
    // Freed, re-prioritised, or moved to the other tier (whose queue took its deadline over).
    if (b.phys < 0 || b.expiry_gen != gen || b.tier != tier_) continue;
    const bool listed = b.listed;
    if (listed) erase(id);
    b.retention = kDefaultRetentionPriority;
    b.expiry_ns = 0;
    if (listed) push(id);
  }
}

}  // namespace core
}  // namespace pagedkv
