// The cache the simulator drives: either a full KvCache (control plane, kernels, both tiers)
// or, for --no-data, a core::ControlPlane alone (the same decisions, no KV bytes), so an
// operator can plan a full-size model and pool on a laptop. A model of several KV groups
// (CacheConfig::groups: sliding-window and full-attention layers) is a ModelKvCache, or for
// --no-data one control plane per group driven in step the way ModelKvCache drives its caches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
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
  /// The cache's counts; with several groups, merge_group_stats() of theirs.
  virtual ControlStats stats() const = 0;
  /// KV groups (CacheConfig::num_groups()).
  virtual int32_t num_groups() const { return 1; }
  /// The counts of group `g` (of its own pools, in its own blocks).
  virtual ControlStats group_stats(int32_t g) const {
    (void)g;
    return stats();
  }
  virtual Status check_invariants() const = 0;
  /// "cpu: ..." / "cuda: ..." or "none (--no-data: control plane only)".
  virtual std::string description() const = 0;
  /// Whether KV bytes are written and moved.
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

/// A KvCache on `config.backend` (a ModelKvCache when `config` has groups); writes come from a
/// scratch buffer of `max_tokens` tokens. kInvalidArgument for a storage tier with groups.
StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage = {});

/// A core::ControlPlane alone (one per group when `config` has groups).
StatusOr<std::unique_ptr<Engine>> make_control_engine(const CacheConfig& config);

/// One ControlStats for a model of several groups: the counts of things every group does once
/// per sequence or prompt (sequences, prefix lookups, their tokens and hit / miss blocks,
/// sequence offloads, restores and drops) are the largest group's, every other count (blocks and
/// bytes per tier, blocks moved) is the sum over the groups, so a tier's blocks add up to the
/// groups' pools (blocks of different sizes). One group: its own counts.
ControlStats merge_group_stats(const std::vector<ControlStats>& groups);

}  // namespace sim
}  // namespace pagedkv
