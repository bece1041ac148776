// The cache the simulator drives: either a full KvCache (control plane, kernels, both tiers)
// or, for --no-data, a core::ControlPlane alone (the same decisions, no KV bytes), so an
// operator can plan a full-size model and pool on a laptop.
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
  virtual ControlStats stats() const = 0;
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

/// A KvCache on `config.backend`; writes come from a scratch buffer of `max_tokens` tokens.
StatusOr<std::unique_ptr<Engine>> make_cache_engine(const CacheConfig& config, int64_t max_tokens,
                                                    const StorageOptions& storage = {});

/// A core::ControlPlane alone.
StatusOr<std::unique_ptr<Engine>> make_control_engine(const CacheConfig& config);

}  // namespace sim
}  // namespace pagedkv
