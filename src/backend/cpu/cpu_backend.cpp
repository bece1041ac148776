#include "backend/cpu/cpu_backend.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/paged_copy.hpp"
#include "kernels/registry.hpp"

namespace pagedkv::cpu {
namespace {

constexpr size_t kAlignment = 256;

size_t round_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Pools are large and written at scattered rows: with 4 KiB pages nearly every row written is a
// TLB miss. Large allocations are 2 MiB aligned and asked to be backed by transparent huge pages
// where the kernel allows it (a hint: without them nothing changes but speed).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{8} << 20;

void* allocate_host(size_t bytes) {
  if (bytes < kHugeFrom) return std::aligned_alloc(kAlignment, bytes);
  const size_t huge = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* ptr = std::aligned_alloc(kHugePage, huge);
#if defined(MADV_HUGEPAGE)
  if (ptr != nullptr) (void)madvise(ptr, huge, MADV_HUGEPAGE);
#endif
  return ptr;
}

template <typename Body>
void run_body(const void* params, int64_t num_items) {
  Body body;
  std::memcpy(static_cast<void*>(&body), params, sizeof(Body));
  for (int64_t i = 0; i < num_items; ++i) body(i);
  // Bodies may write with streaming stores (kernels::detail::copy_streaming), which are weakly
  // ordered: they must be visible before the stream reports the work done to another thread.
  kernels::detail::fence_streaming();
}

}  // namespace

void run_kernel(KernelId id, const void* params, int64_t num_items) {
  switch (id) {
#define PAGEDKV_CPU_RUN_CASE(name, Body) \
  case KernelId::name:                   \
    run_body<Body>(params, num_items);   \
    return;
    PAGEDKV_KERNEL_LIST(PAGEDKV_CPU_RUN_CASE)
#undef PAGEDKV_CPU_RUN_CASE
    default:
      return;  // rejected by launch() before anything is queued
  }
}

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : options_(options), default_stream_(std::make_unique<CpuStream>()) {
  device_.limit = options.device_memory_limit;
  pinned_.limit = options.pinned_memory_limit;
}

CpuBackend::~CpuBackend() {
  // Streams drain before the memory they may touch goes away.
  default_stream_.reset();
  streams_.clear();
  for (auto& [ptr, size] : device_.sizes) std::free(ptr);
  for (auto& [ptr, size] : pinned_.sizes) std::free(ptr);
}

std::string CpuBackend::description() const {
  return "cpu: " + std::to_string(std::thread::hardware_concurrency()) +
         " hardware threads, one worker thread per stream" +
         (options_.run_inline_when_idle ? " (idle streams run work inline)" : "");
}

StatusOr<void*> CpuBackend::allocate(Arena& arena, size_t bytes) {
  if (bytes == 0) return invalid_argument(std::string(arena.name) + " allocation of zero bytes");
  std::lock_guard<std::mutex> lock(arena_mutex_);
  const size_t rounded = round_up(bytes);
  if (rounded < bytes || (arena.limit != 0 && arena.in_use + rounded > arena.limit)) {
    return resource_exhausted(std::string(arena.name) + " memory exhausted: asked for " +
                              std::to_string(bytes) + " bytes, " + std::to_string(arena.in_use) +
                              " of " + std::to_string(arena.limit) + " in use");
  }
  void* ptr = allocate_host(rounded);
  if (ptr == nullptr) {
    return resource_exhausted(std::string(arena.name) + " allocation of " + std::to_string(bytes) +
                              " bytes failed");
  }
  arena.sizes.emplace(ptr, rounded);
  arena.in_use += rounded;
  return ptr;
}

void CpuBackend::release(Arena& arena, void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(arena_mutex_);
  auto it = arena.sizes.find(ptr);
  if (it == arena.sizes.end()) return;  // not ours: ignore rather than corrupt the heap
  arena.in_use -= it->second;
  arena.sizes.erase(it);
  std::free(ptr);
}

StatusOr<void*> CpuBackend::allocate_device(size_t bytes) { return allocate(device_, bytes); }
void CpuBackend::free_device(void* ptr) { release(device_, ptr); }
StatusOr<void*> CpuBackend::allocate_pinned(size_t bytes) { return allocate(pinned_, bytes); }
void CpuBackend::free_pinned(void* ptr) { release(pinned_, ptr); }

StatusOr<void*> CpuBackend::mapped_device_pointer(void* pinned) {
  if (pinned == nullptr) return invalid_argument("mapped_device_pointer: null pointer");
  const auto* p = static_cast<const char*>(pinned);
  std::lock_guard<std::mutex> lock(arena_mutex_);
  for (const auto& [base, size] : pinned_.sizes) {
    const auto* b = static_cast<const char*>(base);
    if (p >= b && p < b + size) return pinned;  // one address space: the host pointer itself
  }
  return invalid_argument("mapped_device_pointer: not pinned memory of this backend");
}

StatusOr<Stream> CpuBackend::create_stream(StreamPriority priority) {
  // Accepted and not acted on: each stream is its own worker thread, all alike.
  PAGEDKV_RETURN_IF_ERROR(validate_stream_priority(priority));
  auto stream = std::make_unique<CpuStream>();
  void* handle = stream.get();
  streams_.emplace(handle, StreamEntry{std::move(stream), nullptr});
  return Stream{handle};
}

StatusOr<Stream> CpuBackend::wrap_stream(void* native) {
  if (native == nullptr) return invalid_argument("wrap_stream: null native stream");
  auto it = wrapped_.find(native);
  if (it != wrapped_.end()) return Stream{it->second};
  // The handle only names the stream; the stream itself (a worker) is the backend's own.
  auto stream = std::make_unique<CpuStream>();
  void* handle = stream.get();
  streams_.emplace(handle, StreamEntry{std::move(stream), native});
  wrapped_.emplace(native, handle);
  return Stream{handle};
}

StatusOr<void*> CpuBackend::native_stream(Stream stream) {
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  (void)s;
  if (stream.handle == nullptr) return static_cast<void*>(nullptr);
  // A wrapped stream gives back the caller's handle; a created one has no native object.
  return streams_.at(stream.handle).native;
}

void CpuBackend::destroy_stream(Stream stream) {
  auto it = streams_.find(stream.handle);
  if (it == streams_.end()) return;
  if (it->second.native != nullptr) wrapped_.erase(it->second.native);
  streams_.erase(it);  // the destructor drains the queue
}

StatusOr<Event> CpuBackend::create_event() {
  auto event = std::make_shared<CpuEvent>();
  void* handle = event.get();
  events_.emplace(handle, std::move(event));
  return Event{handle};
}

void CpuBackend::destroy_event(Event event) {
  events_.erase(event.handle);  // queued work holds its own reference
}

StatusOr<CpuStream*> CpuBackend::find_stream(Stream stream) {
  if (stream.handle == nullptr) return default_stream_.get();
  auto it = streams_.find(stream.handle);
  if (it == streams_.end()) return invalid_argument("unknown stream handle");
  return it->second.stream.get();
}

StatusOr<std::shared_ptr<CpuEvent>> CpuBackend::find_event(Event event) {
  auto it = events_.find(event.handle);
  if (it == events_.end()) return invalid_argument("unknown event handle");
  return it->second;
}

Status CpuBackend::record_event(Event event, Stream stream) {
  PAGEDKV_ASSIGN_OR_RETURN(std::shared_ptr<CpuEvent> e, find_event(event));
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  const uint64_t generation = e->next_generation();
  s->enqueue([e, generation] { e->complete(generation); }, options_.run_inline_when_idle);
  return ok_status();
}

Status CpuBackend::wait_event(Stream stream, Event event) {
  PAGEDKV_ASSIGN_OR_RETURN(std::shared_ptr<CpuEvent> e, find_event(event));
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  const uint64_t generation = e->last_generation();
  if (generation == 0) return ok_status();  // never recorded: nothing to wait for (as CUDA)
  // Only a wait that cannot block may run inline; completion is monotonic, so a wait found
  // complete here stays a no-op. An incomplete one is queued, and the stream's later work with it.
  const bool may_run_inline = options_.run_inline_when_idle && e->is_complete(generation);
  s->enqueue([e, generation] { e->wait_for(generation); }, may_run_inline);
  return ok_status();
}

StatusOr<bool> CpuBackend::query_event(Event event) {
  PAGEDKV_ASSIGN_OR_RETURN(std::shared_ptr<CpuEvent> e, find_event(event));
  return e->is_complete(e->last_generation());
}

Status CpuBackend::synchronize_event(Event event) {
  PAGEDKV_ASSIGN_OR_RETURN(std::shared_ptr<CpuEvent> e, find_event(event));
  e->wait_for(e->last_generation());
  return ok_status();
}

Status CpuBackend::synchronize_stream(Stream stream) {
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  s->synchronize();
  return ok_status();
}

Status CpuBackend::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                              Stream stream) {
  if (bytes == 0) return ok_status();
  if (dst == nullptr || src == nullptr) {
    return invalid_argument(std::string(copy_kind_name(kind)) + " copy with a null pointer");
  }
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  const auto delay = stream.handle != nullptr ? options_.copy_delay : std::chrono::microseconds(0);
  // A delayed copy stays on the worker: it must not block the caller.
  s->enqueue(
      [dst, src, bytes, delay] {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        std::memmove(dst, src, bytes);
      },
      options_.run_inline_when_idle && delay.count() == 0);
  return ok_status();
}

Status CpuBackend::copy_batch(const CopyRegion* regions, size_t count, CopyKind kind,
                              Stream stream) {
  (void)kind;  // one address space: every kind is a memmove
  PAGEDKV_RETURN_IF_ERROR(validate_copy_batch(regions, count));
  if (count == 0) return ok_status();
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  std::vector<CopyRegion> copies;
  copies.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (regions[i].bytes > 0) copies.push_back(regions[i]);
  }
  if (copies.empty()) return ok_status();
  // One queued task for the whole batch, delayed once like one copy_async.
  const auto delay = stream.handle != nullptr ? options_.copy_delay : std::chrono::microseconds(0);
  s->enqueue(
      [copies = std::move(copies), delay] {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        for (const CopyRegion& r : copies) std::memmove(r.dst, r.src, r.bytes);
      },
      options_.run_inline_when_idle && delay.count() == 0);
  return ok_status();
}

Status CpuBackend::launch_host_func(Stream stream, std::function<void()> fn) {
  if (!fn) return invalid_argument("launch_host_func with an empty function");
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  s->enqueue(std::move(fn));  // user code may block or sleep: always on the worker, as on CUDA
  return ok_status();
}

Status CpuBackend::launch(const KernelLaunch& launch, Stream stream) {
  const size_t expected = kernels::kernel_params_size(launch.kernel);
  if (expected == 0) return invalid_argument("launch of an unknown kernel id");
  if (launch.params == nullptr || launch.params_size != expected) {
    return invalid_argument(std::string("kernel ") + kernels::kernel_name(launch.kernel) +
                            ": parameter block of " + std::to_string(launch.params_size) +
                            " bytes, expected " + std::to_string(expected));
  }
  if (launch.num_items < 0) {
    return invalid_argument(std::string("kernel ") + kernels::kernel_name(launch.kernel) +
                            ": negative index space");
  }
  // max_blocks shapes a CUDA grid; the loop below runs the same indices whatever it is.
  if (launch.max_blocks < 0) {
    return invalid_argument(std::string("kernel ") + kernels::kernel_name(launch.kernel) +
                            ": negative max_blocks");
  }
  PAGEDKV_ASSIGN_OR_RETURN(CpuStream * s, find_stream(stream));
  if (launch.num_items == 0) return ok_status();
  const auto* bytes = static_cast<const unsigned char*>(launch.params);
  std::vector<unsigned char> params(bytes, bytes + expected);
  auto delay = options_.kernel_delay;
  // The block-copy kernel on a created stream is the transfer engine's copy path: it lags like
  // a copy there.
  if (launch.kernel == KernelId::kCopyBlocks && stream.handle != nullptr &&
      streams_.at(stream.handle).native == nullptr) {
    delay += options_.copy_delay;
  }
  // A spin stands for a model's long kernel: it runs on the worker, as on a device, never on
  // the caller's thread.
  const bool may_run_inline =
      options_.run_inline_when_idle && delay.count() == 0 && launch.kernel != KernelId::kSpin;
  s->enqueue(
      [id = launch.kernel, params = std::move(params), n = launch.num_items, delay] {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        run_kernel(id, params.data(), n);
      },
      may_run_inline);
  return ok_status();
}

}  // namespace pagedkv::cpu

namespace pagedkv {

std::unique_ptr<Backend> create_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace pagedkv
