#include "engine.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <utility>

#include "pagedkv/cache.hpp"
#include "pagedkv/model_cache.hpp"
#include "pagedkv/stats_fields.hpp"
#include "pagedkv/storage_tier.hpp"
#include "workload.hpp"

namespace pagedkv {
namespace sim {

namespace {

// Random finite fp16 rows (never zeros) for writes: `tokens` x the widest row of any group,
// uploaded once.
StatusOr<void*> make_scratch(Backend& backend, Stream stream, const CacheConfig& config,
                             int64_t max_tokens) {
  size_t row = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const CacheConfig c = config.group_config(g);
    row = std::max(row, static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(c.head_dim));
  }
  const size_t elems = static_cast<size_t>(std::max<int64_t>(max_tokens, 1)) * row;
  PAGEDKV_ASSIGN_OR_RETURN(void* scratch, backend.allocate_device(elems * 2));
  std::vector<uint16_t> host(elems);
  Rng rng(0x5eed);
  for (uint16_t& h : host)
    h = float_to_half_bits(static_cast<float>(rng.uniform() * 2.0 - 1.0) + 0.001f);
  Status s = backend.copy_async(scratch, host.data(), elems * 2, CopyKind::kHostToDevice, stream);
  if (s.ok()) s = backend.synchronize_stream(stream);
  if (!s.ok()) {
    backend.free_device(scratch);
    return s;
  }
  return scratch;
}

// A KvCache of one group (a model of several groups goes through ModelCacheEngine).
class CacheEngine final : public Engine {
 public:
  CacheEngine(std::unique_ptr<StorageTier> store, std::unique_ptr<KvCache> cache, void* scratch)
      : store_(std::move(store)), cache_(std::move(cache)), scratch_(scratch) {}
  ~CacheEngine() override {
    cache_->synchronize().ignore_error();
    if (scratch_ != nullptr) cache_->backend().free_device(scratch_);
    cache_.reset();  // before the store it writes back to
  }

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    return cache_->add_sequence(id, prompt, options);
  }
  StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                       const SequenceOptions& options) override {
    if (store_ == nullptr) return int64_t{0};
    PAGEDKV_ASSIGN_OR_RETURN(int64_t n, cache_->fetch_from_storage(prompt, options));
    if (n > 0) PAGEDKV_RETURN_IF_ERROR(cache_->flush_storage());
    return n;
  }
  Status reserve(SequenceId id, int64_t n) override { return cache_->reserve(id, n).status(); }
  Status write(SequenceId id) override {
    if (scratch_ == nullptr) return ok_status();  // the null backend: nothing to write
    // Keys and values of every layer come from the same scratch rows: the simulator measures
    // where bytes go and how long moving them takes, not what they are (the runtime tests
    // check the bytes). A latent (MLA) cache takes keys only.
    const int32_t layers = cache_->config().num_layers;
    const void* value = cache_->config().kv_kind == KvKind::kLatent ? nullptr : scratch_;
    for (int32_t layer = 0; layer < layers; ++layer)
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv(id, layer, scratch_, value, DType::kFloat16));
    return ok_status();
  }
  Status commit(SequenceId id, const std::vector<TokenId>& tokens) override {
    return cache_->commit(id, tokens);
  }
  Status rollback(SequenceId id, int64_t length) override { return cache_->rollback(id, length); }
  Status fork(SequenceId parent, SequenceId child) override { return cache_->fork(parent, child); }
  Status finish(SequenceId id) override { return cache_->finish(id); }
  Status erase(SequenceId id) override { return cache_->erase(id); }
  Status set_active(const std::vector<SequenceId>& ids) override { return cache_->set_active(ids); }
  Status build_batch(const std::vector<SequenceId>& ids) override {
    // Events are not used by the simulator; draining them keeps their memory bounded.
    cache_->drain_events();
    return cache_->build_batch(ids).status();
  }
  Status synchronize() override { return cache_->synchronize(); }
  std::vector<SequenceId> drain_evicted() override { return cache_->drain_evicted_sequences(); }
  ControlStats stats() const override { return cache_->stats(); }
  Status check_invariants() const override { return cache_->check_invariants(); }
  std::string description() const override { return cache_->backend().description(); }
  bool has_data() const override { return cache_->backend().kind() != BackendKind::kNull; }
  double device_alloc_ms() const override { return cache_->pool_info().device_alloc_ms; }
  double host_alloc_ms() const override { return cache_->pool_info().host_alloc_ms; }

 private:
  std::unique_ptr<StorageTier> store_;  // null without --storage-dir
  std::unique_ptr<KvCache> cache_;
  void* scratch_;  // null on the null backend
};

// A model cache: a ModelKvCache (several KV groups, one backend), its groups sharing the logical
// blocks where it can. No storage tier.
class ModelCacheEngine final : public Engine {
 public:
  ModelCacheEngine(std::unique_ptr<ModelKvCache> cache, void* scratch)
      : cache_(std::move(cache)), scratch_(scratch) {}
  ~ModelCacheEngine() override {
    cache_->synchronize().ignore_error();
    if (scratch_ != nullptr) cache_->group(0).backend().free_device(scratch_);
  }

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    return cache_->add_sequence(id, prompt, options);
  }
  Status reserve(SequenceId id, int64_t n) override { return cache_->reserve(id, n).status(); }
  Status write(SequenceId id) override {
    if (scratch_ == nullptr) return ok_status();  // the null backend: nothing to write
    for (int32_t layer = 0; layer < cache_->config().num_layers; ++layer) {
      PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, cache_->layer_group(layer));
      const bool latent = cache_->group_config(lg.group).kv_kind == KvKind::kLatent;
      PAGEDKV_RETURN_IF_ERROR(
          cache_->write_kv(id, layer, scratch_, latent ? nullptr : scratch_, DType::kFloat16));
    }
    return ok_status();
  }
  Status commit(SequenceId id, const std::vector<TokenId>& tokens) override {
    return cache_->commit(id, tokens);
  }
  Status rollback(SequenceId id, int64_t length) override { return cache_->rollback(id, length); }
  Status fork(SequenceId parent, SequenceId child) override { return cache_->fork(parent, child); }
  Status finish(SequenceId id) override { return cache_->finish(id); }
  Status erase(SequenceId id) override { return cache_->erase(id); }
  Status set_active(const std::vector<SequenceId>& ids) override { return cache_->set_active(ids); }
  Status build_batch(const std::vector<SequenceId>& ids) override {
    cache_->drain_events();
    return cache_->build_batch(ids).status();
  }
  Status synchronize() override { return cache_->synchronize(); }
  std::vector<SequenceId> drain_evicted() override { return cache_->drain_evicted_sequences(); }
  ControlStats stats() const override {
    if (cache_->shares_blocks()) return cache_->group(0).stats();
    std::vector<ControlStats> g;
    for (int32_t i = 0; i < cache_->num_groups(); ++i) g.push_back(cache_->group(i).stats());
    return merge_group_stats(g);
  }
  std::optional<ControlStats> group_stats(int32_t g) const override {
    if (!cache_->shares_blocks()) return cache_->group(g).stats();
    // The plane counts the full group's blocks; a window group's pages it plans itself.
    if (g == cache_->group(0).full_group()) return cache_->group(0).stats();
    return std::nullopt;
  }
  Status check_invariants() const override { return cache_->check_invariants(); }
  std::string description() const override {
    return cache_->group(0).backend().description() +
           (cache_->shares_blocks() ? "" : " (one cache per KV group)");
  }
  bool has_data() const override { return scratch_ != nullptr; }
  double device_alloc_ms() const override { return sum_pools(&PoolInfo::device_alloc_ms); }
  double host_alloc_ms() const override { return sum_pools(&PoolInfo::host_alloc_ms); }

 private:
  double sum_pools(double PoolInfo::*field) const {
    // With shared blocks group(g) is the one cache, whose pool_info() sums the groups.
    if (cache_->shares_blocks()) return cache_->group(0).pool_info().*field;
    double ms = 0;
    for (int32_t g = 0; g < cache_->num_groups(); ++g) ms += cache_->group(g).pool_info().*field;
    return ms;
  }

  std::unique_ptr<ModelKvCache> cache_;
  void* scratch_;  // null on the null backend
};

}  // namespace

StatusOr<std::unique_ptr<ModelKvCache>> make_model_cache(const CacheConfig& config) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  ModelKvCacheOptions options;
  options.cache.enable_events = false;
  options.share_blocks = true;
  StatusOr<std::unique_ptr<ModelKvCache>> shared = ModelKvCache::create(config, options);
  if (shared.ok() || (shared.status().code() != StatusCode::kInvalidArgument &&
                      shared.status().code() != StatusCode::kUnimplemented)) {
    return shared;
  }
  // The shared plane refuses a shape it does not take yet before allocating anything.
  options.share_blocks = false;
  return ModelKvCache::create(config, options);
}

StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage) {
  const bool data = config.backend != BackendKind::kNull;
  if (!config.groups.empty()) {
    if (!storage.directory.empty()) {
      return invalid_argument(
          "--storage-dir: a model of several KV groups has no storage tier in pagedkv-sim "
          "(window caches refuse one)");
    }
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<ModelKvCache> cache, make_model_cache(config));
    void* scratch = nullptr;
    if (data) {
      PAGEDKV_ASSIGN_OR_RETURN(scratch, make_scratch(cache->group(0).backend(),
                                                     cache->compute_stream(), config, max_tokens));
    }
    return std::unique_ptr<Engine>(new ModelCacheEngine(std::move(cache), scratch));
  }
  std::unique_ptr<StorageTier> store;
  KvCacheOptions cache_options;
  cache_options.enable_events = false;
  if (!storage.directory.empty()) {
    FileTierOptions fo;
    fo.directory = storage.directory;
    fo.max_bytes = storage.max_bytes;
    PAGEDKV_ASSIGN_OR_RETURN(
        store, make_file_tier(StorageLayout::from_config(config, storage.model_id), fo));
    cache_options.storage = store.get();
  }
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::create(config, cache_options));
  void* scratch = nullptr;
  if (data) {
    PAGEDKV_ASSIGN_OR_RETURN(
        scratch, make_scratch(cache->backend(), cache->compute_stream(), config, max_tokens));
  }
  return std::unique_ptr<Engine>(new CacheEngine(std::move(store), std::move(cache), scratch));
}

StatusOr<std::unique_ptr<Engine>> make_no_data_engine(const CacheConfig& config) {
  CacheConfig c = config;
  c.backend = BackendKind::kNull;
  return make_cache_engine(c, 0);
}

ControlStats merge_group_stats(const std::vector<ControlStats>& groups) {
  if (groups.size() == 1) return groups.front();
  // Counted once per sequence or prompt lookup in every group: the model's count is the
  // largest group's.
  static const char* const kPerSequence[] = {
      "sequences",         "active_sequences",    "offloaded_sequences",
      "prefix_queries",    "prefix_query_tokens", "prefix_hit_tokens",
      "prefix_hit_blocks", "prefix_miss_blocks",  "prefix_host_hit_blocks",
      "sequences_evicted", "sequences_offloaded", "sequences_restored"};
  ControlStats out;
  std::vector<int64_t*> fields;
  for_each_stat(out, [&fields](const std::string&, int64_t& v) { fields.push_back(&v); });
  const std::array<StatInfo, kNumStats>& infos = stat_infos();
  for (const ControlStats& g : groups) {
    const std::array<int64_t, kNumStats> values = stat_values(g);
    for (size_t i = 0; i < kNumStats; ++i) {
      const bool per_sequence = std::find(std::begin(kPerSequence), std::end(kPerSequence),
                                          infos[i].name) != std::end(kPerSequence);
      *fields[i] = per_sequence ? std::max(*fields[i], values[i]) : *fields[i] + values[i];
    }
  }
  return out;
}

}  // namespace sim
}  // namespace pagedkv
