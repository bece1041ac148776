// The part every store shares: argument checks, the job queue and its I/O threads, completions,
// counters and the once-per-outage warning. A store implements the per-block work (put, get,
// remove one block on one I/O thread) and the lookup.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pagedkv/storage_tier.hpp"

namespace pagedkv::detail {

class QueuedStorageTier : public StorageTier {
 public:
  /// `threads` and `max_queued_blocks` are checked by the caller (check_queue_options).
  QueuedStorageTier(StorageLayout layout, int32_t threads, int64_t max_queued_blocks);
  /// A derived store must call stop_workers() in its own destructor (its members outlive them).
  ~QueuedStorageTier() override;

  const StorageLayout& layout() const override { return layout_; }
  StatusOr<uint64_t> submit_put(const std::vector<StorageKey>& keys,
                                const std::vector<const void*>& blocks) override;
  StatusOr<uint64_t> submit_put_borrowed(const std::vector<StorageKey>& keys,
                                         const std::vector<const void*>& blocks) override;
  StatusOr<uint64_t> submit_get(const std::vector<StorageKey>& keys,
                                const std::vector<void*>& blocks) override;
  std::vector<StorageCompletion> poll() override;
  StatusOr<std::vector<StorageCompletion>> wait(const std::vector<uint64_t>& jobs,
                                                int64_t timeout_ms) override;
  void drain() override;
  Status remove(const std::vector<StorageKey>& keys) override;
  StorageStats stats() const override;

  /// Test seam: while paused the I/O threads start no new block (queued work waits; drain()
  /// would wait for ever). The destructor resumes them.
  void set_paused(bool paused);
  /// How many outages (reachable -> unreachable transitions) the store has logged.
  int64_t outage_warnings() const { return outage_warnings_.load(); }

 protected:
  /// One block of a batch (put_blocks / get_blocks): its key, its bytes, and why it failed.
  struct BlockIo {
    StorageKey key;
    unsigned char* data = nullptr;          // puts: the payload; gets: the destination
    const unsigned char* header = nullptr;  // puts: the encoded block header (kBlockHeaderBytes)
    std::string error;                      // set by the store; empty when the block succeeded
  };
  /// Most blocks of one job an I/O thread takes at once (1: one at a time). A job is cut into
  /// about one batch per thread, so that every thread works on a large one.
  virtual size_t max_batch_blocks() const { return 1; }
  /// Stores a batch (each block as put_block would); the default calls put_block for each.
  virtual void put_blocks(int thread, BlockIo* blocks, size_t n);
  /// Reads and verifies a batch (each as get_block would); the default calls get_block for each.
  virtual void get_blocks(int thread, BlockIo* blocks, size_t n);

  /// Stores one block: its encoded header (kBlockHeaderBytes) followed by its payload
  /// (layout().block_bytes; a borrowed put's is the caller's memory). Returns an empty string on
  /// success, else why it failed (and nothing became visible).
  virtual std::string put_block(int thread, const StorageKey& key, const unsigned char* header,
                                const unsigned char* payload) = 0;
  /// Whether `key` is stored already, so that a put of it can be skipped (a key names its bytes:
  /// the same chained prefix hash, namespace and layout). Only a cheap check; default: never.
  virtual bool already_stored(int /*thread*/, const StorageKey& /*key*/) { return false; }
  /// Reads one block into `dst` (layout().block_bytes) and verifies it. Empty string on success.
  virtual std::string get_block(int thread, const StorageKey& key, void* dst) = 0;
  /// Removes one block; true when one was stored and is now removed.
  virtual bool remove_block(int thread, const StorageKey& key) = 0;

  void start_workers();
  void stop_workers();

  /// Logs a warning the first time the store becomes unreachable (per outage).
  void note_unreachable(const std::string& why);
  /// Logs once that the store is reachable again after an outage.
  void note_reachable();
  void count_removed(int64_t n) { removed_ += n; }
  /// Blocks of a get read around the page cache, `in_place` of them straight into the caller's
  /// memory (they count as gets once the batch succeeds).
  void count_direct_gets(int64_t n, int64_t in_place) {
    gets_direct_ += n;
    gets_in_place_ += in_place;
  }

  const StorageLayout layout_;
  const uint64_t fingerprint_;

 private:
  enum class Kind { kPut, kGet, kRemove };
  struct Job;
  struct Task {
    std::shared_ptr<Job> job;
    size_t index;
  };
  StatusOr<uint64_t> enqueue(std::shared_ptr<Job> job);
  Status check_room(int64_t blocks);
  std::unique_ptr<unsigned char[]> take_buffer();
  void give_back(std::unique_ptr<unsigned char[]> buffer);
  void worker(int thread);
  void run_batch(int thread, const std::vector<Task>& batch);
  void finish_task(const Task& task, const std::string& error);

  const int32_t threads_;
  const int64_t max_queued_blocks_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::condition_variable done_cv_;       // a put or get job completed
  std::unordered_set<uint64_t> running_;  // put and get jobs queued and not yet complete
  std::deque<Task> tasks_;
  std::vector<StorageCompletion> completions_;
  int64_t queued_put_blocks_ = 0;
  int64_t busy_ = 0;  // tasks being run
  uint64_t next_job_ = 1;
  bool paused_ = false;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  // Put buffers (payloads) kept for reuse: a fresh large allocation costs a page fault
  // per 4 KiB on first touch, which halved the put throughput of 256 KiB blocks.
  static constexpr int64_t kSpareBytes = int64_t{64} << 20;
  // submit_put queues a job's blocks in chunks of about this many bytes as it copies them.
  static constexpr size_t kCopyChunkBytes = size_t{1} << 20;
  std::mutex spare_mu_;
  std::vector<std::unique_ptr<unsigned char[]>> spare_;
  size_t max_spare_ = 1;
  size_t borrowed_batch_blocks_ = 1;  // most blocks of a borrowed put per batch (kCopyChunkBytes)

  std::atomic<int64_t> puts_{0}, gets_{0}, bytes_written_{0}, bytes_read_{0};
  std::atomic<int64_t> failed_puts_{0}, failed_gets_{0}, rejected_puts_{0}, removed_{0};
  std::atomic<int64_t> gets_direct_{0}, gets_in_place_{0};
  std::atomic<bool> reachable_{true};
  std::atomic<int64_t> outage_warnings_{0};
};

/// Ok, or kInvalidArgument for threads outside [1, 256] or max_queued_blocks < 1.
Status check_queue_options(int32_t threads, int64_t max_queued_blocks);

}  // namespace pagedkv::detail
