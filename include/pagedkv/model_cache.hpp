// ModelKvCache: the cache of a model whose layers form several KV groups (CacheConfig::groups):
// sliding-window layers next to full-attention ones (gpt-oss, Gemma 2/3), or an MLA latent
// group (DeepSeek V2/V3, Kimi). It is a KvCache (cache.hpp, "several KV groups") that holds
// every group over one set of logical blocks: one sequence table, prefix index, planner and
// undo journal for the model, so a call is decided once for all groups and a failed call
// changes no group. This class adds the model-level shapes on top: a batch as one DeviceBatch
// per group (ModelBatch), reserve's slots per group, and a store per group.
//
// A prefix hit counts as far as every group can supply it (all blocks for full attention, the
// blocks inside the window for a window group). The group that attends furthest back (no
// window, else the widest) owns the blocks; any number of window groups may be beside it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"

namespace pagedkv {

/// Options of a ModelKvCache: those of its KvCache (backend, streams, clock, events), and per
/// group an optional storage tier.
struct ModelKvCacheOptions {
  KvCacheOptions cache;  // `cache.storage` and `cache.group_storage` must be empty: use `storage`
  /// Empty, or one storage tier (or null) per group, in group order; each serves that group
  /// only, with that group's layout (KvCacheOptions::group_storage: the group that owns the
  /// blocks needs one). Two groups may not share a store, nor use stores of one layout
  /// fingerprint (a window group's block and a full group's block of the same tokens are
  /// different bytes under the same key): give each group's store its own model id.
  std::vector<StorageTier*> storage;
};

/// One step's batch metadata, one DeviceBatch per group (ModelKvCache::build_batch).
struct ModelBatch {
  std::vector<DeviceBatch> groups;
};

class ModelKvCache {
 public:
  /// Validates the config (groups or the one-group form) and creates the one KvCache that holds
  /// every group. kInvalidArgument names the group and field (also for a shape the one cache
  /// does not hold yet); kResourceExhausted when a pool cannot be had.
  static StatusOr<std::unique_ptr<ModelKvCache>> create(const CacheConfig& config,
                                                        ModelKvCacheOptions options = {});
  ~ModelKvCache();
  ModelKvCache(const ModelKvCache&) = delete;
  ModelKvCache& operator=(const ModelKvCache&) = delete;

  const CacheConfig& config() const { return config_; }
  int32_t num_groups() const { return config_.num_groups(); }
  /// The KvCache that holds every group, for what this class does not route (pools, regions,
  /// geometry). Its calls are the model's: a sequence changed there is changed here.
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  /// Group `g`'s one-group config (CacheConfig::group_config). Requires 0 <= g < num_groups().
  const CacheConfig& group_config(int32_t g) const { return cache_->group_config(g); }
  /// Group `g`'s device pool (requires 0 <= g < num_groups()).
  PoolRef device_pool(int32_t g) const { return cache_->device_pool(g); }
  /// The stream every group's kernels and uploads run on.
  Stream compute_stream() const { return cache_->compute_stream(); }
  /// The group and in-group index of a model layer. kOutOfRange.
  StatusOr<LayerGroup> layer_group(int32_t layer) const { return cache_->layer_group(layer); }

  // ---- sequences (the KvCache calls of the same names) ----

  /// Adds the sequence, sharing the longest prefix of `prompt` that every group can supply.
  /// Returns that length.
  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options = {});
  /// Reserves the next `n` tokens; returns each group's slots (in its own pool), by group.
  StatusOr<std::vector<std::vector<int64_t>>> reserve(SequenceId id, int64_t n);
  /// reserve() of `n_each` tokens for each of `ids`; build_batch gives each group's slots.
  Status reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each);
  /// Writes model layer `layer` of the reserved tokens into its group. A latent group takes
  /// keys only: `value` must be null there.
  Status write_kv(SequenceId id, int32_t layer, const void* key, const void* value,
                  DType input_dtype, int64_t row_stride = 0);
  /// KvCache::write_kv_batch of model layer `layer` through its group's batch.
  /// kInvalidArgument when `batch` has another number of groups or another cache built it.
  Status write_kv_batch(const ModelBatch& batch, int32_t layer, const void* key, const void* value,
                        DType input_dtype, int64_t row_stride = 0);
  /// KvCache::write_kv_batch_all_layers in group `g`: every layer of the group in one launch,
  /// `key`/`value` [group layers][tokens, kv_heads, head_dim] in the order CacheConfig::groups
  /// lists the group's layers (a latent group: keys only, `value` null). kOutOfRange for a group
  /// outside the model, kInvalidArgument for a batch write_kv_batch refuses.
  Status write_kv_batch_all_layers(const ModelBatch& batch, int32_t g, const void* key,
                                   const void* value, DType input_dtype, int64_t row_stride = 0,
                                   int64_t layer_stride = 0);
  Status commit(SequenceId id, const std::vector<TokenId>& tokens);
  Status commit_batch(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                      int64_t n_each = 1);
  /// Shortens the sequence. kFailedPrecondition, nothing changed, when a window group no
  /// longer holds what the shorter length needs.
  Status rollback(SequenceId id, int64_t length);
  Status fork(SequenceId parent, SequenceId child);
  Status finish(SequenceId id);
  Status erase(SequenceId id);
  Status set_active(const std::vector<SequenceId>& ids);
  Status set_priority(SequenceId id, int32_t priority);

  // ---- tiers (every group's pages move with their blocks; a window group's in its window) ----

  Status offload(SequenceId id);
  Status restore(SequenceId id);
  Status prefetch(const std::vector<SequenceId>& ids);
  StatusOr<SequenceResidency> residency(SequenceId id);
  /// Sequences dropped to make room since the last call.
  std::vector<SequenceId> drain_evicted_sequences();

  // ---- storage tiers (ModelKvCacheOptions::storage) ----

  /// KvCache::fetch_from_storage: the owner group's store gives the run of blocks after the
  /// cached prefix, every other group's store its pages of those blocks, and the hit counts as
  /// far as every group can supply it. Never waits.
  StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                       const SequenceOptions& options = {});
  Status poll_storage();
  /// Blocks fetched from storage that have not landed yet.
  int64_t storage_in_flight() const;
  Status flush_storage();

  // ---- reading ----

  /// One DeviceBatch per group (KvCache::build_batches).
  StatusOr<ModelBatch> build_batch(const std::vector<SequenceId>& ids,
                                   const BatchOptions& options = {});
  /// The device view of group `g` of a built batch (its sliding_window set for a window
  /// group). kOutOfRange for a bad group, kInvalidArgument for a batch of another model.
  StatusOr<device::PagedKvView> device_view(const ModelBatch& batch, int32_t g,
                                            KvScales scales = {}) const;
  /// KvCache::gather_layer of model layer `layer` (kOutOfRange for positions a window group no
  /// longer holds).
  Status gather_layer(SequenceId id, int32_t layer, void* key_out, void* value_out,
                      DType packed_dtype, PackedLayout packed_layout, int64_t position_begin = 0,
                      int64_t num_tokens = -1);
  Status synchronize() { return cache_->synchronize(); }

  // ---- queries ----

  bool contains(SequenceId id) const { return cache_->contains(id); }
  StatusOr<int64_t> length(SequenceId id) const { return cache_->length(id); }
  StatusOr<int64_t> pending(SequenceId id) const { return cache_->pending(id); }
  /// Blocks the sequence holds in group `g` (not those that fell out of its window).
  StatusOr<int64_t> held_blocks(SequenceId id, int32_t g) const {
    return cache_->held_blocks(id, g);
  }
  /// Tier and block (or page) of each of the sequence's blocks in group `g`, -1 for those out of
  /// a window group's window. kOutOfRange for a bad group, kNotFound.
  StatusOr<std::vector<BlockLocation>> block_locations(SequenceId id, int32_t g) const {
    return cache_->block_locations(id, g);
  }
  /// Bytes of the blocks the sequence holds over all groups, on whichever tier they are.
  StatusOr<int64_t> held_bytes(SequenceId id) const { return cache_->held_bytes(id); }
  /// The model's counters (KvCache::stats) and one group's (KvCache::group_stats).
  ControlStats stats() const { return cache_->stats(); }
  StatusOr<ControlStats> group_stats(int32_t g) const { return cache_->group_stats(g); }
  Status check_invariants() const { return cache_->check_invariants(); }

  // ---- events ----

  /// The model's control events since the last drain, oldest first, each with its group in
  /// ControlEvent::group (one stream for all groups; a kEventsDropped resync comes first).
  std::vector<ControlEvent> drain_events() { return cache_->drain_events(); }

 private:
  ModelKvCache() = default;
  // kOutOfRange for a group index outside [0, num_groups()).
  Status check_group(int32_t g) const;
  // kInvalidArgument for a batch of another number of groups, or one another cache built.
  Status check_batch(const ModelBatch& batch) const;

  CacheConfig config_;
  std::unique_ptr<KvCache> cache_;
};

}  // namespace pagedkv
