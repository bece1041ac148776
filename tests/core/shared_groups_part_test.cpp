// SharedGroups as a part of its own, over a BlockAllocator, a Journal and a SequenceTable it is
// handed (no ControlPlane): the config check, what a sequence's holds and its moving window do
// to the pages, the undo of the journaled takes and drops, the page events, and its own
// invariant check naming what disagrees.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/core_test_util.hpp"
#include "core/shared_groups.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using testing_util::tiny_config;

constexpr int32_t kBs = 4;

KvGroup group(int32_t window, int64_t device, int32_t layer) {
  KvGroup k;
  k.name = "g" + std::to_string(layer);
  k.layers = {layer};
  k.num_kv_heads = 1;
  k.head_dim = 8;
  k.sliding_window = window;
  k.num_device_blocks = device;
  return k;
}

// Groups of the given windows (0: full attention) and device blocks, block size kBs.
CacheConfig config_of(const std::vector<int32_t>& windows, const std::vector<int64_t>& device) {
  CacheConfig c = tiny_config(kBs, device[0]);
  c.groups.clear();
  for (size_t g = 0; g < windows.size(); ++g) {
    c.groups.push_back(group(windows[g], device[g], static_cast<int32_t>(g)));
  }
  c.num_layers = static_cast<int32_t>(windows.size());
  return c;
}

struct PageEvent {
  EventKind kind;
  LogicalId block;
  int32_t group;
};

// A plane's parts around one SharedGroups: a full group of 8 blocks owning the logical blocks
// (config group 1) and a window-8 group (two blocks of 4 tokens) of 3 pages (config group 0).
class SharedGroupsPart : public ::testing::Test {
 protected:
  SharedGroupsPart()
      : config_(config_of({8, 0}, {3, 8})),
        blocks_(8, 0),
        groups_(
            config_, /*owner=*/1, &blocks_, &journal_,
            [this](EventKind kind, LogicalId b, const GroupPages& g, Tier, bool) {
              events_.push_back(PageEvent{kind, b, g.config_index()});
            },
            /*track_origins=*/false) {}

  // A new sequence holding `n` new blocks from table index 0, `length` tokens committed.
  Sequence* hold_new(SequenceId id, int n, int64_t length) {
    Sequence* s = seqs_.create(id);
    s->tokens.assign(static_cast<size_t>(length), 7);
    groups_.set_first_held(s, length);
    for (int i = 0; i < n; ++i) {
      const LogicalId b = blocks_.allocate(Tier::kDevice);
      s->blocks.push_back(b);
      groups_.take(b);  // the new block's page, with its one holder
    }
    return s;
  }
  Status check() const { return groups_.check(seqs_, std::vector<std::vector<LogicalId>>(1)); }

  CacheConfig config_;
  BlockAllocator blocks_;
  Journal journal_;
  SequenceTable seqs_;
  std::vector<PageEvent> events_;
  SharedGroups groups_;
};

TEST(SharedGroupsConfig, TheOwnerIsTheFullGroupWithTheMostDeviceBlocks) {
  int32_t owner = -1;
  EXPECT_OK(SharedGroups::check_config(config_of({16, 0, 0}, {4, 8, 12}), &owner));
  EXPECT_EQ(owner, 2);
  EXPECT_OK(SharedGroups::check_config(config_of({0, 16, 0}, {12, 4, 12}), &owner));
  EXPECT_EQ(owner, 0) << "the first of a tie";
  EXPECT_OK(SharedGroups::check_config(config_of({64, 0}, {12, 4}), &owner));
  EXPECT_EQ(owner, 1) << "no window reaches further than any window";
}

TEST(SharedGroupsConfig, WithEveryGroupWindowedTheWidestOwnsTheBlocks) {
  int32_t owner = -1;
  EXPECT_OK(SharedGroups::check_config(config_of({8, 32, 16}, {4, 8, 12}), &owner));
  EXPECT_EQ(owner, 1);
  EXPECT_OK(SharedGroups::check_config(config_of({32, 8, 32}, {4, 8, 12}), &owner));
  EXPECT_EQ(owner, 2) << "of two widest, the one with the most device blocks";
}

TEST(SharedGroupsConfig, RefusesOneGroupAndTakesAnyNumberOfWindowsBesideTheOwner) {
  int32_t owner = -1;
  EXPECT_EQ(SharedGroups::check_config(config_of({0}, {8}), &owner).code(),
            StatusCode::kInvalidArgument);
  std::vector<int32_t> many = {8, 12, 16, 20, 24, 28, 12, 0};
  EXPECT_OK(
      SharedGroups::check_config(config_of(many, std::vector<int64_t>(many.size(), 8)), &owner));
  EXPECT_EQ(owner, 7);
  many.pop_back();  // the widest of the windows owns the blocks
  EXPECT_OK(
      SharedGroups::check_config(config_of(many, std::vector<int64_t>(many.size(), 8)), &owner));
  EXPECT_EQ(owner, 5);
}

// Five window sizes beside a full owner, two groups of one size: a sequence decoding 28 tokens
// ends up holding, in every group, exactly the blocks its window still covers. The groups of
// window 8 share one bound (both must drop before it moves); those of windows 20 and 24 keep
// theirs past the inline ones (Sequence::kInlineWindowBounds).
TEST(SharedGroupsWindows, EveryWindowSizeKeepsItsOwnBoundAndGroupsOfOneSizeShareIt) {
  const std::vector<int32_t> windows = {8, 8, 12, 16, 20, 24, 0};
  const CacheConfig config = config_of(windows, {8, 8, 8, 8, 8, 8, 16});
  int32_t owner = -1;
  ASSERT_OK(SharedGroups::check_config(config, &owner));
  ASSERT_EQ(owner, 6);
  BlockAllocator blocks(16, 0);
  Journal journal;
  SequenceTable seqs;
  SharedGroups groups(
      config, owner, &blocks, &journal, [](EventKind, LogicalId, const GroupPages&, Tier, bool) {},
      /*track_origins=*/false);
  ASSERT_EQ(groups.size(), 6u);
  Sequence* s = seqs.create(1);
  groups.set_first_held(s, 0);
  for (int64_t length = 1; length <= 28; ++length) {
    if (length > static_cast<int64_t>(s->blocks.size()) * kBs) {
      const LogicalId b = blocks.allocate(Tier::kDevice);
      s->blocks.push_back(b);
      groups.take(b);
    }
    s->tokens.assign(static_cast<size_t>(length), 7);
    groups.trim_windows(s);
    ASSERT_OK(groups.check(seqs, std::vector<std::vector<LogicalId>>(groups.size())))
        << "at " << length;
  }
  for (size_t w = 0; w < groups.size(); ++w) {
    const GroupPages& g = groups[w];
    // 28 tokens, a window of W: the first block it covers is (28 - W) / 4.
    const size_t first = static_cast<size_t>((28 - windows[w]) / kBs);
    SCOPED_TRACE("window " + std::to_string(windows[w]));
    EXPECT_EQ(g.first_held(*s), first);
    EXPECT_EQ(g.released(), static_cast<int64_t>(first));
    for (size_t i = 0; i < s->blocks.size(); ++i) {
      EXPECT_EQ(g.holders(s->blocks[i]), i < first ? 0 : 1) << "block " << i;
      EXPECT_EQ(g.page(s->blocks[i]) >= 0, i >= first) << "block " << i;
    }
  }
  EXPECT_EQ(s->more_bounds.size(), 2u) << "windows 20 and 24, past the three inline bounds";
}

TEST_F(SharedGroupsPart, AWindowThatMovesOnReleasesThePagesBehindIt) {
  ASSERT_EQ(groups_.size(), 1u);
  EXPECT_EQ(groups_.window_index(0), 0u);
  Sequence* s = hold_new(1, 3, 10);  // 10 tokens: the window of 8 covers tokens 2..9
  const GroupPages& g = groups_[0];
  EXPECT_EQ(g.free_count(), 0);
  for (LogicalId b : s->blocks) EXPECT_EQ(g.holders(b), 1);
  EXPECT_OK(check());

  s->tokens.assign(13, 7);  // the window now covers tokens 5..12: block 0 fell out
  EXPECT_EQ(groups_.trim_windows(s), 1);
  EXPECT_EQ(g.page(s->blocks[0]), -1) << "not indexed: its page is freed, not cached";
  EXPECT_EQ(g.free_count(), 1);
  EXPECT_EQ(g.released(), 1);
  EXPECT_EQ(g.first_held(*s), 1u);
  EXPECT_OK(check());
  // Rolling back before the window's first held block is refused; to its own start is not.
  EXPECT_EQ(groups_.check_rollback(*s, 5).code(), StatusCode::kFailedPrecondition);
  EXPECT_OK(groups_.check_rollback(*s, 12));
  EXPECT_OK(groups_.check_rollback(*s, 0));
}

TEST_F(SharedGroupsPart, UndoGivesBackTheCallsTakesAndDrops) {
  Sequence* s = hold_new(1, 2, 8);
  journal_.group_ops.clear();  // the call starts here
  const LogicalId third = blocks_.allocate(Tier::kDevice);
  groups_.take(third);
  groups_.drop(*s, 1, s->blocks[1], /*undoable=*/true);
  EXPECT_EQ(groups_[0].page(s->blocks[1]), -1);
  std::vector<BlockMove> inverse;
  groups_.undo(/*moves_done=*/0, &inverse, /*inverts=*/nullptr);
  EXPECT_TRUE(inverse.empty());
  EXPECT_EQ(groups_[0].page(third), -1) << "the take is undone";
  EXPECT_EQ(groups_[0].holders(s->blocks[1]), 1) << "the drop is undone";
  blocks_[third].ref = 0;
  blocks_.release(third);
  EXPECT_OK(check());
}

TEST_F(SharedGroupsPart, ATakeThatEvictsACachedPageAnnouncesIt) {
  Sequence* s = hold_new(1, 3, 10);
  const LogicalId cached = s->blocks[0];
  blocks_[cached].node = 0;  // indexed: its page stays cached when its holder goes
  groups_.drop(*s, 0, cached);
  s->tokens.assign(13, 7);
  groups_.set_first_held(s, 13);  // its window moved past block 0
  ASSERT_TRUE(groups_[0].cached(cached));
  const LogicalId fresh = blocks_.allocate(Tier::kDevice);
  groups_.take(fresh);  // the pool is full: the cached page goes
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].kind, EventKind::kBlockRemoved);
  EXPECT_EQ(events_[0].block, cached);
  EXPECT_EQ(events_[0].group, 0);
  EXPECT_EQ(groups_[0].evicted(), 1);
}

TEST_F(SharedGroupsPart, ItsCheckNamesAHolderItDoesNotFind) {
  Sequence* s = hold_new(1, 2, 8);
  EXPECT_OK(check());
  groups_[0].hold(s->blocks[0], Tier::kDevice);  // a hold no sequence has
  const Status st = check();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("holders, recounted"), std::string::npos) << st.to_string();
  // An arrival's hold is one the check counts.
  EXPECT_OK(groups_.check(seqs_, std::vector<std::vector<LogicalId>>{{s->blocks[0]}}));
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
