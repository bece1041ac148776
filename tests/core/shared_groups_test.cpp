// A control plane whose KV groups share the logical blocks: one full-attention group owns them,
// and sliding-window groups and further full-attention groups keep pages in pools of their own
// (GroupPages). The random test keeps a model of
// every group's memory: each written slot holds a stamp of the prefix it was computed from, and
// after every call each sequence must read, through its group's block table, the stamps of its
// own tokens over the positions that group attends to (all for full attention, the last W for a
// window). Copy-on-write copies are applied per group; prefix hits, forks, rollbacks, evictions
// and drops all go through the same check, with check_invariants().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

KvGroup group(const std::string& name, int32_t window, int64_t device, int32_t layer) {
  KvGroup k;
  k.name = name;
  k.layers = {layer};
  k.num_kv_heads = 2;
  k.head_dim = 8;
  k.sliding_window = window;
  k.num_device_blocks = device;
  return k;
}

// A model of `windows.size()` groups (listed first; a window of 0: another full-attention group)
// and one full group of `full_blocks`, block size `bs`.
CacheConfig shared_config(int32_t bs, int64_t full_blocks, const std::vector<int32_t>& windows,
                          int64_t window_pages) {
  CacheConfig c = tiny_config(bs, full_blocks);
  std::vector<KvGroup> groups;
  for (size_t w = 0; w < windows.size(); ++w) {
    groups.push_back(
        group("local" + std::to_string(w), windows[w], window_pages, static_cast<int32_t>(w)));
  }
  groups.push_back(group("global", 0, full_blocks, static_cast<int32_t>(windows.size())));
  c.num_layers = static_cast<int32_t>(groups.size());
  c.groups = groups;
  return c;
}

TEST(SharedGroups, ConfigErrors) {
  CacheConfig c = shared_config(16, 64, {64}, 16);
  EXPECT_OK(ControlPlane::create(c));

  CacheConfig host = c;
  host.groups[0].num_host_blocks = 8;
  auto r = ControlPlane::create(host);
  ASSERT_OK(r);

  // Several full-attention groups: the one with the most device blocks owns the logical blocks
  // (the first of those on a tie), the others keep pages that never trim.
  CacheConfig two_full = c;
  two_full.groups[0].sliding_window = 0;
  r = ControlPlane::create(two_full);
  ASSERT_OK(r);
  EXPECT_EQ(r.value()->full_group(), 1);
  two_full.groups[0].num_device_blocks = 64;
  r = ControlPlane::create(two_full);
  ASSERT_OK(r);
  EXPECT_EQ(r.value()->full_group(), 0);

  // Every group with a window: the widest one owns the blocks (a window of 64 beside one of 32).
  CacheConfig no_full = c;
  no_full.groups[1].sliding_window = 32;
  r = ControlPlane::create(no_full);
  ASSERT_OK(r);
  EXPECT_EQ(r.value()->full_group(), 0);

  // Any number of window groups (five sizes, one of them twice) beside the full group.
  CacheConfig many = shared_config(16, 64, {32, 64, 128, 256, 512, 64}, 16);
  r = ControlPlane::create(many);
  ASSERT_OK(r);
  EXPECT_EQ(r.value()->full_group(), 6);

  // Four windows and no full group: the widest owns the blocks, three are beside it.
  CacheConfig four = shared_config(16, 64, {32, 64, 128, 256}, 16);
  four.groups.pop_back();
  four.num_layers = 4;
  r = ControlPlane::create(four);
  ASSERT_OK(r);
  EXPECT_EQ(r.value()->full_group(), 3);

  // Any number of full-attention groups beside the windows.
  CacheConfig wide = shared_config(16, 64, {32, 0, 64, 0, 128}, 16);
  EXPECT_OK(ControlPlane::create(wide));

  CacheConfig one = c;
  one.groups.erase(one.groups.begin());
  one.groups[0].layers = {0, 1};
  r = ControlPlane::create(one);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("group_config(0)"), std::string::npos);
}

TEST(SharedGroups, WindowGroupOutOfPagesIsAnErrorThatChangesNothing) {
  // Two pages in the window group: a third block cannot be had there, although the full group
  // has room. Nothing changes, and the error names the group.
  auto cp = make_cp(shared_config(4, 32, {8}, 2));
  ASSERT_OK(cp->add_sequence(1, {}));
  ASSERT_OK(cp->reserve(1, 8));
  const auto r = cp->reserve(1, 12);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("out of pages in group 0 (window 8)"), std::string::npos)
      << r.status().to_string();
  EXPECT_EQ(cp->pending(1).value(), 8);
  EXPECT_EQ(cp->group_pages(0).used, 2);
  ReserveResult rr;
  EXPECT_EQ(cp->reserve_batch({1}, 12, &rr).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(rr.slots.empty());
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(SharedGroups, WindowGroupPressureDropsAnInactiveSequence) {
  // The full group has room; the window group's two pages are held by an inactive sequence,
  // which is dropped for the active one's reserve, as a one-group plane drops for its blocks.
  auto cp = make_cp(shared_config(4, 32, {8}, 2));
  ASSERT_OK(cp->add_sequence(1, {}));
  ASSERT_OK(cp->reserve(1, 8));
  ASSERT_OK(cp->add_sequence(2, {}));
  ASSERT_OK(cp->set_active({2}));
  auto r = cp->reserve(2, 4);
  ASSERT_OK(r);
  EXPECT_EQ(r.value().transfers.evicted, std::vector<SequenceId>{1});
  EXPECT_FALSE(cp->contains(1));
  EXPECT_EQ(cp->stats().sequences_evicted, 1);
  PAGEDKV_EXPECT_INV(*cp);
  // A batch member is never dropped for the batch.
  ASSERT_OK(cp->add_sequence(3, {}));
  ReserveResult rr;
  EXPECT_EQ(cp->reserve_batch({2, 3}, 8, &rr).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cp->contains(3));
  PAGEDKV_EXPECT_INV(*cp);
}

// With host pools, an inactive sequence holding the window pages a reserve needs is offloaded,
// pages and blocks, as a one-group plane offloads for its blocks; without room for its pages in
// the window group's host pool it is dropped, even when the full group's host pool has room.
TEST(SharedGroups, WindowGroupPressureOffloadsAnInactiveSequenceWhenEveryHostPoolHasRoom) {
  for (const int64_t window_host_pages : {int64_t{2}, int64_t{1}}) {
    SCOPED_TRACE("window host pages " + std::to_string(window_host_pages));
    CacheConfig c = shared_config(4, 32, {8}, 2);
    c.groups[0].num_host_blocks = window_host_pages;
    c.groups[1].num_host_blocks = 8;
    auto cp = make_cp(c);
    ASSERT_OK(cp->add_sequence(1, {}));
    ASSERT_OK(cp->reserve(1, 8));
    ASSERT_OK(cp->commit(1, iota_tokens(8, 1)));  // two blocks, both in the window
    ASSERT_OK(cp->add_sequence(2, {}));
    ASSERT_OK(cp->set_active({2}));
    auto r = cp->reserve(2, 4);
    ASSERT_OK(r);
    const Transfers& t = r.value().transfers;
    if (window_host_pages == 2) {
      EXPECT_TRUE(t.evicted.empty());
      EXPECT_EQ(t.offloaded, std::vector<SequenceId>{1});
      int64_t full_moves = 0, window_moves = 0;
      for (const BlockMove& m : t.moves) {
        EXPECT_EQ(m.src_tier, Tier::kDevice);
        EXPECT_EQ(m.dst_tier, Tier::kHost);
        (m.group == 0 ? window_moves : full_moves) += 1;
      }
      EXPECT_EQ(full_moves, 2);
      EXPECT_EQ(window_moves, 2);
      EXPECT_TRUE(cp->contains(1));
      EXPECT_TRUE(cp->residency(1).value().offloaded);
      EXPECT_EQ(cp->stats().sequences_evicted, 0);
    } else {
      EXPECT_EQ(t.evicted, std::vector<SequenceId>{1});
      EXPECT_TRUE(t.moves.empty());
      EXPECT_FALSE(cp->contains(1));
    }
    PAGEDKV_EXPECT_INV(*cp);
  }
}

TEST(SharedGroups, RollbackIntoAReleasedWindowNamesTheGroup) {
  auto cp = make_cp(shared_config(4, 64, {8}, 16));
  ASSERT_OK(cp->add_sequence(1, {}));
  ASSERT_OK(cp->reserve(1, 22));
  ASSERT_OK(cp->commit(1, iota_tokens(22, 1)));  // the window group holds blocks 3-5
  const auto held = [&cp] { return cp->group_pages(0).used - cp->group_pages(0).cached; };
  EXPECT_EQ(held(), 3);
  EXPECT_EQ(cp->group_pages(0).cached, 3);  // blocks 0-2 left the window, indexed: cached
  for (int64_t to : {10, 19}) {
    const Status st = cp->rollback(1, to);
    ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("in group 0 (they fell out of its sliding window); the shortest "
                                "length it can roll back to is 20"),
              std::string::npos)
        << st.to_string();
    EXPECT_EQ(cp->length(1).value(), 22);
  }
  ASSERT_OK(cp->rollback(1, 20));  // its window starts at block 3, still held
  EXPECT_EQ(held(), 2);            // block 5 (two tokens, not indexed) was freed
  EXPECT_EQ(cp->group_pages(0).cached, 3);
  ASSERT_OK(cp->rollback(1, 0));
  EXPECT_EQ(held(), 0);
  EXPECT_EQ(cp->group_pages(0).cached, 5);
  PAGEDKV_EXPECT_INV(*cp);
}

// A cached block whose window page was evicted, and a sequence that computes the same block
// again: registering it finds the indexed block, which takes over the new block's window page
// (the same tokens after the same prefix: the same keys and values), so the sequence and the
// index share one block again. When another sequence holds the new block too (forked before the
// block filled), its page cannot move: the block stays the sequence's own, unindexed.
// Block events by (kind, group), in order.
std::vector<std::pair<EventKind, int32_t>> block_events(ControlPlane& cp) {
  std::vector<std::pair<EventKind, int32_t>> out;
  for (const ControlEvent& e : cp.drain_events()) {
    if (e.kind == EventKind::kBlockStored || e.kind == EventKind::kBlockRemoved) {
      out.emplace_back(e.kind, e.group);
    }
  }
  return out;
}

std::unique_ptr<ControlPlane> cached_block_without_window_page() {
  // Block size 4, window 4 (a sequence holds at most 2 window pages), 4 window pages; the
  // window group is groups[0], the full group groups[1]. Each group's events name it.
  auto cp = make_cp(shared_config(4, 32, {4}, 4));
  const std::vector<TokenId> t = iota_tokens(8, 50);
  EXPECT_OK(cp->add_sequence(1, {}));
  EXPECT_OK(cp->reserve(1, 8));
  EXPECT_OK(cp->commit(1, t));
  EXPECT_OK(cp->finish(1));  // blocks 0 and 1 cached, with their window pages
  EXPECT_EQ(cp->group_pages(0).cached, 2);
  using P = std::pair<EventKind, int32_t>;
  const P full_stored{EventKind::kBlockStored, 1}, window_stored{EventKind::kBlockStored, 0};
  EXPECT_EQ(block_events(*cp),
            (std::vector<P>{full_stored, window_stored, full_stored, window_stored}));
  EXPECT_OK(cp->add_sequence(2, {}));
  EXPECT_OK(cp->reserve(2, 16));  // four window pages: both cached ones evicted
  EXPECT_EQ(cp->group_pages(0).evicted, 2);
  const P window_removed{EventKind::kBlockRemoved, 0};
  EXPECT_EQ(block_events(*cp), (std::vector<P>{window_removed, window_removed}));
  EXPECT_OK(cp->finish(2));  // nothing committed: its pages are freed
  EXPECT_EQ(cp->group_pages(0).used, 0);
  EXPECT_EQ(cp->cached_prefix(iota_tokens(9, 50), 0).value(), 0);  // no window page: no hit
  return cp;
}

TEST(SharedGroups, ARegisteredBlockTakesOverTheWindowPageOfTheSameTokens) {
  auto cp = cached_block_without_window_page();
  const std::vector<TokenId> t = iota_tokens(8, 50);
  ASSERT_OK(cp->add_sequence(3, {}));
  ASSERT_OK(cp->reserve(3, 4));
  ASSERT_OK(cp->build_batch({3}));
  const int32_t page = cp->group_batch(0).block_tables[0];
  const int32_t own_block = cp->group_batch(1).block_tables[0];
  ASSERT_OK(cp->commit(3, t.data(), 4));
  ASSERT_OK(cp->build_batch({3}));
  EXPECT_EQ(cp->group_batch(0).block_tables[0], page);       // the same window page
  EXPECT_NE(cp->group_batch(1).block_tables[0], own_block);  // the indexed full block
  EXPECT_EQ(cp->stats().device.used_blocks, 1);              // its own one was freed
  // The indexed block is a window group's again.
  EXPECT_EQ(block_events(*cp),
            (std::vector<std::pair<EventKind, int32_t>>{{EventKind::kBlockStored, 0}}));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->finish(3));
  EXPECT_EQ(cp->cached_prefix(iota_tokens(5, 50), 0).value(), 4);  // a hit again
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(SharedGroups, AWindowPageTwoSequencesHoldIsNotTakenOver) {
  auto cp = cached_block_without_window_page();
  const std::vector<TokenId> t = iota_tokens(8, 50);
  ASSERT_OK(cp->add_sequence(3, {}));
  ASSERT_OK(cp->reserve(3, 4));
  ASSERT_OK(cp->commit(3, t.data(), 2));
  ASSERT_OK(cp->fork(3, 4));  // holds block 0 too, with two tokens
  ASSERT_OK(cp->build_batch({3, 4}));
  const int32_t own_block = cp->group_batch(1).block_tables[0];
  ASSERT_OK(cp->commit(3, t.data() + 2, 2));
  ASSERT_OK(cp->build_batch({3, 4}));
  const BatchMetadata& full = cp->group_batch(1);
  EXPECT_EQ(full.block_tables[0], own_block);  // not swapped for the indexed one
  EXPECT_EQ(full.block_tables[static_cast<size_t>(full.max_blocks)], own_block);
  EXPECT_EQ(cp->group_pages(0).used, 1);
  PAGEDKV_EXPECT_INV(*cp);
}

// A cached block demoted to the host takes every group's cached page with it, so a prompt hits
// it in every group (a window group needs the pages of its window, another full-attention group
// all of them), and restoring the hit brings those pages back beside the block.
TEST(SharedGroups, AHostHitFindsEveryGroupsPages) {
  for (const int32_t window : {4, 0}) {
    SCOPED_TRACE("window " + std::to_string(window));
    CacheConfig c = shared_config(4, 4, {window}, 4);
    for (KvGroup& g : c.groups) g.num_host_blocks = 8;
    auto cp = make_cp(c);
    const std::vector<TokenId> t = iota_tokens(8, 50);
    ASSERT_OK(cp->add_sequence(1, {}));
    ASSERT_OK(cp->reserve(1, 8));
    ASSERT_OK(cp->commit(1, t));
    ASSERT_OK(cp->finish(1));  // two cached blocks, with both groups' pages
    ASSERT_EQ(cp->group_pages(0).cached, 2);
    ASSERT_OK(cp->add_sequence(2, {}));
    auto r = cp->reserve(2, 16);  // every device block: both cached ones are demoted
    ASSERT_OK(r);
    int64_t to_host[2] = {0, 0};
    for (const BlockMove& m : r.value().transfers.moves) {
      ASSERT_EQ(m.dst_tier, Tier::kHost);
      ++to_host[m.group];
    }
    EXPECT_EQ(to_host[0], 2);  // the window (or second full) group's pages
    EXPECT_EQ(to_host[1], 2);  // the owner's blocks
    EXPECT_EQ(cp->stats().host.cached_blocks, 2);
    PAGEDKV_EXPECT_INV(*cp);
    ASSERT_OK(cp->finish(2));
    std::vector<TokenId> prompt = iota_tokens(9, 50);
    EXPECT_EQ(cp->cached_prefix(prompt, 0).value(), 8);
    auto hit = cp->add_sequence(3, prompt);
    ASSERT_OK(hit);
    EXPECT_EQ(hit.value(), 8);
    PAGEDKV_EXPECT_INV(*cp);
    auto group_locations = cp->group_block_locations(3, 0);
    ASSERT_OK(group_locations);
    const std::vector<BlockLocation>& pages = group_locations.value();
    ASSERT_EQ(pages.size(), 2u);
    for (size_t i = window == 0 ? 0 : 1; i < pages.size(); ++i) {
      EXPECT_EQ(pages[i].tier, Tier::kHost);
      EXPECT_GE(pages[i].block, 0);
    }
    auto restore = cp->reserve(3, 1);  // brings the hit back to the device
    ASSERT_OK(restore);
    int64_t to_device[2] = {0, 0};
    for (const BlockMove& m : restore.value().transfers.moves) {
      if (m.dst_tier == Tier::kDevice) ++to_device[m.group];
    }
    EXPECT_EQ(to_device[1], 2);
    EXPECT_EQ(to_device[0], 2);  // a window page outside the window comes back as cached
    PAGEDKV_EXPECT_INV(*cp);
  }
}

// A shared plane whose window group never trims (a window longer than any sequence, a pool as
// large as the full group's) decides exactly as a one-group plane: the same hits, slots,
// copies, drops and full-group tables under the same random calls, and the window group's
// tables hold a page wherever the full group's hold a block.
TEST(SharedGroups, AWindowThatNeverTrimsLeavesTheFullGroupAsOneGroup) {
  const int32_t bs = 4;
  for (uint32_t seed = 31; seed <= 34; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto one = make_cp(tiny_config(bs, 48));
    auto shared = make_cp(shared_config(bs, 48, {1 << 14}, 48));
    std::mt19937 rng(seed);
    auto pick = [&rng](int64_t n) {
      return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    };
    std::vector<TokenId> stream;
    for (int i = 0; i < 200; ++i) stream.push_back(static_cast<TokenId>(pick(3) + 1));
    std::vector<SequenceId> live;
    SequenceId next_id = 1;
    for (int op = 0; op < 1500; ++op) {
      const int64_t kind = live.empty() ? 0 : pick(8);
      if (kind <= 1) {
        std::vector<TokenId> prompt(stream.begin(), stream.begin() + 1 + pick(40));
        const SequenceId id = next_id++;
        const auto a = one->add_sequence(id, prompt);
        const auto b = shared->add_sequence(id, prompt);
        ASSERT_OK(a);
        ASSERT_OK(b);
        ASSERT_EQ(a.value(), b.value());
        live.push_back(id);
        // Its prompt is prefilled, so that later prompts hit it.
        const int64_t rest = static_cast<int64_t>(prompt.size()) - a.value();
        const auto ra = one->reserve(id, rest);
        const auto rb = shared->reserve(id, rest);
        ASSERT_EQ(ra.status().code(), rb.status().code());
        if (ra.ok()) {
          ASSERT_EQ(ra.value().slots, rb.value().slots);
          ASSERT_EQ(ra.value().transfers.evicted, rb.value().transfers.evicted);
          for (SequenceId v : ra.value().transfers.evicted) {
            live.erase(std::find(live.begin(), live.end(), v));
          }
          ASSERT_OK(one->commit(id, prompt.data() + a.value(), rest));
          ASSERT_OK(shared->commit(id, prompt.data() + a.value(), rest));
        }
      } else if (kind <= 4) {
        std::vector<SequenceId> ids;
        for (SequenceId id : live) {
          if (pick(2) == 0) ids.push_back(id);
        }
        if (ids.empty()) ids.push_back(live[0]);
        const int64_t n = 1 + pick(6);
        ReserveResult ra, rb;
        const Status sa = one->reserve_batch(ids, n, &ra);
        const Status sb = shared->reserve_batch(ids, n, &rb);
        ASSERT_EQ(sa.code(), sb.code()) << sa.to_string() << " / " << sb.to_string();
        if (!sa.ok()) continue;
        ASSERT_EQ(ra.slots, rb.slots);
        ASSERT_EQ(ra.transfers.evicted, rb.transfers.evicted);
        std::vector<BlockCopy> full_copies;
        for (BlockCopy c : rb.transfers.copies) {
          if (c.group == shared->full_group())
            full_copies.push_back(BlockCopy{c.src_block, c.dst_block});
        }
        ASSERT_EQ(ra.transfers.copies, full_copies);
        ASSERT_EQ(rb.transfers.copies.size(), 2 * full_copies.size());
        for (SequenceId id : ra.transfers.evicted)
          live.erase(std::find(live.begin(), live.end(), id));
        std::vector<TokenId> t(ids.size() * static_cast<size_t>(n));
        for (auto& x : t) x = static_cast<TokenId>(pick(3) + 1);
        ASSERT_OK(one->commit_batch(ids, t.data(), n));
        ASSERT_OK(shared->commit_batch(ids, t.data(), n));
      } else if (kind == 5) {
        const SequenceId id = live[static_cast<size_t>(pick(static_cast<int64_t>(live.size())))];
        const int64_t to = pick(one->length(id).value() + 1);
        ASSERT_EQ(one->rollback(id, to).code(), shared->rollback(id, to).code());
      } else if (kind == 6) {
        const SequenceId id = live[static_cast<size_t>(pick(static_cast<int64_t>(live.size())))];
        ASSERT_OK(one->fork(id, next_id));
        ASSERT_OK(shared->fork(id, next_id));
        live.push_back(next_id++);
      } else {
        const size_t i = static_cast<size_t>(pick(static_cast<int64_t>(live.size())));
        ASSERT_OK(one->finish(live[i]));
        ASSERT_OK(shared->finish(live[i]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      PAGEDKV_EXPECT_INV(*one);
      PAGEDKV_EXPECT_INV(*shared);
      if (live.empty()) continue;
      ASSERT_OK(one->build_batch(live));
      ASSERT_OK(shared->build_batch(live));
      const BatchMetadata& a = *one->build_batch(live).value();
      const BatchMetadata& full = shared->group_batch(shared->full_group());
      const BatchMetadata& window = shared->group_batch(0);
      ASSERT_EQ(a.slot_mapping, full.slot_mapping);
      ASSERT_EQ(a.seq_lens, window.seq_lens);
      for (size_t r = 0; r < live.size(); ++r) {
        for (int32_t i = 0; i < a.max_blocks; ++i) {
          const int32_t x = a.block_tables[r * static_cast<size_t>(a.max_blocks) + i];
          ASSERT_EQ(x, full.block_tables[r * static_cast<size_t>(full.max_blocks) + i]);
          ASSERT_EQ(x >= 0,
                    window.block_tables[r * static_cast<size_t>(window.max_blocks) + i] >= 0);
        }
      }
    }
    EXPECT_GT(one->stats().prefix_hit_blocks, 0);
    EXPECT_GT(one->stats().copy_on_write, 0);
  }
}

// ---------------------------------------------------------------- the random model

uint64_t mix(uint64_t h, TokenId t) {
  h ^= static_cast<uint64_t>(t) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

struct Model {
  int32_t bs;
  std::vector<int64_t> windows;             // per config group; 0: full
  std::vector<std::vector<uint64_t>> mem;   // per config group, per device slot
  std::vector<std::vector<uint64_t>> host;  // per config group, per host slot
  std::map<SequenceId, std::vector<TokenId>> tokens;
  // How the window groups' tables are built (BatchOptions::ring_window_tables): plain, rings,
  // or switching between the two at every build.
  enum class Tables { kPlain, kRing, kAlternate } tables = Tables::kPlain;
  int builds = 0;

  BatchOptions options(bool csr = false) {
    BatchOptions o;
    o.build_csr = csr;
    o.ring_window_tables =
        tables == Tables::kRing || (tables == Tables::kAlternate && ++builds % 2 == 0);
    return o;
  }

  // Stamps of every prefix of `t`: stamp[p] is what position p's slot holds.
  static std::vector<uint64_t> stamps(const std::vector<TokenId>& t) {
    std::vector<uint64_t> s(t.size());
    uint64_t h = 1;
    for (size_t p = 0; p < t.size(); ++p) s[p] = h = mix(h, t[p]);
    return s;
  }

  std::vector<uint64_t>& pool(int32_t group, Tier t) {
    return (t == Tier::kDevice ? mem : host)[static_cast<size_t>(group)];
  }
  void apply_moves(const std::vector<BlockMove>& moves, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const BlockMove& mv = moves[i];
      std::vector<uint64_t>& src = pool(mv.group, mv.src_tier);
      std::vector<uint64_t>& dst = pool(mv.group, mv.dst_tier);
      for (int32_t o = 0; o < bs; ++o) {
        dst[static_cast<size_t>(mv.dst_block) * bs + o] =
            src[static_cast<size_t>(mv.src_block) * bs + o];
      }
    }
  }
  // The data plane's order: every move, then every copy.
  void apply_copies(const Transfers& t) {
    apply_moves(t.moves, t.moves.size());
    for (const BlockCopy& c : t.copies) {
      auto& m = mem[static_cast<size_t>(c.group)];
      for (int32_t o = 0; o < bs; ++o) {
        m[static_cast<size_t>(c.dst_block) * bs + o] = m[static_cast<size_t>(c.src_block) * bs + o];
      }
    }
  }
};

// Every sequence reads its stamps through every group's table, over what that group attends
// to; a decoding sequence (nothing reserved) holds at most ceil(W / bs) + 1 window pages.
void verify(ControlPlane& cp, Model& m) {
  PAGEDKV_EXPECT_INV(cp);
  std::vector<SequenceId> ids;  // the resident ones (an offloaded one reads after its restore)
  for (const auto& kv : m.tokens) {
    if (!cp.residency(kv.first).value().offloaded) ids.push_back(kv.first);
  }
  const BatchOptions options = m.options(/*csr=*/true);
  auto md = cp.build_batch(ids, options);
  ASSERT_OK(md);
  for (int32_t g = 0; g < cp.num_groups(); ++g) {
    const BatchMetadata& b = cp.group_batch(g);
    ASSERT_EQ(b.batch_size, static_cast<int32_t>(ids.size()));
    ASSERT_EQ(b.indptr.size(), ids.size() + 1);
    const int64_t w = m.windows[static_cast<size_t>(g)];
    // Rings: every window group but the one owning the blocks, exactly when asked for.
    ASSERT_EQ(b.ring_table, options.ring_window_tables && w > 0 && g != cp.full_group());
    const auto column = [&b](int64_t i) { return b.ring_table ? i % b.max_blocks : i; };
    for (size_t r = 0; r < ids.size(); ++r) {
      const std::vector<TokenId>& t = m.tokens.at(ids[r]);
      const std::vector<uint64_t> st = Model::stamps(t);
      const int64_t len = static_cast<int64_t>(t.size());
      const int32_t* row = &b.block_tables[r * static_cast<size_t>(b.max_blocks)];
      const int64_t from = w == 0 ? 0 : std::max<int64_t>(0, len - w);
      for (int64_t p = from; p < len; ++p) {
        const int32_t page = row[column(p / m.bs)];
        ASSERT_GE(page, 0) << "group " << g << " sequence " << ids[r] << " position " << p;
        ASSERT_EQ(m.mem[static_cast<size_t>(g)][static_cast<size_t>(page) * m.bs + p % m.bs],
                  st[static_cast<size_t>(p)])
            << "group " << g << " sequence " << ids[r] << " position " << p << " of " << len;
      }
      // The CSR form holds the same rows.
      const int32_t n = b.indptr[r + 1] - b.indptr[r];
      ASSERT_EQ(n,
                static_cast<int32_t>((t.size() + static_cast<size_t>(cp.pending(ids[r]).value()) +
                                      static_cast<size_t>(m.bs) - 1) /
                                     static_cast<size_t>(m.bs)));
      const int32_t* csr = b.indices.data() + b.indptr[r];
      if (!b.ring_table) {
        for (int32_t i = 0; i < n; ++i) ASSERT_EQ(csr[i], row[i]);
      } else {
        // The blocks from the first held one on, each in its column; every other column -1.
        int32_t live = 0;
        while (live < n && csr[live] < 0) ++live;
        ASSERT_LE(n - live, b.max_blocks) << "group " << g << " sequence " << ids[r];
        std::vector<int32_t> expect(static_cast<size_t>(b.max_blocks), -1);
        for (int32_t i = live; i < n; ++i) {
          ASSERT_GE(csr[i], 0) << "a hole in the window of sequence " << ids[r];
          expect[static_cast<size_t>(column(i))] = csr[i];
        }
        ASSERT_EQ(std::vector<int32_t>(row, row + b.max_blocks), expect)
            << "group " << g << " sequence " << ids[r];
      }
      ASSERT_EQ(b.last_page_len[r], b.seq_lens[r] == 0 ? 0 : (b.seq_lens[r] - 1) % m.bs + 1);
      if (w > 0 && cp.pending(ids[r]).value() == 0) {
        int64_t held = 0;
        for (int32_t i = 0; i < b.max_blocks; ++i) held += row[i] >= 0 ? 1 : 0;
        ASSERT_LE(held, (w + m.bs - 1) / m.bs + 1) << "group " << g << " sequence " << ids[r];
      }
    }
  }
}

// Writes stamps for `n` reserved positions of each of `ids` (slots from the groups' batch
// metadata), then commits the first `k` of `next` each.
void write_and_commit(ControlPlane& cp, Model& m, const std::vector<SequenceId>& ids, int64_t n,
                      int64_t k, const std::vector<std::vector<TokenId>>& next) {
  auto md = cp.build_batch(ids, m.options());
  ASSERT_OK(md);
  for (int32_t g = 0; g < cp.num_groups(); ++g) {
    const BatchMetadata& b = cp.group_batch(g);
    ASSERT_EQ(b.slot_mapping.size(), ids.size() * static_cast<size_t>(n));
    for (size_t r = 0; r < ids.size(); ++r) {
      std::vector<TokenId> t = m.tokens.at(ids[r]);
      t.insert(t.end(), next[r].begin(), next[r].end());
      const std::vector<uint64_t> st = Model::stamps(t);
      const size_t len = m.tokens.at(ids[r]).size();
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = b.slot_mapping[r * static_cast<size_t>(n) + static_cast<size_t>(j)];
        ASSERT_GE(slot, 0);
        m.mem[static_cast<size_t>(g)][static_cast<size_t>(slot)] = st[len + static_cast<size_t>(j)];
      }
    }
  }
  for (size_t r = 0; r < ids.size(); ++r) {
    ASSERT_OK(cp.commit(ids[r], next[r].data(), k));
    auto& t = m.tokens[ids[r]];
    t.insert(t.end(), next[r].begin(), next[r].begin() + k);
  }
}

// Every group's rows (block tables, or a ring's blocks in block order; lengths) and each
// sequence's reservation: what a plan's undo must leave as it found it.
using Rows = std::vector<std::vector<int32_t>>;
Rows rows_of(ControlPlane& cp, Model& m) {
  std::vector<SequenceId> ids;
  Rows out;
  for (const auto& kv : m.tokens) {
    if (cp.residency(kv.first).value().offloaded) continue;
    ids.push_back(kv.first);
    out.push_back({static_cast<int32_t>(cp.pending(kv.first).value())});
  }
  EXPECT_OK(cp.build_batch(ids, m.options(/*csr=*/true)));
  for (int32_t g = 0; g < cp.num_groups(); ++g) {
    const BatchMetadata& b = cp.group_batch(g);
    for (size_t r = 0; r < ids.size(); ++r) {
      const int32_t* row = &b.block_tables[r * static_cast<size_t>(b.max_blocks)];
      // A ring's width is the widest row's so far, not the sequence's; the forms alternate.
      if (m.tables != Model::Tables::kPlain) {
        out[r].insert(out[r].end(), b.indices.data() + b.indptr[r],
                      b.indices.data() + b.indptr[r + 1]);
      } else {
        out[r].insert(out[r].end(), row, row + b.max_blocks);
      }
      out[r].push_back(b.seq_lens[r]);
    }
  }
  return out;
}

// What a router keeps from the events: per group and tier, the block hashes stored and not removed
// since. Each group's events must make sense on their own: nothing stored twice, nothing
// removed that was not stored.
void check_events(ControlPlane& cp, std::set<std::tuple<int32_t, uint64_t, Tier>>* announced) {
  for (const ControlEvent& e : cp.drain_events()) {
    ASSERT_NE(e.kind, EventKind::kEventsDropped);
    const std::tuple<int32_t, uint64_t, Tier> key{e.group, e.block_hash, e.tier};
    if (e.kind == EventKind::kBlockStored) {
      ASSERT_TRUE(announced->insert(key).second) << "group " << e.group << " stored twice";
    } else if (e.kind == EventKind::kBlockRemoved) {
      ASSERT_EQ(announced->erase(key), 1u) << "group " << e.group << " removed an unknown block";
    }
  }
}

void forget_evicted(Model& m, const Transfers& t) {
  for (SequenceId id : t.evicted) m.tokens.erase(id);
}

// A random run's model: its window groups (window, pool) and where the full group is listed.
struct Shape {
  int32_t bs;
  std::vector<std::pair<int32_t, int64_t>> windows;  // (window, pages)
  int64_t full_blocks;
  size_t full_at;           // the full group's index in CacheConfig::groups
  int64_t host_blocks = 0;  // every group's host pool
  int32_t full_window = 0;  // the "full" group's window: with one, every group has a window
  Model::Tables tables = Model::Tables::kPlain;
};

void run_random(uint32_t seed, const Shape& shape, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int32_t bs = shape.bs;
  CacheConfig c = tiny_config(bs, shape.full_blocks);
  c.max_sequence_length = 1 << 16;
  Model m;
  m.bs = bs;
  m.tables = shape.tables;
  for (const auto& [window, pages] : shape.windows) {
    if (c.groups.size() == shape.full_at) {
      c.groups.push_back(group("global", shape.full_window, shape.full_blocks, 0));
      m.windows.push_back(shape.full_window);
    }
    c.groups.push_back(group("local", window, pages, 0));
    m.windows.push_back(window);
  }
  if (c.groups.size() == shape.full_at) {
    c.groups.push_back(group("global", shape.full_window, shape.full_blocks, 0));
    m.windows.push_back(shape.full_window);
  }
  for (size_t g = 0; g < c.groups.size(); ++g) {
    c.groups[g].layers = {static_cast<int32_t>(g)};
    c.groups[g].num_host_blocks = shape.host_blocks;
    m.mem.emplace_back(static_cast<size_t>(c.groups[g].num_device_blocks * bs), 0);
    m.host.emplace_back(static_cast<size_t>(shape.host_blocks * bs), 0);
  }
  c.num_layers = static_cast<int32_t>(c.groups.size());
  auto cp = make_cp(c);
  ASSERT_EQ(cp->full_group(), static_cast<int32_t>(shape.full_at));
  std::mt19937 rng(seed);
  auto pick = [&rng](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  std::vector<std::vector<TokenId>> streams(3);
  for (auto& s : streams) {
    for (int i = 0; i < 400; ++i) s.push_back(static_cast<TokenId>(pick(3) + 1));
  }
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<TokenId>(pick(3) + 1);
    return t;
  };
  auto random_live = [&]() {
    auto it = m.tokens.begin();
    std::advance(it, pick(static_cast<int64_t>(m.tokens.size())));
    return it->first;
  };
  SequenceId next_id = 1;
  int hits = 0, cows = 0, undone = 0, moved = 0, offloads = 0;
  std::set<std::tuple<int32_t, uint64_t, Tier>> announced;  // (group, hash, tier) a router holds
  for (int op = 0; op < ops; ++op) {
    const int64_t kind = m.tokens.empty() ? 0 : pick(shape.host_blocks > 0 ? 12 : 10);
    if (kind <= 1) {  // a new sequence: a prefix of a stream, its uncached part prefilled
      const auto& s = streams[static_cast<size_t>(pick(3))];
      std::vector<TokenId> prompt(s.begin(), s.begin() + 1 + pick(3 * bs * 4));
      if (pick(4) == 0) prompt.back() = static_cast<TokenId>(pick(3) + 1);
      const SequenceId id = next_id++;
      auto added = cp->add_sequence(id, prompt);
      ASSERT_OK(added);
      const int64_t cached = added.value();
      hits += cached > 0;
      m.tokens[id] = std::vector<TokenId>(prompt.begin(), prompt.begin() + cached);
      verify(*cp, m);  // the hit reads right before anything is written
      const int64_t rest = static_cast<int64_t>(prompt.size()) - cached;
      auto rr = cp->reserve(id, rest);
      if (!rr.ok()) {
        ASSERT_EQ(rr.status().code(), StatusCode::kResourceExhausted) << rr.status().to_string();
        ASSERT_OK(cp->finish(id));
        m.tokens.erase(id);
      } else {
        cows += !rr.value().transfers.copies.empty();
        m.apply_copies(rr.value().transfers);
        forget_evicted(m, rr.value().transfers);
        write_and_commit(*cp, m, {id}, rest, rest,
                         {std::vector<TokenId>(prompt.begin() + cached, prompt.end())});
      }
    } else if (kind <= 5) {  // a decode step (or chunk) over some sequences
      std::vector<SequenceId> ids;
      for (const auto& kv : m.tokens) {
        if (pick(3) != 0) ids.push_back(kv.first);
      }
      if (ids.empty()) ids.push_back(random_live());
      const int64_t n = pick(4) == 0 ? 1 + pick(2 * bs) : 1;
      ReserveResult rr;
      Status st;
      if (pick(3) == 0) {
        // The runtime's form: a plan, undone (as when the data plane fails) or kept.
        const Rows before = rows_of(*cp, m);
        auto plan = cp->plan_reserve_batch(ids, n);
        st = plan.status();
        if (plan.ok() && pick(2) == 0) {
          forget_evicted(m, plan.value().transfers());  // drops stay when a plan is undone
          const bool dropped = !plan.value().transfers().evicted.empty();
          // The data plane queued the first `done` moves before it failed: the undo hands back
          // their inverse, which puts every byte back.
          const auto& moves = plan.value().transfers().moves;
          const size_t done = static_cast<size_t>(pick(static_cast<int64_t>(moves.size()) + 1));
          m.apply_moves(moves, done);
          const std::vector<BlockMove> inverse = plan.value().undo(static_cast<int64_t>(done));
          m.apply_moves(inverse, inverse.size());
          moved += static_cast<int>(done);
          ++undone;
          verify(*cp, m);
          if (!dropped) {
            ASSERT_EQ(rows_of(*cp, m), before) << "the undo left the tables changed";
          }
          continue;
        }
        if (plan.ok()) {
          rr.transfers = plan.value().transfers();
          rr.slots = plan.value().slots();
          plan.value().commit();
        }
      } else if (pick(4) == 0) {
        for (SequenceId id : ids) {         // one call per sequence, as a scheduler may step them
          if (!cp->contains(id)) continue;  // dropped for an earlier one's room
          ReserveResult one;
          st = cp->reserve_into(id, n, &one);
          if (!st.ok()) break;
          // Each call's transfers run before the next call's: moves, then copies.
          m.apply_copies(one.transfers);
          cows += !one.transfers.copies.empty();
          rr.transfers.evicted.insert(rr.transfers.evicted.end(), one.transfers.evicted.begin(),
                                      one.transfers.evicted.end());
        }
      } else {
        st = cp->reserve_batch(ids, n, &rr);
      }
      if (!st.ok()) {
        ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
        // Per-sequence calls that went ahead keep their reservations (and drops).
        forget_evicted(m, rr.transfers);
        verify(*cp, m);
        continue;
      }
      cows += !rr.transfers.copies.empty();
      m.apply_copies(rr.transfers);  // empty after per-sequence calls (applied call by call)
      for (SequenceId id : rr.transfers.evicted) {
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
        // Only per-sequence calls may drop a later member (reserve_batch never does).
        ids.erase(std::find(ids.begin(), ids.end(), id));
      }
      forget_evicted(m, rr.transfers);
      // A per-sequence call may also offload an earlier member for room: it writes nothing.
      ids.erase(std::remove_if(ids.begin(), ids.end(),
                               [&](SequenceId id) { return cp->residency(id).value().offloaded; }),
                ids.end());
      if (ids.empty()) {
        verify(*cp, m);
        continue;
      }
      std::vector<std::vector<TokenId>> next;
      for (size_t r = 0; r < ids.size(); ++r) next.push_back(random_tokens(n));
      write_and_commit(*cp, m, ids, n, pick(3) == 0 ? pick(n + 1) : n, next);
    } else if (kind == 6) {  // rollback (refused when a window no longer holds the tokens)
      const SequenceId id = random_live();
      const int64_t len = static_cast<int64_t>(m.tokens[id].size());
      const int64_t to = pick(len + 1);
      const Status st = cp->rollback(id, to);
      if (st.ok()) {
        m.tokens[id].resize(static_cast<size_t>(to));
      } else {
        ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
      }
    } else if (kind == 7) {
      const SequenceId parent = random_live();
      const SequenceId child = next_id++;
      if (cp->residency(parent).value().offloaded) {
        ASSERT_EQ(cp->fork(parent, child).code(), StatusCode::kFailedPrecondition);
      } else {
        ASSERT_OK(cp->fork(parent, child));
        m.tokens[child] = m.tokens[parent];
      }
    } else if (kind == 8) {
      const SequenceId id = random_live();
      ASSERT_OK(cp->finish(id));
      m.tokens.erase(id);
    } else if (kind == 10) {  // offload (refused for an active or offloaded one, or no room)
      const SequenceId id = random_live();
      auto t = cp->offload(id);
      if (t.ok()) {
        m.apply_copies(t.value());
        ++offloads;
      } else {
        ASSERT_TRUE(t.status().code() == StatusCode::kFailedPrecondition ||
                    t.status().code() == StatusCode::kResourceExhausted)
            << t.status().to_string();
      }
    } else if (kind == 11) {  // restore one, or prefetch a few
      StatusOr<Transfers> t =
          pick(2) == 0 ? cp->restore(random_live()) : cp->prefetch({random_live(), random_live()});
      if (t.ok()) {
        m.apply_copies(t.value());
        forget_evicted(m, t.value());
      } else {
        ASSERT_TRUE(t.status().code() == StatusCode::kFailedPrecondition ||
                    t.status().code() == StatusCode::kResourceExhausted)
            << t.status().to_string();
      }
    } else if (pick(3) == 0) {  // active sequences are never dropped for room
      std::vector<SequenceId> active;
      for (const auto& kv : m.tokens) {
        if (pick(3) == 0) active.push_back(kv.first);
      }
      ASSERT_OK(cp->set_active(active));
    } else {
      const SequenceId id = random_live();
      ASSERT_OK(cp->erase(id));
      m.tokens.erase(id);
    }
    verify(*cp, m);
    check_events(*cp, &announced);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The run reached what it is for: prefix hits, copies-on-write, window pages evicted.
  const ControlStats st = cp->stats();
  int64_t page_evictions = 0;
  bool tight = false;
  for (int32_t g = 0; g < cp->num_groups(); ++g) {
    if (g == cp->full_group()) continue;
    page_evictions += cp->group_pages(g).evicted;
    tight = tight || c.groups[static_cast<size_t>(g)].num_device_blocks < shape.full_blocks;
  }
  std::printf(
      "seed %u: %d hits, %d copies, %lld evicted, %lld pages evicted, %lld dropped, "
      "%lld released\n",
      seed, hits, cows, static_cast<long long>(st.blocks_evicted),
      static_cast<long long>(page_evictions), static_cast<long long>(st.sequences_evicted),
      static_cast<long long>(st.window_released_blocks));
  EXPECT_GT(hits, 5);
  EXPECT_GT(cows, 0);
  EXPECT_GT(undone, 5);
  if (shape.host_blocks > 0) {
    EXPECT_GT(offloads, 20);
    EXPECT_GT(moved, 0);
  }
  EXPECT_GT(st.sequences_evicted, 0);
  if (tight) {
    EXPECT_GT(page_evictions, 0);
  }
}

// run_random() for seeds first..last, stopping at the first fatal failure.
void run_seeds(uint32_t first, uint32_t last, const Shape& shape, int ops) {
  for (uint32_t seed = first; seed <= last; ++seed) {
    run_random(seed, shape, ops);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(SharedGroups, RandomOneWindowGroupAgainstAModelOfEveryGroupsMemory) {
  run_seeds(1, 6, Shape{4, {{8, 40}}, 64, 1}, 1500);
}

TEST(SharedGroups, RandomTwoWindowGroupsAgainstAModelOfEveryGroupsMemory) {
  run_seeds(11, 14, Shape{4, {{4, 48}, {12, 48}}, 64, 2}, 1500);
}

// The shape: block size 16, a window of 64 (at most 5 pages a decoding sequence).
TEST(SharedGroups, RandomWindow64OfBlocks16) {
  run_seeds(41, 43, Shape{16, {{64, 48}}, 96, 1}, 1000);
}

// The full group listed first and in the middle, three windows (two not a multiple of the
// block size), pools of different sizes.
TEST(SharedGroups, RandomThreeWindowsAroundTheFullGroup) {
  run_seeds(51, 53, Shape{4, {{5, 40}, {9, 56}, {4, 30}}, 64, 0}, 1200);
  if (HasFatalFailure()) return;
  run_seeds(54, 56, Shape{4, {{5, 40}, {9, 56}, {4, 30}}, 64, 2}, 1200);
}

// Every group with a host pool: offloads, restores, prefetches, prefix hits on offloaded
// blocks, demotions, and plans undone after part of their moves ran.
TEST(SharedGroups, RandomWithAHostTier) {
  run_seeds(61, 64, Shape{4, {{8, 40}}, 64, 1, 48}, 1500);
  if (HasFatalFailure()) return;
  run_seeds(65, 67, Shape{4, {{5, 40}, {12, 56}}, 64, 0, 40}, 1500);
}

// A second full-attention group (another shape, or an MLA latent group: the plane does not tell
// them apart) beside a window: its pages cover every block and are never trimmed; with fewer
// pages than the owner it evicts cached pages of its own.
TEST(SharedGroups, RandomASecondFullGroupBesideAWindow) {
  run_seeds(71, 73, Shape{4, {{0, 48}, {8, 40}}, 64, 2}, 1500);
  if (HasFatalFailure()) return;
  run_seeds(74, 75, Shape{4, {{6, 40}, {0, 56}, {0, 48}}, 64, 0}, 1200);
}

TEST(SharedGroups, RandomTwoFullGroupsWithAHostTier) {
  run_seeds(81, 84, Shape{4, {{0, 88}}, 96, 1, 64}, 1500);
}

// Every group with a window: the widest (the "full" group here, listed first, in the middle
// and last) owns the blocks and releases those that leave its own window, after the narrower
// groups have released their pages of them.
TEST(SharedGroups, RandomEveryGroupWindowedTheWidestOwningTheBlocks) {
  run_seeds(91, 93, Shape{4, {{8, 40}}, 64, 1, 0, 16}, 1500);
  if (HasFatalFailure()) return;
  run_seeds(94, 95, Shape{4, {{5, 40}, {12, 56}}, 64, 0, 0, 13}, 1500);
  if (HasFatalFailure()) return;
  run_seeds(96, 97, Shape{4, {{6, 48}, {6, 40}, {9, 40}}, 64, 2, 0, 9}, 1200);
}

TEST(SharedGroups, RandomEveryGroupWindowedWithAHostTier) {
  run_seeds(101, 103, Shape{4, {{8, 40}}, 64, 1, 48, 20}, 1500);
}

// More window sizes than a sequence record keeps in the lines a decode step reads (the bounds
// of the fourth size on live apart), two groups of one size sharing a bound, and a host tier.
TEST(SharedGroups, RandomMoreWindowSizesThanTheInlineBounds) {
  const Shape many{4, {{4, 40}, {5, 40}, {6, 48}, {7, 40}, {6, 40}, {9, 56}, {12, 56}}, 64, 3};
  run_seeds(111, 113, many, 1200);
  if (HasFatalFailure()) return;
  Shape hosted = many;
  hosted.host_blocks = 40;
  run_seeds(114, 115, hosted, 1200);
}

// Ring tables for the window groups beside the owner (BatchOptions::ring_window_tables), built
// at every step of the random runs: each position read through its column, every column
// outside the window -1, the CSR in block order, undo leaving the rings as they were. Then
// the two forms alternating build by build (every switch lays the table out anew). A second
// full-attention group beside them keeps a plain table.
Shape with_tables(Shape s, Model::Tables t) {
  s.tables = t;
  return s;
}

TEST(SharedGroups, RandomRingWindowTables) {
  for (Model::Tables t : {Model::Tables::kRing, Model::Tables::kAlternate}) {
    SCOPED_TRACE(t == Model::Tables::kRing ? "rings" : "alternating");
    run_seeds(121, 123, with_tables(Shape{4, {{8, 40}}, 64, 1}, t), 1500);
    if (HasFatalFailure()) return;
    run_seeds(124, 125, with_tables(Shape{16, {{64, 48}}, 96, 1}, t), 1000);
    if (HasFatalFailure()) return;
    run_seeds(126, 127, with_tables(Shape{4, {{5, 40}, {9, 56}, {4, 30}}, 64, 2, 40}, t), 1200);
    if (HasFatalFailure()) return;
    run_seeds(128, 129, with_tables(Shape{4, {{5, 40}, {12, 56}}, 64, 0, 0, 13}, t), 1500);
    if (HasFatalFailure()) return;
    run_seeds(130, 131, with_tables(Shape{4, {{0, 48}, {8, 40}}, 64, 2}, t), 1500);
    if (HasFatalFailure()) return;
  }
}

TEST(SharedGroups, RandomAmpleWindowPoolsKeepCachedPages) {
  run_seeds(21, 23, Shape{3, {{6, 120}}, 120, 1}, 1500);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
