// The CPU backend: host memory, one worker thread per stream (work that cannot block runs on the
// caller's thread while its stream is idle), kernel bodies run in a loop.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/cpu/cpu_stream.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cpu_backend.hpp"

namespace pagedkv::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);
  ~CpuBackend() override;

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string description() const override;
  int32_t device_ordinal() const override { return options_.device_ordinal; }

  StatusOr<void*> allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  StatusOr<void*> allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  StatusOr<void*> mapped_device_pointer(void* pinned) override;

  StatusOr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) override;
  StatusOr<Stream> wrap_stream(void* native) override;
  StatusOr<void*> native_stream(Stream stream) override;
  void destroy_stream(Stream stream) override;
  StatusOr<Event> create_event() override;
  void destroy_event(Event event) override;

  Status record_event(Event event, Stream stream) override;
  Status wait_event(Stream stream, Event event) override;
  StatusOr<bool> query_event(Event event) override;
  Status synchronize_event(Event event) override;
  Status synchronize_stream(Stream stream) override;

  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                    Stream stream) override;
  Status copy_batch(const CopyRegion* regions, size_t count, CopyKind kind, Stream stream) override;
  Status launch_host_func(Stream stream, std::function<void()> fn) override;
  Status launch(const KernelLaunch& launch, Stream stream) override;

 private:
  // One pool of tracked allocations (device or pinned) with an optional byte limit.
  struct Arena {
    const char* name;
    size_t limit;
    size_t in_use = 0;
    std::unordered_map<void*, size_t> sizes;
  };
  StatusOr<void*> allocate(Arena& arena, size_t bytes);
  void release(Arena& arena, void* ptr);
  // A stream made by create_stream() or wrap_stream(); `native` is the wrapped handle (null for
  // a created stream).
  struct StreamEntry {
    std::unique_ptr<CpuStream> stream;
    void* native = nullptr;
  };
  StatusOr<CpuStream*> find_stream(Stream stream);
  StatusOr<std::shared_ptr<CpuEvent>> find_event(Event event);

  CpuBackendOptions options_;
  std::mutex arena_mutex_;
  Arena device_{"device", 0, 0, {}};
  Arena pinned_{"pinned", 0, 0, {}};
  std::unordered_map<void*, StreamEntry> streams_;  // by Stream::handle, the CpuStream*
  std::unordered_map<void*, void*> wrapped_;        // native handle -> Stream::handle
  std::unordered_map<void*, std::shared_ptr<CpuEvent>> events_;
  std::unique_ptr<CpuStream> default_stream_;
};

/// Runs kernel `id` over [0, num_items) on the calling thread. `params` is the body struct.
void run_kernel(KernelId id, const void* params, int64_t num_items);

}  // namespace pagedkv::cpu
