// EventRing: the bounded queue of control events between the control plane and whoever drains
// them. A reader that drains rarely, or never (a SeedKvCache user), must not make the cache grow
// without bound, so the ring holds at most `capacity` events and drops the oldest on overflow;
// the next drain then begins with one kEventsDropped event saying how many were lost, which tells
// the reader to resync (treat every block as cleared). The marker is kept outside the slots, so a
// drain returns at most capacity + 1 events and the marker itself is never dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// A bounded FIFO of control events (see the file comment). Storage grows with use up to
/// `capacity` slots and is reused after each drain. Every pushed event gets the next sequence
/// number (0, 1, 2, ...; never reused, not even after erase_since), so a caller can name
/// "everything pushed since" even when the ring has dropped some of it. Single owner thread.
class EventRing {
 public:
  /// `capacity` must be >= 1 (asserted; ControlPlane::create validates it first).
  explicit EventRing(size_t capacity);

  /// The most events held between drains (the drop marker not counted).
  size_t capacity() const { return capacity_; }
  /// Events the next drain() would return, the drop marker included (<= capacity() + 1).
  size_t size() const { return count_ + (pending_dropped_ > 0 ? 1 : 0); }
  bool empty() const { return size() == 0; }
  /// The sequence number the next push() will give its event.
  uint64_t next_sequence() const { return next_seq_; }
  /// Events dropped on overflow since the ring was made.
  int64_t dropped_total() const { return dropped_total_; }

  /// Appends an event; when the ring is full the oldest held event is dropped first and counted
  /// for the next drain's marker.
  /// A `revocable` event belongs to a call that may still be undone (erase_revocable_since).
  void push(ControlEvent event, bool revocable = false);
  /// Returns and clears the held events, oldest first, preceded by one kEventsDropped event
  /// (ControlEvent::dropped_events = events lost) when any were dropped since the last drain.
  std::vector<ControlEvent> drain();
  /// Removes the held events whose sequence number is >= `first` and for which `pred` is true,
  /// keeping the order of the rest. Events already drained or dropped are out of reach; a pending
  /// drop marker stays, since what was dropped stays lost.
  void erase_since(uint64_t first, bool (*pred)(const ControlEvent&));
  /// Removes the held events pushed as revocable whose sequence number is >= `first`, as
  /// erase_since() does.
  void erase_revocable_since(uint64_t first);

 private:
  struct Slot {
    uint64_t seq = 0;
    ControlEvent event;
    bool revocable = false;
  };
  template <typename Pred>
  void erase_if_since(uint64_t first, Pred pred);
  // The i-th held event, oldest first (i < count_).
  Slot& at(size_t i) {
    const size_t p = head_ + i;
    return slots_[p < slots_.size() ? p : p - slots_.size()];
  }

  size_t capacity_;
  // Grows to capacity_ and never shrinks. head_ moves only on overflow, when the slots are all
  // there, and a drain resets it; so while slots_.size() < capacity_, head_ is 0.
  std::vector<Slot> slots_;
  size_t head_ = 0;
  size_t count_ = 0;
  uint64_t next_seq_ = 0;
  int64_t pending_dropped_ = 0;  // dropped since the last drain: the marker's count
  int64_t dropped_total_ = 0;
};

}  // namespace core
}  // namespace pagedkv
