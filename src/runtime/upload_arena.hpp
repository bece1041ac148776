// Uploads small host arrays (slot mappings, block tables, block pairs) to the device without
// synchronising the host on every call: each upload is staged in a pinned ring and copied
// asynchronously on the cache's stream. The host waits only when the ring wraps, for the copies
// and kernels that still use the previous round.
#pragma once

#include <cstddef>
#include <memory>

#include "pagedkv/backend.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::runtime {

class UploadArena {
 public:
  /// A ring of `capacity` bytes in pinned and device memory, used on `stream`.
  static StatusOr<std::unique_ptr<UploadArena>> create(Backend& backend, Stream stream,
                                                       size_t capacity);
  ~UploadArena();
  UploadArena(const UploadArena&) = delete;
  UploadArena& operator=(const UploadArena&) = delete;

  /// Copies `bytes` bytes from host memory `src` to the device; the returned device pointer is
  /// valid for work queued on the stream until the ring wraps again. Grows the ring (after a
  /// synchronisation) when one upload is larger than it.
  StatusOr<void*> upload(const void* src, size_t bytes);

  size_t capacity() const { return capacity_; }
  /// Incremented each time the ring wraps: pointers from an earlier round are stale.
  uint64_t round() const { return round_; }

 private:
  UploadArena(Backend& backend, Stream stream) : backend_(backend), stream_(stream) {}
  Status reallocate(size_t capacity);
  void release();

  Backend& backend_;
  Stream stream_;
  void* staging_ = nullptr;  // pinned
  void* device_ = nullptr;
  size_t capacity_ = 0;
  size_t offset_ = 0;
  uint64_t round_ = 1;
};

}  // namespace pagedkv::runtime
