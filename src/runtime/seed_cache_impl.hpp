// The mode-specific halves of SeedKvCache. The facade (seed_cache.cpp) checks what both modes
// share (layer and head ranges, input sizes, that the sequence exists); an implementation
// checks the rest and must leave everything unchanged when it returns an error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/seed_cache.hpp"
#include "runtime/upload_arena.hpp"

namespace pagedkv::runtime {

/// Per-(sequence, layer) device buffers holding the packed [heads, len, head_dim] keys and
/// values of the layers read, reused across cache misses (seed defect 10: no allocation per
/// miss). A buffer is allocated on the first read of its layer, sized to that read in
/// 16-position steps; a longer read regrows it by at least a quarter. A layer's packed copy is
/// valid until invalidated. A removed sequence's buffers are kept (up to 64 MiB) for later reads.
class PackedMirror {
 public:
  PackedMirror(Backend& backend, Stream stream, const CacheConfig& config)
      : backend_(backend), stream_(stream), config_(config) {}
  ~PackedMirror();
  PackedMirror(const PackedMirror&) = delete;
  PackedMirror& operator=(const PackedMirror&) = delete;

  /// The cached view of (id, layer) when it is valid for `length`.
  std::optional<SeedKvView> find(SequenceId id, int32_t layer, int64_t length) const;
  /// Device pointers where (id, layer) packed at `length` goes; (re)allocates that layer's
  /// buffer when it is too short, after waiting for queued reads of the old one, which is freed
  /// first. kResourceExhausted (the layer then has no buffer) when it cannot be had.
  StatusOr<SeedKvView> slot(SequenceId id, int32_t layer, int64_t length);
  /// Marks (id, layer) as holding the packed data of `length` positions.
  void mark_valid(SequenceId id, int32_t layer, int64_t length);
  void invalidate(SequenceId id, int32_t layer);
  void invalidate_all(SequenceId id);
  /// Frees the sequence's buffers (after the stream's queued work).
  void erase(SequenceId id);
  /// Layers whose packed copy is valid, over all sequences.
  int64_t valid_layers() const;

 private:
  // One layer's buffer: keys [heads, capacity, head_dim], then values alike.
  struct Layer {
    void* data = nullptr;
    int64_t capacity = 0;       // positions per head
    int64_t valid_length = -1;  // -1 when invalid
  };
  SeedKvView view(const Layer& l, int64_t length) const;
  // Moves the layers' buffers to the spares (their queued reads must be done).
  void free_layers(std::vector<Layer>& layers);
  // A spare buffer of at least `capacity` positions (the smallest), or {} for none.
  Layer take_spare(int64_t capacity);
  // Keeps a buffer whose reads are done for a later read, freeing the smallest spares beyond
  // kSpareBytes.
  void keep_spare(Layer l);
  int64_t buffer_bytes(int64_t capacity) const;

  Backend& backend_;
  Stream stream_;
  CacheConfig config_;
  std::unordered_map<SequenceId, std::vector<Layer>> entries_;  // num_layers each
  // Buffers of removed sequences, for the next sequences' reads: a first read then touches
  // memory already mapped (a fresh allocation faulted in every page under the gather: 19K
  // faults in the seed replay, docs/runtime.md) and makes no device allocation. An outgrown
  // buffer is still freed before its replacement is allocated, so a regrowth's peak is the new
  // buffer alone.
  std::vector<Layer> spares_;
  int64_t spare_bytes_ = 0;
};

/// What a mode implements. Inputs are host fp16 arrays whose sizes the facade has checked.
class SeedImpl {
 public:
  virtual ~SeedImpl() = default;
  virtual Backend& backend() = 0;
  virtual Stream stream() const = 0;
  virtual KvCache* paged() { return nullptr; }

  virtual bool contains(SequenceId id) const = 0;
  virtual StatusOr<int64_t> length(SequenceId id) const = 0;
  virtual StatusOr<int64_t> allocate(SequenceId id, const std::vector<TokenId>& tokens) = 0;
  /// One token, every head, one layer: `key`/`value` are [heads * head_dim].
  virtual Status write_token(SequenceId id, int32_t layer, int64_t pos, const uint16_t* key,
                             const uint16_t* value, std::optional<TokenId> token) = 0;
  /// One head, `n` positions: `key`/`value` are [n, head_dim].
  virtual Status write_head_range(SequenceId id, int32_t layer, int32_t head, int64_t pos,
                                  int64_t n, const uint16_t* key, const uint16_t* value) = 0;
  virtual Status advance(SequenceId id, int64_t delta) = 0;
  virtual Status rollback(SequenceId id, int64_t length) = 0;
  virtual StatusOr<SeedKvView> layer_view(SequenceId id, int32_t layer) = 0;
  virtual StatusOr<SeedKvView> packed_layer(SequenceId id, int32_t layer) = 0;
  /// Writes packed [heads, length, head_dim] into positions [0, length) of one layer and makes
  /// `length` the sequence's length.
  virtual Status import(SequenceId id, int32_t layer, int64_t length, const uint16_t* key,
                        const uint16_t* value) = 0;
  virtual Status remove(SequenceId id) = 0;
  virtual Status set_active(const std::vector<SequenceId>& ids) = 0;
  virtual Status set_priority(SequenceId id, int32_t priority) = 0;
  virtual std::vector<SequenceId> drain_evicted() = 0;
  virtual Status restore(SequenceId id) = 0;
  virtual SeedKvCacheStats stats() const = 0;
  virtual Status synchronize() = 0;
};

/// Paged mode over a KvCache.
StatusOr<std::unique_ptr<SeedImpl>> make_paged_seed_impl(const CacheConfig& config,
                                                         const SeedKvCacheOptions& options);
/// Dense mode over core::DenseAllocator.
StatusOr<std::unique_ptr<SeedImpl>> make_dense_seed_impl(const CacheConfig& config,
                                                         const SeedKvCacheOptions& options);

}  // namespace pagedkv::runtime
