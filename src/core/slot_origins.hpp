// SlotOrigins: where the bytes of each physical slot were when the current tier-moving call
// began.
//
// A call's moves run on the data plane after the call returns, in list order, and what the data
// plane queues before them (the write-back's staging copies) sees every slot as it was when the
// call began. A block that the call moved into a slot and then dropped from it has not reached
// that slot when its bytes are staged: they are still at its origin, the slot it held when the
// call began (it may have moved more than once). The control plane names that origin in
// DroppedBlock, so the write-back copies the block's own bytes, never the slot's previous
// occupant's.
//
// Each record is stamped with its call, so a new call forgets the last one's in O(1).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

class SlotOrigins {
 public:
  /// Sizes the records of both in-process tiers (no call recorded yet).
  void resize(int64_t device_slots, int64_t host_slots) {
    slots_[0].assign(static_cast<size_t>(device_slots), Record{});
    slots_[1].assign(static_cast<size_t>(host_slots), Record{});
  }
  /// A new call: every slot holds its own bytes again.
  void begin_call() { ++call_; }
  /// Records a move of the current call (between the device and host tiers): its destination
  /// will hold what its source held, whose origin is the source's own.
  void record(const BlockMove& m) {
    const BlockLocation from = origin(m.src_tier, m.src_block);
    Record& r = at(m.dst_tier, m.dst_block);
    r.call = call_;
    r.origin = from;
  }
  /// Where the bytes that slot `phys` of `t` holds once the current call's moves so far have run
  /// were when the call began.
  BlockLocation origin(Tier t, int32_t phys) const {
    const Record& r = at(t, phys);
    return r.call == call_ ? r.origin : BlockLocation{t, phys};
  }

 private:
  struct Record {
    uint64_t call = 0;  // the call that filled the slot; 0: none
    BlockLocation origin;
  };
  Record& at(Tier t, int32_t phys) {
    return slots_[t == Tier::kDevice ? 0 : 1][static_cast<size_t>(phys)];
  }
  const Record& at(Tier t, int32_t phys) const {
    return slots_[t == Tier::kDevice ? 0 : 1][static_cast<size_t>(phys)];
  }

  uint64_t call_ = 1;
  std::vector<Record> slots_[2];
};

}  // namespace core
}  // namespace pagedkv
