#include "runtime/upload_arena.hpp"

#include <cstring>

namespace pagedkv::runtime {
namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

StatusOr<std::unique_ptr<UploadArena>> UploadArena::create(Backend& backend, Stream stream,
                                                           size_t capacity) {
  std::unique_ptr<UploadArena> arena(new UploadArena(backend, stream));
  PAGEDKV_RETURN_IF_ERROR(arena->reallocate(align_up(capacity == 0 ? kAlign : capacity)));
  return arena;
}

UploadArena::~UploadArena() {
  backend_.synchronize_stream(stream_).ignore_error();  // copies may still read the staging ring
  release();
}

void UploadArena::release() {
  backend_.free_pinned(staging_);
  backend_.free_device(device_);
  staging_ = device_ = nullptr;
  capacity_ = offset_ = 0;
}

Status UploadArena::reallocate(size_t capacity) {
  PAGEDKV_ASSIGN_OR_RETURN(void* staging, backend_.allocate_pinned(capacity));
  StatusOr<void*> device = backend_.allocate_device(capacity);
  if (!device.ok()) {
    backend_.free_pinned(staging);
    return device.status();
  }
  release();
  staging_ = staging;
  device_ = *device;
  capacity_ = capacity;
  return ok_status();
}

StatusOr<void*> UploadArena::upload(const void* src, size_t bytes) {
  if (bytes == 0) return device_;  // nothing to copy; any valid pointer does
  const size_t need = align_up(bytes);
  if (offset_ + need > capacity_) {
    // Wrap: everything queued that reads the ring must be done before it is overwritten.
    PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_stream(stream_));
    offset_ = 0;
    ++round_;
    if (need > capacity_) {
      size_t grown = capacity_ * 2;
      while (grown < need) grown *= 2;
      PAGEDKV_RETURN_IF_ERROR(reallocate(grown));
    }
  }
  char* staging = static_cast<char*>(staging_) + offset_;
  char* device = static_cast<char*>(device_) + offset_;
  std::memcpy(staging, src, bytes);
  PAGEDKV_RETURN_IF_ERROR(
      backend_.copy_async(device, staging, bytes, CopyKind::kHostToDevice, stream_));
  offset_ += need;
  return static_cast<void*>(device);
}

}  // namespace pagedkv::runtime
