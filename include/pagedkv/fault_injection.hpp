// FaultInjectionBackend: a Backend that delegates every call to another one and makes the n-th
// call of a chosen kind fail, so tests can check that a caller (KvCache, the transfer engine, a
// server) survives a backend error at every point where one can happen.
//
// A failed call does nothing on the inner backend and returns kInternal with a message
// "injected fault: <kind> #<index> (<call>)", e.g. "injected fault: copy #7 (copy_async)", where
// <index> is the 1-based count of calls of that kind since construction (or reset_counts()).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedkv/backend.hpp"

namespace pagedkv {

/// Which backend calls a fault can be injected into. Calls that cannot fail (kind, description,
/// native_stream, the free_* and destroy_* calls) and the lookups wrap_stream (of the caller's
/// stream) and mapped_device_pointer, which fail only on bad input, are neither counted nor
/// failed.
enum class FaultKind : uint8_t {
  kAllocation = 0,  // allocate_device, allocate_pinned
  kCopy = 1,        // copy_async, copy_batch (one call however many regions)
  kLaunch = 2,      // launch (the transfer engine's copy kernel too), launch_host_func
  kEvent = 3,       // create_stream, create_event, record_event, wait_event
  kSync = 4,        // synchronize_stream, synchronize_event
  kQuery = 5,       // query_event (fails without waiting)
};
inline constexpr int kNumFaultKinds = 6;

/// "allocation", "copy", "launch", "event", "sync" or "query".
///
/// Queries have their own kind because how many a call makes depends on timing (a poll stops at
/// the first copy still running), so counting them with the waits would make the n-th sync fault
/// land on different calls from run to run. A caller may absorb a failed query (a poll that
/// fails is retried later); the other kinds come back from the call that met them.
const char* fault_kind_name(FaultKind kind);

/// Objects made through a FaultInjectionBackend and not yet released through it, for leak
/// checks (the CPU backend frees what is left when it is destroyed, so ASan cannot see these).
struct LiveObjects {
  int64_t device_allocations = 0;  // allocate_device minus free_device of non-null pointers
  int64_t pinned_allocations = 0;  // allocate_pinned minus free_pinned of non-null pointers
  int64_t streams = 0;             // create_stream minus destroy_stream of those streams
  int64_t events = 0;              // create_event minus destroy_event of non-null events
  friend bool operator==(const LiveObjects& a, const LiveObjects& b) {
    return a.device_allocations == b.device_allocations &&
           a.pinned_allocations == b.pinned_allocations && a.streams == b.streams &&
           a.events == b.events;
  }
  friend bool operator!=(const LiveObjects& a, const LiveObjects& b) { return !(a == b); }
};

/// One copy call seen by the wrapper while it records them (record_copies()).
struct CopyCall {
  bool batched = false;  // copy_batch (else copy_async)
  CopyKind kind = CopyKind::kDeviceToDevice;
  Stream stream;
  size_t regions = 0;   // 1 for copy_async; the count passed to copy_batch
  size_t bytes = 0;     // over all regions
  bool failed = false;  // the wrapper injected a fault or the inner backend returned an error
};

/// One launch call seen by the wrapper while it records them (record_launches()).
struct LaunchCall {
  bool host_func = false;  // launch_host_func (else launch; the fields below are then unset)
  KernelId kernel = KernelId::kFill;
  Stream stream;
  int64_t num_items = 0;
  int32_t max_blocks = 0;  // KernelLaunch::max_blocks as passed
  bool failed = false;     // the wrapper injected a fault or the inner backend returned an error
};

/// Wraps a backend (not owned, must outlive the wrapper) and fails chosen calls once.
/// Counters and arming are atomic, so a test thread may arm while the owner thread calls.
class FaultInjectionBackend final : public Backend {
 public:
  explicit FaultInjectionBackend(Backend& inner);

  /// The wrapped backend (calls made on it directly are not counted).
  Backend& inner() { return inner_; }

  /// Arms `kind`: the n-th call of that kind from now (1-based) fails, once. n <= 0 disarms.
  /// Replaces an earlier arming of the same kind; other kinds keep theirs.
  void fail_nth(FaultKind kind, int64_t n);
  /// Disarms every kind.
  void disarm_all();
  /// Whether `kind` is armed (its fault has not fired yet).
  bool armed(FaultKind kind) const;
  /// Calls of `kind` seen since construction or reset_counts(), failed ones included.
  int64_t count(FaultKind kind) const;
  /// Faults injected since construction or reset_counts().
  int64_t injected() const;
  /// Faults of `kind` injected since construction or reset_counts().
  int64_t injected(FaultKind kind) const;
  /// The message of the last injected fault ("" when none).
  std::string last_fault() const;
  /// Zeroes the counts, the injected count and the last fault; disarms every kind. The live
  /// objects are real and stay counted.
  void reset_counts();
  /// Allocations, streams and events made through the wrapper and not yet released.
  LiveObjects live() const;
  /// Starts (or stops) keeping a CopyCall for each copy_async and copy_batch, so tests can see
  /// how a caller batches its copies and on which streams. Off at construction.
  void record_copies(bool on);
  /// The copy calls recorded since recording started or reset_counts(), oldest first.
  std::vector<CopyCall> copy_calls() const;
  /// Starts (or stops) keeping a LaunchCall for each launch and launch_host_func, so tests can
  /// see a caller's launch shapes and whether it queues host functions. Off at construction.
  void record_launches(bool on);
  /// The launch calls recorded since recording started or reset_counts(), oldest first.
  std::vector<LaunchCall> launch_calls() const;
  /// The priority `stream` was created with, for a stream created through the wrapper and not
  /// yet destroyed; nullopt otherwise (the default stream, wrapped streams).
  std::optional<StreamPriority> stream_priority(Stream stream) const;
  /// Starts (or stops) acting as if every stream were capturing a CUDA graph: is_capturing()
  /// answers true, and each call a capture must not see (allocations, create_event,
  /// record_event, query_event, synchronize_*, launch_host_func, and host-to-device copies,
  /// the uploads of host metadata) fails with kInternal "capture violation: ..." and is
  /// counted; launches, device-to-device copies and waits on events go through.
  void simulate_capture(bool on);
  /// Calls refused while simulating a capture, since construction or reset_counts().
  int64_t capture_violations() const;

  BackendKind kind() const override;
  std::string description() const override;
  int32_t device_ordinal() const override;
  int64_t max_resident_threads() const override;

  StatusOr<void*> allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  StatusOr<void*> allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  StatusOr<void*> mapped_device_pointer(void* pinned) override;

  StatusOr<Stream> create_stream(StreamPriority priority = StreamPriority::kNormal) override;
  StatusOr<Stream> wrap_stream(void* native) override;
  StatusOr<void*> native_stream(Stream stream) override;
  void destroy_stream(Stream stream) override;
  StatusOr<bool> is_capturing(Stream stream) override;
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
  struct Counter {
    std::atomic<int64_t> calls{0};
    std::atomic<int64_t> target{0};  // the index of the call to fail; 0 when disarmed
    std::atomic<int64_t> injected{0};
  };
  // Counts a call of `kind`; an error when it is the armed one.
  Status tick(FaultKind kind, const char* call);
  // Keeps `call` when recording; returns `status`.
  Status note_copy(CopyCall call, Status status);
  Status note_launch(LaunchCall call, Status status);
  // An error (and a count) when simulating a capture: `call` may not run inside one.
  Status outside_capture(const char* call);

  Backend& inner_;
  std::array<Counter, kNumFaultKinds> counters_;
  std::atomic<int64_t> injected_{0};
  std::atomic<int64_t> live_device_{0};
  std::atomic<int64_t> live_pinned_{0};
  mutable std::mutex streams_mutex_;
  // Created here, not yet destroyed (not wrapped ones), with their priorities.
  std::unordered_map<void*, StreamPriority> live_streams_;
  std::atomic<int64_t> live_events_{0};
  mutable std::mutex last_mutex_;
  std::string last_fault_;
  std::atomic<bool> record_copies_{false};
  std::atomic<bool> capturing_{false};
  std::atomic<int64_t> capture_violations_{0};
  mutable std::mutex copies_mutex_;
  std::vector<CopyCall> copy_calls_;
  std::atomic<bool> record_launches_{false};
  mutable std::mutex launches_mutex_;
  std::vector<LaunchCall> launch_calls_;
};

}  // namespace pagedkv
