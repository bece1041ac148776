// What a hybrid (or MLA) model's cache gains: the memory one sequence takes per KV group, and
// how many sequences of a context length fit in a device budget, against the uniform cache of
// the same model (every layer full attention) in the same budget.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace sim {

/// One group's share of a sequence.
struct GroupMemory {
  std::string name;  // "full", "window"; "model" without groups
  int32_t layers = 0;
  int32_t sliding_window = 0;  // 0: full attention
  int64_t block_bytes = 0;
  int64_t blocks = 0;  // CacheConfig::blocks_per_sequence
  int64_t bytes = 0;   // blocks x block_bytes
};

/// What one decoding sequence of `context` tokens takes (its context plus the next token's slot).
struct SequenceMemory {
  int64_t context = 0;
  std::vector<GroupMemory> groups;  // one per group (one without groups)
  int64_t bytes = 0;                // over the groups
  int64_t uniform_bytes = 0;        // the same sequence in the uniform cache
  /// uniform_bytes / bytes: the capacity gain the block accounting predicts.
  double gain() const;
};

/// The memory of one sequence of `context` tokens in `config` (groups or not).
SequenceMemory sequence_memory(const CacheConfig& config, int64_t context);

/// Sequences that fit, measured by reserving through the cache on the null backend.
struct Capacity {
  int64_t context = 0;
  int64_t budget_bytes = 0;
  int64_t sequences = 0;          // the model's cache (its groups' pools split for `context`)
  int64_t uniform_sequences = 0;  // the uniform cache, the same budget
  SequenceMemory memory;          // the analytic figures next to the measured ones
  /// sequences / uniform_sequences, 0 when the uniform cache holds none.
  double gain() const;
};

/// How many decoding sequences of `context` tokens fit in `budget_bytes` of device memory: the
/// model's cache on the null backend (make_model_cache; no host tier, no eviction, the budget
/// split between the groups in proportion to what a sequence takes in each,
/// CacheConfig::with_pools), each sequence prefilled a block at a time (so a window group
/// releases blocks as they fall out of its window) and its next token reserved, until the cache
/// is out of blocks; then the same for the uniform cache. kInvalidArgument for a context below 1 or
/// a budget below 1 byte.
StatusOr<Capacity> measure_capacity(const CacheConfig& config, int64_t context,
                                    int64_t budget_bytes);

}  // namespace sim
}  // namespace pagedkv
