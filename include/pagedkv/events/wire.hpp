// The wire format of KV events for KV-aware routers: vLLM's KVEventBatch in msgpack, as vLLM's
// ZmqEventPublisher sends it and as Dynamo's KV router, llm-d and sgl-router read it.
// docs/events.md describes every field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::events {

/// The `medium` of a block event: "GPU" for the device tier, "CPU" for the host tier, "DISK"
/// for the storage tier.
const char* medium_name(Tier tier);

/// One KV group as block events describe it: vLLM's `kv_cache_spec_kind` and
/// `kv_cache_spec_sliding_window` of the group's BlockStored events.
struct WireGroup {
  /// A vLLM KVCacheSpecKind value: "full_attention", "sliding_window", "mla_attention",
  /// "sliding_window_mla"; empty: not written.
  std::string kind;
  /// The window in tokens; 0 (full attention): not written.
  int32_t sliding_window = 0;
};

/// The WireGroup of each of `config`'s groups (one for a config without groups), from its
/// kv_kind and sliding_window.
std::vector<WireGroup> wire_groups(const CacheConfig& config);

/// What the encoder needs that a ControlEvent does not carry.
struct WireOptions {
  /// Tokens per block (`block_size` of BlockStored); every stored event must carry that many.
  int32_t block_size = 0;
  /// `data_parallel_rank` of the batch (vLLM: one publisher per data-parallel rank).
  int32_t data_parallel_rank = 0;
  /// The KV groups of a hybrid model, by ControlEvent::group. With two or more, every block
  /// event carries `group_idx` and stored ones the group's kind and window, as vLLM's hybrid
  /// models send them; empty or one group: none of these fields (one cache's output).
  std::vector<WireGroup> groups;
};

/// How many events of each wire kind a batch holds.
struct WireCounts {
  int64_t stored = 0;
  int64_t removed = 0;
  int64_t cleared = 0;
  int64_t skipped = 0;  // sequence events: vLLM's format has no place for them
  int64_t total() const { return stored + removed + cleared; }
};

/// Encodes `events` as one msgpack KVEventBatch `[timestamp, [event...], data_parallel_rank]`
/// and writes it to `*out` (replacing its content). kBlockStored becomes a BlockStored map,
/// kBlockRemoved a BlockRemoved map, kEventsDropped an AllBlocksCleared map (the reader must
/// resync); sequence events are skipped. A first block's parent (the namespace's root hash,
/// `root_hash`) is sent as nil, as vLLM does; a namespace other than 0 is sent as `lora_id`.
/// With two or more `options.groups`, block events carry their group (see WireOptions::groups).
/// kInvalidArgument (and `*out` untouched) for block_size < 1, a negative rank, a null `out`,
/// a stored event whose token count is not block_size, or an event whose group is not one of
/// `options.groups` (only group 0 with fewer than two).
Status encode_batch(const std::vector<ControlEvent>& events, double timestamp,
                    const WireOptions& options, std::string* out, WireCounts* counts = nullptr);

/// The parent hash of a namespace's first block: the seed of the chained block hash
/// (docs/events.md gives the formula and a test vector).
uint64_t root_hash(NamespaceId ns);

/// The 8-byte big-endian form of a message sequence number (frame 2 of a published message).
std::string sequence_bytes(int64_t seq);

}  // namespace pagedkv::events
