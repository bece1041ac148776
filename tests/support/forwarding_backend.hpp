// ForwardingBackend: a Backend that hands every call to another one, for test backends that
// change a few calls (delay, gate, record, fill) and must pass the rest through unchanged,
// including the optional ones (device ordinal, resident threads, mapped pointers, capture).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "pagedkv/backend.hpp"

namespace pagedkv::testing {

class ForwardingBackend : public Backend {
 public:
  /// Forwards to `inner`, which must outlive this backend.
  explicit ForwardingBackend(Backend& inner) : inner_(&inner) {}
  /// Forwards to `inner`, which this backend owns.
  explicit ForwardingBackend(std::unique_ptr<Backend> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}

  Backend& inner() const { return *inner_; }

  BackendKind kind() const override { return inner_->kind(); }
  std::string description() const override { return inner_->description(); }
  int32_t device_ordinal() const override { return inner_->device_ordinal(); }
  int64_t max_resident_threads() const override { return inner_->max_resident_threads(); }
  StatusOr<void*> allocate_device(size_t b) override { return inner_->allocate_device(b); }
  void free_device(void* p) override { inner_->free_device(p); }
  StatusOr<void*> allocate_pinned(size_t b) override { return inner_->allocate_pinned(b); }
  void free_pinned(void* p) override { inner_->free_pinned(p); }
  StatusOr<void*> mapped_device_pointer(void* pinned) override {
    return inner_->mapped_device_pointer(pinned);
  }
  StatusOr<Stream> create_stream(StreamPriority p = StreamPriority::kNormal) override {
    return inner_->create_stream(p);
  }
  StatusOr<Stream> wrap_stream(void* n) override { return inner_->wrap_stream(n); }
  StatusOr<void*> native_stream(Stream s) override { return inner_->native_stream(s); }
  void destroy_stream(Stream s) override { inner_->destroy_stream(s); }
  StatusOr<bool> is_capturing(Stream s) override { return inner_->is_capturing(s); }
  StatusOr<Event> create_event() override { return inner_->create_event(); }
  void destroy_event(Event e) override { inner_->destroy_event(e); }
  Status record_event(Event e, Stream s) override { return inner_->record_event(e, s); }
  Status wait_event(Stream s, Event e) override { return inner_->wait_event(s, e); }
  StatusOr<bool> query_event(Event e) override { return inner_->query_event(e); }
  Status synchronize_event(Event e) override { return inner_->synchronize_event(e); }
  Status synchronize_stream(Stream s) override { return inner_->synchronize_stream(s); }
  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream s) override {
    PAGEDKV_RETURN_IF_ERROR(before_work(s));
    return inner_->copy_async(dst, src, bytes, kind, s);
  }
  Status copy_batch(const CopyRegion* r, size_t n, CopyKind kind, Stream s) override {
    PAGEDKV_RETURN_IF_ERROR(before_work(s));
    return inner_->copy_batch(r, n, kind, s);
  }
  Status launch_host_func(Stream s, std::function<void()> fn) override {
    return inner_->launch_host_func(s, std::move(fn));
  }
  Status launch(const KernelLaunch& l, Stream s) override {
    PAGEDKV_RETURN_IF_ERROR(before_work(s));
    return inner_->launch(l, s);
  }

 protected:
  /// Called before each copy or kernel launch is queued on `s` (not before a host function):
  /// a subclass may queue something ahead of it there (a stall, a gate). An error is the call's.
  virtual Status before_work(Stream s) {
    (void)s;
    return ok_status();
  }

 private:
  std::unique_ptr<Backend> owned_;
  Backend* inner_;
};

}  // namespace pagedkv::testing
