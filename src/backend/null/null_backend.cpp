// The null backend (include/pagedkv/null_backend.hpp): checks each call as the CPU backend does,
// then does nothing. Memory is reserved address space (MAP_NORESERVE), committed page by page
// only where the host writes it.
#include "pagedkv/null_backend.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "kernels/registry.hpp"

namespace pagedkv {
namespace {

class NullBackend final : public Backend {
 public:
  explicit NullBackend(const NullBackendOptions& options) : options_(options) {
    const long page = sysconf(_SC_PAGESIZE);
    page_ = page > 0 ? static_cast<size_t>(page) : 4096;
  }
  ~NullBackend() override {
    for (const auto& [base, size] : device_) munmap(base, size);
    for (const auto& [base, size] : pinned_) munmap(base, size);
  }

  BackendKind kind() const override { return BackendKind::kNull; }
  std::string description() const override {
    return "null: no data (copies and kernels are not run; pools are unbacked address space)";
  }
  int32_t device_ordinal() const override { return options_.device_ordinal; }

  StatusOr<void*> allocate_device(size_t bytes) override { return allocate(&device_, bytes); }
  void free_device(void* ptr) override { release(&device_, ptr); }
  StatusOr<void*> allocate_pinned(size_t bytes) override { return allocate(&pinned_, bytes); }
  void free_pinned(void* ptr) override { release(&pinned_, ptr); }
  StatusOr<void*> mapped_device_pointer(void* pinned) override {
    if (pinned == nullptr) return invalid_argument("mapped_device_pointer: null pointer");
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pinned_.upper_bound(pinned);
    if (it != pinned_.begin()) {
      --it;
      const auto* b = static_cast<const char*>(it->first);
      if (static_cast<const char*>(pinned) < b + it->second) return pinned;  // one address space
    }
    return invalid_argument("mapped_device_pointer: not pinned memory of this backend");
  }

  StatusOr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) override {
    PAGEDKV_RETURN_IF_ERROR(validate_stream_priority(priority));
    void* handle = next_handle();
    streams_.emplace(handle, nullptr);
    return Stream{handle};
  }
  StatusOr<Stream> wrap_stream(void* native) override {
    if (native == nullptr) return invalid_argument("wrap_stream: null native stream");
    auto it = wrapped_.find(native);
    if (it != wrapped_.end()) return Stream{it->second};
    void* handle = next_handle();
    streams_.emplace(handle, native);
    wrapped_.emplace(native, handle);
    return Stream{handle};
  }
  StatusOr<void*> native_stream(Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(check_stream(stream));
    if (stream.handle == nullptr) return static_cast<void*>(nullptr);
    return streams_.at(stream.handle);
  }
  void destroy_stream(Stream stream) override {
    auto it = streams_.find(stream.handle);
    if (it == streams_.end()) return;
    if (it->second != nullptr) wrapped_.erase(it->second);
    streams_.erase(it);
  }
  StatusOr<bool> is_capturing(Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(check_stream(stream));
    return false;
  }
  StatusOr<Event> create_event() override {
    void* handle = next_handle();
    events_.insert(handle);
    return Event{handle};
  }
  void destroy_event(Event event) override { events_.erase(event.handle); }

  // Nothing is ever pending: events complete when recorded, waits and syncs return at once.
  Status record_event(Event event, Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(check_event(event));
    return check_stream(stream);
  }
  Status wait_event(Stream stream, Event event) override {
    PAGEDKV_RETURN_IF_ERROR(check_stream(stream));
    return check_event(event);
  }
  StatusOr<bool> query_event(Event event) override {
    PAGEDKV_RETURN_IF_ERROR(check_event(event));
    return true;
  }
  Status synchronize_event(Event event) override { return check_event(event); }
  Status synchronize_stream(Stream stream) override { return check_stream(stream); }

  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                    Stream stream) override {
    if (bytes == 0) return ok_status();
    if (dst == nullptr || src == nullptr) {
      return invalid_argument(std::string(copy_kind_name(kind)) + " copy with a null pointer");
    }
    return check_stream(stream);
  }
  Status copy_batch(const CopyRegion* regions, size_t count, CopyKind kind,
                    Stream stream) override {
    (void)kind;
    PAGEDKV_RETURN_IF_ERROR(validate_copy_batch(regions, count));
    return check_stream(stream);
  }
  // Stream order is kept by running it now: everything queued before it is already "done".
  Status launch_host_func(Stream stream, std::function<void()> fn) override {
    if (!fn) return invalid_argument("launch_host_func with an empty function");
    PAGEDKV_RETURN_IF_ERROR(check_stream(stream));
    fn();
    return ok_status();
  }
  Status launch(const KernelLaunch& launch, Stream stream) override {
    const size_t expected = kernels::kernel_params_size(launch.kernel);
    if (expected == 0) return invalid_argument("launch of an unknown kernel id");
    const std::string name = kernels::kernel_name(launch.kernel);
    if (launch.params == nullptr || launch.params_size != expected) {
      return invalid_argument("kernel " + name + ": parameter block of " +
                              std::to_string(launch.params_size) + " bytes, expected " +
                              std::to_string(expected));
    }
    if (launch.num_items < 0) return invalid_argument("kernel " + name + ": negative index space");
    if (launch.max_blocks < 0) return invalid_argument("kernel " + name + ": negative max_blocks");
    return check_stream(stream);  // the body is not run
  }

 private:
  using Allocations = std::map<void*, size_t>;

  StatusOr<void*> allocate(Allocations* arena, size_t bytes) {
    const char* what = arena == &device_ ? "device" : "pinned";
    if (bytes == 0) return invalid_argument(std::string(what) + " allocation of zero bytes");
    const size_t rounded = (bytes + page_ - 1) / page_ * page_;
    if (rounded < bytes) {
      return resource_exhausted(std::string(what) + " allocation of " + std::to_string(bytes) +
                                " bytes: too large");
    }
    // Page aligned (so 256-byte aligned); no swap or commit is reserved, and an untouched page
    // costs nothing.
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return resource_exhausted(std::string(what) + " allocation of " + std::to_string(bytes) +
                                " bytes failed: no address space");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    arena->emplace(p, rounded);
    return p;
  }
  void release(Allocations* arena, void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = arena->find(ptr);
    if (it == arena->end()) return;  // not ours: ignore, as the CPU backend does
    munmap(it->first, it->second);
    arena->erase(it);
  }
  Status check_stream(Stream stream) const {
    if (stream.handle == nullptr || streams_.count(stream.handle) != 0) return ok_status();
    return invalid_argument("unknown stream handle");
  }
  Status check_event(Event event) const {
    if (events_.count(event.handle) != 0) return ok_status();
    return invalid_argument("unknown event handle");
  }
  // Handles name streams and events only; they are never dereferenced.
  void* next_handle() { return reinterpret_cast<void*>(++handles_); }

  NullBackendOptions options_;
  size_t page_ = 4096;
  std::mutex mutex_;  // the allocation maps (mapped_device_pointer may be asked from any thread)
  Allocations device_;
  Allocations pinned_;
  uintptr_t handles_ = 0;
  std::unordered_map<void*, void*> streams_;  // handle -> wrapped native handle (null: created)
  std::unordered_map<void*, void*> wrapped_;  // native handle -> handle
  std::unordered_set<void*> events_;
};

}  // namespace

std::unique_ptr<Backend> create_null_backend(const NullBackendOptions& options) {
  return std::make_unique<NullBackend>(options);
}

}  // namespace pagedkv
