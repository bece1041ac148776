// The cache the simulator drives: a KvCache (control plane, kernels, both tiers) on the
// config's backend. For --no-data that backend is the null one (BackendKind::kNull: copies and
// kernels dropped, pools that cost no memory), so the decisions are the cache's own and an
// operator can plan a full-size model and pool on a laptop. A model of several KV groups
// (CacheConfig::groups: sliding-window and full-attention layers) is a ModelKvCache, whose
// groups share the logical blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

class ModelKvCache;
class StorageTier;

namespace sim {

/// The calls the scheduler makes; each mirrors the KvCache method of the same name.
class Engine {
 public:
  virtual ~Engine() = default;

  virtual StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                         const SequenceOptions& options) = 0;
  /// Brings the blocks a storage tier holds after `prompt`'s cached prefix into the host tier
  /// and waits for them (the simulated scheduler admits a request once its blocks arrived);
  /// returns the blocks fetched. 0 without a storage tier.
  virtual StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                               const SequenceOptions& options) {
    (void)prompt;
    (void)options;
    return int64_t{0};
  }
  /// Reserves `n` slots (restoring the sequence, offloading others, as the cache decides).
  virtual Status reserve(SequenceId id, int64_t n) = 0;
  /// Queues the K/V writes of the reserved tokens into every layer (no-op without data).
  virtual Status write(SequenceId id) = 0;
  virtual Status commit(SequenceId id, const std::vector<TokenId>& tokens) = 0;
  virtual Status rollback(SequenceId id, int64_t length) = 0;
  virtual Status fork(SequenceId parent, SequenceId child) = 0;
  virtual Status finish(SequenceId id) = 0;
  virtual Status erase(SequenceId id) = 0;
  virtual Status set_active(const std::vector<SequenceId>& ids) = 0;
  /// Builds (and, with data, uploads) the step's batch metadata.
  virtual Status build_batch(const std::vector<SequenceId>& ids) = 0;
  /// Waits for queued kernels and transfers (no-op without data).
  virtual Status synchronize() = 0;
  /// Sequences the cache dropped to make room since the last call.
  virtual std::vector<SequenceId> drain_evicted() = 0;
  /// The cache's counts (with several groups, the blocks are the owner group's).
  virtual ControlStats stats() const = 0;
  /// The counts of group `g`: its own pools' pages, at its own page size (KvCache::group_stats).
  virtual ControlStats group_stats(int32_t g) const {
    (void)g;
    return stats();
  }
  /// The group whose blocks every other group's pages follow: its pool bounds admission; the
  /// others' pages the cache's planner finds itself (offloading, dropping or refusing).
  virtual int32_t owner_group() const { return 0; }
  virtual Status check_invariants() const = 0;
  /// "cpu: ..." / "cuda: ..." / "null: ..." (--no-data).
  virtual std::string description() const = 0;
  /// Whether KV bytes are written and moved (false on the null backend).
  virtual bool has_data() const = 0;
  /// Milliseconds the device and host pools took to allocate (0 without data).
  virtual double device_alloc_ms() const = 0;
  virtual double host_alloc_ms() const = 0;
};

/// Where a cache engine keeps its storage tier (docs/storage.md): a FileTier directory.
struct StorageOptions {
  std::string directory;  // empty: no storage tier
  int64_t max_bytes = 0;  // the store's size bound (0: none)
  std::string model_id = "pagedkv-sim";
};

/// A KvCache on `config.backend` (a ModelKvCache when `config` has groups, with a FileTier per
/// group in DIR/group<g> when `storage` names a directory); writes come from a scratch buffer
/// of `max_tokens` tokens, and none are made on the null backend.
StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage = {},
                                                    int32_t tp_size = 1);

/// The model cache make_cache_engine drives for a config with groups (also takes one without),
/// with `stores` (empty, or one per group) as its storage tiers. Events off.
/// kInvalidArgument for a bad config or a shape the one cache does not hold yet.
StatusOr<std::unique_ptr<ModelKvCache>> make_model_cache(
    const CacheConfig& config, const std::vector<StorageTier*>& stores = {}, int32_t tp_size = 1);

/// make_cache_engine on the null backend (--no-data): the cache's decisions, no KV bytes. With
/// `tp_size` > 1, one control plane over that many null-backend pools, each of its share of the
/// heads (KvCacheOptions::tp_size).
StatusOr<std::unique_ptr<Engine>> make_no_data_engine(const CacheConfig& config,
                                                      int32_t tp_size = 1);

}  // namespace sim
}  // namespace pagedkv
