// The randomized end-to-end test of ModelKvCache on real bytes (model_cache_harness.hpp):
// sequences with shared prompt prefixes are added (their hit checked against a brute-force
// agreement of the groups), decoded in batches, extended, forked, rolled back, finished,
// erased, offloaded, restored and prefetched under memory pressure in both tiers of every
// group, and every read path (gather_layer, build_batch's tables, the device view through the
// reference decode attention) is compared with the reference, with check_invariants() after
// every step. Two models: a hybrid one (full-attention and sliding-window groups of different
// shapes) and an MLA one (one latent group, keys only). The hybrid one also with a FileTier per
// group, every add fetching its prompt from storage first, so that blocks and window pages
// written back and read again are checked as every other byte. Also: a changed byte is
// reported.
//
// On both backends (runtime_backends.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/model_cache_harness.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

// Six layers, Gemma-like: four sliding-window layers (window 64) and two full ones, with other
// head counts and dims, small pools and host tiers so that every group is under pressure.
// `full_window`: the "full" group's window (then every group has one, and the wider owns the
// blocks).
CacheConfig hybrid_config(int32_t full_window = 0) {
  CacheConfig c;
  c.num_layers = 6;
  c.block_size = 16;
  KvGroup full;
  full.name = "full";
  full.layers = {2, 5};
  full.num_kv_heads = 2;
  full.head_dim = 16;
  full.num_device_blocks = 28;
  full.num_host_blocks = 40;
  full.sliding_window = full_window;
  KvGroup window;
  window.name = "window";
  window.layers = {0, 1, 3, 4};
  window.num_kv_heads = 4;
  window.head_dim = 8;
  window.sliding_window = 64;
  window.num_device_blocks = 14;
  window.num_host_blocks = 24;
  c.groups = {full, window};
  return c;
}

// One latent group (keys only): 64 ckv + 8 kpe elements, or DeepSeek's 512 + 64.
CacheConfig mla_config(int32_t latent_dim, int32_t rope_dim, int32_t layers, int64_t blocks) {
  CacheConfig c;
  c.num_layers = layers;
  c.block_size = 16;
  std::vector<int32_t> all(static_cast<size_t>(layers));
  for (int32_t l = 0; l < layers; ++l) all[static_cast<size_t>(l)] = l;
  KvGroup g = KvGroup::latent("mla", all, latent_dim, rope_dim);
  g.num_device_blocks = blocks;
  g.num_host_blocks = blocks;
  c.groups = {g};
  return c;
}

struct RunCounters {
  int64_t ops = 0;
  int64_t adds = 0;
  int64_t hit_tokens = 0;
  int64_t exhausted = 0;
  int64_t evicted = 0;
  int64_t offloads = 0;
  int64_t restores = 0;
  int64_t forks = 0;
  int64_t commits_refused = 0;  // the reservation was offloaded in between
  int64_t rollbacks = 0;
  int64_t rollbacks_refused = 0;
  int64_t gathers = 0;
  int64_t views = 0;
  int64_t bytes_checked = 0;
  int64_t fetched = 0;  // blocks an add brought back from storage first
};

std::string describe(const RunCounters& c) {
  return "ops " + std::to_string(c.ops) + ", adds " + std::to_string(c.adds) + ", hit tokens " +
         std::to_string(c.hit_tokens) + ", exhausted " + std::to_string(c.exhausted) +
         ", evicted " + std::to_string(c.evicted) + ", offloads " + std::to_string(c.offloads) +
         ", restores " + std::to_string(c.restores) + ", forks " + std::to_string(c.forks) +
         ", commits refused " + std::to_string(c.commits_refused) + ", rollbacks " +
         std::to_string(c.rollbacks) + " (refused " + std::to_string(c.rollbacks_refused) +
         "), gathers " + std::to_string(c.gathers) + ", views " + std::to_string(c.views) +
         ", bytes " + std::to_string(c.bytes_checked);
}

constexpr int64_t kMaxLength = 260;  // longer sequences are finished, not extended

class ModelCacheRandom : public testing::ModelCacheHarness {
 protected:
  // A live sequence, uniformly.
  SequenceId pick(std::mt19937_64& rng) const {
    auto it = ref_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % ref_.size()));
    return it->first;
  }
  std::vector<SequenceId> pick_distinct(std::mt19937_64& rng, size_t most, bool short_only) {
    std::vector<SequenceId> ids;
    for (const auto& [id, tokens] : ref_) {
      if (!short_only || static_cast<int64_t>(tokens.size()) < kMaxLength) ids.push_back(id);
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(std::min(ids.size(), 1 + static_cast<size_t>(rng() % most)));
    return ids;
  }
  std::vector<TokenId> fresh(int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (TokenId& x : t) x = next_token_++;
    return t;
  }
  bool on_device(SequenceId id) {
    auto r = cache_->residency(id);
    return r.ok() && *r == SequenceResidency::kDevice;
  }
  void expect_allowed(const Status& st, const char* what, RunCounters& c) {
    if (st.code() == StatusCode::kResourceExhausted) {
      ++c.exhausted;
    }
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::kResourceExhausted)
        << what << ": " << st.to_string();
  }

  // Adds a prompt of a shared family prefix and fresh tokens; checks the hit.
  void op_add(std::mt19937_64& rng, RunCounters& c) {
    const int64_t shared = static_cast<int64_t>(rng() % 150);
    const TokenId family = static_cast<TokenId>(1000000 * (1 + rng() % 4));
    std::vector<TokenId> prompt;
    for (int64_t i = 0; i < shared; ++i) prompt.push_back(family + static_cast<TokenId>(i));
    const std::vector<TokenId> tail = fresh(1 + static_cast<int64_t>(rng() % 40));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    if (!stores_.empty()) {
      // What the stores hold of the prompt lands first: the hit below may then reach it.
      auto fetched = cache_->fetch_from_storage(prompt);
      ASSERT_OK(fetched);
      c.fetched += *fetched;
      ASSERT_OK(cache_->flush_storage());
      invariants();
    }
    const int64_t want = agreed_by_brute_force(prompt);
    const SequenceId id = next_id_++;
    Status appended;
    auto hit = add_and_prefill(id, prompt, &appended);
    ASSERT_OK(hit);
    EXPECT_EQ(*hit, want) << "the hit is not the longest length every group can supply";
    ++c.adds;
    c.hit_tokens += *hit;
    expect_allowed(appended, "prefill", c);
  }

  void op_decode(std::mt19937_64& rng, RunCounters& c) {
    const std::vector<SequenceId> ids = pick_distinct(rng, 4, true);
    if (ids.empty()) return;
    expect_allowed(decode_step(ids, fresh(static_cast<int64_t>(ids.size()))), "decode", c);
  }

  void op_extend(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId id = pick(rng);
    if (static_cast<int64_t>(ref_[id].size()) >= kMaxLength) {
      ASSERT_OK(cache_->finish(id));
      ref_.erase(id);
      return;
    }
    expect_allowed(append(id, fresh(1 + static_cast<int64_t>(rng() % 24))), "extend", c);
  }

  // A step of one sequence with another's in between (reserve and write x, append to y, commit
  // x): y's reserve may offload x's reservation in some group, and x's commit is then refused
  // until a restore.
  void op_interleaved(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId x = pick(rng), y = pick(rng);
    const int64_t len = static_cast<int64_t>(ref_[x].size());
    if (x == y || len >= kMaxLength || static_cast<int64_t>(ref_[y].size()) >= kMaxLength) return;
    const std::vector<TokenId> tx = fresh(1 + static_cast<int64_t>(rng() % 4));
    auto rx = cache_->reserve(x, static_cast<int64_t>(tx.size()));
    if (!rx.ok()) return expect_allowed(rx.status(), "reserve x", c);
    ASSERT_OK(write_layers(x, tx, len));
    if (cache_->contains(y)) {  // x's reserve may have dropped it
      expect_allowed(append(y, fresh(1 + static_cast<int64_t>(rng() % 48))), "append y", c);
    }
    if (!cache_->contains(x)) return;  // dropped: the drain takes it out of the reference
    Status st = cache_->commit(x, tx);
    if (st.code() == StatusCode::kFailedPrecondition) {
      ++c.commits_refused;
      EXPECT_EQ(*cache_->pending(x), static_cast<int64_t>(tx.size()));
      EXPECT_EQ(*cache_->length(x), len);
      ASSERT_OK(cache_->synchronize());
      const Status r = cache_->restore(x);
      if (!r.ok() || !cache_->contains(x)) {
        expect_allowed(r, "restore x", c);
        if (cache_->contains(x)) {
          ASSERT_OK(cache_->rollback(x, len));  // drops the reservation
        }
        return;
      }
      st = cache_->commit(x, tx);
    }
    ASSERT_OK(st);
    ref_[x].insert(ref_[x].end(), tx.begin(), tx.end());
  }

  void op_fork(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId parent = pick(rng);
    const bool device = on_device(parent);
    const SequenceId child = next_id_++;
    const Status st = cache_->fork(parent, child);
    if (device) {
      ASSERT_OK(st);
    } else if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
      EXPECT_FALSE(cache_->contains(child));
      return;
    }
    ref_[child] = ref_[parent];
    ++c.forks;
  }

  void op_rollback(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId id = pick(rng);
    const int64_t len = static_cast<int64_t>(ref_[id].size());
    const int64_t target =
        rng() % 8 == 0 ? 0 : std::max<int64_t>(0, len - static_cast<int64_t>(rng() % 48));
    // Refused when a window group no longer holds the first block the shorter window needs.
    bool refuse = false;
    std::vector<std::vector<BlockLocation>> before;
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      before.push_back(*cache_->block_locations(id, g));
      if (target > 0 && gconf(g).sliding_window > 0 &&
          before.back()[static_cast<size_t>(window_first_block(g, target))].block < 0) {
        refuse = true;
      }
    }
    const Status st = cache_->rollback(id, target);
    ++c.rollbacks;
    if (refuse) {
      ++c.rollbacks_refused;
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
      for (int32_t g = 0; g < cache_->num_groups(); ++g) {
        EXPECT_EQ(*cache_->length(id), len);
        EXPECT_EQ(*cache_->block_locations(id, g), before[static_cast<size_t>(g)]);
      }
      return;
    }
    ASSERT_OK(st) << "rollback " << id << " from " << len << " to " << target;
    ref_[id].resize(static_cast<size_t>(target));
  }

  void op_offload(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId id = pick(rng);
    const bool device = on_device(id);
    const Status st = cache_->offload(id);
    if (st.ok()) {
      ++c.offloads;
      return;
    }
    // Already offloaded, or no room on the host: refused, and a resident one stays resident.
    EXPECT_TRUE(st.code() == StatusCode::kFailedPrecondition ||
                st.code() == StatusCode::kResourceExhausted)
        << st.to_string();
    if (device && cache_->contains(id)) {
      EXPECT_NE(*cache_->residency(id), SequenceResidency::kHost) << st.to_string();
    }
  }

  void op_restore(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId id = pick(rng);
    auto r = cache_->residency(id);
    ASSERT_OK(r);
    if (*r != SequenceResidency::kHost) return;
    const Status st = cache_->restore(id);
    if (st.ok()) ++c.restores;
    expect_allowed(st, "restore", c);
  }

  void op_gather(std::mt19937_64& rng, RunCounters& c) {
    const SequenceId id = pick(rng);
    ASSERT_OK(cache_->synchronize());
    if (*cache_->residency(id) == SequenceResidency::kHost) {
      const Status st = cache_->restore(id);
      expect_allowed(st, "restore before gather", c);
      if (!st.ok()) return;
      ASSERT_OK(cache_->synchronize());
    }
    if (!on_device(id)) return;
    const std::string problem = check_gather(id, &c.bytes_checked);
    EXPECT_EQ(problem, "");
    ++c.gathers;
  }

  void op_view(std::mt19937_64& rng, RunCounters& c) {
    ASSERT_OK(cache_->synchronize());
    std::vector<SequenceId> ids;
    for (SequenceId id : pick_distinct(rng, 4, false)) {
      if (on_device(id)) ids.push_back(id);
    }
    if (ids.empty()) return;
    const std::string problem = check_view(ids, rng() % 2 == 0, rng);
    EXPECT_EQ(problem, "");
    ++c.views;
  }

  // `ops` random steps; invariants, lengths and pending checked after each.
  void run(uint64_t seed, int64_t ops, RunCounters& c) {
    std::mt19937_64 rng(seed);
    for (int64_t op = 0; op < ops; ++op) {
      const int r = static_cast<int>(rng() % 100);
      SCOPED_TRACE("seed " + std::to_string(seed) + " op " + std::to_string(op) + " kind " +
                   std::to_string(r));
      if (r < 14 || ref_.size() < 2) {
        op_add(rng, c);
      } else if (r < 39) {
        op_decode(rng, c);
      } else if (r < 44) {
        op_interleaved(rng, c);
      } else if (r < 54) {
        op_extend(rng, c);
      } else if (r < 58) {
        op_fork(rng, c);
      } else if (r < 66) {
        const SequenceId id = pick(rng);
        ASSERT_OK(cache_->finish(id));
        ref_.erase(id);
      } else if (r < 69) {
        const SequenceId id = pick(rng);
        ASSERT_OK(cache_->erase(id));
        ref_.erase(id);
      } else if (r < 74) {
        op_rollback(rng, c);
      } else if (r < 80) {
        op_offload(rng, c);
      } else if (r < 84) {
        op_restore(rng, c);
      } else if (r < 87) {
        const std::vector<SequenceId> ids = pick_distinct(rng, 3, false);
        const Status st = cache_->prefetch(ids);
        EXPECT_OK(st);
      } else if (r < 95) {
        op_gather(rng, c);
      } else {
        op_view(rng, c);
      }
      // In step before the drain too: a sequence one group dropped is gone from every group.
      ASSERT_NO_FATAL_FAILURE(invariants());
      c.evicted += drain();
      ASSERT_NO_FATAL_FAILURE(invariants());
      const std::string lengths = check_lengths();
      ASSERT_EQ(lengths, "") << describe(c);
      if (HasFailure()) return;  // the first problem, not thousands after it
      ++c.ops;
    }
    // Every live sequence read back once more, through gather and the view.
    ASSERT_OK(cache_->synchronize());
    std::vector<SequenceId> live;
    for (const auto& [id, tokens] : ref_) live.push_back(id);
    for (SequenceId id : live) {
      if (!cache_->contains(id)) continue;
      if (*cache_->residency(id) == SequenceResidency::kHost && !cache_->restore(id).ok()) {
        continue;
      }
      c.evicted += drain();
      ASSERT_OK(cache_->synchronize());
      if (!cache_->contains(id) || !on_device(id)) continue;
      EXPECT_EQ(check_gather(id, &c.bytes_checked), "");
      EXPECT_EQ(check_view({id}, false, rng), "");
      ASSERT_NO_FATAL_FAILURE(invariants());
    }
  }

  // Pressure really happened and every path really ran.
  void expect_coverage(const RunCounters& c, int64_t ops) {
    EXPECT_EQ(c.ops, ops) << describe(c);
    EXPECT_GT(c.adds, ops / 20) << describe(c);
    EXPECT_GT(c.hit_tokens, 0) << describe(c);
    EXPECT_GT(c.exhausted, 0) << describe(c);
    EXPECT_GT(c.evicted, 0) << describe(c);
    EXPECT_GT(c.offloads, 0) << describe(c);
    EXPECT_GT(c.restores, 0) << describe(c);
    EXPECT_GT(c.forks, 0) << describe(c);
    EXPECT_GT(c.rollbacks, 0) << describe(c);
    EXPECT_GT(c.gathers, ops / 25) << describe(c);
    EXPECT_GT(c.views, ops / 50) << describe(c);
    EXPECT_GT(attention_checks_, 0) << describe(c);
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      const ControlStats s = *cache_->group_stats(g);
      SCOPED_TRACE("group " + std::to_string(g));
      EXPECT_GT(s.prefix_hit_blocks, 0);
      EXPECT_GT(s.sequences_offloaded, 0);
      EXPECT_GT(s.blocks_restored, 0);
      EXPECT_GT(s.copy_on_write, 0);
      if (gconf(g).sliding_window > 0) {
        EXPECT_GT(s.window_released_blocks, 0);
      }
    }
  }

  // With `stored`, a FileTier per group (fresh directories per seed); `full_window` as in
  // hybrid_config().
  void run_hybrid(bool stored, int32_t full_window = 0);
  void TearDown() override {
    cache_.reset();  // before the stores it writes to
    stores_.clear();
  }

  SequenceId next_id_ = 1;
  TokenId next_token_ = 50000000;
  std::vector<std::unique_ptr<testing::TempDir>> dirs_;
  std::vector<std::unique_ptr<StorageTier>> stores_;
};
INSTANTIATE_TEST_SUITE_P(Backends, ModelCacheRandom, testing::runtime_backends(),
                         testing::backend_param_name);

// The hybrid model's run over PAGEDKV_HYBRID_SEEDS seeds.
void ModelCacheRandom::run_hybrid(bool stored, int32_t full_window) {
  constexpr int64_t kOps = 3000;  // per seed
  const auto start = std::chrono::steady_clock::now();
  RunCounters total;
  int64_t narrow_puts = 0, narrow_gets = 0;  // the narrower window's store, with full_window
  // PAGEDKV_HYBRID_SEEDS=<n> runs seeds 1..n (default 3) for a longer search.
  const char* env = std::getenv("PAGEDKV_HYBRID_SEEDS");
  const uint64_t seeds =
      env != nullptr ? std::max<uint64_t>(1, std::strtoull(env, nullptr, 10)) : 3;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ModelKvCacheOptions options;
    // Even seeds move blocks by batched copies, odd ones by the copy kernel (on the CPU backend,
    // whose host pool is mapped), so that both paths carry every group's moves.
    if (seed % 2 == 0) options.cache.transfer_kernel_block_bytes = 0;
    cache_.reset();  // before the stores it writes to
    stores_.clear();
    dirs_.clear();
    for (int32_t g = 0; stored && g < 2; ++g) {
      dirs_.push_back(std::make_unique<testing::TempDir>());
      FileTierOptions fo;
      fo.directory = dirs_.back()->path();
      auto store =
          make_file_tier(StorageLayout::from_config(hybrid_config(full_window).group_config(g),
                                                    "random/" + std::to_string(g)),
                         fo);
      ASSERT_OK(store);
      stores_.push_back(std::move(store).value());
      options.storage.push_back(stores_.back().get());
    }
    make(hybrid_config(full_window), options);
    ASSERT_FALSE(HasFatalFailure());
    RunCounters c;
    ASSERT_NO_FATAL_FAILURE(run(seed, kOps, c));
    expect_coverage(c, kOps);
    if (stored) {
      // Both groups wrote back and read again: blocks of the full group, window pages. With a
      // window of 96 owning the blocks, the window of 64 has a page for fewer of the blocks the
      // host tier drops, and a prompt's fetch needs fewer of them: counted over all seeds.
      for (int32_t g = 0; g < 2; ++g) {
        const StorageStats st = stores_[static_cast<size_t>(g)]->stats();
        if (full_window > 0 && g == 1) {
          narrow_puts += st.puts;
          narrow_gets += st.gets;
          continue;
        }
        EXPECT_GT(st.puts, 20) << "group " << g;
        EXPECT_GT(st.gets, 5) << "group " << g;
      }
      EXPECT_GT(c.fetched, 5) << describe(c);
    }
    // The window group refused some rollbacks.
    EXPECT_GT(c.rollbacks_refused, 0) << describe(c);
    RecordProperty("seed" + std::to_string(seed), describe(c));
    total.ops += c.ops;
    total.commits_refused += c.commits_refused;
  }
  if (stored && full_window > 0) {
    EXPECT_GT(narrow_puts, 2);
    EXPECT_GT(narrow_gets, 0);
  }
  // Some reads of released positions were refused, and some commits found the reservation
  // offloaded to make room for another sequence.
  EXPECT_GT(out_of_range_checks_, 0);
  EXPECT_GT(total.commits_refused, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("ops", static_cast<int>(total.ops));
  RecordProperty("seconds", std::to_string(s));
}

TEST_P(ModelCacheRandom, HybridModelEveryReadMatchesTheReference) { run_hybrid(false); }

// The same with the window group's tables built as rings (BatchOptions::ring_window_tables):
// the decode steps write through their slot mappings, and every check_view reads the rings,
// their CSR and the reference decode attention through the device view. Then with every group
// windowed: the owner (window 96) keeps a plain table, the window of 64 a ring.
TEST_P(ModelCacheRandom, HybridModelRingWindowTablesEveryReadMatchesTheReference) {
  ring_tables_ = true;
  run_hybrid(false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(ring_rows_checked_, 100);
  const int64_t checked = ring_rows_checked_;
  run_hybrid(false, 96);
  EXPECT_GT(ring_rows_checked_, checked + 100);
}

// The same, each group with a store of its own.
TEST_P(ModelCacheRandom, HybridModelWithStorageEveryReadMatchesTheReference) { run_hybrid(true); }

// Every group with a window: the "full" group's of 96 tokens owns the blocks, the window of 64
// beside it; with and without a store per group.
TEST_P(ModelCacheRandom, EveryGroupWindowedEveryReadMatchesTheReference) { run_hybrid(false, 96); }
TEST_P(ModelCacheRandom, EveryGroupWindowedWithStorageEveryReadMatchesTheReference) {
  run_hybrid(true, 96);
}

TEST_P(ModelCacheRandom, MlaModelEveryReadMatchesTheReference) {
  constexpr int64_t kOps = 2000;
  make(mla_config(72, 8, 3, 40));
  ASSERT_FALSE(HasFatalFailure());
  RunCounters c;
  ASSERT_NO_FATAL_FAILURE(run(2, kOps, c));
  expect_coverage(c, kOps);
  RecordProperty("counters", describe(c));
}

// Every kind of group over the one set of blocks: two full-attention groups of different
// shapes (one of them an MLA latent group, keys only) beside a sliding-window group. The owner
// of the blocks is the group with the most device blocks; the latent group, with fewer, evicts
// cached pages of its own.
CacheConfig mixed_config() {
  CacheConfig c = hybrid_config();
  c.num_layers = 7;
  KvGroup latent = KvGroup::latent("latent", {6}, 40, 8);
  latent.num_device_blocks = 22;
  latent.num_host_blocks = 32;
  c.groups.push_back(latent);
  return c;
}

TEST_P(ModelCacheRandom, FullLatentAndWindowGroupsEveryReadMatchesTheReference) {
  constexpr int64_t kOps = 2500;
  for (uint64_t seed = 11; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ModelKvCacheOptions options;
    if (seed % 2 == 0) options.cache.transfer_kernel_block_bytes = 0;
    make(mixed_config(), options);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(cache_->cache().full_group(), 0);
    RunCounters c;
    ASSERT_NO_FATAL_FAILURE(run(seed, kOps, c));
    expect_coverage(c, kOps);
    EXPECT_GT(cache_->stats().window_released_blocks, 0);
    EXPECT_GT(cache_->group_stats(1)->window_released_blocks, 0);
    EXPECT_EQ(cache_->group_stats(0)->window_released_blocks, 0);
    EXPECT_EQ(cache_->group_stats(2)->window_released_blocks, 0);
    RecordProperty("seed" + std::to_string(seed), describe(c));
  }
}

// Five window groups of four sizes beside the full group: more window sizes than a sequence
// record keeps in the lines a decode step reads (the fourth size's bound lives apart), and two
// groups of one size sharing a bound.
CacheConfig many_windows_config() {
  CacheConfig c = hybrid_config();
  c.num_layers = 7;
  KvGroup base = c.groups[1];
  c.groups.resize(1);
  const std::pair<int32_t, int32_t> windows[] = {{0, 16}, {1, 32}, {3, 48}, {4, 64}, {6, 32}};
  for (const auto& [layer, window] : windows) {
    KvGroup g = base;
    g.name = "window" + std::to_string(layer);
    g.layers = {layer};
    g.sliding_window = window;
    c.groups.push_back(g);
  }
  return c;
}

TEST_P(ModelCacheRandom, ManyWindowSizesEveryReadMatchesTheReference) {
  constexpr int64_t kOps = 2500;
  make(many_windows_config());
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(cache_->cache().full_group(), 0);
  RunCounters c;
  ASSERT_NO_FATAL_FAILURE(run(21, kOps, c));
  expect_coverage(c, kOps);
  RecordProperty("counters", describe(c));
}

// DeepSeek's latent width, a shorter run.
TEST_P(ModelCacheRandom, DeepSeekLatentEveryReadMatchesTheReference) {
  constexpr int64_t kOps = 300;
  make(mla_config(576, 64, 2, 24));
  ASSERT_FALSE(HasFatalFailure());
  RunCounters c;
  ASSERT_NO_FATAL_FAILURE(run(3, kOps, c));
  EXPECT_EQ(c.ops, kOps);
  EXPECT_GT(c.gathers, 0) << describe(c);
  EXPECT_GT(c.views, 0) << describe(c);
  EXPECT_GT(c.hit_tokens, 0) << describe(c);
  EXPECT_GT(c.exhausted + c.evicted + c.offloads, 0) << describe(c);
}

// The checks can fail: a value byte of a window layer changed in the device pool behind the
// cache's back is reported by the gather (with its coordinates) and by the attention.
TEST_P(ModelCacheRandom, AByteChangedInTheWindowGroupIsReported) {
  make(hybrid_config());
  ASSERT_FALSE(HasFatalFailure());
  RunCounters c;
  ASSERT_NO_FATAL_FAILURE(run(4, 400, c));
  ASSERT_FALSE(HasFailure());
  ASSERT_OK(cache_->synchronize());
  SequenceId victim = 0;
  for (const auto& [id, tokens] : ref_) {
    if (on_device(id) && tokens.size() > 20) {
      victim = id;
      break;
    }
  }
  ASSERT_NE(victim, 0u) << "no device-resident sequence after 400 steps";
  std::mt19937_64 rng(5);
  ASSERT_EQ(check_gather(victim), "");
  ASSERT_EQ(check_view({victim}, false, rng), "");

  // Layer 3 is the window group's (group 1) in-group layer 2.
  const int32_t g = 1;
  ASSERT_EQ(lg(3).group, g);
  const int64_t pos = static_cast<int64_t>(ref_[victim].size()) - 1;
  const auto blocks = cache_->block_locations(victim, g);
  ASSERT_OK(blocks);
  const int32_t bs = gconf(g).block_size;
  const PoolRef pool = cache_->device_pool(g);
  const int64_t offset = pool.layout.element_offset((*blocks)[size_t(pos / bs)].block, lg(3).layer,
                                                    KvPart::kValue, int32_t(pos % bs), 1, 2);
  uint16_t* element = static_cast<uint16_t*>(pool.data) + offset;
  uint16_t bits = 0;
  ASSERT_OK(backend_->copy_async(&bits, element, sizeof bits, CopyKind::kDeviceToHost, Stream{}));
  ASSERT_OK(backend_->synchronize_stream(Stream{}));
  bits ^= 0x0400;
  ASSERT_OK(backend_->copy_async(element, &bits, sizeof bits, CopyKind::kHostToDevice, Stream{}));
  ASSERT_OK(backend_->synchronize_stream(Stream{}));

  const std::string problem = check_gather(victim);
  EXPECT_NE(problem.find("seq " + std::to_string(victim) + " layer 3 value position " +
                         std::to_string(pos) + " head 1 dim 2"),
            std::string::npos)
      << problem;
  const std::string attention = check_view({victim}, false, rng);
  EXPECT_NE(attention.find("layer 3"), std::string::npos) << attention;
}

}  // namespace
}  // namespace pagedkv
