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
enum class Tier : uint8_t { kDevice = 0, kHost = 1 };
inline constexpr int kNumTiers = 2;

/// Retention priority of cached blocks: lower is evicted first.
inline constexpr int32_t kMinRetentionPriority = 0;
inline constexpr int32_t kMaxRetentionPriority = 100;
inline constexpr int32_t kDefaultRetentionPriority = 35;

/// Copy one device block into another (copy-on-write); physical device block ids.
struct BlockCopy {
  int32_t src_block = -1;
  int32_t dst_block = -1;
  friend bool operator==(const BlockCopy& a, const BlockCopy& b) {
    return a.src_block == b.src_block && a.dst_block == b.dst_block;
  }
};

/// Move one block between tiers (offload device->host, restore host->device); physical ids.
struct BlockMove {
  Tier src_tier = Tier::kDevice;
  int32_t src_block = -1;
  Tier dst_tier = Tier::kHost;
  int32_t dst_block = -1;
  friend bool operator==(const BlockMove& a, const BlockMove& b) {
    return a.src_tier == b.src_tier && a.src_block == b.src_block && a.dst_tier == b.dst_tier &&
           a.dst_block == b.dst_block;
  }
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

  bool empty() const {
    return moves.empty() && copies.empty() && offloaded.empty() && restored.empty() &&
           evicted.empty();
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

/// Where one logical block of a sequence lives now.
struct BlockLocation {
  Tier tier = Tier::kDevice;
  int32_t block = -1;
  friend bool operator==(const BlockLocation& a, const BlockLocation& b) {
    return a.tier == b.tier && a.block == b.block;
  }
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
  /// Per row: committed + reserved tokens.
  std::vector<int32_t> seq_lens;
  /// CSR (FlashInfer): row r's blocks are indices[indptr[r] .. indptr[r+1]).
  std::vector<int32_t> indptr;
  std::vector<int32_t> indices;
  /// Tokens in each row's last block (1..block_size), 0 for an empty row.
  std::vector<int32_t> last_page_len;
};

/// Block counts of one tier.
struct TierStats {
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;
  /// Cached blocks that no sequence references (evictable).
  int64_t cached_blocks = 0;
  /// Blocks referenced by at least one sequence.
  int64_t used_blocks = 0;
  int64_t total_bytes = 0;
  /// Bytes of cached + used blocks.
  int64_t used_bytes = 0;
};

/// Counters of a control plane since it was created.
struct ControlStats {
  TierStats device;
  TierStats host;
  int64_t sequences = 0;
  int64_t active_sequences = 0;
  int64_t offloaded_sequences = 0;
  /// Prefix lookups (one per added sequence) and their full-block outcome.
  int64_t prefix_queries = 0;
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_miss_blocks = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  /// Of prefix_hit_blocks, those found on the host tier (onboarded by the next reserve).
  int64_t prefix_host_hit_blocks = 0;
  int64_t blocks_evicted = 0;
  int64_t sequences_evicted = 0;
  int64_t sequences_offloaded = 0;
  int64_t blocks_offloaded = 0;
  int64_t sequences_restored = 0;
  int64_t blocks_restored = 0;
  int64_t copy_on_write = 0;
  /// Cached blocks moved to the host tier instead of being evicted from the device.
  int64_t blocks_demoted = 0;
  /// Cached host blocks dropped (least recently used first) to make host room.
  int64_t host_blocks_dropped = 0;
  /// Control events dropped, oldest first, because the event ring was full (nobody drained);
  /// each run of drops is announced by one EventKind::kEventsDropped event.
  int64_t events_dropped = 0;
};

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
};

}  // namespace pagedkv
