// TierPlan: a tier-moving call's decision as a transaction. The control plane has already
// applied it to its books (blocks allocated, moved between tiers, copied on write; sequences
// offloaded, restored or dropped); the runtime must now carry its transfers out on the streams
// and then commit it, or, when the data plane failed part way, undo it. The type enforces the
// protocol: a plan is move-only, destroying an open plan undoes it, and while a plan is open the
// control plane refuses every other mutating call (kFailedPrecondition).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

class ControlPlane;

/// An open tier plan (see the file comment). Its transfers and slots live in the control plane
/// (one plan is open at a time, so one buffer serves every plan without allocating) and are
/// readable until the plan is committed or undone.
class TierPlan {
 public:
  TierPlan() = default;
  TierPlan(const TierPlan&) = delete;
  TierPlan& operator=(const TierPlan&) = delete;
  TierPlan(TierPlan&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
  TierPlan& operator=(TierPlan&& other) noexcept;
  /// Undoes the plan, as undo(0), when it is still open.
  ~TierPlan();

  /// Whether the plan still waits for commit() or undo().
  bool is_open() const { return owner_ != nullptr; }
  /// What the data plane must run, in order: every move, then every copy. Open plans only.
  const Transfers& transfers() const;
  /// The reserved slots, one per token, grouped by sequence in call order (reserve plans).
  const std::vector<int64_t>& slots() const;

  /// Keeps the plan: the data plane has queued all of its transfers.
  void commit();
  /// Takes the plan back after the data plane queued only the first `moves_done` of its moves:
  /// every block returns to the slot it left, allocations and copy-on-write are reverted, the
  /// sequences get their tables, reservations and residency back, and the plan's events are
  /// revoked. What needs no data stays done: unreferenced cached blocks it evicted and victims
  /// it dropped (Transfers::evicted). Returns the moves that bring the bytes back: the inverse of
  /// the first `moves_done` moves, newest first, for blocks that still exist. With `inverts`,
  /// the index in transfers().moves of the move each of them inverts (a rank of a
  /// tensor-parallel cache that queued fewer moves copies back only those).
  std::vector<BlockMove> undo(int64_t moves_done, std::vector<int32_t>* inverts = nullptr);

 private:
  friend class ControlPlane;
  explicit TierPlan(ControlPlane* owner) : owner_(owner) {}

  ControlPlane* owner_ = nullptr;
};

}  // namespace core
}  // namespace pagedkv
