// ModelKvCache: the cache of a model whose layers form several KV groups (CacheConfig::groups):
// sliding-window layers next to full-attention ones (gpt-oss, Gemma 2/3), or an MLA latent
// group (DeepSeek V2/V3, Kimi). Each group has its own pools, page shape and window, and all of
// them share one backend and compute stream; this class keeps their sequences in step and
// routes each model layer to its group. Two ways to hold the groups:
//  - separate planes (the default): each group is a KvCache of its own, with its own sequence
//    table, prefix tree and planner, and group(g) is that cache;
//  - shared blocks (ModelKvCacheOptions::share_blocks; at least one full-attention or latent
//    group and up to three window groups, no storage tiers): one KvCache holds every group
//    (cache.hpp, "several KV groups"), so a sequence is looked up, planned and committed once for
//    all groups. The control part of a decode step then costs about 1.4x one group's instead
//    of 2.3x (docs/hybrid-models.md).
//
// A sequence lives in every group with the same committed length and reservation. A prefix hit
// counts only as far as every group can supply it (all blocks for full attention, the blocks
// inside the window for a window group). Calls check what they can before changing anything;
// where a group can refuse after another has gone ahead (out of device or host blocks), the
// call is taken back in the groups that went ahead, as each method says.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"

namespace pagedkv {

/// Options of a ModelKvCache: those of every group's KvCache (backend, streams, clock, events),
/// and per group an optional storage tier.
struct ModelKvCacheOptions {
  KvCacheOptions cache;  // `cache.storage` must be null: use `storage`
  /// Empty, or one storage tier (or null) per group, in group order; each serves that group
  /// only, with that group's layout. Two groups may not share a store, nor use stores of one
  /// layout fingerprint (a window group's block and a full group's block of the same tokens are
  /// different bytes under the same key): give each group's store its own model id.
  std::vector<StorageTier*> storage;
  /// Hold every group in one KvCache whose groups share the logical blocks (see the file
  /// comment). Needs a full-attention (or latent) group and at most three window groups, and no
  /// storage tier (kInvalidArgument, kUnimplemented). group(g) is then that one cache for every g:
  /// use this class's per-group calls (group_config, block_locations, device_view) for a group.
  bool share_blocks = false;
};

/// One step's batch metadata, one DeviceBatch per group (ModelKvCache::build_batch).
struct ModelBatch {
  std::vector<DeviceBatch> groups;
};

class ModelKvCache {
 public:
  /// Validates the config (groups or the one-group form) and creates one KvCache per group, or
  /// one for all of them with share_blocks.
  /// kInvalidArgument names the group and field; kResourceExhausted when a pool cannot be had.
  static StatusOr<std::unique_ptr<ModelKvCache>> create(const CacheConfig& config,
                                                        ModelKvCacheOptions options = {});
  ~ModelKvCache();
  ModelKvCache(const ModelKvCache&) = delete;
  ModelKvCache& operator=(const ModelKvCache&) = delete;

  const CacheConfig& config() const { return config_; }
  int32_t num_groups() const { return config_.num_groups(); }
  /// Whether the groups share one KvCache (ModelKvCacheOptions::share_blocks).
  bool shares_blocks() const { return shared_; }
  /// A group's cache, for what this class does not route (stats, pools). Calls that change
  /// sequences must go through the ModelKvCache, or the groups fall out of step; events drained
  /// here carry group 0 (use drain_events() for the group tag). With shared blocks, the one
  /// cache of every group.
  KvCache& group(int32_t g) { return *groups_[shared_ ? 0 : static_cast<size_t>(g)]; }
  const KvCache& group(int32_t g) const { return *groups_[shared_ ? 0 : static_cast<size_t>(g)]; }
  /// Group `g`'s one-group config (CacheConfig::group_config). Requires 0 <= g < num_groups().
  const CacheConfig& group_config(int32_t g) const {
    return group_configs_[static_cast<size_t>(g)];
  }
  /// Group `g`'s device pool (requires 0 <= g < num_groups()).
  PoolRef device_pool(int32_t g) const {
    return shared_ ? groups_.front()->device_pool(g) : group(g).device_pool();
  }
  /// The stream every group's kernels and uploads run on.
  Stream compute_stream() const { return groups_.front()->compute_stream(); }
  /// The group and in-group index of a model layer. kOutOfRange.
  StatusOr<LayerGroup> layer_group(int32_t layer) const;

  // ---- sequences ----

  /// Adds the sequence to every group, sharing the longest prefix of `prompt` that every group
  /// can supply. Returns that length (the committed length in every group).
  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options = {});
  /// Reserves the next `n` tokens in every group; returns each group's slots (in its own pool).
  /// When a group is out of blocks (kResourceExhausted), the reservation is dropped in every
  /// group (the sequence keeps its committed tokens; reserve again after freeing room);
  /// sequences the groups that went ahead offloaded stay offloaded (their data is kept).
  StatusOr<std::vector<std::vector<int64_t>>> reserve(SequenceId id, int64_t n);
  /// reserve() of `n_each` tokens for each of `ids`, one batched call per group; on
  /// kResourceExhausted the reservations of `ids` are dropped in every group.
  Status reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each);
  /// Writes model layer `layer` of the reserved tokens (KvCache::write_kv in its group). A
  /// latent group takes keys only: `value` must be null there.
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
  /// Commits in every group (checked in full first, so an error commits nothing).
  /// kFailedPrecondition when a group offloaded the sequence to make room after its reserve
  /// (groups pick their victims on their own): restore() it, then commit.
  Status commit(SequenceId id, const std::vector<TokenId>& tokens);
  Status commit_batch(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                      int64_t n_each = 1);
  /// Shortens the sequence in every group. kFailedPrecondition, nothing changed, when a window
  /// group no longer holds what the shorter length needs.
  Status rollback(SequenceId id, int64_t length);
  Status fork(SequenceId parent, SequenceId child);
  Status finish(SequenceId id);
  Status erase(SequenceId id);
  Status set_active(const std::vector<SequenceId>& ids);
  Status set_priority(SequenceId id, int32_t priority);

  // ---- tiers (each group moves its own blocks: a window group only those in its window) ----

  /// Offloads the sequence in every group; when a group refuses, the groups that went ahead
  /// restore it again and the error is returned.
  Status offload(SequenceId id);
  /// Restores the sequence in every group where it is offloaded. On kResourceExhausted the
  /// groups that went ahead stay restored; the sequence stays kHost until a later restore or
  /// reserve finishes the rest.
  Status restore(SequenceId id);
  Status prefetch(const std::vector<SequenceId>& ids);
  /// The least ready residency over the groups (kHost before kInFlight before kDevice).
  StatusOr<SequenceResidency> residency(SequenceId id);
  /// Sequences some group dropped to make room since the last call; they are erased from the
  /// other groups too, so they are gone from the model cache.
  std::vector<SequenceId> drain_evicted_sequences();

  // ---- storage tiers (ModelKvCacheOptions::storage) ----

  /// Starts bringing back from the groups' storage tiers what a prefix hit of `prompt` needs:
  /// the full-attention groups first, each fetching the blocks after its cached prefix, then
  /// the window groups, each fetching the blocks its window lacks for the longest hit the
  /// full-attention groups reach (all or none). Returns the blocks on their way over all
  /// groups. As KvCache::fetch_from_storage, it never waits: a scheduler that wants the hit
  /// waits for storage_in_flight() to drop before add_sequence. When a group's fetch fails, the
  /// error names it and the groups before it may have reads in flight, which land as prefix
  /// cache as usual.
  StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                       const SequenceOptions& options = {});
  /// KvCache::poll_storage in every group.
  Status poll_storage();
  /// Blocks fetched from storage that have not landed yet, over all groups.
  int64_t storage_in_flight() const;
  /// KvCache::flush_storage in every group.
  Status flush_storage();

  // ---- reading ----

  /// build_batch in every group.
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
  Status synchronize();

  // ---- queries ----

  bool contains(SequenceId id) const { return groups_.front()->contains(id); }
  StatusOr<int64_t> length(SequenceId id) const { return groups_.front()->length(id); }
  StatusOr<int64_t> pending(SequenceId id) const { return groups_.front()->pending(id); }
  /// Blocks the sequence holds in group `g` (not those that fell out of its window).
  StatusOr<int64_t> held_blocks(SequenceId id, int32_t g) const;
  /// Tier and block (or page) of each of the sequence's blocks in group `g`, -1 for those out of
  /// a window group's window. kOutOfRange for a bad group, kNotFound.
  StatusOr<std::vector<BlockLocation>> block_locations(SequenceId id, int32_t g) const;
  /// Bytes of the blocks the sequence holds over all groups, on whichever tier they are (an
  /// offloaded sequence's host blocks count too; a shared block is counted in full).
  StatusOr<int64_t> held_bytes(SequenceId id) const;
  /// Every group's invariants, and that every sequence is in every group with the same length
  /// and reservation.
  Status check_invariants() const;

  // ---- events ----

  /// Every group's control events since the last drain, each with its group index in
  /// ControlEvent::group. Order: first the kEventsDropped event of every group whose event ring
  /// overflowed, in group order; then group 0's other events oldest first, then group 1's, and
  /// so on. Only the order inside a group means anything (no event of one group is about a
  /// block of another); the resyncs come first so that a reader that forgets every group on one
  /// (vLLM's AllBlocksCleared names no group) keeps the events drained with it.
  std::vector<ControlEvent> drain_events();

 private:
  ModelKvCache() = default;
  // The caches that hold the groups: one per group, or one for all with shared blocks. Calls
  // that every group takes go to each of them.
  int32_t num_planes() const { return static_cast<int32_t>(groups_.size()); }
  // `st` with the group of plane `p` named in front of its message (with shared blocks the one
  // cache names its groups itself).
  Status in_group(int32_t p, const Status& st) const;
  // kOutOfRange for a group index outside [0, num_groups()).
  Status check_group(int32_t g) const;
  // kInvalidArgument for a batch of another number of groups, or one another cache built.
  Status check_batch(const ModelBatch& batch) const;
  // Erases from every group the sequences some group dropped, into evicted_.
  void sync_evictions();
  // Drops the reservation of `ids` in groups [0, upto) after group `upto` refused a reserve.
  void drop_reservations(const std::vector<SequenceId>& ids, int32_t upto);
  // Ok unless a group other than group 0 holds `id` offloaded with tokens reserved (commit's
  // check: each group picks its own victims, so a reservation can be offloaded in some only).
  Status check_reserved_on_device(SequenceId id, const char* what) const;
  // Ok when every group holds what `length` tokens of `id` need (rollback's check).
  Status check_rollback(SequenceId id, int64_t length) const;

  CacheConfig config_;
  std::vector<CacheConfig> group_configs_;  // config_.group_config(g), by group
  bool shared_ = false;
  std::unique_ptr<Backend> owned_backend_;
  std::vector<std::unique_ptr<KvCache>> groups_;  // the planes
  std::vector<LayerGroup> layers_;                // by model layer
  std::unordered_set<SequenceId> ids_;            // the model's sequences (for check_invariants)
  std::vector<SequenceId> evicted_;
};

}  // namespace pagedkv
