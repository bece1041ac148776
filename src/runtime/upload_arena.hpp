// Uploads small host arrays (slot mappings, block tables, block pairs, a seed call's K/V) to the
// device without synchronising the host: each call packs its arrays into one region of a pinned
// staging chunk and copies the region with one asynchronous copy on the arena's stream.
//
// Lifetimes. upload() returns an UploadLease; the region stays untouched while the lease lives.
// Destroying the lease releases the region: by then the caller has queued every consumer of it
// on the stream (or on a stream ordered after it). A chunk is refilled only after an event
// recorded once its last lease was released has completed, and a chunk is freed (when a larger
// one replaces it) only after that event too. So no upload can overwrite or free an array that
// queued work has still to read, however many uploads a call makes or however large they are.
// The host blocks only when more than kMaxChunks chunks are all still in use by the device.
//
// Several targets. An arena may serve several devices, each with its own stream (the ranks of a
// tensor-parallel cache, which upload the same batch metadata): an upload is packed once into
// the shared pinned staging and copied to each target's device twin on that target's stream,
// and a chunk is reused only once every target's fence has completed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::runtime {

class UploadArena;

/// One host array of an upload.
struct UploadPart {
  const void* src = nullptr;
  size_t bytes = 0;
};

/// The part that uploads all of `v`.
template <typename T>
UploadPart part(const std::vector<T>& v) {
  return {v.data(), v.size() * sizeof(T)};
}

/// One device an arena uploads to, and the stream its copies (and their readers) are queued on.
struct UploadTarget {
  Backend* backend = nullptr;
  Stream stream{};
};

/// A region of the arena holding one upload's arrays on the device. Move-only; releases the
/// region when destroyed or reset.
class UploadLease {
 public:
  static constexpr size_t kMaxParts = 8;
  static constexpr size_t kMaxTargets = 16;

  UploadLease() = default;
  ~UploadLease() { reset(); }
  UploadLease(UploadLease&& other) noexcept { *this = std::move(other); }
  UploadLease& operator=(UploadLease&& other) noexcept;
  UploadLease(const UploadLease&) = delete;
  UploadLease& operator=(const UploadLease&) = delete;

  /// Device address of part `i` (as given to upload()) on target `target`; an empty part gets
  /// a valid address.
  template <typename T = void>
  const T* device(size_t i, size_t target = 0) const {
    return static_cast<const T*>(static_cast<const void*>(bases_[target] + offsets_[i]));
  }
  bool held() const { return arena_ != nullptr; }
  /// Releases the region now (see the file comment).
  void reset();

 private:
  friend class UploadArena;
  UploadArena* arena_ = nullptr;
  void* chunk_ = nullptr;
  std::array<const char*, kMaxTargets> bases_{};  // the region's chunk on each target
  std::array<size_t, kMaxParts> offsets_{};
};

class UploadArena {
 public:
  /// Chunks in flight before an upload waits on the host for the oldest one.
  static constexpr size_t kMaxChunks = 4;

  /// An arena used on `stream` with `chunks` chunks (1 to kMaxChunks) of `capacity` bytes each
  /// allocated now. With kMaxChunks of them, uploads that fit a chunk never allocate: when every
  /// chunk is in flight, an upload waits for the oldest released one instead.
  static StatusOr<std::unique_ptr<UploadArena>> create(Backend& backend, Stream stream,
                                                       size_t capacity, size_t chunks = 1) {
    return create({UploadTarget{&backend, stream}}, capacity, chunks);
  }
  /// An arena over `targets` (1 to UploadLease::kMaxTargets; the staging is pinned by the first
  /// target's backend), as create() above for each.
  static StatusOr<std::unique_ptr<UploadArena>> create(std::vector<UploadTarget> targets,
                                                       size_t capacity, size_t chunks = 1);
  /// Waits for the streams, then frees every chunk. Leases must have been released.
  ~UploadArena();
  UploadArena(const UploadArena&) = delete;
  UploadArena& operator=(const UploadArena&) = delete;

  /// Packs `parts` (at most UploadLease::kMaxParts) into one region and queues one copy of it to
  /// each target's device on its stream. On error no region is held, and nothing is queued
  /// unless a later target's copy failed (the earlier targets' copies then fill a region no
  /// lease holds, which the next upload overwrites in stream order).
  StatusOr<UploadLease> upload(std::initializer_list<UploadPart> parts) {
    return upload(parts.begin(), parts.size());
  }
  /// upload() of `count` parts at `parts` (a list whose length is known at run time).
  StatusOr<UploadLease> upload(const UploadPart* parts, size_t count);

  /// Bytes of pinned (and of device) memory the arena holds now.
  size_t capacity_bytes() const;
  /// Chunks held now.
  size_t num_chunks() const { return chunks_.size(); }
  /// Leases not yet released.
  int64_t live_leases() const;

 private:
  // A pinned staging buffer and its device twin on each target, filled front to back.
  struct Chunk {
    void* staging = nullptr;
    std::vector<void*> device;  // by target
    size_t capacity = 0;
    size_t offset = 0;
    int64_t live = 0;  // leases not yet released
    // By target: recorded once the chunk is retired and its last lease released.
    std::vector<Event> fence;
    bool fenced = false;    // every target's `fence` holds that recording
    bool unfenced = false;  // recording one failed: reuse only after synchronising the streams
  };
  explicit UploadArena(std::vector<UploadTarget> targets) : targets_(std::move(targets)) {}
  StatusOr<Chunk*> chunk_for(size_t bytes);
  StatusOr<Chunk*> new_chunk(size_t capacity);
  void free_chunk(Chunk* c);
  void retire(Chunk* c);
  void fence(Chunk* c);
  StatusOr<bool> reusable(Chunk* c, bool wait);
  void release(void* chunk);
  Backend& staging_backend() const { return *targets_.front().backend; }
  friend class UploadLease;

  std::vector<UploadTarget> targets_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  Chunk* current_ = nullptr;
};

}  // namespace pagedkv::runtime
