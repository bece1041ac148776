#include "core/group_pages.hpp"

#include <algorithm>
#include <cassert>

namespace pagedkv {
namespace core {

GroupPages::GroupPages(int32_t config_index, int64_t window, int32_t live_slot, int64_t block_size,
                       int64_t device_pages, int64_t host_pages, int64_t num_logical)
    : config_index_(config_index),
      window_(window),
      live_slot_(window > 0 ? live_slot : -1),
      bdiv_(block_size),
      num_pages_{device_pages, host_pages},
      rec_(static_cast<size_t>(num_logical)) {
  // Descending, so that pops hand out 0, 1, 2, ... on a fresh pool (as BlockAllocator).
  for (int t = 0; t < kNumTiers; ++t) {
    free_[t].reserve(static_cast<size_t>(num_pages_[t]));
    for (int64_t p = num_pages_[t] - 1; p >= 0; --p) free_[t].push_back(static_cast<int32_t>(p));
  }
}

int32_t GroupPages::take_page(Tier t, LogicalId* evicted) {
  std::vector<int32_t>& free = free_[idx(t)];
  if (free.empty()) {
    // Evict the least recently cached page and hand it over at once.
    const LogicalId victim = head_[idx(t)];
    Record& v = rec_[static_cast<size_t>(victim)];
    unlink(victim, t);
    const int32_t p = v.page;
    v.page = -1;
    ++evicted_;
    *evicted = victim;
    // The next eviction starts from the new head's successor: fetch it now.
    const LogicalId head = head_[idx(t)];
    if (head != kNoBlock) {
      const LogicalId after = rec_[static_cast<size_t>(head)].next;
      if (after != kNoBlock) __builtin_prefetch(&rec_[static_cast<size_t>(after)]);
    }
    return p;
  }
  *evicted = kNoBlock;
  const int32_t p = free.back();
  free.pop_back();
  return p;
}

LogicalId GroupPages::take(LogicalId b, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page < 0 && room(t) > 0);
  LogicalId victim = kNoBlock;
  r.page = take_page(t, &victim);
  r.holders = 1;
  return victim;
}

void GroupPages::hold(LogicalId b, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0);
  if (r.holders++ == 0) unlink(b, t);
}

void GroupPages::drop(LogicalId b, bool cacheable, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.holders > 0);
  if (--r.holders > 0) return;
  if (cacheable) {
    link_tail(b, t);
  } else {
    free_[idx(t)].push_back(r.page);
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

int32_t GroupPages::move(LogicalId b, Tier from, Tier to, LogicalId* evicted) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0 && from != to && room(to) > 0);
  const bool listed = r.holders == 0;
  if (listed) unlink(b, from);
  const int32_t p = take_page(to, evicted);
  free_[idx(from)].push_back(r.page);
  r.page = p;
  if (listed) link_tail(b, to);
  return p;
}

void GroupPages::reclaim(Tier t, int32_t page) {
  std::vector<int32_t>& free = free_[idx(t)];
  auto it = std::find(free.begin(), free.end(), page);
  assert(it != free.end());
  free.erase(it);
}

void GroupPages::move_back(LogicalId b, Tier now, Tier to, int32_t page) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0);
  const bool listed = r.holders == 0;
  if (listed) unlink(b, now);
  free_[idx(now)].push_back(r.page);
  reclaim(to, page);
  r.page = page;
  if (listed) link_tail(b, to);
}

void GroupPages::untake(LogicalId b) {
  Record& r = rec_[static_cast<size_t>(b)];
  assert(r.page >= 0 && r.holders == 1);
  r.holders = 0;
  free_[idx(Tier::kDevice)].push_back(r.page);
  r.page = -1;
}

void GroupPages::undrop(LogicalId b, int32_t page, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.page >= 0) {
    assert(r.page == page);
    hold(b, t);
    return;
  }
  // The drop freed it: take that page back (nothing later in the call reused it, or that use
  // was undone first).
  reclaim(t, page);
  r.page = page;
  r.holders = 1;
}

void GroupPages::release(LogicalId b, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.page < 0) return;
  assert(r.holders == 0);
  unlink(b, t);
  free_[idx(t)].push_back(r.page);
  r.page = -1;
}

void GroupPages::link_tail(LogicalId b, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  LogicalId& head = head_[idx(t)];
  LogicalId& tail = tail_[idx(t)];
  r.prev = tail;
  r.next = kNoBlock;
  if (tail == kNoBlock) {
    head = b;
  } else {
    rec_[static_cast<size_t>(tail)].next = b;
  }
  tail = b;
  ++cached_[idx(t)];
}

void GroupPages::unlink(LogicalId b, Tier t) {
  Record& r = rec_[static_cast<size_t>(b)];
  if (r.prev == kNoBlock) {
    head_[idx(t)] = r.next;
  } else {
    rec_[static_cast<size_t>(r.prev)].next = r.next;
  }
  if (r.next == kNoBlock) {
    tail_[idx(t)] = r.prev;
  } else {
    rec_[static_cast<size_t>(r.next)].prev = r.prev;
  }
  r.prev = r.next = kNoBlock;
  --cached_[idx(t)];
}

bool GroupPages::list_consistent() const {
  for (int t = 0; t < kNumTiers; ++t) {
    int64_t n = 0;
    LogicalId prev = kNoBlock;
    for (LogicalId b = head_[t]; b != kNoBlock; b = rec_[static_cast<size_t>(b)].next) {
      if (++n > cached_[t] || !cached(b) || rec_[static_cast<size_t>(b)].prev != prev) {
        return false;
      }
      prev = b;
    }
    if (n != cached_[t] || prev != tail_[t]) return false;
  }
  return true;
}

}  // namespace core
}  // namespace pagedkv
