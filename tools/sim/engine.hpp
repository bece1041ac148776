// The cache the simulator drives: a KvCache (control plane, kernels, both tiers) on the
// config's backend. For --no-data that backend is the null one (BackendKind::kNull: copies and
// kernels dropped, pools that cost no memory), so the decisions are the cache's own and an
// operator can plan a full-size model and pool on a laptop. A model of several KV groups
// (CacheConfig::groups: sliding-window and full-attention layers) is a ModelKvCache whose groups
// share the logical blocks (ModelKvCacheOptions::share_blocks), or one cache per group for a
// shape the shared blocks do not take yet.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

class ModelKvCache;

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
  /// The cache's counts: with groups that share blocks, the plane's (its blocks are the
  /// full-attention group's); with a cache per group, merge_group_stats() of theirs.
  virtual ControlStats stats() const = 0;
  /// The counts of group `g` (of its own pools, in its own blocks), or nullopt when the cache
  /// does not count it apart: a window group whose pages the shared plane plans itself.
  virtual std::optional<ControlStats> group_stats(int32_t g) const {
    (void)g;
    return stats();
  }
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

/// A KvCache on `config.backend` (a ModelKvCache with shared blocks when `config` has groups,
/// one cache per group where the shared blocks refuse the groups' shape); writes come from a
/// scratch buffer of `max_tokens` tokens, and none are made on the null backend.
/// kInvalidArgument for a storage tier with groups.
StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage = {});

/// The model cache make_cache_engine drives for a config with groups (also takes one without):
/// a ModelKvCache whose groups share the logical blocks, or one cache per group where the
/// shared plane refuses the groups' shape (today groups that all have a window, or more than
/// three windows). Events off. kInvalidArgument for a bad config.
StatusOr<std::unique_ptr<ModelKvCache>> make_model_cache(const CacheConfig& config);

/// make_cache_engine on the null backend (--no-data): the cache's decisions, no KV bytes.
StatusOr<std::unique_ptr<Engine>> make_no_data_engine(const CacheConfig& config);

/// One ControlStats for a model held as one cache per group: the counts of things every group does
/// once per sequence or prompt (sequences, prefix lookups, their tokens and hit / miss blocks,
/// sequence offloads, restores and drops) are the largest group's, every other count (blocks and
/// bytes per tier, blocks moved) is the sum over the groups, so a tier's blocks add up to the
/// groups' pools (blocks of different sizes). One group: its own counts.
ControlStats merge_group_stats(const std::vector<ControlStats>& groups);

}  // namespace sim
}  // namespace pagedkv
