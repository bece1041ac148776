#include <mutex>
#include <string>
#include <utility>

#include "pagedkv/fault_injection.hpp"

namespace pagedkv {

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kAllocation:
      return "allocation";
    case FaultKind::kCopy:
      return "copy";
    case FaultKind::kLaunch:
      return "launch";
    case FaultKind::kEvent:
      return "event";
    case FaultKind::kSync:
      return "sync";
    case FaultKind::kQuery:
      return "query";
  }
  return "unknown";
}

FaultInjectionBackend::FaultInjectionBackend(Backend& inner) : inner_(inner) {}

void FaultInjectionBackend::fail_nth(FaultKind kind, int64_t n) {
  Counter& c = counters_[static_cast<size_t>(kind)];
  c.target.store(n <= 0 ? 0 : c.calls.load() + n);
}

void FaultInjectionBackend::disarm_all() {
  for (Counter& c : counters_) c.target.store(0);
}

bool FaultInjectionBackend::armed(FaultKind kind) const {
  return counters_[static_cast<size_t>(kind)].target.load() != 0;
}

int64_t FaultInjectionBackend::count(FaultKind kind) const {
  return counters_[static_cast<size_t>(kind)].calls.load();
}

int64_t FaultInjectionBackend::injected() const { return injected_.load(); }

int64_t FaultInjectionBackend::injected(FaultKind kind) const {
  return counters_[static_cast<size_t>(kind)].injected.load();
}

std::string FaultInjectionBackend::last_fault() const {
  std::lock_guard<std::mutex> lock(last_mutex_);
  return last_fault_;
}

void FaultInjectionBackend::reset_counts() {
  for (Counter& c : counters_) {
    c.target.store(0);
    c.calls.store(0);
    c.injected.store(0);
  }
  injected_.store(0);
  capture_violations_.store(0);
  {
    std::lock_guard<std::mutex> lock(copies_mutex_);
    copy_calls_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(launches_mutex_);
    launch_calls_.clear();
  }
  std::lock_guard<std::mutex> lock(last_mutex_);
  last_fault_.clear();
}

void FaultInjectionBackend::record_copies(bool on) { record_copies_.store(on); }

std::vector<CopyCall> FaultInjectionBackend::copy_calls() const {
  std::lock_guard<std::mutex> lock(copies_mutex_);
  return copy_calls_;
}

Status FaultInjectionBackend::note_copy(CopyCall call, Status status) {
  if (!record_copies_.load()) return status;
  call.failed = !status.ok();
  std::lock_guard<std::mutex> lock(copies_mutex_);
  copy_calls_.push_back(call);
  return status;
}

void FaultInjectionBackend::record_launches(bool on) { record_launches_.store(on); }

std::vector<LaunchCall> FaultInjectionBackend::launch_calls() const {
  std::lock_guard<std::mutex> lock(launches_mutex_);
  return launch_calls_;
}

Status FaultInjectionBackend::note_launch(LaunchCall call, Status status) {
  if (!record_launches_.load()) return status;
  call.failed = !status.ok();
  std::lock_guard<std::mutex> lock(launches_mutex_);
  launch_calls_.push_back(call);
  return status;
}

Status FaultInjectionBackend::tick(FaultKind kind, const char* call) {
  Counter& c = counters_[static_cast<size_t>(kind)];
  const int64_t index = c.calls.fetch_add(1) + 1;
  int64_t expected = index;
  // The exchange makes the fault one-shot even if two threads reach the same index.
  if (c.target.load() != index || !c.target.compare_exchange_strong(expected, 0)) {
    return ok_status();
  }
  injected_.fetch_add(1);
  c.injected.fetch_add(1);
  std::string message = std::string("injected fault: ") + fault_kind_name(kind) + " #" +
                        std::to_string(index) + " (" + call + ")";
  {
    std::lock_guard<std::mutex> lock(last_mutex_);
    last_fault_ = message;
  }
  return internal_error(std::move(message));
}

Status FaultInjectionBackend::outside_capture(const char* call) {
  if (!capturing_.load()) return ok_status();
  capture_violations_.fetch_add(1);
  std::string message = std::string("capture violation: ") + call + " while capturing";
  {
    std::lock_guard<std::mutex> lock(last_mutex_);
    last_fault_ = message;
  }
  return internal_error(std::move(message));
}

void FaultInjectionBackend::simulate_capture(bool on) { capturing_.store(on); }

int64_t FaultInjectionBackend::capture_violations() const { return capture_violations_.load(); }

StatusOr<bool> FaultInjectionBackend::is_capturing(Stream stream) {
  if (capturing_.load()) return true;
  return inner_.is_capturing(stream);
}

LiveObjects FaultInjectionBackend::live() const {
  LiveObjects out;
  out.device_allocations = live_device_.load();
  out.pinned_allocations = live_pinned_.load();
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    out.streams = static_cast<int64_t>(live_streams_.size());
  }
  out.events = live_events_.load();
  return out;
}

BackendKind FaultInjectionBackend::kind() const { return inner_.kind(); }

int32_t FaultInjectionBackend::device_ordinal() const { return inner_.device_ordinal(); }
int64_t FaultInjectionBackend::max_resident_threads() const {
  return inner_.max_resident_threads();
}

std::string FaultInjectionBackend::description() const {
  return "fault injection over " + inner_.description();
}

StatusOr<void*> FaultInjectionBackend::allocate_device(size_t bytes) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("allocate_device"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kAllocation, "allocate_device"));
  StatusOr<void*> ptr = inner_.allocate_device(bytes);
  if (ptr.ok()) live_device_.fetch_add(1);
  return ptr;
}

void FaultInjectionBackend::free_device(void* ptr) {
  if (ptr != nullptr) live_device_.fetch_sub(1);
  inner_.free_device(ptr);
}

StatusOr<void*> FaultInjectionBackend::allocate_pinned(size_t bytes) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("allocate_pinned"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kAllocation, "allocate_pinned"));
  StatusOr<void*> ptr = inner_.allocate_pinned(bytes);
  if (ptr.ok()) live_pinned_.fetch_add(1);
  return ptr;
}

void FaultInjectionBackend::free_pinned(void* ptr) {
  if (ptr != nullptr) live_pinned_.fetch_sub(1);
  inner_.free_pinned(ptr);
}

// Not a fault point: a lookup of memory already allocated (through the allocation count).
StatusOr<void*> FaultInjectionBackend::mapped_device_pointer(void* pinned) {
  return inner_.mapped_device_pointer(pinned);
}

StatusOr<Stream> FaultInjectionBackend::create_stream(StreamPriority priority) {
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kEvent, "create_stream"));
  StatusOr<Stream> stream = inner_.create_stream(priority);
  if (stream.ok()) {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    live_streams_.emplace(stream->handle, priority);
  }
  return stream;
}

std::optional<StreamPriority> FaultInjectionBackend::stream_priority(Stream stream) const {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = live_streams_.find(stream.handle);
  if (it == live_streams_.end()) return std::nullopt;
  return it->second;
}

// Not a fault point: wrapping only looks up (or names) a stream, and fails only on bad input.
// Not a live object either: a wrapped handle is a shared name that needs no release (a cache
// that wraps the server's stream leaves it wrapped), so destroy_stream of it counts nothing.
StatusOr<Stream> FaultInjectionBackend::wrap_stream(void* native) {
  return inner_.wrap_stream(native);
}

StatusOr<void*> FaultInjectionBackend::native_stream(Stream stream) {
  return inner_.native_stream(stream);
}

void FaultInjectionBackend::destroy_stream(Stream stream) {
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    live_streams_.erase(stream.handle);
  }
  inner_.destroy_stream(stream);
}

StatusOr<Event> FaultInjectionBackend::create_event() {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("create_event"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kEvent, "create_event"));
  StatusOr<Event> event = inner_.create_event();
  if (event.ok()) live_events_.fetch_add(1);
  return event;
}

void FaultInjectionBackend::destroy_event(Event event) {
  if (event.handle != nullptr) live_events_.fetch_sub(1);
  inner_.destroy_event(event);
}

Status FaultInjectionBackend::record_event(Event event, Stream stream) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("record_event"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kEvent, "record_event"));
  return inner_.record_event(event, stream);
}

Status FaultInjectionBackend::wait_event(Stream stream, Event event) {
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kEvent, "wait_event"));
  return inner_.wait_event(stream, event);
}

StatusOr<bool> FaultInjectionBackend::query_event(Event event) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("query_event"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kQuery, "query_event"));
  return inner_.query_event(event);
}

Status FaultInjectionBackend::synchronize_event(Event event) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("synchronize_event"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kSync, "synchronize_event"));
  return inner_.synchronize_event(event);
}

Status FaultInjectionBackend::synchronize_stream(Stream stream) {
  PAGEDKV_RETURN_IF_ERROR(outside_capture("synchronize_stream"));
  PAGEDKV_RETURN_IF_ERROR(tick(FaultKind::kSync, "synchronize_stream"));
  return inner_.synchronize_stream(stream);
}

Status FaultInjectionBackend::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                                         Stream stream) {
  const CopyCall call{/*batched=*/false, kind, stream, 1, bytes, false};
  Status status = kind == CopyKind::kHostToDevice ? outside_capture("copy_async (host to device)")
                                                  : ok_status();
  if (status.ok()) status = tick(FaultKind::kCopy, "copy_async");
  if (status.ok()) status = inner_.copy_async(dst, src, bytes, kind, stream);
  return note_copy(call, std::move(status));
}

Status FaultInjectionBackend::copy_batch(const CopyRegion* regions, size_t count, CopyKind kind,
                                         Stream stream) {
  CopyCall call{/*batched=*/true, kind, stream, count, 0, false};
  for (size_t i = 0; regions != nullptr && i < count; ++i) call.bytes += regions[i].bytes;
  Status status = kind == CopyKind::kHostToDevice ? outside_capture("copy_batch (host to device)")
                                                  : ok_status();
  if (status.ok()) status = tick(FaultKind::kCopy, "copy_batch");
  if (status.ok()) status = inner_.copy_batch(regions, count, kind, stream);
  return note_copy(call, std::move(status));
}

Status FaultInjectionBackend::launch_host_func(Stream stream, std::function<void()> fn) {
  LaunchCall call;
  call.host_func = true;
  call.stream = stream;
  Status status = outside_capture("launch_host_func");
  if (status.ok()) status = tick(FaultKind::kLaunch, "launch_host_func");
  if (status.ok()) status = inner_.launch_host_func(stream, std::move(fn));
  return note_launch(call, std::move(status));
}

Status FaultInjectionBackend::launch(const KernelLaunch& launch, Stream stream) {
  const LaunchCall call{/*host_func=*/false, launch.kernel,     stream,
                        launch.num_items,    launch.max_blocks, false};
  Status status = tick(FaultKind::kLaunch, "launch");
  if (status.ok()) status = inner_.launch(launch, stream);
  return note_launch(call, std::move(status));
}

}  // namespace pagedkv
