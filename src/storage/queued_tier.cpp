#include "storage/queued_tier.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/logging.hpp"
#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"

namespace pagedkv::detail {

struct QueuedStorageTier::Job {
  Kind kind = Kind::kPut;
  uint64_t id = 0;
  std::vector<StorageKey> keys;
  std::vector<std::unique_ptr<unsigned char[]>> stored;  // copying puts: each payload's copy
  std::vector<uint32_t> crcs;                            // copying puts: each payload's CRC-32C
  std::vector<const void*> borrowed;                     // borrowed puts: the caller's payloads
  std::vector<void*> dsts;                               // gets
  std::vector<uint8_t> block_ok;                         // gets: block i read and verified
  size_t remaining = 0;
  size_t failed = 0;
  std::string first_error;
};

Status check_queue_options(int32_t threads, int64_t max_queued_blocks) {
  if (threads < 1 || threads > 256) {
    return invalid_argument("threads: must be in [1, 256], got " + std::to_string(threads));
  }
  if (max_queued_blocks < 1) {
    return invalid_argument("max_queued_blocks: must be positive, got " +
                            std::to_string(max_queued_blocks));
  }
  return ok_status();
}

QueuedStorageTier::QueuedStorageTier(StorageLayout layout, int32_t threads,
                                     int64_t max_queued_blocks)
    : layout_(std::move(layout)),
      fingerprint_(layout_.fingerprint()),
      threads_(threads),
      max_queued_blocks_(max_queued_blocks) {
  borrowed_batch_blocks_ = std::max<size_t>(
      1, kCopyChunkBytes / static_cast<size_t>(std::max<int64_t>(1, layout_.block_bytes)));
  max_spare_ = static_cast<size_t>(std::max<int64_t>(
      1, std::min<int64_t>(max_queued_blocks,
                           kSpareBytes / std::max<int64_t>(1, layout_.block_bytes))));
}

std::unique_ptr<unsigned char[]> QueuedStorageTier::take_buffer() {
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    if (!spare_.empty()) {
      std::unique_ptr<unsigned char[]> b = std::move(spare_.back());
      spare_.pop_back();
      return b;
    }
  }
  const auto n = static_cast<size_t>(layout_.block_bytes);
  return std::unique_ptr<unsigned char[]>(new (std::nothrow) unsigned char[n]);
}

void QueuedStorageTier::give_back(std::unique_ptr<unsigned char[]> buffer) {
  std::lock_guard<std::mutex> lock(spare_mu_);
  if (spare_.size() < max_spare_) spare_.push_back(std::move(buffer));
}

QueuedStorageTier::~QueuedStorageTier() { stop_workers(); }

void QueuedStorageTier::start_workers() {
  for (int t = 0; t < threads_; ++t) workers_.emplace_back([this, t] { worker(t); });
}

void QueuedStorageTier::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.empty()) return;
    paused_ = false;
    stopping_ = true;  // the workers finish every queued task first
  }
  work_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
}

namespace {

std::string key_name(const StorageKey& k) {
  return "(ns " + hex16(k.ns) + ", hash " + hex16(k.block_hash) + ")";
}

template <typename P>
Status check_job(const char* call, const std::vector<StorageKey>& keys,
                 const std::vector<P>& blocks) {
  if (keys.empty()) return invalid_argument(std::string(call) + ": keys is empty");
  if (keys.size() != blocks.size()) {
    return invalid_argument(std::string(call) + ": " + std::to_string(keys.size()) + " keys but " +
                            std::to_string(blocks.size()) + " blocks");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] == nullptr) {
      return invalid_argument(std::string(call) + ": blocks[" + std::to_string(i) + "] is null");
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<uint64_t> QueuedStorageTier::submit_put(const std::vector<StorageKey>& keys,
                                                 const std::vector<const void*>& blocks) {
  Status s = check_job("submit_put", keys, blocks);
  if (!s.ok()) return s;
  const auto n = static_cast<int64_t>(keys.size());
  s = check_room(n);  // before copying, so a full queue costs no copy; again when queuing
  if (!s.ok()) return s;
  auto job = std::make_shared<Job>();
  job->kind = Kind::kPut;
  job->keys = keys;
  job->stored.reserve(keys.size());
  job->crcs.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::unique_ptr<unsigned char[]> buf = take_buffer();
    if (buf == nullptr) {
      rejected_puts_ += n;
      return resource_exhausted("submit_put: out of memory copying the blocks; nothing queued");
    }
    job->stored.push_back(std::move(buf));
  }
  job->remaining = keys.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return failed_precondition("storage tier: shutting down");
    if (queued_put_blocks_ + n > max_queued_blocks_) {
      rejected_puts_ += n;
      return resource_exhausted("submit_put: write queue full; nothing queued");
    }
    queued_put_blocks_ += n;
    job->id = next_job_++;
    running_.insert(job->id);
  }
  // Queued a chunk at a time as the copy goes, so that the I/O threads write the first blocks
  // while the later ones are copied: the copy is about half the cost of a write to the page
  // cache, and overlapping them is what brings a put near a plain sequential write.
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  const size_t chunk = std::max<size_t>(1, kCopyChunkBytes / payload);
  for (size_t i = 0; i < keys.size(); i += chunk) {
    const size_t end = std::min(keys.size(), i + chunk);
    for (size_t j = i; j < end; ++j) {  // the checksum in the same pass: one read of the bytes
      job->crcs[j] = crc32c_copy(job->stored[j].get(), blocks[j], payload);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t j = i; j < end; ++j) tasks_.push_back(Task{job, j});
    }
    work_cv_.notify_one();
  }
  return job->id;
}

Status QueuedStorageTier::check_room(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queued_put_blocks_ + n <= max_queued_blocks_) return ok_status();
  rejected_puts_ += n;
  return resource_exhausted("submit_put: write queue full (" + std::to_string(queued_put_blocks_) +
                            " of " + std::to_string(max_queued_blocks_) + " blocks queued, " +
                            std::to_string(n) + " more asked); nothing queued");
}

StatusOr<uint64_t> QueuedStorageTier::submit_put_borrowed(const std::vector<StorageKey>& keys,
                                                          const std::vector<const void*>& blocks) {
  Status s = check_job("submit_put_borrowed", keys, blocks);
  if (!s.ok()) return s;
  s = check_room(static_cast<int64_t>(keys.size()));
  if (!s.ok()) return s;
  auto job = std::make_shared<Job>();
  job->kind = Kind::kPut;
  job->keys = keys;
  job->borrowed = blocks;  // checksummed and written in place by the I/O threads
  return enqueue(std::move(job));
}

StatusOr<uint64_t> QueuedStorageTier::submit_get(const std::vector<StorageKey>& keys,
                                                 const std::vector<void*>& blocks) {
  Status s = check_job("submit_get", keys, blocks);
  if (!s.ok()) return s;
  auto job = std::make_shared<Job>();
  job->kind = Kind::kGet;
  job->keys = keys;
  job->dsts = blocks;
  job->block_ok.assign(keys.size(), 0);
  return enqueue(std::move(job));
}

Status QueuedStorageTier::remove(const std::vector<StorageKey>& keys) {
  if (keys.empty()) return ok_status();
  auto job = std::make_shared<Job>();
  job->kind = Kind::kRemove;
  job->keys = keys;
  StatusOr<uint64_t> id = enqueue(std::move(job));
  return id.ok() ? ok_status() : id.status();
}

StatusOr<uint64_t> QueuedStorageTier::enqueue(std::shared_ptr<Job> job) {
  const size_t n = job->keys.size();
  job->remaining = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return failed_precondition("storage tier: shutting down");
    if (job->kind == Kind::kPut) {
      if (queued_put_blocks_ + static_cast<int64_t>(n) > max_queued_blocks_) {
        rejected_puts_ += static_cast<int64_t>(n);
        return resource_exhausted("submit_put: write queue full; nothing queued");
      }
      queued_put_blocks_ += static_cast<int64_t>(n);
    }
    job->id = next_job_++;
    if (job->kind != Kind::kRemove) running_.insert(job->id);
    for (size_t i = 0; i < n; ++i) tasks_.push_back(Task{job, i});
  }
  work_cv_.notify_all();
  return job->id;
}

std::vector<StorageCompletion> QueuedStorageTier::poll() {
  std::vector<StorageCompletion> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(completions_);
  return out;
}

StatusOr<std::vector<StorageCompletion>> QueuedStorageTier::wait(const std::vector<uint64_t>& jobs,
                                                                 int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto taken = [this](uint64_t id) {
    return std::none_of(completions_.begin(), completions_.end(),
                        [id](const StorageCompletion& c) { return c.job == id; });
  };
  for (uint64_t id : jobs) {
    if (running_.count(id) == 0 && taken(id)) {
      return not_found("wait: job " + std::to_string(id) +
                       " is not pending (already taken by poll or wait, or never submitted)");
    }
  }
  const auto finished = [&] {
    return std::none_of(jobs.begin(), jobs.end(),
                        [this](uint64_t id) { return running_.count(id) != 0; });
  };
  if (timeout_ms < 0) {
    done_cv_.wait(lock, finished);
  } else {
    done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), finished);
  }
  // Ours move out; the rest stay for poll (a poll on another thread may have taken some of ours).
  std::vector<StorageCompletion> out;
  const auto ours = [&](const StorageCompletion& c) {
    return std::find(jobs.begin(), jobs.end(), c.job) != jobs.end();
  };
  for (StorageCompletion& c : completions_) {
    if (ours(c)) out.push_back(std::move(c));
  }
  completions_.erase(std::remove_if(completions_.begin(), completions_.end(), ours),
                     completions_.end());
  return out;
}

void QueuedStorageTier::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return tasks_.empty() && busy_ == 0; });
}

void QueuedStorageTier::set_paused(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
  }
  work_cv_.notify_all();
}

StorageStats QueuedStorageTier::stats() const {
  StorageStats s;
  s.puts = puts_.load();
  s.gets = gets_.load();
  s.bytes_written = bytes_written_.load();
  s.bytes_read = bytes_read_.load();
  s.failed_puts = failed_puts_.load();
  s.failed_gets = failed_gets_.load();
  s.rejected_puts = rejected_puts_.load();
  s.removed = removed_.load();
  s.gets_direct = gets_direct_.load();
  s.gets_in_place = gets_in_place_.load();
  return s;
}

void QueuedStorageTier::worker(int thread) {
  std::vector<Task> batch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(
        lock, [this] { return (!paused_ && !tasks_.empty()) || (stopping_ && tasks_.empty()); });
    if (tasks_.empty()) return;  // stopping, and nothing left to do
    // The next blocks of the same job, up to this thread's share of it.
    batch.clear();
    const std::shared_ptr<Job> job = tasks_.front().job;
    const size_t share =
        (job->keys.size() + static_cast<size_t>(threads_) - 1) / static_cast<size_t>(threads_);
    size_t limit = job->kind == Kind::kRemove ? 1 : std::min(max_batch_blocks(), share);
    // A borrowed put's batch is checksummed, then written: small enough that the write reads
    // the blocks from the CPU's cache, not a second time from memory.
    if (!job->borrowed.empty()) limit = std::min(limit, borrowed_batch_blocks_);
    do {
      batch.push_back(std::move(tasks_.front()));
      tasks_.pop_front();
    } while (batch.size() < limit && !tasks_.empty() && tasks_.front().job == job);
    busy_ += static_cast<int64_t>(batch.size());
    lock.unlock();
    run_batch(thread, batch);
    lock.lock();
    busy_ -= static_cast<int64_t>(batch.size());
    if (tasks_.empty() && busy_ == 0) idle_cv_.notify_all();
  }
}

void QueuedStorageTier::put_blocks(int thread, BlockIo* blocks, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    blocks[i].error = put_block(thread, blocks[i].key, blocks[i].header, blocks[i].data);
  }
}

void QueuedStorageTier::get_blocks(int thread, BlockIo* blocks, size_t n) {
  for (size_t i = 0; i < n; ++i) blocks[i].error = get_block(thread, blocks[i].key, blocks[i].data);
}

void QueuedStorageTier::run_batch(int thread, const std::vector<Task>& batch) {
  Job& job = *batch.front().job;
  const auto payload = static_cast<uint64_t>(layout_.block_bytes);
  if (job.kind == Kind::kRemove) {
    for (const Task& t : batch) {
      if (remove_block(thread, job.keys[t.index])) ++removed_;
      finish_task(t, {});
    }
    return;
  }
  const bool borrowed = !job.borrowed.empty();
  std::vector<BlockIo> io;
  std::vector<const Task*> owner;  // io[i] is the block of *owner[i]
  std::vector<unsigned char> heads(job.kind == Kind::kPut ? batch.size() * kBlockHeaderBytes : 0);
  io.reserve(batch.size());
  owner.reserve(batch.size());
  for (const Task& t : batch) {
    const StorageKey& key = job.keys[t.index];
    if (job.kind == Kind::kPut) {
      if (already_stored(thread, key)) {  // nothing to write: stored, not written
        if (!borrowed) give_back(std::move(job.stored[t.index]));
        ++puts_;
        finish_task(t, {});
        continue;
      }
      // A borrowed block is checksummed here, on the I/O thread, from the caller's memory.
      auto* data = static_cast<unsigned char*>(borrowed ? const_cast<void*>(job.borrowed[t.index])
                                                        : job.stored[t.index].get());
      BlockHeader h;
      h.fingerprint = fingerprint_;
      h.key = key;
      h.payload_bytes = payload;
      h.payload_crc = borrowed ? crc32c(data, static_cast<size_t>(payload)) : job.crcs[t.index];
      unsigned char* head = heads.data() + io.size() * kBlockHeaderBytes;
      encode_block_header(h, head);
      io.push_back(BlockIo{key, data, head, {}});
    } else {
      io.push_back(BlockIo{key, static_cast<unsigned char*>(job.dsts[t.index]), nullptr, {}});
    }
    owner.push_back(&t);
  }
  if (io.empty()) return;
  if (job.kind == Kind::kPut) {
    put_blocks(thread, io.data(), io.size());
  } else {
    get_blocks(thread, io.data(), io.size());
  }
  for (size_t i = 0; i < io.size(); ++i) {
    const Task& t = *owner[i];
    const bool ok = io[i].error.empty();
    if (job.kind == Kind::kPut) {
      if (!borrowed) give_back(std::move(job.stored[t.index]));  // the copy is no longer needed
      if (ok) {
        ++puts_;
        bytes_written_ += static_cast<int64_t>(payload);
      } else {
        ++failed_puts_;
      }
    } else if (ok) {
      ++gets_;
      bytes_read_ += static_cast<int64_t>(payload);
    } else {
      ++failed_gets_;
    }
    finish_task(t, io[i].error);
  }
}

void QueuedStorageTier::finish_task(const Task& task, const std::string& error) {
  Job& job = *task.job;
  const StorageKey& key = job.keys[task.index];
  std::lock_guard<std::mutex> lock(mu_);
  if (job.kind == Kind::kPut) --queued_put_blocks_;
  if (job.kind == Kind::kGet) job.block_ok[task.index] = error.empty() ? 1 : 0;
  if (!error.empty()) {
    if (job.failed++ == 0) {
      job.first_error = "block " + std::to_string(task.index) + " " + key_name(key) + ": " + error;
    }
  }
  if (--job.remaining == 0 && job.kind != Kind::kRemove) {
    StorageCompletion c;
    c.job = job.id;
    c.ok = job.failed == 0;
    if (job.kind == Kind::kGet) {
      c.blocks_ok = static_cast<size_t>(
          std::find(job.block_ok.begin(), job.block_ok.end(), uint8_t{0}) - job.block_ok.begin());
    }
    if (!c.ok) {
      c.error = std::string(job.kind == Kind::kPut ? "put" : "get") + ": " +
                std::to_string(job.failed) + " of " + std::to_string(job.keys.size()) +
                " blocks failed; first: " + job.first_error;
    }
    completions_.push_back(std::move(c));
    running_.erase(job.id);
    done_cv_.notify_all();
  }
}

void QueuedStorageTier::note_unreachable(const std::string& why) {
  if (reachable_.exchange(false)) {
    ++outage_warnings_;
    logger().warn("{} storage tier unreachable ({}): lookups miss and puts fail until it is back",
                  medium(), why);
  }
}

void QueuedStorageTier::note_reachable() {
  if (!reachable_.exchange(true)) logger().info("{} storage tier reachable again", medium());
}

}  // namespace pagedkv::detail
