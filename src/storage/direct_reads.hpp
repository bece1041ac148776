// Reads around the page cache: O_DIRECT reads of aligned spans into aligned buffers of the
// reader's own or into the caller's (aligned iovecs), several in flight at once through io_uring
// (liburing), or one at a time where this build has no liburing or the kernel refuses io_uring. The
// file store reads the blocks the page cache does not hold this way
// (FileTierOptions::direct_read_depth): a cold read then neither allocates page-cache memory nor
// waits for one read before it starts the next.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "storage/file_io.hpp"

namespace pagedkv::detail {

/// Whether [offset, offset + bytes) of the file is in the page cache (Linux's cachestat).
enum class PageCacheState { kCached, kNotCached, kUnknown };
/// kCached when every page of the range is cached, kNotCached when one is not, kUnknown where
/// the kernel cannot tell (cachestat is Linux 6.5+).
PageCacheState page_cache_state(int fd, int64_t offset, int64_t bytes);

/// Test seam: while set, readers made from then on read one span at a time, as where the kernel
/// refuses io_uring.
void refuse_io_uring_for_testing(bool refuse);

class DirectReads {
 public:
  /// One read: `bytes` from `offset` of `fd` (opened with O_DIRECT); offset, bytes aligned to
  /// the filesystem's O_DIRECT alignment. `tag` names it to the completion. With `iov`, the
  /// bytes go to those `iovcnt` buffers (aligned bases and lengths, `bytes` in all; kept valid
  /// until the completion), else to one of the reader's.
  struct Read {
    int fd = -1;
    int64_t offset = 0;
    int64_t bytes = 0;
    size_t tag = 0;
    const iovec* iov = nullptr;
    int iovcnt = 0;
  };
  /// A completed read: its tag, the buffer holding the bytes read (null for a read into iovecs),
  /// how many (fewer than asked: the file ended), or the errno it failed with (0: none). The
  /// buffer is reused after return.
  using Done = std::function<void(size_t tag, const unsigned char* data, int64_t got, int err)>;

  /// `depth`: reads in flight at most (>= 1).
  explicit DirectReads(int depth);
  ~DirectReads();
  DirectReads(const DirectReads&) = delete;
  DirectReads& operator=(const DirectReads&) = delete;

  /// Runs every read, up to `depth` at a time, calling `done` for each as it completes (in
  /// any order), on the caller's thread; once it returns, no read is in flight. False when the
  /// buffers cannot be allocated (then no read ran and `done` was not called).
  bool run(const std::vector<Read>& reads, const Done& done);

  /// Whether reads go through io_uring (else one at a time), once run() has been called.
  bool uses_io_uring() const;

 private:
  struct Ring;
  bool ensure_buffers(int64_t bytes);
  void run_one_at_a_time(const std::vector<Read>& reads, const Done& done);
  void run_ring(const std::vector<Read>& reads, const Done& done);

  const int depth_;
  int64_t buffer_bytes_ = 0;                                          // each buffer's size
  std::vector<std::unique_ptr<unsigned char, FreeAligned>> buffers_;  // depth_ of them
  std::unique_ptr<Ring> ring_;  // null: not set up yet, or refused
  bool ring_tried_ = false;
};

}  // namespace pagedkv::detail
