// SeedKvCache: the operations of the seed's (kapsl-llm) KvCache on top of pagedkv, so that code
// written against the seed ports with a rename. Paged mode wraps a KvCache; dense mode keeps one
// contiguous device buffer per sequence. fp16 only, like the seed. See docs/seed-compatibility.md
// for the mapping of each method and for what differs.
//
// Unlike the seed, every call validates its arguments and returns a Status (no panics, no
// zero-padding of short inputs, no truncation of long ones), and a failed call changes nothing.
// One owner thread drives it; it is not internally locked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// A read-only run of fp16 values (IEEE binary16 bits) in host memory, the seed's `&[f16]`.
struct HalfSpan {
  const uint16_t* data = nullptr;
  size_t size = 0;
  HalfSpan() = default;
  HalfSpan(const uint16_t* d, size_t n) : data(d), size(n) {}
  HalfSpan(const std::vector<uint16_t>& v) : data(v.data()), size(v.size()) {}  // NOLINT
};

/// First of the token ids that paged mode commits for positions written without one: each such
/// position gets a fresh negative id (-1, -2, ...), so blocks of different bytes never hash
/// alike. Prompts may not contain negative ids, so these blocks never match a prompt.
inline constexpr TokenId kSeedPlaceholderToken = -1;

/// One layer of a sequence on the device: keys and values as [heads, length, head_dim] fp16 with
/// `head_stride` elements between heads (length * head_dim when packed; the buffer capacity times
/// head_dim for a dense zero-copy view). Valid for work queued on compute_stream() until the next
/// write, advance, rollback or removal of the sequence.
struct SeedKvView {
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t length = 0;
  int64_t head_stride = 0;
};

/// A layer exported in ONNX past_key / past_value shape [1, heads, length, head_dim], on the host.
struct SeedOnnxLayer {
  std::vector<uint16_t> key;
  std::vector<uint16_t> value;
  int64_t shape[4] = {1, 0, 0, 0};
};

/// The seed's KvCacheStats.
struct SeedKvCacheStats {
  CacheMode mode = CacheMode::kPaged;
  int64_t bytes_used = 0;
  int64_t bytes_capacity = 0;
  int64_t blocks_total = 0;
  int64_t blocks_free = 0;
  int64_t sequences = 0;
  int64_t evicted_blocks = 0;
  int64_t evicted_sequences = 0;
  /// Layers whose packed view is cached.
  int64_t packed_layers = 0;
  /// Device blocks whose data sits in the host tier (paged mode).
  int64_t cpu_offloaded_blocks = 0;
};

/// Options of a SeedKvCache that are not part of the configuration.
struct SeedKvCacheOptions {
  /// Executor; not owned, must outlive the cache. Null: create one from config.backend.
  Backend* backend = nullptr;
  /// Stream for all device work ({}: the backend's default stream).
  Stream compute_stream{};
  /// The caller's own stream (a cudaStream_t), used instead of compute_stream when set, as
  /// KvCacheOptions::native_compute_stream. Not owned.
  void* native_compute_stream = nullptr;
  /// Record the paged KvCache's control events (paged_cache()->drain_events()), as
  /// KvCacheOptions::enable_events; the seed has none, so a port that does not read them can
  /// turn this off and save the ring's growth and a push per block event.
  bool enable_events = true;
};

namespace runtime {
class SeedImpl;
}

/// The seed's KvCache surface in both modes (CacheConfig::mode).
class SeedKvCache {
 public:
  /// Validates the config (fp16 only) and creates the paged KvCache or the dense allocator.
  /// kInvalidArgument names the field; kResourceExhausted when memory cannot be had.
  static StatusOr<std::unique_ptr<SeedKvCache>> create(const CacheConfig& config,
                                                       SeedKvCacheOptions options = {});
  ~SeedKvCache();
  SeedKvCache(const SeedKvCache&) = delete;
  SeedKvCache& operator=(const SeedKvCache&) = delete;

  /// kPaged or kDense.
  CacheMode mode() const { return config_.mode; }
  /// The configuration the cache was created with.
  const CacheConfig& config() const { return config_; }
  /// The executor every device pointer belongs to.
  Backend& backend();
  /// The stream every device pointer handed out is ordered on.
  Stream compute_stream() const;
  /// The underlying KvCache in paged mode (offload, events, batches); null in dense mode.
  KvCache* paged_cache();

  /// Creates a sequence for a prompt and returns how many of its tokens are already cached
  /// (paged prefix hit, at least one token left to compute; 0 in dense mode). For an existing
  /// sequence returns min(length, tokens.size() - 1), restoring it first when it is offloaded.
  /// kInvalidArgument (negative token id), kOutOfRange (prompt too long).
  StatusOr<int64_t> allocate_sequence(SequenceId id, const std::vector<TokenId>& tokens);

  /// Writes one token's keys and values ([heads * head_dim] each, exactly) for one layer at
  /// `pos`. Paged: pos is the next uncommitted position or an already written pending one; the
  /// token becomes part of the sequence at advance_sequence. Dense: any pos below
  /// max_sequence_length. `token_id` (layer 0) is what advance commits for prefix caching.
  Status append_token(SequenceId id, int32_t layer, int64_t pos, HalfSpan key, HalfSpan value,
                      std::optional<TokenId> token_id = std::nullopt);
  /// Writes head `head` of positions [pos_start, pos_start + n) of one layer from head-major
  /// input ([n, head_dim] each, n = key.size / head_dim, a whole number). Same pos rules.
  Status append_head_range_seq_first(SequenceId id, int32_t layer, int32_t head, int64_t pos_start,
                                     HalfSpan key, HalfSpan value);
  /// Makes the next written position part of the sequence (length + 1).
  Status advance_sequence(SequenceId id);
  /// Makes the next `delta` written positions part of the sequence. Paged: kFailedPrecondition
  /// when fewer than `delta` positions were written since the last advance. kInvalidArgument
  /// (both modes) when the length would pass max_sequence_length.
  Status advance_sequence_by(SequenceId id, int64_t delta);
  /// Shortens the sequence to `length` (== length: no-op; > length: kOutOfRange). Drops
  /// written-but-not-advanced positions in paged mode.
  Status rollback_sequence(SequenceId id, int64_t length);

  /// The layer as [heads, length, head_dim]: dense mode a zero-copy strided view of the
  /// sequence's buffer, paged mode the packed view of get_packed_layer.
  StatusOr<SeedKvView> get_layer_view(SequenceId id, int32_t layer);
  /// The layer packed contiguously (head_stride = length * head_dim), cached until the next
  /// write to that layer or change of length; a miss is one gather into a reused per-sequence
  /// buffer. kFailedPrecondition for an empty sequence (the seed's None).
  StatusOr<SeedKvView> get_packed_layer(SequenceId id, int32_t layer);
  /// Imports a packed [heads, length, head_dim] layer (host) into that layer only; `length`
  /// must equal sequence_length. The next get_packed_layer returns these bytes.
  Status set_packed_layer(SequenceId id, int32_t layer, int64_t length, HalfSpan key,
                          HalfSpan value);
  /// Writes positions [0, length) of one layer from host [heads, src_capacity, head_dim] tensors
  /// (the seed's KvTensor; src_capacity 0 means length) and sets the length to `length`,
  /// extending the sequence when longer (its other layers then hold unwritten data there).
  /// Only that layer changes (seed defect 3 fixed).
  Status overwrite_layer(SequenceId id, int32_t layer, HalfSpan key, HalfSpan value, int64_t length,
                         int64_t src_capacity = 0);
  /// Keys AND values of a layer as [1, heads, length, head_dim] host arrays (waits for the
  /// device); empty arrays of shape [1, heads, 0, head_dim] for an empty sequence.
  StatusOr<SeedOnnxLayer> get_layer_as_onnx(SequenceId id, int32_t layer);

  /// Removes a sequence. Paged: its full blocks stay cached for later prompts; dense: its buffer
  /// joins the capped free list. kNotFound.
  Status remove_sequence(SequenceId id);
  /// Whether the sequence exists (offloaded ones included).
  bool has_sequence(SequenceId id) const;
  /// Committed length. kNotFound.
  StatusOr<int64_t> sequence_length(SequenceId id) const;

  /// Replaces the set of sequences never evicted or offloaded (dense: accepted, no effect).
  Status set_active_sequences(const std::vector<SequenceId>& ids);
  /// Sets a sequence's priority (lower is offloaded or dropped first). kNotFound.
  Status set_sequence_priority(SequenceId id, int32_t priority);
  /// Sequences dropped (not offloaded) to make room since the last call (dense: none).
  std::vector<SequenceId> drain_evicted_sequences();
  /// Queues the restore of an offloaded sequence (asynchronous; reads on compute_stream() wait
  /// for it). kNotFound, kFailedPrecondition (not offloaded, or dense mode).
  Status restore_offloaded_sequence(SequenceId id);
  /// The seed's figures.
  SeedKvCacheStats stats() const;
  /// Blocks the host until all queued device work is done.
  Status synchronize();

 private:
  SeedKvCache() = default;
  Status check_layer(SequenceId id, int32_t layer) const;

  CacheConfig config_;
  std::unique_ptr<runtime::SeedImpl> impl_;
};

}  // namespace pagedkv
