#include "capacity.hpp"

#include <algorithm>
#include <memory>

#include "core/control_plane.hpp"
#include "model.hpp"

namespace pagedkv {
namespace sim {

namespace {

// Decoding sequences of `context` tokens that fit in the device pools of `config`: each
// prefilled a block at a time in every group, then its next token reserved, until a group is
// out of blocks.
StatusOr<int64_t> fill(const CacheConfig& config, int64_t context) {
  std::vector<std::unique_ptr<core::ControlPlane>> planes;
  core::ControlOptions options;
  options.enable_events = false;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    CacheConfig c = config.group_config(g);
    c.num_host_blocks = 0;                      // device capacity only
    c.eviction_policy = EvictionPolicy::kNone;  // never take blocks from a sequence
    c.enable_prefix_caching = false;            // distinct prompts: nothing to share
    c.max_sequence_length = std::max<int64_t>(c.max_sequence_length, context + 1);
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<core::ControlPlane> cp,
                             core::ControlPlane::create(c, options));
    planes.push_back(std::move(cp));
  }
  const int64_t bs = config.block_size;
  const std::vector<TokenId> chunk(static_cast<size_t>(bs), 1);
  ReserveResult rr;  // reused
  // Reserves `n` in every group: false when one is out of blocks.
  auto reserve = [&](SequenceId id, int64_t n) -> StatusOr<bool> {
    for (auto& cp : planes) {
      rr.slots.clear();
      rr.transfers = Transfers{};
      const Status st = cp->reserve_into(id, n, &rr);
      if (st.code() == StatusCode::kResourceExhausted) return false;
      PAGEDKV_RETURN_IF_ERROR(st);
    }
    return true;
  };
  for (SequenceId id = 0;; ++id) {
    for (auto& cp : planes) PAGEDKV_RETURN_IF_ERROR(cp->add_sequence(id, {}).status());
    for (int64_t done = 0; done < context;) {
      const int64_t n = std::min(bs, context - done);
      PAGEDKV_ASSIGN_OR_RETURN(bool fits, reserve(id, n));
      if (!fits) return static_cast<int64_t>(id);
      for (auto& cp : planes) PAGEDKV_RETURN_IF_ERROR(cp->commit(id, chunk.data(), n));
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
