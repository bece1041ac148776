#include "engine.hpp"

#include <utility>

#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/storage_tier.hpp"
#include "workload.hpp"

namespace pagedkv {
namespace sim {

namespace {

class CacheEngine final : public Engine {
 public:
  CacheEngine(std::unique_ptr<StorageTier> store, std::unique_ptr<KvCache> cache, void* scratch)
      : store_(std::move(store)), cache_(std::move(cache)), scratch_(scratch) {}
  ~CacheEngine() override {
    cache_->synchronize().ignore_error();
    cache_->backend().free_device(scratch_);
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
    // Keys and values of every layer come from the same scratch rows: the simulator measures
    // where bytes go and how long moving them takes, not what they are (the runtime tests
    // check the bytes).
    const int32_t layers = cache_->config().num_layers;
    for (int32_t layer = 0; layer < layers; ++layer)
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv(id, layer, scratch_, scratch_, DType::kFloat16));
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
  bool has_data() const override { return true; }
  double device_alloc_ms() const override { return cache_->pool_info().device_alloc_ms; }
  double host_alloc_ms() const override { return cache_->pool_info().host_alloc_ms; }

 private:
  std::unique_ptr<StorageTier> store_;  // null without --storage-dir
  std::unique_ptr<KvCache> cache_;
  void* scratch_;
};

class ControlEngine final : public Engine {
 public:
  explicit ControlEngine(std::unique_ptr<core::ControlPlane> cp) : cp_(std::move(cp)) {}

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    return cp_->add_sequence(id, prompt, options);
  }
  Status reserve(SequenceId id, int64_t n) override {
    result_.transfers = Transfers{};
    result_.slots.clear();
    PAGEDKV_RETURN_IF_ERROR(cp_->reserve_into(id, n, &result_));
    evicted_.insert(evicted_.end(), result_.transfers.evicted.begin(),
                    result_.transfers.evicted.end());
    return ok_status();
  }
  Status write(SequenceId) override { return ok_status(); }
  Status commit(SequenceId id, const std::vector<TokenId>& tokens) override {
    return cp_->commit(id, tokens);
  }
  Status rollback(SequenceId id, int64_t length) override { return cp_->rollback(id, length); }
  Status fork(SequenceId parent, SequenceId child) override { return cp_->fork(parent, child); }
  Status finish(SequenceId id) override { return cp_->finish(id); }
  Status erase(SequenceId id) override { return cp_->erase(id); }
  Status set_active(const std::vector<SequenceId>& ids) override { return cp_->set_active(ids); }
  Status build_batch(const std::vector<SequenceId>& ids) override {
    return cp_->build_batch(ids).status();
  }
  Status synchronize() override { return ok_status(); }
  std::vector<SequenceId> drain_evicted() override { return std::exchange(evicted_, {}); }
  ControlStats stats() const override { return cp_->stats(); }
  Status check_invariants() const override { return cp_->check_invariants(); }
  std::string description() const override {
    return "none (--no-data: control plane only, no KV bytes)";
  }
  bool has_data() const override { return false; }
  double device_alloc_ms() const override { return 0; }
  double host_alloc_ms() const override { return 0; }

 private:
  std::unique_ptr<core::ControlPlane> cp_;
  ReserveResult result_;
  std::vector<SequenceId> evicted_;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage) {
  std::unique_ptr<StorageTier> store;
  KvCacheOptions cache_options;
  if (!storage.directory.empty()) {
    FileTierOptions fo;
    fo.directory = storage.directory;
    fo.max_bytes = storage.max_bytes;
    PAGEDKV_ASSIGN_OR_RETURN(
        store, make_file_tier(StorageLayout::from_config(config, storage.model_id), fo));
    cache_options.storage = store.get();
  }
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::create(config, cache_options));
  const size_t elems = static_cast<size_t>(std::max<int64_t>(max_tokens, 1)) *
                       static_cast<size_t>(config.num_kv_heads) *
                       static_cast<size_t>(config.head_dim);
  PAGEDKV_ASSIGN_OR_RETURN(void* scratch, cache->backend().allocate_device(elems * 2));
  // Random finite fp16 values (never zeros), uploaded once.
  std::vector<uint16_t> host(elems);
  Rng rng(0x5eed);
  for (uint16_t& h : host)
    h = float_to_half_bits(static_cast<float>(rng.uniform() * 2.0 - 1.0) + 0.001f);
  Status s = cache->backend().copy_async(scratch, host.data(), elems * 2, CopyKind::kHostToDevice,
                                         cache->compute_stream());
  if (s.ok()) s = cache->synchronize();
  if (!s.ok()) {
    cache->backend().free_device(scratch);
    return s;
  }
  return std::unique_ptr<Engine>(new CacheEngine(std::move(store), std::move(cache), scratch));
}

StatusOr<std::unique_ptr<Engine>> make_control_engine(const CacheConfig& config) {
  core::ControlOptions options;
  options.enable_events = false;
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<core::ControlPlane> cp,
                           core::ControlPlane::create(config, options));
  return std::unique_ptr<Engine>(new ControlEngine(std::move(cp)));
}

}  // namespace sim
}  // namespace pagedkv
