#include "engine.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>

#include "pagedkv/cache.hpp"
#include "pagedkv/model_cache.hpp"
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

// A model cache: a ModelKvCache (several KV groups over one set of logical blocks, one
// backend), with a FileTier per group when the run has a storage directory.
class ModelCacheEngine final : public Engine {
 public:
  ModelCacheEngine(std::vector<std::unique_ptr<StorageTier>> stores,
                   std::unique_ptr<ModelKvCache> cache, void* scratch)
      : stores_(std::move(stores)), cache_(std::move(cache)), scratch_(scratch) {}
  ~ModelCacheEngine() override {
    cache_->synchronize().ignore_error();
    if (scratch_ != nullptr) cache_->cache().backend().free_device(scratch_);
    cache_.reset();  // before the stores it writes back to
  }

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    return cache_->add_sequence(id, prompt, options);
  }
  StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                       const SequenceOptions& options) override {
    if (stores_.empty()) return int64_t{0};
    PAGEDKV_ASSIGN_OR_RETURN(int64_t n, cache_->fetch_from_storage(prompt, options));
    if (n > 0) PAGEDKV_RETURN_IF_ERROR(cache_->flush_storage());
    return n;
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
  ControlStats stats() const override { return cache_->stats(); }
  ControlStats group_stats(int32_t g) const override {
    StatusOr<ControlStats> st = cache_->group_stats(g);
    return st.ok() ? *st : ControlStats{};
  }
  int32_t owner_group() const override { return cache_->cache().full_group(); }
  Status check_invariants() const override { return cache_->check_invariants(); }
  std::string description() const override { return cache_->cache().backend().description(); }
  bool has_data() const override { return scratch_ != nullptr; }
  double device_alloc_ms() const override { return cache_->cache().pool_info().device_alloc_ms; }
  double host_alloc_ms() const override { return cache_->cache().pool_info().host_alloc_ms; }

 private:
  std::vector<std::unique_ptr<StorageTier>> stores_;  // one per group, or none
  std::unique_ptr<ModelKvCache> cache_;
  void* scratch_;  // null on the null backend
};

}  // namespace

StatusOr<std::unique_ptr<StorageTier>> make_store(const CacheConfig& group_config,
                                                  const StorageOptions& storage,
                                                  const std::string& subdirectory,
                                                  const std::string& model_id) {
  FileTierOptions fo;
  fo.directory = subdirectory.empty() ? storage.directory : storage.directory + "/" + subdirectory;
  fo.max_bytes = storage.max_bytes;
  return make_file_tier(StorageLayout::from_config(group_config, model_id), fo);
}

StatusOr<std::unique_ptr<ModelKvCache>> make_model_cache(const CacheConfig& config,
                                                         const std::vector<StorageTier*>& stores,
                                                         int32_t tp_size) {
  ModelKvCacheOptions options;
  options.cache.enable_events = false;
  options.cache.tp_size = tp_size;
  options.storage = stores;
  return ModelKvCache::create(config, options);
}

StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage,
                                                    int32_t tp_size) {
  const bool data = config.backend != BackendKind::kNull;
  if (data && tp_size != 1) {
    // The engine's writes fill one rank's pool from one scratch buffer.
    return unimplemented("tp: a tensor-parallel run has no KV bytes yet: add --no-data");
  }
  if (!config.groups.empty()) {
    PAGEDKV_RETURN_IF_ERROR(config.validate());
    // A store per group, in a directory of its own, with the group in its model id: the
    // groups' blocks of the same tokens are different bytes.
    std::vector<std::unique_ptr<StorageTier>> stores;
    std::vector<StorageTier*> store_ptrs;
    for (int32_t g = 0; g < config.num_groups() && !storage.directory.empty(); ++g) {
      const std::string name = "group" + std::to_string(g);
      PAGEDKV_ASSIGN_OR_RETURN(
          std::unique_ptr<StorageTier> store,
          make_store(config.group_config(g), storage, name, storage.model_id + "/" + name));
      store_ptrs.push_back(store.get());
      stores.push_back(std::move(store));
    }
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<ModelKvCache> cache,
                             make_model_cache(config, store_ptrs, tp_size));
    void* scratch = nullptr;
    if (data) {
      PAGEDKV_ASSIGN_OR_RETURN(scratch, make_scratch(cache->cache().backend(),
                                                     cache->compute_stream(), config, max_tokens));
    }
    return std::unique_ptr<Engine>(
        new ModelCacheEngine(std::move(stores), std::move(cache), scratch));
  }
  std::unique_ptr<StorageTier> store;
  KvCacheOptions cache_options;
  cache_options.enable_events = false;
  cache_options.tp_size = tp_size;
  if (!storage.directory.empty()) {
    PAGEDKV_ASSIGN_OR_RETURN(store, make_store(config, storage, "", storage.model_id));
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

StatusOr<std::unique_ptr<Engine>> make_no_data_engine(const CacheConfig& config, int32_t tp_size) {
  CacheConfig c = config;
  c.backend = BackendKind::kNull;
  return make_cache_engine(c, 0, {}, tp_size);
}

}  // namespace sim
}  // namespace pagedkv
