// commit_batch(): the same tokens, tables, prefix index, counters and events as commit() per id
// on a random workload (prefix sharing, forks, windows, rollbacks, eviction), including batches
// that are not the one reserve_batch just resolved, on planes of one group (with and without a
// sliding window or prefix caching) and planes whose window groups share the blocks (every
// group's pages and events compared); every refusal commits nothing, also when
// the resolved-id memo of the step is reused (a member rolled back, offloaded, finished or
// listed in another order); check_commit_batch() answers as commit_batch() would and changes
// nothing.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using testing_util::expect_same_code;
using testing_util::iota_tokens;
using testing_util::make_cp;
using testing_util::tiny_config;

using EventKey =
    std::tuple<EventKind, int32_t, Tier, SequenceId, uint64_t, uint64_t, std::vector<TokenId>>;

std::vector<EventKey> event_keys(ControlPlane* cp) {
  std::vector<EventKey> out;
  for (const ControlEvent& e : cp->drain_events()) {
    out.emplace_back(e.kind, e.group, e.tier, e.sequence, e.block_hash, e.parent_hash, e.tokens);
  }
  return out;
}

void expect_same(ControlPlane* a, ControlPlane* b, const std::vector<SequenceId>& ids) {
  for (SequenceId id : ids) {
    ASSERT_EQ(a->contains(id), b->contains(id)) << id;
    if (!a->contains(id)) continue;
    EXPECT_EQ(*a->block_locations(id), *b->block_locations(id)) << id;
    for (int32_t g = 0; g < a->num_groups(); ++g) {
      EXPECT_EQ(*a->group_block_locations(id, g), *b->group_block_locations(id, g))
          << id << " group " << g;
    }
    EXPECT_EQ(*a->length(id), *b->length(id)) << id;
    EXPECT_EQ(*a->pending(id), *b->pending(id)) << id;
  }
  const ControlStats sa = a->stats();
  const ControlStats sb = b->stats();
  EXPECT_EQ(sa.device.free_blocks, sb.device.free_blocks);
  EXPECT_EQ(sa.device.cached_blocks, sb.device.cached_blocks);
  EXPECT_EQ(sa.blocks_evicted, sb.blocks_evicted);
  EXPECT_EQ(sa.window_released_blocks, sb.window_released_blocks);
  for (int32_t g = 0; g < a->num_groups(); ++g) {
    const auto pa = a->group_pages(g);
    const auto pb = b->group_pages(g);
    EXPECT_EQ(pa.used, pb.used) << "group " << g;
    EXPECT_EQ(pa.cached, pb.cached) << "group " << g;
    EXPECT_EQ(pa.evicted, pb.evicted) << "group " << g;
  }
  EXPECT_EQ(event_keys(a), event_keys(b));
  PAGEDKV_EXPECT_INV(*a);
  PAGEDKV_EXPECT_INV(*b);
}

KvGroup group(const char* name, int32_t window, int64_t device, int32_t layer) {
  KvGroup k;
  k.name = name;
  k.layers = {layer};
  k.num_kv_heads = 2;
  k.head_dim = 8;
  k.sliding_window = window;
  k.num_device_blocks = device;
  return k;
}

// The planes of the random test, by name.
CacheConfig random_config(const std::string& name) {
  CacheConfig c = tiny_config(4, 80);
  if (name == "window8") c.sliding_window = 8;
  if (name == "window6_uncached") {  // trims on other steps than fills, and nothing indexed
    c.sliding_window = 6;
    c.enable_prefix_caching = false;
  }
  if (name.rfind("groups", 0) == 0) {
    // Window pools small enough that their cached pages are evicted.
    std::vector<KvGroup> g = {group("local", 8, 24, 0)};
    if (name == "groups_two_windows") g.push_back(group("local2", 6, 20, 1));
    if (name == "groups_window_and_full") g.push_back(group("full2", 0, 80, 1));
    g.push_back(group("global", 0, 80, static_cast<int32_t>(g.size())));
    c.num_layers = static_cast<int32_t>(g.size());
    c.groups = g;
  }
  return c;
}

bool c_indexes(const std::string& name) { return random_config(name).enable_prefix_caching; }

class CommitBatchRandom : public ::testing::TestWithParam<std::string> {};  // random_config

TEST_P(CommitBatchRandom, MatchesPerSequenceCommit) {
  int batches = 0;
  int registered = 0;
  int64_t window_released = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    const CacheConfig c = random_config(GetParam());
    auto one = make_cp(c);  // commit() per id
    auto bat = make_cp(c);  // commit_batch()
    std::vector<SequenceId> live;
    SequenceId next_id = 1;
    auto both = [&](auto&& op) { expect_same_code(*one, *bat, op); };
    for (int step = 0; step < 300; ++step) {
      const int op = static_cast<int>(rng() % 8);
      if (op == 0 || live.size() < 3) {
        // Prompts of three families, so that commits complete blocks others already hold.
        const int len = static_cast<int>(rng() % 10);
        const std::vector<TokenId> p = iota_tokens(len, static_cast<TokenId>(100 * (rng() % 3)));
        const SequenceId id = next_id++;
        auto x = one->add_sequence(id, p);
        auto y = bat->add_sequence(id, p);
        ASSERT_EQ(x.ok(), y.ok());
        if (x.ok()) live.push_back(id);
      } else if (op == 1) {
        const SequenceId parent = live[rng() % live.size()];
        const SequenceId child = next_id++;
        both([&](ControlPlane& cp) { return cp.fork(parent, child); });
        if (one->contains(child)) live.push_back(child);
      } else if (op == 2) {
        const size_t i = rng() % live.size();
        const SequenceId id = live[i];
        both([&](ControlPlane& cp) { return cp.finish(id); });
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        // A decode-like step over a random subset: reserve_batch, then the commit of some of the
        // reserved tokens, per id on one plane and in one call on the other. Half the time the
        // commit lists the members in another order than the reserve (no memo hit).
        std::vector<SequenceId> ids;
        for (SequenceId id : live) {
          if (rng() % 2 == 0) ids.push_back(id);
        }
        const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
        ReserveResult r1, r2;
        const Status x = one->reserve_batch(ids, n, &r1);
        const Status y = bat->reserve_batch(ids, n, &r2);
        ASSERT_EQ(x.code(), y.code()) << x.to_string() << " / " << y.to_string();
        if (!x.ok()) continue;
        for (const SequenceId id : r1.transfers.evicted) {
          live.erase(std::find(live.begin(), live.end(), id));
        }
        if (rng() % 2 == 0) std::shuffle(ids.begin(), ids.end(), rng);
        const int64_t k = static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1));
        std::vector<TokenId> toks;
        for (size_t i = 0; i < ids.size() * static_cast<size_t>(k); ++i) {
          toks.push_back(static_cast<TokenId>(rng() % 5));  // few values: blocks repeat
        }
        for (size_t i = 0; i < ids.size(); ++i) {
          ASSERT_OK(one->commit(ids[i], toks.data() + i * static_cast<size_t>(k), k));
        }
        ASSERT_OK(bat->commit_batch(ids, toks.data(), k));
        ++batches;
      }
      expect_same(one.get(), bat.get(), live);
      if (HasFailure()) return;
    }
    registered += static_cast<int>(one->stats().device.cached_blocks);
    window_released += one->stats().window_released_blocks;
  }
  EXPECT_GT(batches, 1000);
  if (c_indexes(GetParam())) {
    EXPECT_GT(registered, 0);
  }  // filled blocks that stayed cached
  if (GetParam() != "full") {
    EXPECT_GT(window_released, 0);
  }  // windows moved in commits
}

INSTANTIATE_TEST_SUITE_P(Planes, CommitBatchRandom,
                         ::testing::Values("full", "window8", "window6_uncached", "groups_window",
                                           "groups_two_windows", "groups_window_and_full"));

// Rows that each fill several blocks, the second with the same tokens as the first: the blocks
// are indexed after all appends (commit_batch defers them), still chain by chain and row by row,
// so the second row's blocks are replaced by the first's as with commit() per id.
TEST(CommitBatch, RowsFillingSeveralBlocksShareThemAsPerIdCommits) {
  auto one = make_cp(tiny_config(4, 32));               // commit() per id
  auto bat = make_cp(tiny_config(4, 32));               // commit_batch()
  const std::vector<TokenId> row = iota_tokens(12, 0);  // blocks 0..3, 4..7, 8..11
  std::vector<TokenId> toks = row;
  toks.insert(toks.end(), row.begin(), row.end());
  for (ControlPlane* cp : {one.get(), bat.get()}) {
    ASSERT_OK(cp->add_sequence(1, {}));
    ASSERT_OK(cp->add_sequence(2, {}));
    ReserveResult r;
    ASSERT_OK(cp->reserve_batch({1, 2}, 12, &r));
  }
  ASSERT_OK(one->commit(1, toks.data(), 12));
  ASSERT_OK(one->commit(2, toks.data() + 12, 12));
  ASSERT_OK(bat->commit_batch({1, 2}, toks.data(), 12));
  const std::vector<int32_t> first = testing_util::device_blocks(*bat, 1);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(testing_util::device_blocks(*bat, 2), first);
  EXPECT_EQ(bat->stats().device.free_blocks, 32 - 3);  // the second row's own three were freed
  EXPECT_EQ(*bat->cached_prefix(iota_tokens(13, 0), 0), 12);
  const std::vector<EventKey> events = event_keys(bat.get());
  ASSERT_EQ(events.size(), 3u);
  for (size_t k = 0; k < events.size(); ++k) {
    EXPECT_EQ(std::get<0>(events[k]), EventKind::kBlockStored) << k;
    EXPECT_EQ(std::get<6>(events[k]), iota_tokens(4, static_cast<TokenId>(4 * k))) << k;
    if (k > 0) {
      EXPECT_EQ(std::get<5>(events[k]), std::get<4>(events[k - 1])) << k;  // parent = previous
    }
  }
  EXPECT_EQ(event_keys(one.get()), events);
  expect_same(one.get(), bat.get(), {1, 2});
}

// A batch that fills far more blocks than commit_batch hashes ahead at once (runs of 64): 150
// rows in five token families, each row with a committed first block, then filling two blocks
// (the second's parent filled in the same batch) and part of a third. Rows of a family share
// their blocks, and a second such batch continues the chains, as with commit() per id.
TEST(CommitBatch, ManyRowsFillingBlocksAcrossRunsIndexThemAsPerIdCommits) {
  constexpr int kRows = 150;
  auto one = make_cp(tiny_config(4, 2048));  // commit() per id
  auto bat = make_cp(tiny_config(4, 2048));  // commit_batch()
  std::vector<SequenceId> ids;
  for (int r = 0; r < kRows; ++r) ids.push_back(static_cast<SequenceId>(r + 1));
  const auto family_tokens = [](int row, int from, int n) {
    return iota_tokens(n, static_cast<TokenId>(1000 * (row % 5) + from));
  };
  for (ControlPlane* cp : {one.get(), bat.get()}) {
    for (int r = 0; r < kRows; ++r) {
      const SequenceId id = ids[static_cast<size_t>(r)];
      ASSERT_OK(cp->add_sequence(id, {}));
      ReserveResult rr;
      ASSERT_OK(cp->reserve_into(id, 4, &rr));
      ASSERT_OK(cp->commit(id, family_tokens(r, 0, 4)));
    }
  }
  for (int round = 0; round < 2; ++round) {
    const int from = 4 + 10 * round;
    std::vector<TokenId> toks;
    for (int r = 0; r < kRows; ++r) {
      const std::vector<TokenId> t = family_tokens(r, from, 10);
      toks.insert(toks.end(), t.begin(), t.end());
    }
    for (ControlPlane* cp : {one.get(), bat.get()}) {
      ReserveResult rr;
      ASSERT_OK(cp->reserve_batch(ids, 10, &rr));
    }
    for (int r = 0; r < kRows; ++r) {
      ASSERT_OK(one->commit(ids[static_cast<size_t>(r)], toks.data() + 10 * r, 10));
    }
    ASSERT_OK(bat->commit_batch(ids, toks.data(), 10));
    expect_same(one.get(), bat.get(), ids);
    ASSERT_OK(bat->check_invariants());
  }
  // Five families, each a chain of six full blocks (4 + 10 + 10 tokens) that its 30 rows share:
  // every row's own copies were freed.
  EXPECT_EQ(bat->stats().device.free_blocks, 2048 - 5 * 6);
  for (int f = 0; f < 5; ++f) {
    EXPECT_EQ(*bat->cached_prefix(family_tokens(f, 0, 25), 0), 24) << f;
    EXPECT_EQ(testing_util::device_blocks(*bat, ids[static_cast<size_t>(f)]),
              testing_util::device_blocks(*bat, ids[static_cast<size_t>(f + 5)]))
        << f;
  }
  EXPECT_EQ(event_keys(one.get()), event_keys(bat.get()));
}

// Two sequences in a decode step: reserve_batch({1, 2}, 2) resolves the batch the commit reuses.
class CommitBatchRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    cp_ = make_cp(tiny_config(4, 16, /*host=*/16));
    ASSERT_OK(cp_->add_sequence(1, iota_tokens(3, 0)));
    ASSERT_OK(cp_->add_sequence(2, iota_tokens(5, 10)));
    ASSERT_OK(cp_->reserve_into(1, 3, &r_));
    ASSERT_OK(cp_->commit(1, iota_tokens(3, 0)));
    ASSERT_OK(cp_->reserve_into(2, 5, &r_));
    ASSERT_OK(cp_->commit(2, iota_tokens(5, 10)));
    ASSERT_OK(cp_->reserve_batch({1, 2}, 2, &r_));
  }
  // The call is refused with `code`, check_commit_batch says the same first, and nothing moved.
  void expect_refused(const std::vector<SequenceId>& ids, const std::vector<TokenId>& toks,
                      int64_t n, StatusCode code) {
    const int64_t len1 = *cp_->length(1);
    const int64_t pend1 = *cp_->pending(1);
    const ControlStats before = cp_->stats();
    EXPECT_EQ(cp_->check_commit_batch(ids, toks.data(), n).code(), code);
    EXPECT_EQ(cp_->commit_batch(ids, toks.data(), n).code(), code);
    EXPECT_EQ(*cp_->length(1), len1);
    EXPECT_EQ(*cp_->pending(1), pend1);
    EXPECT_EQ(cp_->stats().device.cached_blocks, before.device.cached_blocks);
    PAGEDKV_EXPECT_INV(*cp_);
  }
  std::unique_ptr<ControlPlane> cp_;
  ReserveResult r_;
};

TEST_F(CommitBatchRefusals, AMemberRolledBackSinceTheReserve) {
  ASSERT_OK(cp_->rollback(2, 5));  // drops its reservation; the memo stays valid
  expect_refused({1, 2}, {7, 7, 8, 8}, 2, StatusCode::kFailedPrecondition);
  EXPECT_EQ(*cp_->length(2), 5);
}

TEST_F(CommitBatchRefusals, AMemberOffloadedSinceTheReserve) {
  ASSERT_OK(cp_->offload(2));
  expect_refused({1, 2}, {7, 7, 8, 8}, 2, StatusCode::kFailedPrecondition);
  const Status st = cp_->commit_batch({1, 2}, std::vector<TokenId>{7, 7, 8, 8}.data(), 2);
  EXPECT_NE(st.message().find("offloaded"), std::string::npos) << st.message();
}

TEST_F(CommitBatchRefusals, AMemberFinishedSinceTheReserve) {
  ASSERT_OK(cp_->finish(2));
  expect_refused({1, 2}, {7, 7, 8, 8}, 2, StatusCode::kNotFound);
}

TEST_F(CommitBatchRefusals, BadBatches) {
  expect_refused({1, 2, 1}, {7, 7, 8, 8, 9, 9}, 2, StatusCode::kInvalidArgument);  // twice
  expect_refused({1, 99}, {7, 7, 8, 8}, 2, StatusCode::kNotFound);
  expect_refused({1, 2}, {7, 7, 7, 8, 8, 8}, 3, StatusCode::kFailedPrecondition);  // > reserved
  expect_refused({1, 2}, {}, -1, StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->commit_batch({1, 2}, nullptr, 1).code(), StatusCode::kInvalidArgument);
  // After all of these the step's own commit still goes through, in the order it was reserved.
  ASSERT_OK(cp_->commit_batch({1, 2}, std::vector<TokenId>{3, 4, 14, 15}.data(), 2));
  EXPECT_EQ(*cp_->length(1), 5);
  EXPECT_EQ(*cp_->length(2), 7);
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(CommitBatchRefusals, TokensGoToTheirMemberInAnyOrder) {
  // Listed in the other order than reserve_batch's: sequence 2 (10..14) gets {15, 16} and
  // sequence 1 (0..2) gets {3, 4}; swapped, neither would continue its own run of ids.
  ASSERT_OK(cp_->commit_batch({2, 1}, std::vector<TokenId>{15, 16, 3, 4}.data(), 2));
  EXPECT_EQ(*cp_->cached_prefix(iota_tokens(9, 10), 0), 4);  // 10..13; 14..16 fill 3 of 4
  EXPECT_EQ(*cp_->length(2), 7);
  EXPECT_EQ(*cp_->length(1), 5);
  ASSERT_OK(cp_->reserve_batch({1, 2}, 1, &r_));
  ASSERT_OK(cp_->commit_batch({1, 2}, std::vector<TokenId>{5, 17}.data(), 1));
  EXPECT_EQ(*cp_->cached_prefix(iota_tokens(9, 10), 0), 8);  // 10..17: two blocks
  EXPECT_EQ(*cp_->cached_prefix(iota_tokens(6, 0), 0), 4);   // 0..3 (4 5 fill half the next)
  PAGEDKV_EXPECT_INV(*cp_);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
