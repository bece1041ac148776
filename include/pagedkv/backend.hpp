// The executor interface: memory, streams, events, copies and kernel-body launches.
//
// Two implementations: the CPU backend (host memory; each stream is a worker thread running its
// work in order, so asynchrony and event ordering are real; work that cannot block may run on
// the caller's thread while the stream is idle) and the CUDA backend (cudaMalloc,
// pinned cudaHostAlloc, CUDA streams and events, a generic __global__ trampoline). Kernel bodies
// are written once (kernels/*.hpp) and named by a KernelId; each backend runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pagedkv/config.hpp"
#include "pagedkv/kernel_id.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// An ordered queue of work. The default-constructed Stream is the backend's default stream.
///
/// Which CUDA streams lie behind them: the default stream is a blocking stream the backend
/// creates (cudaStreamCreate), so it is ordered with work on CUDA's legacy stream 0 (a caller
/// that uses stream 0 gets implicit order); streams from create_stream() are non-blocking
/// (cudaStreamNonBlocking) and are ordered only by events; a wrap_stream() stream is the
/// caller's own, with the caller's flags. `Stream{}` is never CUDA's stream 0 itself: wrap
/// `cudaStreamLegacy` (or `cudaStreamPerThread`) to queue on it. Wrapping the same native handle
/// again gives the same Stream until destroy_stream() forgets it; the native handle of one of
/// the backend's own streams gives that stream back.
struct Stream {
  void* handle = nullptr;
  friend bool operator==(Stream a, Stream b) { return a.handle == b.handle; }
  friend bool operator!=(Stream a, Stream b) { return a.handle != b.handle; }
};

/// A marker in a stream: recorded after the work queued so far, waited on by other streams.
struct Event {
  void* handle = nullptr;
};

/// Where the source and destination of a copy live.
enum class CopyKind : uint8_t {
  kDeviceToDevice = 0,
  kDeviceToHost = 1,
  kHostToDevice = 2,
  kHostToHost = 3,
};

/// "device-to-host" and so on, for messages.
const char* copy_kind_name(CopyKind kind);

/// One copy of a batch: `bytes` bytes from `src` to `dst`. A region of zero bytes is skipped.
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

/// One kernel launch: which body, its parameters (a trivially copyable struct the body type
/// expects; copied by the backend before `launch` returns) and the size of the index space.
struct KernelLaunch {
  KernelId kernel = KernelId::kFill;
  const void* params = nullptr;
  size_t params_size = 0;
  int64_t num_items = 0;
  /// The most CTAs (thread blocks of the CUDA grid) the launch may occupy; 0: no cap beyond the
  /// backend's own (one full wave of resident blocks). Bodies are index-only with grid-stride
  /// loops, so any grid gives the same bytes; a cap keeps a launch that is bound by something
  /// other than the SMs (PCIe, for the transfer engine's copy kernel) from taking every SM's
  /// warp slots from the compute kernels running beside it. The CPU backend ignores it.
  /// Negative: kInvalidArgument.
  int32_t max_blocks = 0;
};

/// A stream's scheduling priority relative to the backend's other streams (CUDA stream
/// priorities: where several streams have blocks ready, a higher-priority stream's are
/// scheduled first; running blocks are not preempted).
enum class StreamPriority : uint8_t {
  /// The default stream's and create_stream()'s default: on CUDA one step above the device's
  /// lowest priority where the device has more than one, so that kLow streams yield to it.
  kNormal = 0,
  /// The device's lowest priority: for background work (the transfer engine's copy streams)
  /// that should not delay the compute stream's kernels.
  kLow = 1,
};

/// "normal" or "low".
const char* stream_priority_name(StreamPriority priority);

/// Executes allocations, copies and kernel bodies. Methods are thread-compatible: one owner.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// kCpu, kCuda or kNull.
  virtual BackendKind kind() const = 0;
  /// A one-line description of the executor, e.g. "cuda: NVIDIA H200 (132 SMs, sm_90)".
  virtual std::string description() const = 0;
  /// The device its memory and streams belong to: the CUDA device ordinal; on the CPU backend
  /// the ordinal its options name (0 by default). DLPack exports carry it as `device_id`.
  virtual int32_t device_ordinal() const { return 0; }
  /// How many threads the device keeps resident at once (CUDA: SMs x threads per SM), which the
  /// data-plane ops size their launches by (few rows get more threads each); 0 where the backend
  /// does not say (the CPU backend: the ops then model a GPU).
  virtual int64_t max_resident_threads() const { return 0; }

  /// Device memory (host memory on the CPU backend), 256-byte aligned.
  /// kResourceExhausted when it cannot be had; zero bytes is kInvalidArgument.
  virtual StatusOr<void*> allocate_device(size_t bytes) = 0;
  virtual void free_device(void* ptr) = 0;
  /// Page-locked host memory usable by asynchronous copies, 256-byte aligned; mapped into the
  /// device's address space where the device can map host memory (mapped_device_pointer()).
  virtual StatusOr<void*> allocate_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;
  /// The address under which kernels reach pinned memory from allocate_pinned() (`pinned` may
  /// point inside an allocation), so a kernel can copy between device and host memory itself:
  /// the pointer itself on the CPU backend; cudaHostGetDevicePointer of memory allocated with
  /// cudaHostAllocMapped on CUDA. kUnimplemented where the device cannot map host memory (the
  /// default, for backends that do not say), kInvalidArgument for null or memory that is not
  /// this backend's pinned memory.
  virtual StatusOr<void*> mapped_device_pointer(void* pinned);

  /// A new stream owned by the backend (non-blocking on CUDA) with scheduling priority
  /// `priority` (cudaStreamCreateWithPriority; the CPU backend records it and runs every stream
  /// alike). Every override declares the same default, kNormal (a default argument of a virtual
  /// is taken from the static type). kInvalidArgument for an unknown priority.
  virtual StatusOr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) = 0;
  /// Wraps a native stream the caller owns (a cudaStream_t on CUDA; on the CPU backend any non-null
  /// handle names a stream of the backend's own, created on first use) so the cache can order its
  /// work with the caller's. Not owned: destroy_stream() forgets it without destroying it.
  /// kInvalidArgument for null.
  virtual StatusOr<Stream> wrap_stream(void* native) = 0;
  /// The native handle behind `stream` (a cudaStream_t on CUDA, also for the default stream;
  /// null on the CPU backend except for a wrapped stream, whose handle comes back), for
  /// libraries that take one (CUB, cuBLAS, a server's kernels). kInvalidArgument for an unknown
  /// stream.
  virtual StatusOr<void*> native_stream(Stream stream) = 0;
  /// Waits for the stream's work, then releases it. The default stream is not destroyed; a
  /// wrapped stream is forgotten (on CUDA without waiting and without destroying it).
  virtual void destroy_stream(Stream stream) = 0;
  /// Whether `stream` is capturing a CUDA graph (cudaStreamIsCapturing, legal during a
  /// capture): work queued on it now is recorded into the graph, not run, and allocations,
  /// event queries, synchronizations and host functions may invalidate the capture. False on
  /// the CPU backend. kInvalidArgument for an unknown stream.
  virtual StatusOr<bool> is_capturing(Stream stream) {
    (void)stream;
    return false;
  }
  virtual StatusOr<Event> create_event() = 0;
  virtual void destroy_event(Event event) = 0;

  /// Captures the work queued on `stream` so far; the event completes after it.
  virtual Status record_event(Event event, Stream stream) = 0;
  /// Work queued on `stream` after this call does not start before `event` (as last recorded)
  /// completes. Does not block the host.
  virtual Status wait_event(Stream stream, Event event) = 0;
  /// True when the event's captured work is done (also for a never-recorded event).
  virtual StatusOr<bool> query_event(Event event) = 0;
  /// Blocks the host until the event's captured work is done.
  virtual Status synchronize_event(Event event) = 0;
  /// Blocks the host until all work queued on `stream` is done.
  virtual Status synchronize_stream(Stream stream) = 0;

  /// Queues a copy of `bytes` bytes on `stream`.
  virtual Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                            Stream stream) = 0;
  /// Queues the copies of `regions[0, count)` on `stream` as one operation (cudaMemcpyBatchAsync
  /// on CUDA 12.8+): it starts after the work queued before it and the work queued after it
  /// starts after every copy is done; within the batch the copies may run in any order or at
  /// once, so no region may write bytes another one reads or writes (not checked). Count 0 is a
  /// no-op. kInvalidArgument (nothing queued) for null `regions` with a positive count or a
  /// region with bytes and a null pointer; a backend error may leave part of the batch queued.
  virtual Status copy_batch(const CopyRegion* regions, size_t count, CopyKind kind,
                            Stream stream) = 0;
  /// Queues `fn` to run on the host in stream order (cudaLaunchHostFunc). `fn` must not call
  /// back into the backend.
  virtual Status launch_host_func(Stream stream, std::function<void()> fn) = 0;
  /// Queues a kernel body over the index space [0, launch.num_items), on at most
  /// launch.max_blocks CTAs when that is positive.
  virtual Status launch(const KernelLaunch& launch, Stream stream) = 0;
};

/// The argument checks every copy_batch() makes before it queues anything (see there): ok, or
/// kInvalidArgument naming the first bad region.
Status validate_copy_batch(const CopyRegion* regions, size_t count);

/// The argument check every create_stream() makes: ok, or kInvalidArgument for a value outside
/// StreamPriority.
Status validate_stream_priority(StreamPriority priority);

/// Creates a backend. kAuto picks CUDA when this build has it and a device is present, else the
/// CPU backend (never the null backend, which only kNull gives); the choice is logged once. kCuda
/// without a device (or without CUDA in this build) is kUnavailable. A CUDA backend belongs to
/// device `device` (-1: the device current when it is created): each of its calls makes that device
/// current and gives the caller's back afterwards, so a process can hold one cache per GPU. A CPU
/// backend reports `device` as its ordinal (-1: 0). kInvalidArgument for a device below -1 or
/// (CUDA) not present.
StatusOr<std::unique_ptr<Backend>> create_backend(BackendKind kind = BackendKind::kAuto,
                                                  int32_t device = -1);

/// True when this build includes the CUDA backend.
bool cuda_backend_built();

/// True when the CUDA backend is built and at least one device is present.
bool cuda_device_available();

}  // namespace pagedkv
