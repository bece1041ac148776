#include "backend/cpu/cpu_stream.hpp"

#include <algorithm>
#include <utility>

namespace pagedkv::cpu {

uint64_t CpuEvent::next_generation() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++recorded_;
}

uint64_t CpuEvent::last_generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_;
}

void CpuEvent::complete(uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = std::max(completed_, generation);
  }
  cv_.notify_all();
}

void CpuEvent::wait_for(uint64_t generation) const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_ >= generation; });
}

bool CpuEvent::is_complete(uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= generation;
}

CpuStream::CpuStream() : worker_([this] { run(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
}

void CpuStream::enqueue(std::function<void()> task, bool may_run_inline) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++enqueued_;
  if (!may_run_inline || busy_ || !queue_.empty()) {
    queue_.push_back(std::move(task));
    lock.unlock();
    work_cv_.notify_one();
    return;
  }
  // Idle: everything queued before has finished (under this mutex, so its effects are visible
  // here), and busy_ keeps the worker from starting anything queued after this task meanwhile.
  busy_ = true;
  lock.unlock();
  task();
  lock.lock();
  busy_ = false;
  ++finished_;
  const bool queued_meanwhile = !queue_.empty();
  lock.unlock();
  if (queued_meanwhile) work_cv_.notify_one();
  idle_cv_.notify_all();
}

void CpuStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  idle_cv_.wait(lock, [&] { return finished_ >= target; });
}

void CpuStream::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !busy_ && (stopping_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    task();
    lock.lock();
    busy_ = false;
    ++finished_;
    idle_cv_.notify_all();
  }
}

}  // namespace pagedkv::cpu
