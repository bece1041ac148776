#include "engine.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>

#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/model_cache.hpp"
#include "pagedkv/stats_fields.hpp"
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
    // A latent (MLA) cache takes keys only.
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
  bool has_data() const override { return true; }
  double device_alloc_ms() const override { return cache_->pool_info().device_alloc_ms; }
  double host_alloc_ms() const override { return cache_->pool_info().host_alloc_ms; }

 private:
  std::unique_ptr<StorageTier> store_;  // null without --storage-dir
  std::unique_ptr<KvCache> cache_;
  void* scratch_;
};

// A model cache: a ModelKvCache (several KV groups, one backend). No storage tier (window
// caches refuse one).
class ModelCacheEngine final : public Engine {
 public:
  ModelCacheEngine(std::unique_ptr<ModelKvCache> cache, void* scratch)
      : cache_(std::move(cache)), scratch_(scratch) {}
  ~ModelCacheEngine() override {
    cache_->synchronize().ignore_error();
    cache_->group(0).backend().free_device(scratch_);
  }

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    return cache_->add_sequence(id, prompt, options);
  }
  Status reserve(SequenceId id, int64_t n) override { return cache_->reserve(id, n).status(); }
  Status write(SequenceId id) override {
    for (int32_t layer = 0; layer < cache_->config().num_layers; ++layer) {
      PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, cache_->layer_group(layer));
      const bool latent = cache_->group(lg.group).config().kv_kind == KvKind::kLatent;
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
    for (int32_t g = 0; g < cache_->num_groups(); ++g) cache_->group(g).drain_events();
    return cache_->build_batch(ids).status();
  }
  Status synchronize() override { return cache_->synchronize(); }
  std::vector<SequenceId> drain_evicted() override { return cache_->drain_evicted_sequences(); }
  ControlStats stats() const override {
    std::vector<ControlStats> g;
    for (int32_t i = 0; i < cache_->num_groups(); ++i) g.push_back(cache_->group(i).stats());
    return merge_group_stats(g);
  }
  int32_t num_groups() const override { return cache_->num_groups(); }
  ControlStats group_stats(int32_t g) const override { return cache_->group(g).stats(); }
  Status check_invariants() const override { return cache_->check_invariants(); }
  std::string description() const override { return cache_->group(0).backend().description(); }
  bool has_data() const override { return true; }
  double device_alloc_ms() const override {
    double ms = 0;
    for (int32_t g = 0; g < cache_->num_groups(); ++g)
      ms += cache_->group(g).pool_info().device_alloc_ms;
    return ms;
  }
  double host_alloc_ms() const override {
    double ms = 0;
    for (int32_t g = 0; g < cache_->num_groups(); ++g)
      ms += cache_->group(g).pool_info().host_alloc_ms;
    return ms;
  }

 private:
  std::unique_ptr<ModelKvCache> cache_;
  void* scratch_;
};

// The control plane alone: one core::ControlPlane per group, kept in step as ModelKvCache keeps
// its groups' caches (the same sequences, lengths and reservations; the prefix every group can
// supply; a sequence one group drops is erased from all).
class ControlEngine final : public Engine {
 public:
  ControlEngine(std::vector<std::unique_ptr<core::ControlPlane>> planes)
      : planes_(std::move(planes)) {}

  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options) override {
    if (planes_.size() == 1) return planes_[0]->add_sequence(id, prompt, options);
    // The longest prefix every group can supply: each answers the longest it can up to the
    // bound, which only falls, until all agree (a window group's usable lengths have gaps).
    int64_t agreed = static_cast<int64_t>(prompt.size());
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& cp : planes_) {
        PAGEDKV_ASSIGN_OR_RETURN(int64_t c, cp->cached_prefix(prompt, options.ns, agreed));
        changed |= c < agreed;
        agreed = std::min(agreed, c);
      }
    }
    for (size_t g = 0; g < planes_.size(); ++g) {
      StatusOr<int64_t> c = planes_[g]->add_sequence(id, prompt, options, agreed);
      if (c.ok() && *c == agreed) continue;
      for (size_t h = 0; h <= g; ++h) (void)planes_[h]->erase(id);
      if (!c.ok()) return c.status();
      return internal_error("group " + std::to_string(g) + " shared " + std::to_string(*c) +
                            " tokens, not the agreed " + std::to_string(agreed));
    }
    return agreed;
  }
  Status reserve(SequenceId id, int64_t n) override {
    for (size_t g = 0; g < planes_.size(); ++g) {
      result_.transfers = Transfers{};
      result_.slots.clear();
      const Status st = planes_[g]->reserve_into(id, n, &result_);
      take_evicted();
      if (!st.ok()) {
        // Groups that went ahead drop the reservation (the same length: only that goes).
        for (size_t h = 0; h < g; ++h) {
          StatusOr<int64_t> len = planes_[h]->length(id);
          if (len.ok()) (void)planes_[h]->rollback(id, *len);
        }
        return st;
      }
    }
    return ok_status();
  }
  Status write(SequenceId) override { return ok_status(); }
  Status commit(SequenceId id, const std::vector<TokenId>& tokens) override {
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->commit(id, tokens));
    return ok_status();
  }
  Status rollback(SequenceId id, int64_t length) override {
    if (planes_.size() > 1) PAGEDKV_RETURN_IF_ERROR(check_rollback(id, length));
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->rollback(id, length));
    return ok_status();
  }
  Status fork(SequenceId parent, SequenceId child) override {
    for (size_t g = 0; g < planes_.size(); ++g) {
      const Status st = planes_[g]->fork(parent, child);
      if (!st.ok()) {
        for (size_t h = 0; h < g; ++h) (void)planes_[h]->erase(child);
        return st;
      }
    }
    return ok_status();
  }
  Status finish(SequenceId id) override {
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->finish(id));
    return ok_status();
  }
  Status erase(SequenceId id) override {
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->erase(id));
    return ok_status();
  }
  Status set_active(const std::vector<SequenceId>& ids) override {
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->set_active(ids));
    return ok_status();
  }
  Status build_batch(const std::vector<SequenceId>& ids) override {
    for (auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->build_batch(ids).status());
    return ok_status();
  }
  Status synchronize() override { return ok_status(); }
  std::vector<SequenceId> drain_evicted() override { return std::exchange(evicted_, {}); }
  ControlStats stats() const override {
    if (planes_.size() == 1) return planes_[0]->stats();
    std::vector<ControlStats> g;
    for (const auto& cp : planes_) g.push_back(cp->stats());
    return merge_group_stats(g);
  }
  int32_t num_groups() const override { return static_cast<int32_t>(planes_.size()); }
  ControlStats group_stats(int32_t g) const override {
    return planes_[static_cast<size_t>(g)]->stats();
  }
  Status check_invariants() const override {
    for (const auto& cp : planes_) PAGEDKV_RETURN_IF_ERROR(cp->check_invariants());
    for (const auto& cp : planes_) {
      if (cp->stats().sequences != planes_[0]->stats().sequences)
        return internal_error("invariant: the groups hold different numbers of sequences");
    }
    return ok_status();
  }
  std::string description() const override {
    return "none (--no-data: control plane only, no KV bytes)";
  }
  bool has_data() const override { return false; }
  double device_alloc_ms() const override { return 0; }
  double host_alloc_ms() const override { return 0; }

 private:
  // The sequences the last reserve dropped: gone from every group (one group's planner chose
  // them, the others still hold them).
  void take_evicted() {
    for (SequenceId id : result_.transfers.evicted) {
      if (planes_.size() > 1) {
        if (std::find(evicted_.begin(), evicted_.end(), id) != evicted_.end()) continue;
        for (auto& cp : planes_)
          if (cp->contains(id)) (void)cp->erase(id);
      }
      evicted_.push_back(id);
    }
  }
  // Ok when every window group still holds what `length` tokens need (ModelKvCache's check),
  // so a refused rollback changes no group.
  Status check_rollback(SequenceId id, int64_t length) const {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, planes_[0]->length(id));
    if (length <= 0 || length > len) return ok_status();  // the planes check the range
    for (const auto& cp : planes_) {
      const CacheConfig& c = cp->config();
      if (c.sliding_window == 0) continue;
      PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, cp->block_locations(id));
      const int64_t first = std::max<int64_t>(0, length - c.sliding_window) / c.block_size;
      if (blocks[static_cast<size_t>(first)].block < 0)
        return failed_precondition("rollback: a window group no longer holds token " +
                                   std::to_string(first * c.block_size) + " of sequence " +
                                   std::to_string(id));
    }
    return ok_status();
  }

  std::vector<std::unique_ptr<core::ControlPlane>> planes_;
  ReserveResult result_;
  std::vector<SequenceId> evicted_;
};

// Scratch rows for writes: `tokens` x the widest row of any group, random finite fp16 values
// (never zeros), uploaded once.
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

}  // namespace

StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage) {
  if (!config.groups.empty()) {
    if (!storage.directory.empty()) {
      return invalid_argument(
          "--storage-dir: a model of several KV groups has no storage tier in pagedkv-sim "
          "(window caches refuse one)");
    }
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<ModelKvCache> cache, ModelKvCache::create(config));
    KvCache& first = cache->group(0);
    PAGEDKV_ASSIGN_OR_RETURN(
        void* scratch, make_scratch(first.backend(), first.compute_stream(), config, max_tokens));
    return std::unique_ptr<Engine>(new ModelCacheEngine(std::move(cache), scratch));
  }
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
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  core::ControlOptions options;
  options.enable_events = false;
  std::vector<std::unique_ptr<core::ControlPlane>> planes;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<core::ControlPlane> cp,
                             core::ControlPlane::create(config.group_config(g), options));
    planes.push_back(std::move(cp));
  }
  return std::unique_ptr<Engine>(new ControlEngine(std::move(planes)));
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
