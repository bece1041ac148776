// A ModelKvCache with a storage tier per group (ModelKvCacheOptions::storage), end to end on
// real bytes and real FileTier directories: a first cache computes a prompt and is pushed past
// its host tiers, so both groups write their blocks back, the window group its flat ones; a
// second cache on the same directories (a restart) fetches what a hit needs, the window group
// only its window at the hit the full group reaches, and a sequence added afterwards hits it and
// reads back, through gather_layer of every model layer, exactly what the first cache's model
// wrote. Without the full group's store, or with a window store missing one block, the window
// group fetches nothing. Stores shared between groups are refused, and so is a model whose
// owner group has no store. check_invariants() after every step. On both backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/model_cache.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/model_cache_harness.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::TempDir;

// Layers 0, 2 full attention (group 0), 1, 3 sliding window 32 (group 1), block 16; 12 device
// and 6 host blocks per group, so a few 96-token prompts push the first one into storage.
CacheConfig model(int32_t full_window = 0) {
  CacheConfig c;
  c.num_layers = 4;
  c.block_size = 16;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2};
  full.num_kv_heads = 2;
  full.head_dim = 16;
  full.num_device_blocks = 12;
  full.num_host_blocks = 6;
  KvGroup window = full;
  window.name = "window";
  window.layers = {1, 3};
  window.num_kv_heads = 1;
  window.head_dim = 24;
  window.sliding_window = 32;
  full.sliding_window = full_window;
  c.groups = {full, window};
  return c;
}

std::vector<TokenId> iota_tokens(int64_t n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<TokenId>(i);
  return t;
}

// A store that claims one key fewer than it holds (a window with a hole in the store).
class OneShortStore : public StorageTier {
 public:
  explicit OneShortStore(StorageTier* inner) : inner_(inner) {}
  const char* medium() const override { return inner_->medium(); }
  const StorageLayout& layout() const override { return inner_->layout(); }
  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override {
    PAGEDKV_ASSIGN_OR_RETURN(size_t n, inner_->batch_exists(keys));
    return n == keys.size() && n > 0 ? n - 1 : n;
  }
  StatusOr<uint64_t> submit_put(const std::vector<StorageKey>& keys,
                                const std::vector<const void*>& bytes) override {
    return inner_->submit_put(keys, bytes);
  }
  StatusOr<uint64_t> submit_get(const std::vector<StorageKey>& keys,
                                const std::vector<void*>& dst) override {
    return inner_->submit_get(keys, dst);
  }
  std::vector<StorageCompletion> poll() override { return inner_->poll(); }
  void drain() override { inner_->drain(); }
  Status remove(const std::vector<StorageKey>& keys) override { return inner_->remove(keys); }
  StorageStats stats() const override { return inner_->stats(); }

 private:
  StorageTier* inner_;
};

class ModelCacheStorageTest : public testing::ModelCacheHarness {
 protected:
  // Opens a store per group on the test's directories (a new process would open them the same
  // way) and a cache over them; `window_one_short` wraps the window group's store in
  // OneShortStore.
  void open(bool window_one_short = false) {
    cache_.reset();  // before the stores it uses
    stores_.clear();
    short_.reset();
    const CacheConfig c = model(full_window_);
    const char* ids[] = {"model/full", "model/window"};
    for (int32_t g = 0; g < 2; ++g) {
      FileTierOptions fo;
      fo.directory = dirs_[g].path();
      auto store = make_file_tier(StorageLayout::from_config(c.group_config(g), ids[g]), fo);
      ASSERT_OK(store);
      stores_.push_back(std::move(store).value());
    }
    ModelKvCacheOptions o;
    o.storage = {stores_[0].get(), stores_[1].get()};
    if (window_one_short) {
      short_ = std::make_unique<OneShortStore>(stores_[1].get());
      o.storage[1] = short_.get();
    }
    make(c, o);
  }

  // Blocks (or window pages) each group's store read back, and wrote.
  int64_t gets(int32_t g) const { return stores_[static_cast<size_t>(g)]->stats().gets; }
  int64_t puts(int32_t g) const { return stores_[static_cast<size_t>(g)]->stats().puts; }

  void TearDown() override {
    cache_.reset();
    stores_.clear();
  }

  // Computes `prompt` as sequence `id`, finishes it (its full blocks stay cached), and checks
  // the bytes on the way.
  void compute_and_finish(SequenceId id, const std::vector<TokenId>& prompt) {
    Status appended;
    auto hit = add_and_prefill(id, prompt, &appended);
    ASSERT_OK(hit);
    ASSERT_OK(appended);
    EXPECT_EQ(check_gather(id), "");
    ASSERT_OK(cache_->finish(id));
    ref_.erase(id);
    invariants();
  }

  // The first cache: computes `p_`, then enough other prompts to push it through both groups'
  // host tiers into their stores, and waits for the write-backs.
  void write_p_to_storage() {
    ASSERT_NO_FATAL_FAILURE(open());
    ASSERT_NO_FATAL_FAILURE(compute_and_finish(1, p_));
    for (SequenceId id = 10; id < 15; ++id) {
      ASSERT_NO_FATAL_FAILURE(compute_and_finish(id, iota_tokens(96, 100000 * TokenId(id))));
    }
    ASSERT_OK(cache_->flush_storage());
    invariants();
    for (int32_t g = 0; g < 2; ++g) EXPECT_GE(puts(g), 6) << "group " << g;
  }

  // Adds `id` with `prompt` after a finished fetch; returns the hit and checks every layer's
  // bytes against the model.
  int64_t add_and_check(SequenceId id, const std::vector<TokenId>& prompt) {
    EXPECT_OK(cache_->flush_storage());
    EXPECT_EQ(cache_->storage_in_flight(), 0);
    invariants();
    Status appended;
    auto hit = add_and_prefill(id, prompt, &appended);
    EXPECT_OK(hit);
    EXPECT_OK(appended);
    EXPECT_EQ(check_gather(id), "");
    invariants();
    return hit.ok() ? *hit : -1;
  }

  int32_t full_window_ = 0;  // the "full" group's window (then every group has one)
  TempDir dirs_[2];
  std::vector<std::unique_ptr<StorageTier>> stores_;
  std::unique_ptr<OneShortStore> short_;
  const std::vector<TokenId> p_ = iota_tokens(96, 1000);  // six blocks
};
INSTANTIATE_TEST_SUITE_P(Backends, ModelCacheStorageTest, testing::runtime_backends(),
                         testing::backend_param_name);

// P2 shares P's first 64 tokens: the full group fetches those 4 blocks (its reach: 64), the
// window group the blocks its window at 64 needs ([32, 64): blocks 2 and 3). Then P itself: the
// full group fetches blocks 4 and 5, the window group its window at 95 ([63, 95): blocks 3..5)
// without block 3, already cached. The count is of the blocks on their way (each group's pages
// of them come along).
TEST_P(ModelCacheStorageTest, ARestartedCacheHitsWhatEachGroupFetched) {
  ASSERT_NO_FATAL_FAILURE(write_p_to_storage());
  ASSERT_NO_FATAL_FAILURE(open());
  std::vector<TokenId> p2(p_.begin(), p_.begin() + 64);
  const std::vector<TokenId> tail = iota_tokens(32, 5000);
  p2.insert(p2.end(), tail.begin(), tail.end());
  EXPECT_EQ(*cache_->fetch_from_storage(p2), 4);
  EXPECT_EQ(add_and_check(1, p2), 64);
  EXPECT_EQ(gets(0), 4);
  EXPECT_EQ(gets(1), 2);
  EXPECT_EQ(cache_->stats().storage_hit_blocks, 4);

  ASSERT_OK(cache_->finish(1));
  ref_.erase(1);
  EXPECT_EQ(*cache_->fetch_from_storage(p_), 2);
  EXPECT_EQ(add_and_check(2, p_), 95);
  EXPECT_EQ(gets(0), 6);
  EXPECT_EQ(gets(1), 4);
  EXPECT_EQ(cache_->stats().storage_hit_blocks, 6);
}

// Every group with a window: the wider one (48 tokens) owns the blocks. A restarted cache fetches
// what a prompt's windows need from both stores, and every layer reads the right bytes.
TEST_P(ModelCacheStorageTest, EveryGroupWindowedFetchesWhatTheWindowsNeed) {
  full_window_ = 48;
  ASSERT_NO_FATAL_FAILURE(write_p_to_storage());
  ASSERT_NO_FATAL_FAILURE(open());
  EXPECT_EQ(cache_->cache().full_group(), 0);
  const auto fetched = cache_->fetch_from_storage(p_);
  ASSERT_OK(fetched);
  EXPECT_GT(*fetched, 0);
  EXPECT_EQ(add_and_check(2, p_), 95);
  EXPECT_GT(gets(0), 0);
  EXPECT_GT(gets(1), 0);
}

// The fetches start from the group that owns the blocks: without its store nothing of a prompt
// is reachable, so a model whose owner group has no store is refused.
TEST_P(ModelCacheStorageTest, TheGroupThatOwnsTheBlocksNeedsAStore) {
  ASSERT_NO_FATAL_FAILURE(write_p_to_storage());
  cache_.reset();
  ModelKvCacheOptions o;
  o.storage = {nullptr, stores_[1].get()};
  CacheConfig c_config = model();
  c_config.backend = kind();
  auto c = ModelKvCache::create(c_config, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("owns the blocks"), std::string::npos)
      << c.status().message();
}

// A window store missing one of the three blocks the window needs (the one plane asks it per
// key, and it answers none): the window group fetches nothing it needs (a window with a hole is
// no hit), the full group its six; the hit is then what the window group already has: nothing.
TEST_P(ModelCacheStorageTest, AWindowWithAHoleInTheStoreIsNotFetched) {
  ASSERT_NO_FATAL_FAILURE(write_p_to_storage());
  ASSERT_NO_FATAL_FAILURE(open(/*window_one_short=*/true));
  EXPECT_EQ(*cache_->fetch_from_storage(p_), 6);
  EXPECT_EQ(add_and_check(1, p_), 0);
  EXPECT_EQ(gets(1), 0);
  EXPECT_EQ(cache_->group_stats(1)->host.free_blocks, 6) << "no window host page was kept";
}

// One store for two groups, or two stores of one layout fingerprint, is refused by name.
TEST_P(ModelCacheStorageTest, GroupsMayNotShareAStoreOrAKeySpace) {
  CacheConfig same_shape = model();
  same_shape.groups[1].num_kv_heads = same_shape.groups[0].num_kv_heads;
  same_shape.groups[1].head_dim = same_shape.groups[0].head_dim;
  std::vector<std::unique_ptr<StorageTier>> stores;
  for (const char* id : {"model", "model", "model/window"}) {
    FileTierOptions fo;
    fo.directory = dirs_[0].path();
    stores.push_back(
        std::move(make_file_tier(StorageLayout::from_config(same_shape.group_config(1), id), fo))
            .value());
  }
  ModelKvCacheOptions o;
  for (const auto& [a, b, text] :
       {std::tuple{0, 0, "has the same store"}, std::tuple{0, 1, "a store of the same layout"}}) {
    o.storage = {stores[static_cast<size_t>(a)].get(), stores[static_cast<size_t>(b)].get()};
    auto c = ModelKvCache::create(same_shape, o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(text), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("storage (group 1): group 0 "), std::string::npos)
        << c.status().message();
  }
  o.storage = {stores[0].get(), stores[2].get()};
  make(same_shape, o);  // stores with their own model ids
  ASSERT_FALSE(HasFatalFailure());
  cache_.reset();  // before the stores
}

}  // namespace
}  // namespace pagedkv
