// A CPU "stream": one worker thread that runs queued work in order, and events that mark
// positions in such a queue. Asynchrony is real: enqueue returns before the work runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace pagedkv::cpu {

/// Completion state of an event. `recorded` counts record calls (made on the owner thread);
/// `completed` is the highest record generation whose captured work has finished.
class CpuEvent {
 public:
  /// Called by the owner when recording: returns the generation to complete later.
  uint64_t next_generation();
  /// The generation most recently handed out by next_generation().
  uint64_t last_generation() const;
  /// Called by a worker when the work captured by `generation` is done.
  void complete(uint64_t generation);
  /// Blocks until `generation` has completed.
  void wait_for(uint64_t generation) const;
  bool is_complete(uint64_t generation) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  uint64_t recorded_ = 0;
  uint64_t completed_ = 0;
};

/// An in-order work queue served by its own thread.
class CpuStream {
 public:
  CpuStream();
  ~CpuStream();  // drains the queue, then joins the worker
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  /// Queues `task`; it runs after everything queued before it.
  void enqueue(std::function<void()> task);
  /// Blocks until every task queued so far has run.
  void synchronize();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the state above is constructed
};

}  // namespace pagedkv::cpu
