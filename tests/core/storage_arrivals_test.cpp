// Blocks coming back from a storage tier (storage_lookup, begin_arrival, finish_arrival): the
// keys of a prompt's blocks after its cached prefix are the hashes the index would give them; an
// arrival holds free host slots, or those of the least recently used cached host leaves (never
// the prefix it continues, never a sequence's block); a good read joins the index as cached host
// blocks that later prompts hit; a failed read, a prefix evicted meanwhile, or a block computed
// meanwhile registers nothing twice. Also where a dropped block's bytes are when a call demotes
// it and drops it again (DroppedBlock::source). check_invariants() after every step.
#include <gtest/gtest.h>

#include <algorithm>
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
using testing_util::tiny_config;

// The hashes a control plane gives a prompt's full blocks when it computes all of them.
std::vector<uint64_t> indexed_hashes(const std::vector<TokenId>& prompt) {
  auto cp = make_cp(tiny_config(4, 16, 0));
  add_and_fill(*cp, 1, prompt);
  std::vector<uint64_t> out;
  for (const ControlEvent& e : cp->drain_events()) {
    if (e.kind == EventKind::kBlockStored) out.push_back(e.block_hash);
  }
  return out;
}

class StorageArrivalsTest : public ::testing::Test {
 protected:
  // Device 8 blocks, host 4; prompt_ is 16 tokens (4 blocks), the first 8 of them cached.
  void SetUp() override {
    cp_ = make_cp(tiny_config(4, 8, 4));
    prompt_ = iota_tokens(16, 500);
    add_and_fill(*cp_, 1, std::vector<TokenId>(prompt_.begin(), prompt_.begin() + 8));
    ASSERT_OK(cp_->finish(1));
    cp_->drain_events();
  }

  StorageLookup lookup() {
    auto l = cp_->storage_lookup(prompt_, 0, 16);
    EXPECT_OK(l);
    return l.ok() ? *l : StorageLookup{};
  }

  std::unique_ptr<ControlPlane> cp_;
  std::vector<TokenId> prompt_;
};

TEST_F(StorageArrivalsTest, TheLookupNamesTheBlocksAfterTheCachedPrefixByTheirIndexHashes) {
  const StorageLookup l = lookup();
  const std::vector<uint64_t> all = indexed_hashes(prompt_);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(l.hashes, (std::vector<uint64_t>{all[2], all[3]}));
  EXPECT_EQ(l.parent_hash, all[1]);
  EXPECT_EQ(l.tokens, std::vector<TokenId>(prompt_.begin() + 8, prompt_.end()));
  EXPECT_EQ(cp_->storage_lookup(prompt_, 0, 1)->hashes.size(), 1u) << "max_blocks";
  EXPECT_EQ(cp_->storage_lookup(prompt_, 7, 16)->hashes.size(), 4u) << "another namespace";
}

TEST_F(StorageArrivalsTest, AGoodReadBecomesCachedHostBlocksThatAPromptHits) {
  auto a = cp_->begin_arrival(lookup(), 2);
  ASSERT_OK(a);
  EXPECT_EQ(a->host_blocks.size(), 2u);
  EXPECT_EQ(cp_->arrivals_in_flight(), 1);
  EXPECT_EQ(cp_->stats().host.free_blocks, 2);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(*cp_->add_sequence(9, prompt_), 8) << "not a hit before it has arrived";
  ASSERT_OK(cp_->finish(9));

  EXPECT_EQ(*cp_->finish_arrival(a->id, true), 2);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(cp_->arrivals_in_flight(), 0);
  const ControlStats st = cp_->stats();
  EXPECT_EQ(st.storage_hit_blocks, 2);
  EXPECT_EQ(st.host.cached_blocks, 2);
  int stored_on_host = 0;
  for (const ControlEvent& e : cp_->drain_events()) {
    stored_on_host += e.kind == EventKind::kBlockStored && e.tier == Tier::kHost ? 1 : 0;
  }
  EXPECT_EQ(stored_on_host, 2);

  EXPECT_EQ(*cp_->add_sequence(2, prompt_), 15) << "all four blocks hit, one token to compute";
  // Whole blocks of the hit only: the last one is copied on write for the token left to compute.
  EXPECT_EQ(cp_->stats().prefix_host_hit_blocks, 1);
  const auto locations = *cp_->block_locations(2);
  EXPECT_EQ(locations[2], (BlockLocation{Tier::kHost, a->host_blocks[0]}));
  EXPECT_EQ(locations[3], (BlockLocation{Tier::kHost, a->host_blocks[1]}));
  ASSERT_OK(cp_->reserve(2, 1));  // onboards them
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_FALSE(cp_->residency(2)->offloaded);
}

// A read that failed at its second block: the first joins the index and a prompt hits it, the
// second's slot is free again.
TEST_F(StorageArrivalsTest, APartlyGoodReadRegistersTheBlocksBeforeTheFirstBadOne) {
  auto a = cp_->begin_arrival(lookup(), 2);
  ASSERT_OK(a);
  EXPECT_EQ(cp_->finish_arrival_partly(a->id, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->arrivals_in_flight(), 1) << "a refused call keeps the arrival";
  EXPECT_EQ(*cp_->finish_arrival_partly(a->id, 1), 1);
  PAGEDKV_EXPECT_INV(*cp_);
  const ControlStats st = cp_->stats();
  EXPECT_EQ(st.storage_hit_blocks, 1);
  EXPECT_EQ(st.host.cached_blocks, 1);
  EXPECT_EQ(st.host.free_blocks, 3);
  EXPECT_EQ(*cp_->add_sequence(2, prompt_), 12) << "blocks 0 and 1 cached, block 2 arrived";
  EXPECT_EQ(cp_->block_locations(2)->at(2), (BlockLocation{Tier::kHost, a->host_blocks[0]}));
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(StorageArrivalsTest, AFailedReadRegistersNothingAndFreesItsSlots) {
  auto a = cp_->begin_arrival(lookup(), 2);
  ASSERT_OK(a);
  EXPECT_EQ(*cp_->finish_arrival(a->id, false), 0);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(cp_->stats().host.free_blocks, 4);
  EXPECT_EQ(cp_->stats().storage_hit_blocks, 0);
  EXPECT_EQ(*cp_->add_sequence(2, prompt_), 8);
  EXPECT_EQ(cp_->finish_arrival(a->id, true).status().code(), StatusCode::kNotFound);
}

TEST_F(StorageArrivalsTest, APrefixEvictedMeanwhileOrABlockComputedMeanwhileIsNotRegisteredTwice) {
  // Computed meanwhile: a sequence commits the whole prompt before the read lands.
  auto a = cp_->begin_arrival(lookup(), 2);
  ASSERT_OK(a);
  add_and_fill(*cp_, 3, prompt_);
  EXPECT_EQ(*cp_->finish_arrival(a->id, true), 0);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(cp_->stats().host.free_blocks, 4);
  ASSERT_OK(cp_->erase(3));  // drops the whole chain from the index
  PAGEDKV_EXPECT_INV(*cp_);

  // Evicted meanwhile: the prefix the read continues is gone when it lands.
  add_and_fill(*cp_, 4, std::vector<TokenId>(prompt_.begin(), prompt_.begin() + 8));
  ASSERT_OK(cp_->finish(4));
  auto b = cp_->begin_arrival(lookup(), 2);
  ASSERT_OK(b);
  ASSERT_EQ(b->host_blocks.size(), 2u);
  ASSERT_OK(cp_->add_sequence(5, prompt_));
  ASSERT_OK(cp_->erase(5));  // the only holder of the cached prefix: it goes
  EXPECT_EQ(*cp_->finish_arrival(b->id, true), 0);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 0);
}

// A lookup whose key for a block is not the hash the index gives it (a broken caller): that
// block and the ones after it are freed, never indexed, and no event names them (no store, and
// no removal of a block never announced); the blocks before it register as usual.
TEST_F(StorageArrivalsTest, ABlockWhoseKeyIsNotItsIndexHashIsFreedWithoutAnEvent) {
  StorageLookup l = lookup();
  ASSERT_EQ(l.hashes.size(), 2u);
  const uint64_t good = l.hashes[0];
  l.hashes[1] ^= 1;
  auto a = cp_->begin_arrival(l, 2);
  ASSERT_OK(a);
  ASSERT_EQ(a->host_blocks.size(), 2u);
  EXPECT_EQ(*cp_->finish_arrival(a->id, true), 1);
  PAGEDKV_EXPECT_INV(*cp_);
  const std::vector<ControlEvent> events = cp_->drain_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, EventKind::kBlockStored);
  EXPECT_EQ(events[0].block_hash, good);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 1);
  EXPECT_EQ(cp_->stats().host.free_blocks, 3);
  EXPECT_EQ(*cp_->add_sequence(2, prompt_), 12) << "blocks 0 and 1 cached, block 2 arrived";
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(StorageArrivalsTest, AnArrivalNeverTakesAnotherArrivalsSlotsAndWaitsForAnOpenPlan) {
  const StorageLookup l = lookup();
  EXPECT_EQ(cp_->begin_arrival(l, 3).status().code(), StatusCode::kInvalidArgument);
  auto a = cp_->begin_arrival(l, 2);
  auto b = cp_->begin_arrival(l, 2);
  auto c = cp_->begin_arrival(l, 2);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(a->host_blocks.size() + b->host_blocks.size(), 4u);
  EXPECT_TRUE(c->host_blocks.empty()) << "every host slot is held by an arrival";
  PAGEDKV_EXPECT_INV(*cp_);
  {
    auto plan = cp_->plan_reserve(1, 0);
    EXPECT_EQ(plan.status().code(), StatusCode::kNotFound);  // sequence 1 finished
  }
  ASSERT_OK(cp_->add_sequence(6, {1, 2, 3}));
  auto plan = cp_->plan_reserve(6, 3);
  ASSERT_OK(plan);
  EXPECT_EQ(cp_->finish_arrival(a->id, true).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cp_->begin_arrival(l, 1).status().code(), StatusCode::kFailedPrecondition);
  plan->commit();
  EXPECT_EQ(*cp_->finish_arrival(a->id, true), 2);
  EXPECT_EQ(*cp_->finish_arrival(b->id, true), 0) << "the same blocks arrived with `a`";
  PAGEDKV_EXPECT_INV(*cp_);
}

// A plane that reports host drops (a storage tier is attached), device 8 blocks and host 4 of 4
// tokens, every prompt computed and finished: P's first two blocks, then Q, R (two blocks each),
// S (four) and U (two). S's and U's reserves demote the least recently used cached device blocks,
// P's and then Q's, so the host tier is full of cached blocks: P0 P1 Q0 Q1 on the host, R S U on
// the device.
class WarmHostArrivalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ControlOptions o;
    o.report_host_drops = true;
    auto cp = ControlPlane::create(tiny_config(4, 8, 4), o);
    ASSERT_OK(cp);
    cp_ = std::move(cp).value();
    prompt_ = iota_tokens(17, 500);
    fill_and_finish(1, std::vector<TokenId>(prompt_.begin(), prompt_.begin() + 8));
    fill_and_finish(2, iota_tokens(8, 2000));
    fill_and_finish(3, iota_tokens(8, 3000));
    fill_and_finish(4, iota_tokens(16, 4000));
    fill_and_finish(5, iota_tokens(8, 5000));
    ASSERT_EQ(cp_->stats().host.cached_blocks, 4);
    ASSERT_EQ(cp_->stats().host.free_blocks, 0);
    ASSERT_EQ(*cp_->cached_prefix(prompt_, 0), 8) << "P's blocks are on the host";
    cp_->drain_events();
  }

  void fill_and_finish(SequenceId id, const std::vector<TokenId>& tokens) {
    add_and_fill(*cp_, id, tokens);
    ASSERT_OK(cp_->finish(id));
    PAGEDKV_EXPECT_INV(*cp_);
  }

  std::unique_ptr<ControlPlane> cp_;
  std::vector<TokenId> prompt_;
};

TEST_F(WarmHostArrivalTest, AnArrivalDropsTheLeastRecentlyUsedCachedLeavesButNeverItsPrefix) {
  EXPECT_EQ(cp_->arrival_room(), 4);
  auto l = cp_->storage_lookup(prompt_, 0, cp_->arrival_room());
  ASSERT_OK(l);
  ASSERT_EQ(l->hashes.size(), 2u) << "blocks 2 and 3 after the cached prefix";
  auto a = cp_->begin_arrival(*l, 2);
  ASSERT_OK(a);
  PAGEDKV_EXPECT_INV(*cp_);
  ASSERT_EQ(a->host_blocks.size(), 2u);
  // P1 is the least recently used leaf, but the arrival continues it: Q's two blocks go instead,
  // leaf first, and the arrival takes their slots.
  ASSERT_EQ(a->host_drops.size(), 2u);
  const std::vector<TokenId> q = iota_tokens(8, 2000);
  EXPECT_EQ(a->host_drops[0].tokens, std::vector<TokenId>(q.begin() + 4, q.end()));
  EXPECT_EQ(a->host_drops[1].tokens, std::vector<TokenId>(q.begin(), q.begin() + 4));
  std::vector<int32_t> dropped_slots;
  for (const DroppedBlock& d : a->host_drops) {
    EXPECT_EQ(d.source.tier, Tier::kHost) << "no call is open: the bytes are in their slots";
    dropped_slots.push_back(d.source.block);
  }
  std::vector<int32_t> taken = a->host_blocks;
  std::sort(taken.begin(), taken.end());
  std::sort(dropped_slots.begin(), dropped_slots.end());
  EXPECT_EQ(taken, dropped_slots);
  EXPECT_EQ(cp_->stats().host_blocks_dropped, 2);
  ASSERT_EQ(*cp_->finish_arrival(a->id, true), 2);
  PAGEDKV_EXPECT_INV(*cp_);
  EXPECT_EQ(*cp_->add_sequence(9, prompt_), 16) << "the whole prefix hits";
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(WarmHostArrivalTest, AnArrivalNeverTakesTheSlotsOfASequencesBlocks) {
  // A sequence offloaded to the host holds every host slot: nothing can be dropped for an
  // arrival.
  const std::vector<TokenId> v = iota_tokens(16, 7000);
  ASSERT_OK(cp_->add_sequence(6, v));
  ASSERT_OK(cp_->reserve(6, 16));
  ASSERT_OK(cp_->commit(6, v));
  ASSERT_OK(cp_->offload(6));
  PAGEDKV_EXPECT_INV(*cp_);
  ASSERT_EQ(cp_->stats().host.cached_blocks, 0);
  EXPECT_EQ(cp_->arrival_room(), 0);
  auto l = cp_->storage_lookup(iota_tokens(9, 9000), 0, 4);
  ASSERT_OK(l);
  auto a = cp_->begin_arrival(*l, 2);
  ASSERT_OK(a);
  EXPECT_TRUE(a->host_blocks.empty());
  EXPECT_TRUE(a->host_drops.empty());
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(WarmHostArrivalTest, ABlockDemotedAndDroppedInOneCallIsReadFromItsDeviceBlock) {
  // A 25-token prompt needs seven device blocks: each eviction demotes the least recently used
  // cached device block after dropping the host LRU. The host LRU orders by last use, so R's
  // blocks, demoted early in the call, are dropped again later in the same call, before the
  // call's moves have brought them to the host.
  ASSERT_OK(cp_->add_sequence(7, iota_tokens(25, 8000)));
  auto r = cp_->reserve(7, 25);
  ASSERT_OK(r);
  PAGEDKV_EXPECT_INV(*cp_);
  std::vector<uint64_t> demoted;  // announced on the host tier by this call
  for (const ControlEvent& e : cp_->drain_events()) {
    if (e.kind == EventKind::kBlockStored && e.tier == Tier::kHost) demoted.push_back(e.block_hash);
  }
  const Transfers& t = r->transfers;
  int from_device = 0;
  for (const DroppedBlock& d : t.host_drops) {
    const bool demoted_here =
        std::find(demoted.begin(), demoted.end(), d.block_hash) != demoted.end();
    if (!demoted_here) {
      EXPECT_EQ(d.source.tier, Tier::kHost) << "a block on the host before the call";
      continue;
    }
    ++from_device;
    ASSERT_EQ(d.source.tier, Tier::kDevice) << "its bytes have not reached the host slot";
    const bool is_a_demotion_source =
        std::any_of(t.moves.begin(), t.moves.end(), [&](const BlockMove& m) {
          return m.src_tier == Tier::kDevice && m.dst_tier == Tier::kHost &&
                 m.src_block == d.source.block;
        });
    EXPECT_TRUE(is_a_demotion_source);
  }
  EXPECT_GE(from_device, 2) << "R's two blocks were demoted and dropped within the call";
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
