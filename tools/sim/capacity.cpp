#include "capacity.hpp"

#include <algorithm>
#include <climits>
#include <memory>

#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/model_cache.hpp"

namespace pagedkv {
namespace sim {

namespace {

// Decoding sequences of `context` tokens that fit in the device pools of `config`: a model cache
// on the null backend (make_model_cache: the groups share the logical blocks where they can),
// each sequence prefilled a block at a time, then its next token reserved, until the cache is
// out of blocks.
StatusOr<int64_t> fill(const CacheConfig& config, int64_t context) {
  CacheConfig c = config;
  c.backend = BackendKind::kNull;  // decisions only: pools that cost no memory
  c.num_host_blocks = 0;           // device capacity only
  for (KvGroup& g : c.groups) g.num_host_blocks = 0;
  c.eviction_policy = EvictionPolicy::kNone;  // never take blocks from a sequence
  c.enable_prefix_caching = false;            // distinct prompts: nothing to share
  c.max_sequence_length = static_cast<int32_t>(
      std::max<int64_t>(c.max_sequence_length, std::min<int64_t>(context + 1, INT32_MAX)));
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<ModelKvCache> cache, make_model_cache(c));
  const int64_t bs = c.block_size;
  const std::vector<TokenId> chunk(static_cast<size_t>(bs), 1);
  const std::vector<TokenId> last(static_cast<size_t>(context % bs == 0 ? bs : context % bs), 1);
  // Reserves `n`: false when the cache is out of blocks.
  auto reserve = [&](SequenceId id, int64_t n) -> StatusOr<bool> {
    const Status st = cache->reserve(id, n).status();
    if (st.code() == StatusCode::kResourceExhausted) return false;
    PAGEDKV_RETURN_IF_ERROR(st);
    return true;
  };
  for (SequenceId id = 0;; ++id) {
    PAGEDKV_RETURN_IF_ERROR(cache->add_sequence(id, {}).status());
    for (int64_t done = 0; done < context;) {
      const int64_t n = std::min(bs, context - done);
      PAGEDKV_ASSIGN_OR_RETURN(bool fits, reserve(id, n));
      if (!fits) return static_cast<int64_t>(id);
      PAGEDKV_RETURN_IF_ERROR(cache->commit(id, n == bs ? chunk : last));
      done += n;
    }
    PAGEDKV_ASSIGN_OR_RETURN(bool fits, reserve(id, 1));
    if (!fits) return static_cast<int64_t>(id);
  }
}

}  // namespace

double SequenceMemory::gain() const {
  return bytes > 0 ? static_cast<double>(uniform_bytes) / static_cast<double>(bytes) : 0.0;
}

double Capacity::gain() const {
  return uniform_sequences > 0
             ? static_cast<double>(sequences) / static_cast<double>(uniform_sequences)
             : 0.0;
}

SequenceMemory sequence_memory(const CacheConfig& config, int64_t context) {
  SequenceMemory m;
  m.context = context;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const CacheConfig c = config.group_config(g);
    GroupMemory gm;
    gm.name = config.groups.empty() ? "model" : config.groups[static_cast<size_t>(g)].name;
    gm.layers = c.num_layers;
    gm.sliding_window = c.sliding_window;
    gm.block_bytes = c.block_bytes();
    gm.blocks = c.blocks_per_sequence(context);
    gm.bytes = gm.blocks * gm.block_bytes;
    m.bytes += gm.bytes;
    m.groups.push_back(gm);
  }
  const CacheConfig u = uniform_config(config);
  for (int32_t g = 0; g < u.num_groups(); ++g) {
    const CacheConfig c = u.group_config(g);
    m.uniform_bytes += c.blocks_per_sequence(context) * c.block_bytes();
  }
  return m;
}

StatusOr<Capacity> measure_capacity(const CacheConfig& config, int64_t context,
                                    int64_t budget_bytes) {
  if (context < 1) return invalid_argument("context: must be >= 1 token");
  if (budget_bytes < 1) return invalid_argument("capacity: the device budget must be > 0 bytes");
  Capacity cap;
  cap.context = context;
  cap.budget_bytes = budget_bytes;
  cap.memory = sequence_memory(config, context);
  PAGEDKV_ASSIGN_OR_RETURN(const CacheConfig model, config.with_pools(budget_bytes, 0, context));
  PAGEDKV_ASSIGN_OR_RETURN(const CacheConfig uniform,
                           uniform_config(config).with_pools(budget_bytes, 0, context));
  // A pool below one block holds nothing (with_pools keeps at least one block per group).
  if (uniform.num_device_blocks > 0) {
    PAGEDKV_ASSIGN_OR_RETURN(cap.uniform_sequences, fill(uniform, context));
  }
  if (model.num_device_blocks > 0) {
    PAGEDKV_ASSIGN_OR_RETURN(cap.sequences, fill(model, context));
  }
  return cap;
}

}  // namespace sim
}  // namespace pagedkv
