#include "core/event_ring.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace pagedkv {
namespace core {

EventRing::EventRing(size_t capacity) : capacity_(capacity) { assert(capacity_ >= 1); }

void EventRing::push(ControlEvent event, bool revocable) {
  const uint64_t seq = next_seq_++;
  if (count_ < slots_.size()) {  // a slot left by a drain or an erase
    Slot& s = at(count_);
    s.seq = seq;
    s.event = std::move(event);
    s.revocable = revocable;
    ++count_;
    return;
  }
  if (slots_.size() < capacity_) {
    assert(head_ == 0);
    // Grow geometrically but never past the capacity, so a small ring holds no spare slots.
    if (slots_.size() == slots_.capacity()) {
      slots_.reserve(std::min(capacity_, std::max<size_t>(16, 2 * slots_.size())));
    }
    slots_.push_back(Slot{seq, std::move(event), revocable});
    ++count_;
    return;
  }
  // Full: the newest event takes the oldest one's slot.
  Slot& s = slots_[head_];
  s.seq = seq;
  s.event = std::move(event);
  s.revocable = revocable;
  head_ = head_ + 1 == slots_.size() ? 0 : head_ + 1;
  ++pending_dropped_;
  ++dropped_total_;
}

std::vector<ControlEvent> EventRing::drain() {
  std::vector<ControlEvent> out;
  out.reserve(size());
  if (pending_dropped_ > 0) {
    ControlEvent marker;
    marker.kind = EventKind::kEventsDropped;
    marker.dropped_events = pending_dropped_;
    out.push_back(std::move(marker));
    pending_dropped_ = 0;
  }
  for (size_t i = 0; i < count_; ++i) out.push_back(std::move(at(i).event));
  head_ = 0;
  count_ = 0;
  return out;
}

template <typename Pred>
void EventRing::erase_if_since(uint64_t first, Pred pred) {
  // Sequence numbers grow from the oldest held event to the newest.
  size_t begin = count_;
  while (begin > 0 && at(begin - 1).seq >= first) --begin;
  size_t kept = begin;
  for (size_t i = begin; i < count_; ++i) {
    if (pred(at(i))) continue;
    if (kept != i) at(kept) = std::move(at(i));
    ++kept;
  }
  count_ = kept;
}

void EventRing::erase_since(uint64_t first, bool (*pred)(const ControlEvent&)) {
  erase_if_since(first, [pred](const Slot& s) { return pred(s.event); });
}

void EventRing::erase_revocable_since(uint64_t first) {
  erase_if_since(first, [](const Slot& s) { return s.revocable; });
}

}  // namespace core
}  // namespace pagedkv
