// The CUDA backend: device memory, pinned host memory, streams, events, and kernel bodies
// launched through the generic trampoline.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_factory.hpp"
#include "backend/cuda/cuda_status.hpp"
#include "backend/cuda/device_guard.cuh"
#include "kernels/launch.cuh"
#include "kernels/registry.hpp"

// Returns the Status of a failed CUDA call from a CudaBackend method; a sticky error also marks
// the backend's context lost (CudaBackend::check).
#define PAGEDKV_CUDA_CHECK(call) \
  PAGEDKV_RETURN_IF_ERROR(this->check((call), #call, __FILE__, __LINE__))

namespace pagedkv::cuda {
namespace {

cudaMemcpyKind to_cuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kHostToHost:
      return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

void CUDART_CB run_host_func(void* data) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(data));
  (*fn)();
}

cudaError_t dispatch_kernel(KernelId id, const void* params, int64_t n, cudaStream_t stream,
                            int max_blocks) {
  switch (id) {
#define PAGEDKV_CUDA_LAUNCH_CASE(name, Body) \
  case KernelId::name:                       \
    return launch_body<Body>(params, n, stream, max_blocks);
    PAGEDKV_KERNEL_LIST(PAGEDKV_CUDA_LAUNCH_CASE)
#undef PAGEDKV_CUDA_LAUNCH_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

// Resident blocks per SM of a body's trampoline on the current device; 0 when unknown.
int resident_blocks(KernelId id) {
  int blocks = 0;
  cudaError_t e = cudaErrorInvalidValue;
  switch (id) {
#define PAGEDKV_CUDA_OCCUPANCY_CASE(name, Body) \
  case KernelId::name:                          \
    e = resident_blocks_per_sm<Body>(&blocks);  \
    break;
    PAGEDKV_KERNEL_LIST(PAGEDKV_CUDA_OCCUPANCY_CASE)
#undef PAGEDKV_CUDA_OCCUPANCY_CASE
    default:
      break;
  }
  return e == cudaSuccess ? blocks : 0;
}

// Stream priorities of a device (cudaDeviceGetStreamPriorityRange: a lower number is a higher
// priority; 0 is the lowest on every device so far, and the priority of a stream created without
// one). kNormal sits one step above the lowest where there is room, so that the copy streams
// (kLow) yield to the cache's compute stream rather than share its priority.
struct Priorities {
  int normal = 0;
  int low = 0;
};

Priorities stream_priorities() {
  int least = 0, greatest = 0;
  if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
    cudaGetLastError();  // no priorities: every stream alike
    return {};
  }
  return {greatest < least ? least - 1 : least, least};
}

// Whether cudaMemcpyBatchAsync works here: a 2-region, 1-byte-each device-to-device batch on a
// private stream, whose bytes are read back. A driver older than the toolkit, or a virtualised
// host that does not know the call, may refuse it with any error code (not only
// cudaErrorNotSupported), or accept it and do nothing; any failure picks the per-copy loop for
// the backend's life. The probe's errors are cleared, so none reaches the application.
bool probe_memcpy_batch() {
#if CUDART_VERSION >= 12080
  unsigned char* scratch = nullptr;
  cudaStream_t stream = nullptr;
  bool works = false;
  if (cudaMalloc(&scratch, 4) == cudaSuccess &&
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
    unsigned char bytes[4] = {0x5a, 0xa5, 0, 0};
    void* dsts[2] = {scratch + 2, scratch + 3};
    const void* srcs[2] = {scratch, scratch + 1};
    size_t sizes[2] = {1, 1};
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    bool ok = cudaMemcpyAsync(scratch, bytes, 4, cudaMemcpyHostToDevice, stream) == cudaSuccess;
#if CUDART_VERSION >= 13000
    ok = ok &&
         cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &attr_index, 1, stream) == cudaSuccess;
#else
    size_t fail_index = 0;
    ok = ok && cudaMemcpyBatchAsync(dsts, const_cast<void**>(srcs), sizes, 2, &attr, &attr_index, 1,
                                    &fail_index, stream) == cudaSuccess;
#endif
    unsigned char back[4] = {0, 0, 0, 0};
    ok = ok && cudaMemcpyAsync(back, scratch, 4, cudaMemcpyDeviceToHost, stream) == cudaSuccess;
    ok = cudaStreamSynchronize(stream) == cudaSuccess && ok;
    works = ok && back[2] == 0x5a && back[3] == 0xa5;
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (scratch != nullptr) cudaFree(scratch);
  cudaGetLastError();  // leave no error of the probe behind
  return works;
#else
  return false;  // a toolkit without cudaMemcpyBatchAsync
#endif
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t default_stream, const cudaDeviceProp& props,
              Priorities priorities, bool batch_supported)
      : device_(device),
        default_stream_(default_stream),
        props_(props),
        priorities_(priorities),
        batch_supported_(batch_supported) {
    // Per body, the blocks that are resident at once on every SM (from its registers: a cap
    // of SMs x threads per SM / 256 ignored them and left a partial second wave); grid-stride
    // loops cover the rest. The factory made `device` current.
    const int fallback = props.multiProcessorCount * (props.maxThreadsPerMultiProcessor / 256);
    for (int k = 0; k < static_cast<int>(KernelId::kCount); ++k) {
      const int per_sm = resident_blocks(static_cast<KernelId>(k));
      max_blocks_[static_cast<size_t>(k)] =
          per_sm > 0 ? props.multiProcessorCount * per_sm : (fallback > 0 ? fallback : 1024);
    }
  }
  ~CudaBackend() override {
    // Wrapped streams are the caller's: neither synchronized nor destroyed here. The caller's
    // current device is given back afterwards.
    DeviceGuard guard(device_);
    for (void* s : streams_) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(s));
      cudaStreamDestroy(static_cast<cudaStream_t>(s));
    }
    cudaStreamSynchronize(default_stream_);
    cudaStreamDestroy(default_stream_);
    for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    cudaGetLastError();  // leave no error of ours behind for the application
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  int32_t device_ordinal() const override { return device_; }
  int64_t max_resident_threads() const override {
    return static_cast<int64_t>(props_.multiProcessorCount) * props_.maxThreadsPerMultiProcessor;
  }

  std::string description() const override {
    return std::string("cuda: ") + props_.name + " (" + std::to_string(props_.multiProcessorCount) +
           " SMs, sm_" + std::to_string(props_.major) + std::to_string(props_.minor) + ", " +
           std::to_string(props_.totalGlobalMem >> 20) + " MiB; copy batches: " +
           (batch_supported_ ? "cudaMemcpyBatchAsync" : "one cudaMemcpyAsync per region") +
           "; stream priorities: normal " + std::to_string(priorities_.normal) + ", low " +
           std::to_string(priorities_.low) + ")";
  }

  StatusOr<void*> allocate_device(size_t bytes) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    if (bytes == 0) return invalid_argument("device allocation of zero bytes");
    void* ptr = nullptr;
    PAGEDKV_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    return ptr;
  }
  void free_device(void* ptr) override {
    const DeviceGuard guard(device_);
    if (ptr != nullptr) note(cudaFree(ptr), "cudaFree", __FILE__, __LINE__);
  }
  StatusOr<void*> allocate_pinned(size_t bytes) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    if (bytes == 0) return invalid_argument("pinned allocation of zero bytes");
    void* ptr = nullptr;
    // Mapped, so the transfer engine's copy kernel can reach it (mapped_device_pointer); under
    // unified addressing every pinned allocation is mapped anyway, so this costs nothing.
    const unsigned flags =
        cudaHostAllocPortable | (props_.canMapHostMemory != 0 ? cudaHostAllocMapped : 0u);
    PAGEDKV_CUDA_CHECK(cudaHostAlloc(&ptr, bytes, flags));
    return ptr;
  }
  void free_pinned(void* ptr) override {
    if (ptr != nullptr) note(cudaFreeHost(ptr), "cudaFreeHost", __FILE__, __LINE__);
  }
  StatusOr<void*> mapped_device_pointer(void* pinned) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    if (pinned == nullptr) return invalid_argument("mapped_device_pointer: null pointer");
    if (props_.canMapHostMemory == 0) {
      return unimplemented(std::string("mapped_device_pointer: ") + props_.name +
                           " cannot map host memory");
    }
    const DeviceGuard guard(device_);
    cudaPointerAttributes attributes{};
    PAGEDKV_CUDA_CHECK(cudaPointerGetAttributes(&attributes, pinned));
    if (attributes.type != cudaMemoryTypeHost) {
      return invalid_argument("mapped_device_pointer: not pinned host memory");
    }
    void* device = nullptr;
    PAGEDKV_CUDA_CHECK(cudaHostGetDevicePointer(&device, pinned, 0));
    return device;
  }

  StatusOr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    PAGEDKV_RETURN_IF_ERROR(validate_stream_priority(priority));
    const DeviceGuard guard(device_);
    const int value = priority == StreamPriority::kLow ? priorities_.low : priorities_.normal;
    cudaStream_t s = nullptr;
    PAGEDKV_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, value));
    streams_.insert(s);
    return Stream{s};
  }
  StatusOr<Stream> wrap_stream(void* native) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    if (native == nullptr) {
      return invalid_argument(
          "wrap_stream: null native stream (wrap cudaStreamLegacy for CUDA's legacy stream 0)");
    }
    if (native == static_cast<void*>(default_stream_)) return Stream{};
    if (streams_.count(native) != 0 || wrapped_.count(native) != 0) return Stream{native};
    // Taken as it is, with no query: a stream query can fail (and invalidate the capture) while
    // the caller captures the stream into a CUDA graph. The handle must be a stream of this
    // backend's device, or cudaStreamLegacy / cudaStreamPerThread.
    wrapped_.insert(native);
    return Stream{native};
  }
  StatusOr<void*> native_stream(Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    return static_cast<void*>(s);
  }
  StatusOr<bool> is_capturing(Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    PAGEDKV_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  void destroy_stream(Stream stream) override {
    if (wrapped_.erase(stream.handle) != 0) return;  // the caller's: forget it, nothing more
    if (streams_.erase(stream.handle) == 0) return;
    const DeviceGuard guard(device_);
    const auto s = static_cast<cudaStream_t>(stream.handle);
    note(cudaStreamSynchronize(s), "cudaStreamSynchronize", __FILE__, __LINE__);
    note(cudaStreamDestroy(s), "cudaStreamDestroy", __FILE__, __LINE__);
  }
  StatusOr<Event> create_event() override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    cudaEvent_t e = nullptr;
    PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.insert(e);
    return Event{e};
  }
  void destroy_event(Event event) override {
    const DeviceGuard guard(device_);
    if (events_.erase(event.handle) != 0) {
      note(cudaEventDestroy(static_cast<cudaEvent_t>(event.handle)), "cudaEventDestroy", __FILE__,
           __LINE__);
    }
  }

  Status record_event(Event event, Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaEvent_t e, find_event(event));
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    PAGEDKV_CUDA_CHECK(cudaEventRecord(e, s));
    return ok_status();
  }
  Status wait_event(Stream stream, Event event) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaEvent_t e, find_event(event));
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    PAGEDKV_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
    return ok_status();
  }
  StatusOr<bool> query_event(Event event) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaEvent_t e, find_event(event));
    const cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not-ready is not sticky, but keep the error slot clean
      return false;
    }
    PAGEDKV_RETURN_IF_ERROR(check(err, "cudaEventQuery(e)", __FILE__, __LINE__));
    return true;
  }
  Status synchronize_event(Event event) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaEvent_t e, find_event(event));
    PAGEDKV_CUDA_CHECK(cudaEventSynchronize(e));
    return ok_status();
  }
  Status synchronize_stream(Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(s));
    return ok_status();
  }

  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                    Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    if (bytes == 0) return ok_status();
    if (dst == nullptr || src == nullptr) return invalid_argument("copy with a null pointer");
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), s));
    return ok_status();
  }

  Status copy_batch(const CopyRegion* regions, size_t count, CopyKind kind,
                    Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    PAGEDKV_RETURN_IF_ERROR(validate_copy_batch(regions, count));
    if (count == 0) return ok_status();
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(count);
    srcs.reserve(count);
    sizes.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (regions[i].bytes == 0) continue;
      dsts.push_back(regions[i].dst);
      srcs.push_back(regions[i].src);
      sizes.push_back(regions[i].bytes);
    }
#if CUDART_VERSION >= 12080
    // One submission for the whole batch. The legacy stream (a wrapped 0 or cudaStreamLegacy) is
    // refused by cudaMemcpyBatchAsync, and where the probe at creation found the call missing or
    // broken (probe_memcpy_batch) every batch takes the loop below: the path never changes at
    // run time, so an error here is the copy's own.
    if (dsts.size() > 1 && s != nullptr && s != cudaStreamLegacy && batch_supported_) {
      // The sources are written by work queued earlier on the stream: read them in stream order.
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
#if CUDART_VERSION >= 13000
      const cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                   dsts.size(), &attr, &attr_index, 1, s);
#else
      size_t fail_index = 0;
      const cudaError_t err =
          cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes.data(),
                               dsts.size(), &attr, &attr_index, 1, &fail_index, s);
#endif
      return check(err, "cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, s)", __FILE__,
                   __LINE__);
    }
#endif
    for (size_t i = 0; i < dsts.size(); ++i) {
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], to_cuda(kind), s));
    }
    return ok_status();
  }

  Status launch_host_func(Stream stream, std::function<void()> fn) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    if (!fn) return invalid_argument("launch_host_func with an empty function");
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    auto* boxed = new std::function<void()>(std::move(fn));
    const cudaError_t err = cudaLaunchHostFunc(s, run_host_func, boxed);
    if (err != cudaSuccess) delete boxed;
    PAGEDKV_RETURN_IF_ERROR(
        check(err, "cudaLaunchHostFunc(s, run_host_func, boxed)", __FILE__, __LINE__));
    return ok_status();
  }

  Status launch(const KernelLaunch& launch, Stream stream) override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    const size_t expected = kernels::kernel_params_size(launch.kernel);
    if (expected == 0) return invalid_argument("launch of an unknown kernel id");
    if (launch.params == nullptr || launch.params_size != expected) {
      return invalid_argument(std::string("kernel ") + kernels::kernel_name(launch.kernel) +
                              ": parameter block of " + std::to_string(launch.params_size) +
                              " bytes, expected " + std::to_string(expected));
    }
    if (launch.num_items < 0) return invalid_argument("negative index space");
    if (launch.max_blocks < 0) {
      return invalid_argument(std::string("kernel ") + kernels::kernel_name(launch.kernel) +
                              ": negative max_blocks");
    }
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    // One full wave of resident blocks, or fewer where the caller caps the grid.
    int grid = max_blocks_[static_cast<size_t>(launch.kernel)];
    if (launch.max_blocks > 0 && launch.max_blocks < grid) grid = launch.max_blocks;
    PAGEDKV_CUDA_CHECK(dispatch_kernel(launch.kernel, launch.params, launch.num_items, s, grid));
    return ok_status();
  }

 private:
  StatusOr<cudaStream_t> find_stream(Stream stream) const {
    if (stream.handle == nullptr) return default_stream_;
    if (streams_.count(stream.handle) == 0 && wrapped_.count(stream.handle) == 0) {
      return invalid_argument("unknown stream handle");
    }
    return static_cast<cudaStream_t>(stream.handle);
  }
  StatusOr<cudaEvent_t> find_event(Event event) const {
    if (events_.count(event.handle) == 0) return invalid_argument("unknown event handle");
    return static_cast<cudaEvent_t>(event.handle);
  }

  // The error every call returns once the context is lost; ok before.
  Status alive() const {
    if (!lost_.load(std::memory_order_acquire)) return ok_status();
    std::lock_guard<std::mutex> lock(lost_mutex_);
    return lost_status_;
  }
  // The Status of a CUDA call (cuda_status clears a non-sticky error from the last-error slot).
  // A sticky error loses the context: remembered, and returned from then on.
  Status check(cudaError_t err, const char* what, const char* file, int line) {
    if (err == cudaSuccess) return ok_status();
    Status status = cuda_status(err, what, file, line);
    if (!is_sticky_error(err)) return status;
    std::lock_guard<std::mutex> lock(lost_mutex_);
    if (!lost_.load(std::memory_order_relaxed)) {
      lost_status_ = internal_error("the CUDA context is lost: " + status.message());
      lost_.store(true, std::memory_order_release);
    }
    return lost_status_;
  }
  // check() for calls whose result has nowhere to go (frees, destroys).
  void note(cudaError_t err, const char* what, const char* file, int line) {
    (void)check(err, what, file, line);
  }
  int device_;
  cudaStream_t default_stream_;
  cudaDeviceProp props_;
  Priorities priorities_;
  const bool batch_supported_;  // cudaMemcpyBatchAsync passed the probe at creation
  std::array<int, static_cast<size_t>(KernelId::kCount)> max_blocks_{};
  std::unordered_set<void*> streams_;  // created here: synchronized and destroyed here
  std::unordered_set<void*> wrapped_;  // the caller's: never destroyed here
  std::unordered_set<void*> events_;
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mutex_;
  Status lost_status_;
};

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device) {
  const int count = device_count();
  if (count == 0) return unavailable("no CUDA device is present");
  if (device >= count) {
    return invalid_argument("device " + std::to_string(device) + ": only " + std::to_string(count) +
                            " CUDA devices are present");
  }
  if (device < 0) PAGEDKV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DeviceGuard guard(device);  // the stream below is the device's; the caller's device stays
  cudaDeviceProp props{};
  PAGEDKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, device));
  const Priorities priorities = stream_priorities();
  // A blocking stream: it is ordered with CUDA's legacy stream 0, so an application that runs
  // its kernels on stream 0 gets implicit order with the default stream's work. At kNormal, above
  // the copy streams' kLow.
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&stream, cudaStreamDefault, priorities.normal));
  const bool batch_supported = probe_memcpy_batch();
  return std::unique_ptr<Backend>(
      new CudaBackend(device, stream, props, priorities, batch_supported));
}

}  // namespace pagedkv::cuda
