// GatedTransfers: a CPU-backend wrapper that, while armed, holds all work queued on the
// low-priority streams (the transfer engine's copy streams) at a StreamGate until release().
// A test then sees an offload, restore or prefetch in flight for as long as it looks, with no
// timing margin to lose on a loaded machine, and chooses when the copies run. Everything else
// (the compute stream, the default stream of the test's own uploads) is never held.
#pragma once

#include <memory>
#include <set>
#include <vector>

#include "pagedkv/backend.hpp"
#include "support/forwarding_backend.hpp"
#include "support/stream_gate.hpp"

namespace pagedkv::testing {

class GatedTransfers final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  /// Holds the copy streams' work queued from now on until release(). Do not wait for that work
  /// (synchronize, a residency of kHost) before release(): it would wait forever.
  void arm() {
    gates_.push_back(std::make_unique<StreamGate>());
    armed_ = true;
  }
  /// Lets the held work run; work queued later is not held.
  void release() {
    armed_ = false;
    if (!gates_.empty()) gates_.back()->release();
  }

  StatusOr<Stream> create_stream(StreamPriority p = StreamPriority::kNormal) override {
    auto s = inner().create_stream(p);
    if (s.ok() && p == StreamPriority::kLow) gated_streams_.insert(s->handle);
    return s;
  }
  void destroy_stream(Stream s) override {
    gated_streams_.erase(s.handle);
    inner().destroy_stream(s);
  }

 private:
  Status before_work(Stream s) override {
    if (!armed_ || gated_streams_.count(s.handle) == 0) return ok_status();
    return gates_.back()->close(inner(), s);
  }

  bool armed_ = false;
  std::set<void*> gated_streams_;
  // Every gate made, kept while work queued behind it may still be waiting.
  std::vector<std::unique_ptr<StreamGate>> gates_;
};

}  // namespace pagedkv::testing
