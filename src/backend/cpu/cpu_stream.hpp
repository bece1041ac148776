// A CPU "stream": one worker thread that runs queued work in order, and events that mark
// positions in such a queue. Asynchrony is real: enqueue returns before queued work runs. Work
// that cannot block may instead run on the caller's thread when the stream is idle, which saves
// the hand-off to the worker and back; the order of the stream is the same either way.
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

  /// Queues `task`; it runs after everything queued before it. With `may_run_inline` and an idle
  /// stream (nothing queued, nothing running) it runs on the calling thread before enqueue
  /// returns instead; pass it only for tasks that never block on other work (no event waits on
  /// incomplete events, no sleeps, no user code).
  void enqueue(std::function<void()> task, bool may_run_inline = false);
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
  // A task is running (on the worker, or inline on a caller); the worker takes nothing from the
  // queue meanwhile, so a task queued behind an inline one cannot overtake it.
  bool busy_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the state above is constructed
};

}  // namespace pagedkv::cpu
