#include "core/tier_plan.hpp"

#include <cassert>
#include <utility>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {

TierPlan& TierPlan::operator=(TierPlan&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) undo(0);
    owner_ = std::exchange(other.owner_, nullptr);
  }
  return *this;
}

TierPlan::~TierPlan() {
  if (owner_ != nullptr) undo(0);
}

const Transfers& TierPlan::transfers() const {
  assert(owner_ != nullptr && "TierPlan::transfers() of a closed plan");
  return owner_->plan_result_.transfers;
}

const std::vector<int64_t>& TierPlan::slots() const {
  assert(owner_ != nullptr && "TierPlan::slots() of a closed plan");
  return owner_->plan_result_.slots;
}

void TierPlan::commit() {
  assert(owner_ != nullptr && "TierPlan::commit() of a closed plan");
  std::exchange(owner_, nullptr)->close_journal();
}

std::vector<BlockMove> TierPlan::undo(int64_t moves_done, std::vector<int32_t>* inverts) {
  assert(owner_ != nullptr && "TierPlan::undo() of a closed plan");
  return std::exchange(owner_, nullptr)->undo_plan(moves_done, inverts);
}

}  // namespace core
}  // namespace pagedkv
