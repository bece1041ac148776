// StreamGate: holds a CPU-backend stream's worker in a host function until release(), so a test
// can see whether work was queued behind it (CPU backend only: a closed gate would block CUDA's
// one callback thread and every other stream's host functions behind it).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "pagedkv/backend.hpp"

namespace pagedkv::testing {

class StreamGate {
 public:
  Status close(Backend& backend, Stream stream) {
    return backend.launch_host_func(stream, [this] {
      while (!open_.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }
  void release() { open_.store(true); }

 private:
  std::atomic<bool> open_{false};
};

}  // namespace pagedkv::testing
