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

void CpuStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  work_cv_.notify_one();
}

void CpuStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = enqueued_;
  idle_cv_.wait(lock, [&] { return finished_ >= target; });
}

void CpuStream::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
    ++finished_;
    idle_cv_.notify_all();
  }
}

}  // namespace pagedkv::cpu
