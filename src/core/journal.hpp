// Journal: the record of one tier-moving call's revocable effects, in the order they happened:
// allocations, releases, reference drops and moves between tiers, each touched sequence's state
// before the call, and the references dropped at its end. ControlPlane::undo_plan replays it
// backwards (undo_log.cpp). Plain data with append-only recorders; reused across calls, so a
// decode step allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/sequence_table.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

struct Journal {
  enum class OpKind : uint8_t { kAllocate, kMove, kRelease, kUnref };
  struct Op {
    OpKind kind = OpKind::kAllocate;
    LogicalId block = kNoBlock;
    Tier from_tier = Tier::kDevice;  // kMove: where it came from; kRelease: where it was
    int32_t from_phys = -1;
    int32_t move_index = -1;  // kMove(Cached): its place in the call's Transfers::moves
  };
  // A sequence's state before the call (plain data: a decode step saves one per member). Its
  // table is recovered from the old length, the copy-on-write source and the dropped tail
  // (tails[tail_begin, tail_begin + tail_size), in the order it was popped).
  struct SavedSequence {
    SequenceId id = 0;
    uint64_t last_used = 0;
    int32_t pending = 0;  // <= max_sequence_length, an int32
    uint32_t blocks = 0;
    int32_t cow_index = -1;
    LogicalId cow_source = kNoBlock;
    uint32_t tail_begin = 0;
    uint16_t tail_size = 0;
    bool offloaded = false;
  };
  // A window group's page taken for a new block, a hold on one dropped (with the page it had),
  // or a held page moved with its block (from `page` on `tier`), by the call (a plane of
  // several groups, shared_groups.cpp).
  // kMoveCached: a cached page that followed its block; undone by evicting it (its old page may
  // be taken by then), so its events are not taken back.
  enum class GroupOpKind : uint8_t { kTake, kDrop, kMove, kMoveCached };
  struct GroupOp {
    GroupOpKind kind = GroupOpKind::kTake;
    Tier tier = Tier::kDevice;
    int32_t group = 0;  // index among the plane's window groups
    LogicalId block = kNoBlock;
    int32_t page = -1;
    int32_t move_index = -1;  // kMove(Cached): its place in the call's Transfers::moves
  };
  struct Released {
    LogicalId block = kNoBlock;
    Tier tier = Tier::kDevice;
    int32_t phys = -1;
  };

  /// Whether a call's effects are being recorded (a plan is open).
  bool open = false;
  std::vector<Op> ops;
  std::vector<SavedSequence> sequences;
  std::vector<LogicalId> tails;
  std::vector<Released> released;  // references dropped at the end of the call
  std::vector<GroupOp> group_ops;
  ControlStats counters;     // the counters before the call
  uint64_t first_event = 0;  // sequence number of the call's first event

  /// Starts recording a call; `counters` and `first_event` are the state it starts from.
  void begin(const ControlStats& before, uint64_t first_event_seq) {
    open = true;
    ops.clear();
    sequences.clear();
    tails.clear();
    released.clear();
    group_ops.clear();
    counters = before;
    first_event = first_event_seq;
  }
  void allocation(LogicalId id) { ops.push_back(Op{OpKind::kAllocate, id, Tier::kDevice, -1, -1}); }
  void release(LogicalId id, const BlockInfo& b) {
    ops.push_back(Op{OpKind::kRelease, id, b.tier, b.phys, -1});
  }
  void unref(LogicalId id) { ops.push_back(Op{OpKind::kUnref, id, Tier::kDevice, -1, -1}); }
  void move(LogicalId id, const BlockMove& m, size_t move_index) {
    ops.push_back(Op{OpKind::kMove, id, m.src_tier, m.src_block, static_cast<int32_t>(move_index)});
  }
  /// Saves a sequence's state the first time the call touches it. A call touches each sequence
  /// in one stretch (a reserve restores, then reserves), so a repeat is the latest entry.
  SavedSequence& sequence(const Sequence& s) {
    if (!sequences.empty() && sequences.back().id == s.id) return sequences.back();
    // Written field by field in place: a temporary copied in is read back as wider words than
    // it was written with, a store-forwarding stall that was most of a decode step's reserve.
    SavedSequence& x = sequences.emplace_back();
    x.id = s.id;
    x.last_used = s.last_used;
    x.pending = static_cast<int32_t>(s.pending);
    x.blocks = static_cast<uint32_t>(s.blocks.size());
    x.offloaded = s.offloaded;
    return x;
  }
};

}  // namespace core
}  // namespace pagedkv
