// Value types of the control plane that a server sees: ids, the transfers the data plane must
// run, batch metadata, stats and events. Plain structs, no behaviour.
#pragma once

#include <cstdint>
#include <vector>

namespace pagedkv {

/// A sequence (request, beam, sample) as the caller names it.
using SequenceId = uint64_t;
/// One token id of a prompt or of generated output.
using TokenId = int32_t;
/// A prefix-sharing domain (adapter id, cache salt); blocks of different namespaces never match.
using NamespaceId = uint64_t;

/// Where a block's bytes live.
enum class Tier : uint8_t { kDevice = 0, kHost = 1, kStorage = 2 };
/// Tiers that hold blocks in this process (pools, slots, stats); kStorage, the store behind the
/// host tier (storage_tier.hpp), appears only in events.
inline constexpr int kNumTiers = 2;

/// Retention priority of cached blocks: lower is evicted first.
inline constexpr int32_t kMinRetentionPriority = 0;
inline constexpr int32_t kMaxRetentionPriority = 100;
inline constexpr int32_t kDefaultRetentionPriority = 35;

/// Where a block lives: its tier and physical block id there.
struct BlockLocation {
  Tier tier = Tier::kDevice;
  int32_t block = -1;
  friend bool operator==(const BlockLocation& a, const BlockLocation& b) {
    return a.tier == b.tier && a.block == b.block;
  }
};

/// Copy one device block into another (copy-on-write); physical device block ids.
struct BlockCopy {
  int32_t src_block = -1;
  int32_t dst_block = -1;
  /// The KV group whose pool both pages are in (CacheConfig::groups index; 0 with one group).
  int32_t group = 0;
  friend bool operator==(const BlockCopy& a, const BlockCopy& b) {
    return a.src_block == b.src_block && a.dst_block == b.dst_block && a.group == b.group;
  }
};

/// Move one block between tiers (offload device->host, restore host->device); physical ids.
struct BlockMove {
  Tier src_tier = Tier::kDevice;
  int32_t src_block = -1;
  Tier dst_tier = Tier::kHost;
  int32_t dst_block = -1;
  /// The KV group whose pools both blocks are in (CacheConfig::groups index; 0 with one group).
  int32_t group = 0;
  friend bool operator==(const BlockMove& a, const BlockMove& b) {
    return a.src_tier == b.src_tier && a.src_block == b.src_block && a.dst_tier == b.dst_tier &&
           a.dst_block == b.dst_block && a.group == b.group;
  }
};

/// A cached block that left its tier, with what a store needs to keep it: its key (chained hash
/// and namespace), its place in the prefix tree (parent hash, tokens) and where its bytes are.
struct DroppedBlock {
  uint64_t block_hash = 0;
  uint64_t parent_hash = 0;
  NamespaceId ns = 0;
  /// Where the block's bytes are before the moves of the call that dropped it run: its host slot,
  /// or, when that call moved it there (a demotion followed by a drop), the slot it came from,
  /// usually on the device. The write-back copies from here, ahead of the call's moves.
  BlockLocation source{Tier::kHost, -1};
  std::vector<TokenId> tokens;
  /// The KV group (a config index) whose page this is, in a cache of several groups: a dropped
  /// block is reported once per group that kept a page of it, each `source` in that group's
  /// pools. 0 with one group.
  int32_t group = 0;
};

/// What the data plane must do, in this order, before it writes the new tokens of a call:
/// every move (in list order), then every copy. Also names the sequences the call offloaded,
/// restored (or onboarded) and evicted (dropped) to make room.
struct Transfers {
  std::vector<BlockMove> moves;
  std::vector<BlockCopy> copies;
  std::vector<SequenceId> offloaded;
  std::vector<SequenceId> restored;
  std::vector<SequenceId> evicted;
  /// Cached host blocks the host LRU dropped to make room, when the control plane reports them
  /// (a storage tier is attached): their bytes are at DroppedBlock::source until the moves of
  /// this call run (which may overwrite it), so the data plane copies them out first
  /// (write-back).
  std::vector<DroppedBlock> host_drops;

  bool empty() const {
    return moves.empty() && copies.empty() && offloaded.empty() && restored.empty() &&
           evicted.empty() && host_drops.empty();
  }
};

/// Options of a new sequence.
struct SequenceOptions {
  /// Scheduling priority: under memory pressure lower priorities are offloaded/dropped first.
  int32_t priority = 0;
  /// Prefix-sharing namespace (adapter id / cache salt).
  NamespaceId ns = 0;
  /// Retention priority (0-100) given to this sequence's cached blocks when it releases them.
  int32_t retention_priority = kDefaultRetentionPriority;
  /// After this many nanoseconds (clock of the control plane) the retention priority reverts
  /// to the default; 0 means never.
  int64_t retention_duration_ns = 0;
};

/// The result of reserving slots for the next n tokens of a sequence.
struct ReserveResult {
  /// Moves (restore of this sequence, offload of others) and copy-on-write pairs to run first.
  Transfers transfers;
  /// One device slot (`block * block_size + offset`) per reserved token, in position order.
  std::vector<int64_t> slots;
};

/// Where a sequence's blocks are.
struct Residency {
  int64_t device_blocks = 0;
  int64_t host_blocks = 0;
  /// True after offload until restore (blocks shared with others stay on the device), and for a
  /// new sequence whose prefix hit host-resident blocks until its first reserve onboards them.
  bool offloaded = false;
};

/// Options of one step's batch metadata.
struct BatchOptions {
  /// Also build the CSR form (indptr / indices / last_page_len).
  bool build_csr = false;
  /// Pad the slot mapping with -1 up to this many entries (for fixed-size graphs); 0: no pad.
  int64_t pad_slots_to = 0;
  /// Build each sliding-window group's table as a ring (BatchMetadata::ring_table): a row as
  /// wide as the blocks a sequence holds in the window, not as its whole length, so a decode
  /// step of a window-128 group writes and uploads 9 entries a row at block size 16, whatever
  /// the context (TensorRT-LLM's cyclic window in table form). For kernels that read through
  /// the device view (PagedKvView::ring_table) or index rings themselves; not vLLM's form. The
  /// group that owns the blocks (KvCache::full_group()) and groups without a window keep plain
  /// tables.
  bool ring_window_tables = false;
};

/// Metadata of one step for a batch of sequences. Each row covers a sequence's committed tokens
/// plus its reserved (pending) ones; the slot mapping covers the reserved ones only.
struct BatchMetadata {
  int32_t batch_size = 0;
  /// Row stride of `block_tables`; grows geometrically, never shrinks.
  int32_t max_blocks = 0;
  /// One int64 slot per reserved token (row order, position order), then -1 padding.
  std::vector<int64_t> slot_mapping;
  /// `[batch_size, max_blocks]` physical device block ids, -1 past a row's blocks.
  std::vector<int32_t> block_tables;
  /// The rows are rings (BatchOptions::ring_window_tables, a window group's table): row r's
  /// logical block i is at column i % max_blocks while it is in the window; a column holds -1
  /// when no block of the window is there. Every block a row's tokens read or write fits.
  bool ring_table = false;
  /// Per row: committed + reserved tokens.
  std::vector<int32_t> seq_lens;
  /// CSR (FlashInfer): row r's blocks are indices[indptr[r] .. indptr[r+1]).
  std::vector<int32_t> indptr;
  std::vector<int32_t> indices;
  /// Tokens in each row's last block (1..block_size), 0 for an empty row.
  std::vector<int32_t> last_page_len;
};

/// Every field of TierStats as X(type, name, doc), in declaration order. TierStats and its
/// operator== are generated from this list, and so is every list of stats: for_each_stat
/// (pagedkv/stats_fields.hpp), the tests' snapshots, pagedkv-sim's report, pagedkv_soak's line.
/// A new count is one line here. `doc` is a short meaning, printed in reports.
#define PAGEDKV_TIER_STATS_FIELDS(X)                                            \
  X(int64_t, total_blocks, "blocks in the tier")                                \
  X(int64_t, free_blocks, "blocks neither referenced nor cached")               \
  X(int64_t, cached_blocks, "cached blocks no sequence references (evictable)") \
  X(int64_t, used_blocks, "blocks referenced by at least one sequence")         \
  X(int64_t, total_bytes, "bytes of the tier")                                  \
  X(int64_t, used_bytes, "bytes of cached + used blocks")

/// Every field of ControlStats as X(type, name, doc), in declaration order: the two tiers'
/// TierStats, then the counters since the control plane was created. Prefix lookups are one per
/// added sequence; their hit/miss counts are full blocks. A run of dropped events is announced by
/// one EventKind::kEventsDropped event.
#define PAGEDKV_CONTROL_STATS_FIELDS(X)                                                      \
  X(TierStats, device, "the device tier")                                                    \
  X(TierStats, host, "the host tier (all 0 without one)")                                    \
  X(int64_t, sequences, "sequences in the cache")                                            \
  X(int64_t, active_sequences, "sequences in the active set")                                \
  X(int64_t, offloaded_sequences, "sequences offloaded to the host now")                     \
  X(int64_t, prefix_queries, "prefix lookups (one per added sequence)")                      \
  X(int64_t, prefix_hit_blocks, "full prompt blocks found cached")                           \
  X(int64_t, prefix_miss_blocks, "full prompt blocks not found cached")                      \
  X(int64_t, prefix_query_tokens, "prompt tokens looked up")                                 \
  X(int64_t, prefix_hit_tokens, "prompt tokens found cached")                                \
  X(int64_t, prefix_host_hit_blocks, "of prefix_hit_blocks, those found on the host tier")   \
  X(int64_t, blocks_evicted, "cached device blocks evicted")                                 \
  X(int64_t, sequences_evicted, "sequences dropped to make room")                            \
  X(int64_t, sequences_offloaded, "sequence offloads to the host tier")                      \
  X(int64_t, blocks_offloaded, "blocks offloaded to the host tier")                          \
  X(int64_t, sequences_restored, "sequence restores to the device")                          \
  X(int64_t, blocks_restored, "blocks restored to the device")                               \
  X(int64_t, copy_on_write, "blocks copied before a write (copy-on-write)")                  \
  X(int64_t, blocks_demoted, "cached device blocks moved to the host instead of evicted")    \
  X(int64_t, host_blocks_dropped, "cached host blocks dropped (LRU first) for host room")    \
  X(int64_t, events_dropped, "control events dropped, oldest first, on a full event ring")   \
  X(int64_t, storage_hit_blocks, "blocks read back from the storage tier into the host")     \
  X(int64_t, storage_blocks_written, "dropped host blocks written back to the storage tier") \
  X(int64_t, storage_bytes_read, "bytes read from the storage tier")                         \
  X(int64_t, storage_bytes_written, "bytes written to the storage tier")                     \
  X(int64_t, storage_failed_blocks, "storage reads and writes that failed, in blocks")       \
  X(int64_t, storage_writes_dropped, "dropped host blocks not written back: queue full")     \
  X(int64_t, window_released_blocks, "blocks released as they fell out of a sliding window")

// Helpers that expand the lists above; undefined after the two structs.
#define PAGEDKV_STATS_MEMBER_(type, name, doc) type name{};
#define PAGEDKV_STATS_EQUAL_(type, name, doc) &&a.name == b.name
#define PAGEDKV_STATS_SIZE_(type, name, doc) +sizeof(type)

/// Block counts of one tier: the fields of PAGEDKV_TIER_STATS_FIELDS, all 0 by default.
struct TierStats {
  PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_STATS_MEMBER_)
  /// True when every listed field is equal.
  friend bool operator==(const TierStats& a, const TierStats& b) {
    return true PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_STATS_EQUAL_);
  }
  friend bool operator!=(const TierStats& a, const TierStats& b) { return !(a == b); }
};
// No field outside the list (one added by hand after the expansion would change the size).
static_assert(sizeof(TierStats) == 0 PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_STATS_SIZE_),
              "every field of TierStats must be in PAGEDKV_TIER_STATS_FIELDS");

/// Counters of a control plane since it was created: the fields of PAGEDKV_CONTROL_STATS_FIELDS,
/// all 0 by default.
struct ControlStats {
  PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_STATS_MEMBER_)
  /// True when every listed field (both tiers included) is equal.
  friend bool operator==(const ControlStats& a, const ControlStats& b) {
    return true PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_STATS_EQUAL_);
  }
  friend bool operator!=(const ControlStats& a, const ControlStats& b) { return !(a == b); }
};
static_assert(sizeof(ControlStats) == 0 PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_STATS_SIZE_),
              "every field of ControlStats must be in PAGEDKV_CONTROL_STATS_FIELDS");

#undef PAGEDKV_STATS_MEMBER_
#undef PAGEDKV_STATS_EQUAL_
#undef PAGEDKV_STATS_SIZE_

/// Kinds of control-plane events.
enum class EventKind : uint8_t {
  kBlockStored = 0,    // a full block entered the prefix index
  kBlockRemoved,       // a cached block left the prefix index
  kSequenceEvicted,    // a sequence was dropped to make room
  kSequenceOffloaded,  // a sequence's blocks moved to the host tier
  kSequenceRestored,   // an offloaded sequence's blocks moved back to the device
  kEventsDropped,      // the event ring overflowed and `dropped_events` events were lost:
                       // resync (treat every block as cleared); always first in its drain
};

/// One event for routers and schedulers. Block events fill the hash fields and `tier`; stored
/// events also carry the block's tokens; sequence events fill `sequence`; kEventsDropped fills
/// `dropped_events`. A cached block that changes tier (demoted to the host, offloaded with its
/// sequence, brought back to the device) is announced as stored on its new tier, then removed
/// from its old one; a block leaving the index is removed from the tier it was on.
struct ControlEvent {
  EventKind kind = EventKind::kBlockStored;
  /// Block events: the tier the block was stored on or removed from.
  Tier tier = Tier::kDevice;
  SequenceId sequence = 0;
  uint64_t block_hash = 0;
  /// Hash of the prefix before this block (the namespace root hash for a first block).
  uint64_t parent_hash = 0;
  NamespaceId ns = 0;
  std::vector<TokenId> tokens;
  /// kEventsDropped: how many events were lost just before the ones that follow it.
  int64_t dropped_events = 0;
  /// The KV group (CacheConfig::groups index) whose cache recorded the event: 0 from a
  /// KvCache, the group's index from ModelKvCache::drain_events and from a control plane of
  /// several groups. The same block hash in two
  /// groups names two different blocks (each group holds its own layers' KV).
  int32_t group = 0;
};

}  // namespace pagedkv
