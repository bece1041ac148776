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

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t default_stream, const cudaDeviceProp& props)
      : device_(device), default_stream_(default_stream), props_(props) {
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
           std::to_string(props_.totalGlobalMem >> 20) + " MiB)";
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

  StatusOr<Stream> create_stream() override {
    PAGEDKV_RETURN_IF_ERROR(alive());
    const DeviceGuard guard(device_);
    cudaStream_t s = nullptr;
    PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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
    // refused by cudaMemcpyBatchAsync, and a driver older than the toolkit lacks it: both take
    // the loop below.
    if (dsts.size() > 1 && s != nullptr && s != cudaStreamLegacy &&
        batch_supported_.load(std::memory_order_relaxed)) {
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
      if (err == cudaSuccess) return ok_status();
      if (err != cudaErrorNotSupported && err != cudaErrorCallRequiresNewerDriver) {
        return check(err, "cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, s)", __FILE__,
                     __LINE__);
      }
      (void)cudaGetLastError();  // not sticky: clear it and use the loop from now on
      batch_supported_.store(false, std::memory_order_relaxed);
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
    PAGEDKV_ASSIGN_OR_RETURN(cudaStream_t s, find_stream(stream));
    PAGEDKV_CUDA_CHECK(dispatch_kernel(launch.kernel, launch.params, launch.num_items, s,
                                       max_blocks_[static_cast<size_t>(launch.kernel)]));
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
  std::array<int, static_cast<size_t>(KernelId::kCount)> max_blocks_{};
  std::unordered_set<void*> streams_;  // created here: synchronized and destroyed here
  std::unordered_set<void*> wrapped_;  // the caller's: never destroyed here
  std::unordered_set<void*> events_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> batch_supported_{true};  // false once the driver refused cudaMemcpyBatchAsync
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
  // A blocking stream: it is ordered with CUDA's legacy stream 0, so an application that runs
  // its kernels on stream 0 gets implicit order with the default stream's work.
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  return std::unique_ptr<Backend>(new CudaBackend(device, stream, props));
}

}  // namespace pagedkv::cuda
