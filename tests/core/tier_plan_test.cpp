// TierPlan: the tier-moving calls as transactions. An open plan blocks every other mutating call,
// a committed plan equals the plain call, and a plan that is undone or destroyed leaves the
// control plane as it was before the call (except what needs no data: evictions and drops).
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/control_plane.hpp"
#include "core/core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using testing_util::add_and_fill;
using testing_util::iota_tokens;
using testing_util::make_cp;
using testing_util::snapshot;
using testing_util::tiny_config;

// Device pool of 8 blocks of 4 tokens and a host tier of 8: sequences 1 and 2 fill 6 blocks and
// are inactive, so a reserve of 4 more blocks for sequence 3 must offload one of them.
std::unique_ptr<ControlPlane> under_pressure() {
  auto cp = make_cp(tiny_config(4, 8, 8));
  add_and_fill(*cp, 1, iota_tokens(12, 100));
  add_and_fill(*cp, 2, iota_tokens(12, 200));
  EXPECT_OK(cp->add_sequence(3, {}));
  EXPECT_OK(cp->set_active({3}));
  return cp;
}

const std::vector<SequenceId> kIds = {1, 2, 3};

TEST(TierPlanTest, DestroyingAnOpenPlanUndoesIt) {
  auto cp = under_pressure();
  const auto before = snapshot(*cp, kIds);
  {
    auto plan = cp->plan_reserve(3, 16);
    ASSERT_OK(plan);
    ASSERT_FALSE(plan->transfers().offloaded.empty()) << "the setup must make the plan offload";
    EXPECT_EQ(plan->slots().size(), 16u);
    EXPECT_TRUE(cp->plan_open());
  }
  EXPECT_FALSE(cp->plan_open());
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(snapshot(*cp, kIds), before);
}

TEST(TierPlanTest, CommitKeepsWhatThePlainCallKeeps) {
  auto planned = under_pressure();
  auto plain = under_pressure();
  auto plan = planned->plan_reserve(3, 16);
  ASSERT_OK(plan);
  const Transfers transfers = plan->transfers();
  const std::vector<int64_t> slots = plan->slots();
  plan->commit();
  EXPECT_FALSE(plan->is_open());
  EXPECT_FALSE(planned->plan_open());
  auto r = plain->reserve(3, 16);
  ASSERT_OK(r);
  EXPECT_EQ(slots, r->slots);
  EXPECT_EQ(transfers.moves, r->transfers.moves);
  EXPECT_EQ(transfers.offloaded, r->transfers.offloaded);
  PAGEDKV_EXPECT_INV(*planned);
  EXPECT_EQ(snapshot(*planned, kIds), snapshot(*plain, kIds));
}

TEST(TierPlanTest, AnOpenPlanRefusesEveryMutatingCallAndChangesNothing) {
  auto cp = under_pressure();
  auto plan = cp->plan_reserve(3, 16);
  ASSERT_OK(plan);
  const auto during = snapshot(*cp, kIds);
  const TokenId t = 7;
  ReserveResult out;
  const std::vector<std::pair<const char*, Status>> calls = {
      {"add_sequence", cp->add_sequence(9, {1, 2, 3}).status()},
      {"reserve", cp->reserve(1, 1).status()},
      {"reserve_into", cp->reserve_into(1, 1, &out)},
      {"reserve_batch", cp->reserve_batch({1}, 1, &out)},
      {"plan_reserve", cp->plan_reserve(1, 1).status()},
      {"plan_reserve_batch", cp->plan_reserve_batch({1}, 1).status()},
      {"plan_offload", cp->plan_offload(1).status()},
      {"plan_restore", cp->plan_restore(1).status()},
      {"plan_prefetch", cp->plan_prefetch({1}).status()},
      {"commit", cp->commit(3, &t, 1)},
      {"commit_batch", cp->commit_batch({3}, &t, 1)},
      {"rollback", cp->rollback(1, 0)},
      {"fork", cp->fork(1, 9)},
      {"finish", cp->finish(1)},
      {"erase", cp->erase(2)},
      {"set_active", cp->set_active({})},
      {"set_priority", cp->set_priority(1, 5)},
      {"offload", cp->offload(1).status()},
      {"restore", cp->restore(1).status()},
      {"prefetch", cp->prefetch({1}).status()},
      {"build_batch", cp->build_batch({3}).status()},
  };
  for (const auto& [name, st] : calls) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << name << ": " << st.to_string();
    EXPECT_NE(st.message().find("tier plan is open"), std::string::npos) << name;
  }
  EXPECT_EQ(snapshot(*cp, kIds), during);
  // Queries still answer; the plan is still the one to close.
  EXPECT_EQ(*cp->pending(3), 16);
  EXPECT_OK(cp->check_invariants());
  plan->commit();
  EXPECT_OK(cp->commit(3, &t, 1));
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(TierPlanTest, UndoReturnsTheInverseOfTheMovesDoneNewestFirst) {
  auto cp = under_pressure();
  const auto before = snapshot(*cp, kIds);
  auto plan = cp->plan_reserve(3, 16);
  ASSERT_OK(plan);
  const std::vector<BlockMove> moves = plan->transfers().moves;
  ASSERT_GE(moves.size(), 2u);
  const std::vector<BlockMove> inverse = plan->undo(2);
  ASSERT_EQ(inverse.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const BlockMove& m = moves[1 - i];
    EXPECT_EQ(inverse[i], (BlockMove{m.dst_tier, m.dst_block, m.src_tier, m.src_block})) << i;
  }
  EXPECT_FALSE(plan->is_open());
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(snapshot(*cp, kIds), before);
}

TEST(TierPlanTest, AMovedPlanIsUndoneOnceByItsLastOwner) {
  auto cp = under_pressure();
  const auto before = snapshot(*cp, kIds);
  {
    auto plan = cp->plan_offload(1);
    ASSERT_OK(plan);
    TierPlan owner = std::move(plan).value();
    EXPECT_TRUE(owner.is_open());
    TierPlan last;
    last = std::move(owner);
    EXPECT_FALSE(owner.is_open());  // NOLINT(bugprone-use-after-move): moved-from is closed
    EXPECT_TRUE(last.is_open());
    EXPECT_TRUE(cp->residency(1)->offloaded);
  }
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(snapshot(*cp, kIds), before);
}

TEST(TierPlanTest, AFailedPlanCallLeavesNoPlanOpen) {
  auto cp = under_pressure();
  const auto before = snapshot(*cp, kIds);
  EXPECT_EQ(cp->plan_reserve(3, 1000).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cp->plan_reserve_batch({3, 3}, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp->plan_offload(3).status().code(), StatusCode::kFailedPrecondition);  // active
  EXPECT_EQ(cp->plan_restore(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cp->plan_prefetch({42}).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(cp->plan_open());
  EXPECT_EQ(snapshot(*cp, kIds), before);
  EXPECT_OK(cp->reserve(3, 4));
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(TierPlanTest, SlotsComeFromTheSequenceTableAndFollowAnOffload) {
  auto cp = under_pressure();
  auto r = cp->reserve(1, 3);  // positions 12, 13, 14 of sequence 1
  ASSERT_OK(r);
  std::vector<int64_t> slots;
  ASSERT_OK(cp->reserved_slots(1, &slots));
  EXPECT_EQ(slots, r->slots);
  for (int64_t p = 12; p < 15; ++p) EXPECT_EQ(*cp->slot(1, p), r->slots[p - 12]) << p;
  EXPECT_EQ(cp->slot(1, 15).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp->slot(1, -1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp->slot(42, 0).status().code(), StatusCode::kNotFound);
  // Offloaded: no slot is handed out; restored: the slots are where the blocks are now.
  ASSERT_OK(cp->offload(1));
  EXPECT_EQ(cp->slot(1, 12).status().code(), StatusCode::kFailedPrecondition);
  slots.clear();
  EXPECT_EQ(cp->reserved_slots(1, &slots).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(slots.empty());
  ASSERT_OK(cp->restore(1));
  const auto locations = *cp->block_locations(1);
  for (int64_t p = 12; p < 15; ++p) {
    EXPECT_EQ(*cp->slot(1, p), int64_t{locations[static_cast<size_t>(p / 4)].block} * 4 + p % 4);
  }
  PAGEDKV_EXPECT_INV(*cp);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
