// ModelKvCache, case by case (model_cache_harness.hpp; the randomized run is
// model_cache_random_test.cpp): a window group's memory stays bounded while the full group
// grows; prefix hits are the longest length every group can supply, also after pressure in one
// group evicted its pages; bad input is a clear error that changes nothing; rollback past a
// window and a reserve the window group cannot hold leave every group as it was; a reservation
// offloaded to make room commits only after a restore; an MLA model refuses a value tensor; and
// the one-group model behaves as the KvCache it wraps.
// check_invariants() after every step. On both backends (runtime_backends.hpp).
#include "pagedkv/model_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "runtime/model_cache_harness.hpp"
#include "runtime/null_storage.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::model_rows;
using testing::two_groups;

CacheConfig mla_model() {
  CacheConfig c;
  c.num_layers = 2;
  c.block_size = 16;
  KvGroup g = KvGroup::latent("mla", {0, 1}, 72, 8);
  g.num_device_blocks = 16;
  c.groups = {g};
  return c;
}

std::vector<TokenId> iota_tokens(int64_t n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<TokenId>(i);
  return t;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Everything a refused call must leave alone: each group's stats and pool bytes, and each
// sequence's length, reservation and blocks in each group.
struct Snapshot {
  std::vector<ControlStats> stats;
  std::vector<std::vector<uint8_t>> pools;
  std::map<SequenceId, std::vector<std::vector<int64_t>>> seqs;  // per group: length, pending
  std::map<SequenceId, std::vector<std::vector<BlockLocation>>> blocks;
  bool operator==(const Snapshot& o) const {
    return stats == o.stats && pools == o.pools && seqs == o.seqs && blocks == o.blocks;
  }
};

class ModelCacheTest : public testing::ModelCacheHarness {
 protected:
  Snapshot snapshot() {
    Snapshot s;
    EXPECT_OK(cache_->synchronize());
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      s.stats.push_back(*cache_->group_stats(g));
      s.pools.push_back(pool_bytes(cache_->device_pool(g)));
      for (const auto& [id, tokens] : ref_) {
        s.seqs[id].push_back({*cache_->length(id), *cache_->pending(id)});
        s.blocks[id].push_back(*cache_->block_locations(id, g));
      }
    }
    return s;
  }

  // A refused call: `st` has `code` and a message containing `text`, and nothing changed.
  void expect_refused(const Status& st, StatusCode code, const std::string& text,
                      const Snapshot& before) {
    expect_refusal(st, code, text, snapshot() == before);
  }

  // Sequences 1 (40 tokens) and 2 (90), prefilled with no hit.
  void add_two_sequences() {
    Status appended;
    ASSERT_EQ(*add_and_prefill(1, iota_tokens(40, 10), &appended), 0);
    ASSERT_OK(appended);
    ASSERT_EQ(*add_and_prefill(2, iota_tokens(90, 500), &appended), 0);
    ASSERT_OK(appended);
  }

  // One decode step of `id` by hand: checks the blocks held after the reserve and the commit.
  void decode_and_check_memory(SequenceId id, TokenId token) {
    const int64_t len = static_cast<int64_t>(ref_[id].size());
    ASSERT_OK(cache_->reserve(id, 1));
    invariants();
    expect_held(id, len, len + 1);
    ASSERT_OK(write_layers(id, {token}, len));
    ASSERT_OK(cache_->commit(id, {token}));
    ref_[id].push_back(token);
    invariants();
    expect_held(id, len + 1, len + 1);
  }

  // Full group: a block per 16 tokens; window group: those of the window at `committed`
  // through the last reserved token, at most ceil(64 / 16) + 1 = 5; held_bytes their sum.
  void expect_held(SequenceId id, int64_t committed, int64_t reserved) {
    SCOPED_TRACE("committed " + std::to_string(committed) + " reserved " +
                 std::to_string(reserved));
    const int64_t full = *cache_->held_blocks(id, 0);
    const int64_t window = *cache_->held_blocks(id, 1);
    EXPECT_EQ(full, ceil_div(reserved, 16));
    EXPECT_EQ(window, ceil_div(reserved, 16) - window_first_block(1, committed));
    EXPECT_LE(window, 64 / 16 + 1);
    EXPECT_EQ(*cache_->held_bytes(id),
              full * gconf(0).block_bytes() + window * gconf(1).block_bytes());
    // The only sequence: what it holds is what each group's device tier has in use.
    EXPECT_EQ(cache_->group_stats(0)->device.used_blocks, full);
    EXPECT_EQ(cache_->group_stats(1)->device.used_blocks, window);
    max_window_held_ = std::max(max_window_held_, window);
  }

  ControlStats group_stats(int32_t g) const { return *cache_->group_stats(g); }

  int64_t max_window_held_ = 0;
};
INSTANTIATE_TEST_SUITE_P(Backends, ModelCacheTest, testing::runtime_backends(),
                         testing::backend_param_name);

// ---------------------------------------------------------------- memory

TEST_P(ModelCacheTest, WindowGroupHoldsAtMostFiveBlocksWhileTheFullGroupGrows) {
  make(two_groups(64, 16));
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<TokenId> prompt = iota_tokens(10, 100);
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, prompt, &appended), 0);
  ASSERT_OK(appended);
  invariants();
  for (int step = 0; step < 300; ++step) {
    ASSERT_NO_FATAL_FAILURE(decode_and_check_memory(1, 1000 + step));
    if (step % 50 == 0) {
      EXPECT_EQ(check_gather(1), "");
    }
  }
  EXPECT_EQ(max_window_held_, 5);
  EXPECT_EQ(*cache_->held_blocks(1, 0), ceil_div(310, 16));
  EXPECT_GT(cache_->group_stats(1)->window_released_blocks, 10);
  EXPECT_EQ(cache_->group_stats(0)->window_released_blocks, 0);
  EXPECT_EQ(check_gather(1), "");
  EXPECT_GT(out_of_range_checks_, 0);
  std::mt19937_64 rng(1);
  EXPECT_EQ(check_view({1}, true, rng), "");
  // A bad group index is refused.
  EXPECT_EQ(cache_->held_blocks(1, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->held_blocks(1, -1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->held_blocks(9, 0).status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------- prefix hits

class ModelCachePrefixTest : public ModelCacheTest {
 protected:
  // Adds sequence `id` with `prompt`, appends it in 16-token chunks (a window group never needs
  // more than its window's blocks), and finishes it.
  void run_and_finish(SequenceId id, const std::vector<TokenId>& prompt) {
    auto hit = cache_->add_sequence(id, prompt);
    ASSERT_OK(hit);
    ref_[id].assign(prompt.begin(), prompt.begin() + *hit);
    for (size_t at = static_cast<size_t>(*hit); at < prompt.size(); at += 16) {
      const size_t end = std::min(prompt.size(), at + 16);
      const Status st = append(
          id, std::vector<TokenId>(prompt.begin() + int64_t(at), prompt.begin() + int64_t(end)));
      ASSERT_OK(st);
      invariants();
    }
    ASSERT_OK(cache_->finish(id));
    ref_.erase(id);
    invariants();
  }

  // The hit the cache would give `prompt` now.
  int64_t own(const std::vector<TokenId>& prompt) const {
    return *cache_->cache().cached_prefix(prompt);
  }

  // add_sequence's hit is the brute-force agreement and cached_prefix's answer, and the shared
  // bytes read back; the sequence is then finished (its blocks stay cached).
  int64_t add_and_check(SequenceId id, const std::vector<TokenId>& prompt) {
    const int64_t want = agreed_by_brute_force(prompt);
    const int64_t before = own(prompt);
    auto hit = cache_->add_sequence(id, prompt);
    EXPECT_OK(hit);
    if (!hit.ok()) return -1;
    EXPECT_EQ(*hit, want);
    EXPECT_EQ(*hit, before);
    ref_[id].assign(prompt.begin(), prompt.begin() + *hit);
    invariants();
    EXPECT_EQ(check_gather(id), "");
    EXPECT_OK(cache_->finish(id));
    ref_.erase(id);
    invariants();
    return *hit;
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, ModelCachePrefixTest, testing::runtime_backends(),
                         testing::backend_param_name);

// Pressure in the window group only evicts its pages: the hit falls to what the window group
// can still supply, while the full group keeps all 160 tokens' blocks.
TEST_P(ModelCachePrefixTest, WindowGroupEvictionLowersTheAgreedHit) {
  make(two_groups(100, 12));
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<TokenId> a = iota_tokens(165, 1000);
  ASSERT_NO_FATAL_FAILURE(run_and_finish(1, a));
  std::vector<TokenId> b(a.begin(), a.begin() + 160);
  for (TokenId t : {7, 8, 9, 10, 11}) b.push_back(t);
  EXPECT_EQ(own(b), 160);
  EXPECT_EQ(add_and_check(2, b), 160);

  // Unrelated sequences fill the window group's 12 blocks; the least recently used cached
  // blocks go first: A's early blocks (out of the window at 160) before its last four. Only
  // looked up here (an add would make A's blocks recently used again).
  std::vector<int64_t> hits;
  for (SequenceId id = 10; id < 14; ++id) {
    ASSERT_NO_FATAL_FAILURE(run_and_finish(id, iota_tokens(96, 100000 * TokenId(id))));
    hits.push_back(agreed_by_brute_force(b));
    EXPECT_EQ(own(b), hits.back());
    EXPECT_EQ(group_stats(0).blocks_evicted, 0) << "the full group's pool had room";
  }
  EXPECT_GT(group_stats(1).blocks_evicted, 0);
  EXPECT_EQ(hits.front(), 160) << "pages inside the window went before those out of it";
  EXPECT_LT(hits.back(), 160) << "the window group's in-window pages were never evicted";
  EXPECT_EQ(add_and_check(2, b), hits.back());
}

// The other way round: the full group lost A's first blocks, so a hit stops there although the
// window group's pool had room for every page of the window at 160.
TEST_P(ModelCachePrefixTest, FullGroupEvictionLowersTheAgreedHit) {
  make(two_groups(12, 100));
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<TokenId> a = iota_tokens(165, 1000);
  ASSERT_NO_FATAL_FAILURE(run_and_finish(1, a));
  std::vector<TokenId> b(a.begin(), a.begin() + 160);
  b.push_back(7);
  EXPECT_EQ(own(b), 160);
  ASSERT_NO_FATAL_FAILURE(run_and_finish(10, iota_tokens(96, 500000)));
  const int64_t hit = own(b);
  EXPECT_LT(hit, 160);
  EXPECT_GT(group_stats(0).blocks_evicted, 0);
  EXPECT_EQ(group_stats(1).blocks_evicted, 0) << "the window pages left with their blocks";
  EXPECT_EQ(add_and_check(2, b), hit);
}

// ---------------------------------------------------------------- bad input

TEST_P(ModelCacheTest, MalformedModelsAreRefusedByGroupAndField) {
  const auto expect_refused_config = [&](const CacheConfig& c, const std::string& want,
                                         ModelKvCacheOptions o = {}) {
    CacheConfig cc = c;
    cc.backend = kind();
    auto made = ModelKvCache::create(cc, std::move(o));
    ASSERT_FALSE(made.ok()) << want;
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(made.status().message().rfind(want, 0), 0u) << made.status().message();
  };
  CacheConfig c = two_groups(16, 16);
  c.groups[1].layers = {1, 2, 3, 5};
  expect_refused_config(c, "groups[1] (window): layers: layer 2 is in groups[0] too");
  c = two_groups(16, 16);
  c.groups[1].layers = {1, 3};
  expect_refused_config(c, "groups: layer 5 is in no group");
  c = two_groups(16, 16);
  c.groups[1].layers = {1, 3, 5, 6};
  expect_refused_config(c, "groups[1] (window): layers: layer 6 is outside the model's 6 layers");
  c = two_groups(16, 16);
  c.groups[1].sliding_window = 8;
  expect_refused_config(c, "groups[1] (window): sliding_window: ");
  c = mla_model();
  c.groups[0].num_kv_heads = 2;
  expect_refused_config(c, "groups[0] (mla): num_kv_heads: ");
  c = mla_model();
  c.groups[0].rope_dim = 0;
  expect_refused_config(c, "groups[0] (mla): rope_dim: ");

  ModelKvCacheOptions o;
  o.storage = {nullptr};  // one tier for two groups
  expect_refused_config(two_groups(16, 16), "storage: 1 storage tiers for 2 groups", o);
  testing::NullStorage store;
  o = {};
  o.cache.storage = &store;
  expect_refused_config(two_groups(16, 16), "storage: give a ModelKvCache its storage tiers", o);
}

TEST_P(ModelCacheTest, BadCallsAreClearErrorsThatChangeNothing) {
  make(two_groups(32, 32));
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NO_FATAL_FAILURE(add_two_sequences());
  ASSERT_OK(cache_->reserve_batch({1, 2}, 1));
  auto batch = cache_->build_batch({1, 2});
  ASSERT_OK(batch);
  // Rows for two tokens of the widest group, values too.
  std::vector<uint16_t> rows(2 * 32, 0x3C00);
  DeviceBuffer k(*backend_, rows.size() * 2), v(*backend_, rows.size() * 2);
  k.upload(rows);
  v.upload(rows);
  const Snapshot before = snapshot();

  ModelBatch fewer = *batch;
  fewer.groups.pop_back();
  ModelBatch more = *batch;
  more.groups.push_back(batch->groups[0]);
  for (const ModelBatch* bad : {&fewer, &more}) {
    expect_refused(cache_->write_kv_batch(*bad, 0, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kInvalidArgument, "groups, the model has 2", before);
    expect_refused(cache_->device_view(*bad, 0).status(), StatusCode::kInvalidArgument,
                   "groups, the model has 2", before);
  }
  // Group batches swapped, and a batch another model of the same shape built: the group counts
  // match, the owners do not.
  ModelBatch swapped = *batch;
  std::swap(swapped.groups[0], swapped.groups[1]);
  auto other = ModelKvCache::create(config_, [&] {
    ModelKvCacheOptions o;
    o.cache.backend = backend_.get();
    return o;
  }());
  ASSERT_OK(other);
  ASSERT_OK((*other)->add_sequence(1, iota_tokens(40, 10)));
  ASSERT_OK((*other)->reserve(1, 1));
  auto foreign = (*other)->build_batch({1});
  ASSERT_OK(foreign);
  for (const ModelBatch* bad : {&swapped, &*foreign}) {
    expect_refused(cache_->write_kv_batch(*bad, 0, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kInvalidArgument, "not built by this model's build_batch", before);
    expect_refused(cache_->device_view(*bad, 1).status(), StatusCode::kInvalidArgument,
                   "not built by this model's build_batch", before);
  }
  for (int32_t g : {-1, 2}) {
    expect_refused(cache_->device_view(*batch, g).status(), StatusCode::kOutOfRange,
                   "outside the model's 2 groups", before);
    expect_refused(
        cache_->write_kv_batch_all_layers(*batch, g, k.data(), v.data(), DType::kFloat16),
        StatusCode::kOutOfRange, "outside the model's 2 groups", before);
  }
  for (const ModelBatch* bad : {&swapped, &*foreign, &fewer}) {
    expect_refused(cache_->write_kv_batch_all_layers(*bad, 0, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kInvalidArgument, "batch: ", before);
  }
  for (int32_t layer : {-1, 6}) {
    const std::string want = "layer " + std::to_string(layer) + " outside the model's 6 layers";
    expect_refused(cache_->write_kv(1, layer, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kOutOfRange, want, before);
    expect_refused(cache_->write_kv_batch(*batch, layer, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kOutOfRange, want, before);
    expect_refused(cache_->gather_layer(1, layer, k.data(), v.data(), DType::kFloat16,
                                        PackedLayout::kTokenMajor, 39, 1),
                   StatusCode::kOutOfRange, want, before);
    EXPECT_EQ(cache_->layer_group(layer).status().code(), StatusCode::kOutOfRange);
  }
  expect_refused(cache_->write_kv(7, 1, k.data(), v.data(), DType::kFloat16), StatusCode::kNotFound,
                 "sequence 7 does not exist", before);
  expect_refused(cache_->write_kv(1, 1, k.data(), nullptr, DType::kFloat16),
                 StatusCode::kInvalidArgument, "value: null pointer", before);
  expect_refused(cache_->gather_layer(2, 3, k.data(), v.data(), DType::kFloat16,
                                      PackedLayout::kTokenMajor, 0, 1),
                 StatusCode::kOutOfRange, "position 0 fell out of the sliding window", before);
  expect_refused(cache_->rollback(1, 41), StatusCode::kOutOfRange, "rollback", before);
  expect_refused(cache_->commit(1, {1, 2}), StatusCode::kFailedPrecondition, "reserved", before);
  expect_refused(cache_->add_sequence(2, {1}).status(), StatusCode::kAlreadyExists, "2", before);
  expect_refused(cache_->fork(1, 2), StatusCode::kAlreadyExists, "2", before);
  expect_refused(cache_->commit_batch({1, 7}, {77, 77}), StatusCode::kNotFound,
                 "sequence 7 does not exist", before);
  expect_refused(cache_->commit_batch({1, 2}, {77, 77, 77, 77}, 2), StatusCode::kFailedPrecondition,
                 "2 tokens but only 1 reserved for sequence 1", before);
  expect_refused(cache_->commit_batch({1, 2}, {77}), StatusCode::kInvalidArgument,
                 "1 tokens for 2 sequences of 1 each", before);

  // The batch still works: the step goes through and reads back.
  ASSERT_OK(write_and_commit(*batch, {1, 2}, {77, 77}));
  invariants();
  EXPECT_EQ(check_gather(1), "");
  EXPECT_EQ(check_gather(2), "");
}

TEST_P(ModelCacheTest, WriteKvBatchAllLayersWritesEachGroupsLayersInOneCall) {
  // Each group lists its layers out of the model's order: the inputs follow the group's list.
  CacheConfig c = two_groups(32, 32);
  c.groups[0].layers = {4, 0, 2};
  c.groups[1].layers = {3, 5, 1};
  make(c);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_NO_FATAL_FAILURE(add_two_sequences());
  const std::vector<SequenceId> ids = {2, 1};
  const std::vector<TokenId> next = {88, 77};
  ASSERT_OK(cache_->reserve_batch(ids, 1));
  auto batch = cache_->build_batch(ids);
  ASSERT_OK(batch);
  for (int32_t g = 0; g < cache_->num_groups(); ++g) {
    // [group layers][batch rows][row], the layers in the group's list order.
    std::vector<uint16_t> kr, vr;
    for (int32_t layer : config_.groups[static_cast<size_t>(g)].layers) {
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t pos = static_cast<int64_t>(ref_[ids[i]].size());
        const auto a = model_rows(gconf(g), layer, 0, {next[i]}, pos);
        const auto b = model_rows(gconf(g), layer, 1, {next[i]}, pos);
        kr.insert(kr.end(), a.begin(), a.end());
        vr.insert(vr.end(), b.begin(), b.end());
      }
    }
    DeviceBuffer dk(*backend_, kr.size() * 2), dv(*backend_, vr.size() * 2);
    dk.upload(kr);
    dv.upload(vr);
    const Status st =
        cache_->write_kv_batch_all_layers(*batch, g, dk.data(), dv.data(), DType::kFloat16);
    ASSERT_OK(st);
    ASSERT_OK(cache_->synchronize());
  }
  ASSERT_OK(cache_->commit_batch(ids, next));
  ref_[2].push_back(88);
  ref_[1].push_back(77);
  invariants();
  EXPECT_EQ(check_gather(1), "");
  EXPECT_EQ(check_gather(2), "");
}

// ---------------------------------------------------------------- rollback and reserve

TEST_P(ModelCacheTest, RollbackPastTheWindowIsRefusedInEveryGroup) {
  make(two_groups(64, 16));
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(8, 10), &appended), 0);
  for (int i = 0; i < 24; ++i) ASSERT_OK(append(1, iota_tokens(8, 100 + 8 * i)));
  invariants();
  ASSERT_EQ(ref_[1].size(), 200u);  // the window group holds blocks 8.. (tokens 128..)
  for (int64_t length : {100, 190, 1}) {
    SCOPED_TRACE("rollback to " + std::to_string(length));
    const Snapshot before = snapshot();
    expect_refused(cache_->rollback(1, length), StatusCode::kFailedPrecondition,
                   "no longer holds the tokens before 128 in group 1", before);
  }
  ASSERT_OK(cache_->rollback(1, 196));  // its window starts in block 8
  ref_[1].resize(196);
  invariants();
  EXPECT_EQ(check_gather(1), "");
  EXPECT_EQ(*cache_->held_blocks(1, 0), 13);
  EXPECT_EQ(*cache_->held_blocks(1, 1), 5);
  // Decoding on after the rollback writes over the dropped tokens.
  for (int i = 0; i < 20; ++i) ASSERT_OK(decode_step({1}, {9000 + i}));
  invariants();
  EXPECT_EQ(check_gather(1), "");
  std::mt19937_64 rng(2);
  EXPECT_EQ(check_view({1}, false, rng), "");
  ASSERT_OK(cache_->rollback(1, 0));  // to nothing always works
  ref_[1].clear();
  invariants();
  EXPECT_EQ(*cache_->held_blocks(1, 0), 0);
  EXPECT_EQ(*cache_->held_blocks(1, 1), 0);
  ASSERT_OK(append(1, iota_tokens(70, 4000)));
  invariants();
  EXPECT_EQ(check_gather(1), "");
}

// The window group (second) has 7 pages: a reserve the full group could take and the window
// group cannot is refused in full, and the sequences go on.
TEST_P(ModelCacheTest, ReserveTheWindowGroupCannotHoldLeavesNothingReserved) {
  make(two_groups(64, 7));
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(60, 10), &appended), 0);
  ASSERT_OK(appended);
  invariants();
  {
    const Snapshot before = snapshot();
    auto r = cache_->reserve(1, 64);  // 8 blocks in each group; the window group has 7
    expect_refused(r.status(), StatusCode::kResourceExhausted, "out of pages in group 1", before);
  }
  ASSERT_OK(append(1, iota_tokens(4, 200)));
  invariants();
  EXPECT_EQ(check_gather(1), "");

  ASSERT_EQ(*add_and_prefill(2, iota_tokens(16, 300), &appended), 0);
  ASSERT_OK(appended);
  invariants();
  {
    const Snapshot before = snapshot();
    const Status st = cache_->reserve_batch({1, 2}, 40);
    expect_refused(st, StatusCode::kResourceExhausted, "out of pages in group 1", before);
    EXPECT_EQ(*cache_->pending(1), 0);
    EXPECT_EQ(*cache_->pending(2), 0);
  }
  ASSERT_OK(decode_step({1, 2}, {5, 6}));
  invariants();
  EXPECT_EQ(check_gather(1), "");
  EXPECT_EQ(check_gather(2), "");
  std::mt19937_64 rng(3);
  EXPECT_EQ(check_view({1, 2}, true, rng), "");
}

// A reserved sequence offloaded to make room for another's window pages cannot commit until it
// is restored: refused in full, nothing committed, and after restore() the step goes through.
TEST_P(ModelCacheTest, CommitOfAnOffloadedReservationIsRefusedUntilItsRestore) {
  CacheConfig c = two_groups(64, 7);
  c.groups[0].num_host_blocks = 16;
  c.groups[1].num_host_blocks = 16;
  make(c);
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(16, 10), &appended), 0);
  ASSERT_OK(appended);
  ASSERT_OK(cache_->reserve(1, 1));  // a decode step of sequence 1 is under way
  invariants();
  ASSERT_EQ(*add_and_prefill(2, iota_tokens(16, 500), &appended), 0);
  ASSERT_OK(appended);
  // 6 window blocks for sequence 2: the window group offloads sequence 1, the full group has room.
  auto r = cache_->reserve(2, 80);
  ASSERT_OK(r);
  invariants();
  ASSERT_OK(cache_->synchronize());
  ASSERT_EQ(*cache_->residency(1), SequenceResidency::kHost);

  const Snapshot before = snapshot();
  expect_refused(cache_->commit(1, {77}), StatusCode::kFailedPrecondition, "offloaded", before);
  expect_refused(cache_->commit_batch({1}, {77}), StatusCode::kFailedPrecondition, "offloaded",
                 before);
  EXPECT_EQ(*cache_->pending(1), 1);

  // Sequence 2's step first, then sequence 1's after a restore.
  ASSERT_OK(write_layers(2, iota_tokens(80, 600), 16));
  ASSERT_OK(cache_->commit(2, iota_tokens(80, 600)));
  const std::vector<TokenId> more = iota_tokens(80, 600);
  ref_[2].insert(ref_[2].end(), more.begin(), more.end());
  invariants();
  const Status restored = cache_->restore(1);
  ASSERT_OK(restored);
  drain();
  invariants();
  ASSERT_TRUE(cache_->contains(1));
  ASSERT_EQ(*cache_->pending(1), 1);
  ASSERT_OK(write_layers(1, {77}, 16));
  ASSERT_OK(cache_->commit(1, {77}));
  ref_[1].push_back(77);
  invariants();
  ASSERT_OK(cache_->synchronize());
  for (SequenceId id : {1, 2}) {
    if (*cache_->residency(id) == SequenceResidency::kDevice) {
      EXPECT_EQ(check_gather(id), "");
    }
  }
}

// ---------------------------------------------------------------- MLA

TEST_P(ModelCacheTest, ValueTensorForALatentLayerIsRefusedAndChangesNothing) {
  make(mla_model());
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(20, 10), &appended), 0);
  ASSERT_OK(appended);
  ASSERT_OK(cache_->reserve(1, 2));
  auto batch = cache_->build_batch({1});
  ASSERT_OK(batch);
  std::vector<uint16_t> rows(2 * 72, 0x3C00);
  DeviceBuffer k(*backend_, rows.size() * 2), v(*backend_, rows.size() * 2);
  k.upload(rows);
  v.upload(rows);
  const Snapshot before = snapshot();
  const std::string want = "value: a latent (MLA) cache stores no values; pass null";
  for (int32_t layer : {0, 1}) {
    expect_refused(cache_->write_kv(1, layer, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kInvalidArgument, want, before);
    expect_refused(cache_->write_kv_batch(*batch, layer, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kInvalidArgument, want, before);
    expect_refused(cache_->gather_layer(1, layer, k.data(), v.data(), DType::kFloat16,
                                        PackedLayout::kTokenMajor, 0, 1),
                   StatusCode::kInvalidArgument, want, before);
  }
  EXPECT_EQ(*cache_->pending(1), 2);
  // The reservation is still there: written with keys only, it commits and reads back.
  ASSERT_OK(write_layers(1, {21, 22}, 20));
  ASSERT_OK(cache_->commit(1, {21, 22}));
  ref_[1].push_back(21);
  ref_[1].push_back(22);
  invariants();
  EXPECT_EQ(check_gather(1), "");
  std::mt19937_64 rng(4);
  EXPECT_EQ(check_view({1}, false, rng), "");
}

// ---------------------------------------------------------------- one group

// A ModelKvCache of today's uniform config is the KvCache it wraps: on the same workload (and
// with a window too) it shares the same prefixes, hands out the same slots, drops the same
// sequences and ends with the same stats and block tables.
TEST_P(ModelCacheTest, OneGroupModelBehavesAsAKvCache) {
  for (int32_t window : {0, 64}) {
    SCOPED_TRACE("sliding_window " + std::to_string(window));
    CacheConfig c;
    c.num_layers = 3;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.block_size = 16;
    c.num_device_blocks = 30;
    c.num_host_blocks = 20;
    c.sliding_window = window;
    make(c);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(cache_->num_groups(), 1);
    std::unique_ptr<Backend> kv_backend = testing::make_backend(kind());
    ASSERT_NE(kv_backend, nullptr);
    KvCacheOptions ko;
    ko.backend = kv_backend.get();
    CacheConfig kc = c;
    kc.backend = kind();
    auto made = KvCache::create(kc, ko);
    ASSERT_OK(made);
    KvCache& kv = **made;

    std::mt19937_64 rng(9 + static_cast<uint64_t>(window));
    SequenceId next_id = 1;
    TokenId next_token = 1000000;
    int64_t hits = 0, exhausted = 0, dropped = 0;
    // Reserves `t` after the committed tokens of `id` in both caches (the same slots), writes
    // the model cache and commits both; false when both refused the reserve.
    const auto extend = [&](SequenceId id, const std::vector<TokenId>& t) {
      const int64_t n = static_cast<int64_t>(t.size());
      auto a = cache_->reserve(id, n);
      auto b = kv.reserve(id, n);
      EXPECT_EQ(a.status().code(), b.status().code()) << a.status().to_string();
      if (!a.ok() || !b.ok()) return false;
      EXPECT_EQ(a->size(), 1u);
      EXPECT_EQ(a->front(), *b) << "different slots";
      EXPECT_OK(write_layers(id, t, static_cast<int64_t>(ref_[id].size())));
      EXPECT_OK(cache_->commit(id, t));
      EXPECT_OK(kv.commit(id, t));
      ref_[id].insert(ref_[id].end(), t.begin(), t.end());
      return true;
    };
    for (int op = 0; op < 600; ++op) {
      SCOPED_TRACE("op " + std::to_string(op));
      const int r = static_cast<int>(rng() % 10);
      if (r < 3 || ref_.size() < 2) {
        std::vector<TokenId> prompt =
            iota_tokens(static_cast<int64_t>(rng() % 120), TokenId(10000 * (1 + rng() % 3)));
        for (int64_t i = 0, n = 1 + int64_t(rng() % 20); i < n; ++i) prompt.push_back(next_token++);
        const SequenceId id = next_id++;
        auto a = cache_->add_sequence(id, prompt);
        auto b = kv.add_sequence(id, prompt);
        ASSERT_OK(a);
        ASSERT_OK(b);
        ASSERT_EQ(*a, *b);
        hits += *a;
        ref_[id].assign(prompt.begin(), prompt.begin() + *a);
        if (!extend(id, std::vector<TokenId>(prompt.begin() + *a, prompt.end()))) ++exhausted;
      } else {
        auto it = ref_.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % ref_.size()));
        const SequenceId id = it->first;
        if (r < 8 && it->second.size() < 200) {
          std::vector<TokenId> t(1 + rng() % 20);
          for (TokenId& x : t) x = next_token++;
          if (!extend(id, t)) ++exhausted;
        } else if (r == 8) {
          const Status a = cache_->offload(id), b = kv.offload(id);
          ASSERT_EQ(a.code(), b.code()) << a.to_string() << " vs " << b.to_string();
        } else {
          ASSERT_OK(cache_->finish(id));
          ASSERT_OK(kv.finish(id));
          ref_.erase(it);
        }
      }
      if (HasFailure()) return;
      const std::vector<SequenceId> kv_dropped = kv.drain_evicted_sequences();
      std::vector<SequenceId> model_dropped = cache_->drain_evicted_sequences();
      ASSERT_EQ(model_dropped, kv_dropped);
      for (SequenceId id : model_dropped) ref_.erase(id);
      dropped += static_cast<int64_t>(model_dropped.size());
      invariants();
      ASSERT_OK(kv.check_invariants());
      ASSERT_TRUE(cache_->stats() == kv.stats());
      for (const auto& [id, tokens] : ref_) {
        ASSERT_EQ(*cache_->block_locations(id, 0), *kv.block_locations(id));
        ASSERT_EQ(*cache_->length(id), static_cast<int64_t>(tokens.size()));
      }
    }
    EXPECT_GT(hits, 0);
    EXPECT_GT(exhausted + dropped, 0) << "no pressure";
    // The bytes of the model cache read back.
    ASSERT_OK(cache_->synchronize());
    for (const auto& [id, tokens] : ref_) {
      if (*cache_->residency(id) == SequenceResidency::kDevice) {
        EXPECT_EQ(check_gather(id), "");
      }
    }
  }
}

}  // namespace
}  // namespace pagedkv
