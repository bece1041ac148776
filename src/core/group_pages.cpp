#include "core/group_pages.hpp"

#include <algorithm>
#include <cassert>

namespace pagedkv {
namespace core {

GroupPages::GroupPages(int32_t config_index, int64_t window, int64_t block_size, int64_t num_pages,
                       int64_t num_logical)
    : config_index_(config_index),
      window_(window),
      bdiv_(block_size),
      num_pages_(num_pages),
      rec_(static_cast<size_t>(num_logical)) {
  // Descending, so that pops hand out 0, 1, 2, ... on a fresh pool (as BlockAllocator).
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

LogicalId GroupPages::take(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page < 0 && room() > 0);
  LogicalId victim = kNoBlock;
  if (free_.empty()) {
    // Evict the least recently cached page and hand it over at once.
    victim = head_;
    Record& v = rec_[static_cast<size_t>(victim)];
    unlink(victim);
    r.page = v.page;
    v.page = -1;
    ++evicted_;
    // The next eviction starts from the new head's successor: fetch it now.
    if (head_ != kNoBlock) {
      const LogicalId after = rec_[static_cast<size_t>(head_)].next;
      if (after != kNoBlock) __builtin_prefetch(&rec_[static_cast<size_t>(after)]);
    }
  } else {
    r.page = free_.back();
    free_.pop_back();
  }
  r.holders = 1;
  return victim;
}

void GroupPages::hold(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0);
  if (r.holders++ == 0) unlink(b);
}

void GroupPages::drop(LogicalId b, bool registered) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.holders > 0);
  if (--r.holders > 0) return;
  if (registered) {
    link_tail(b);
  } else {
    free_.push_back(r.page);
    r.page = -1;
  }
}

void GroupPages::adopt(LogicalId from, LogicalId to) {
  Record& f = rec_[static_cast<size_t>(from)];
  Record& t = rec_[static_cast<size_t>(to)];
  assert(f.page >= 0 && f.holders == 1 && t.page < 0);
  t.page = f.page;
  t.holders = 1;
  f.page = -1;
  f.holders = 0;
}

void GroupPages::untake(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0 && r.holders == 1);
  r.holders = 0;
  free_.push_back(r.page);
  r.page = -1;
}

void GroupPages::undrop(LogicalId b, int32_t page) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.page >= 0) {
    assert(r.page == page);
    hold(b);
    return;
  }
  // The drop freed it: take that page back from the free stack (O(free pages), as
  // BlockAllocator::reacquire).
  auto it = std::find(free_.begin(), free_.end(), page);
  assert(it != free_.end());
  free_.erase(it);
  r.page = page;
  r.holders = 1;
}

void GroupPages::release(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.page < 0) return;
  assert(r.holders == 0);
  unlink(b);
  free_.push_back(r.page);
  r.page = -1;
}

void GroupPages::link_tail(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  r.prev = tail_;
  r.next = kNoBlock;
  if (tail_ == kNoBlock) {
    head_ = b;
  } else {
    rec_[static_cast<size_t>(tail_)].next = b;
  }
  tail_ = b;
  ++cached_;
}

void GroupPages::unlink(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.prev == kNoBlock) {
    head_ = r.next;
  } else {
    rec_[static_cast<size_t>(r.prev)].next = r.next;
  }
  if (r.next == kNoBlock) {
    tail_ = r.prev;
  } else {
    rec_[static_cast<size_t>(r.next)].prev = r.prev;
  }
  r.prev = r.next = kNoBlock;
  --cached_;
}

bool GroupPages::list_consistent() const {
  int64_t n = 0;
  LogicalId prev = kNoBlock;
  for (LogicalId b = head_; b != kNoBlock; b = rec_[static_cast<size_t>(b)].next) {
    if (++n > cached_ || !cached(b) || rec_[static_cast<size_t>(b)].prev != prev) return false;
    prev = b;
  }
  return n == cached_ && prev == tail_;
}

}  // namespace core
}  // namespace pagedkv
