// DirectReads (direct_reads.hpp): O_DIRECT reads, several in flight through io_uring.
#include "storage/direct_reads.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#ifdef PAGEDKV_WITH_LIBURING
#include <liburing.h>
#endif

#include "storage/file_io.hpp"

namespace pagedkv::detail {

namespace {

std::atomic<bool> refuse_io_uring{false};

// Linux's cachestat(2) (6.5+); glibc has no wrapper yet. The syscall number is the same on
// every architecture that has the generic table.
constexpr long kCachestatSyscall = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
std::atomic<bool> cachestat_missing{false};

// The rest of a read that came back short: synchronously, while it stays aligned (an O_DIRECT
// read stops short only at the end of the file, where the next read returns 0).
int64_t finish_read(const DirectReads::Read& r, unsigned char* buf, int64_t got, int* err) {
  if (r.iov != nullptr) {
    std::vector<iovec> rest(r.iov, r.iov + r.iovcnt);
    iovec* first = rest.data();
    const int left = advance_iovecs(first, r.iovcnt, static_cast<size_t>(got));
    std::string error;
    const int64_t more = preadv_direct(r.fd, first, left, r.offset + got, 4096, &error, err);
    return more < 0 ? got : got + more;
  }
  while (got < r.bytes) {
    const ssize_t n = ::pread(r.fd, buf + got, static_cast<size_t>(r.bytes - got),
                              static_cast<off_t>(r.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      return got;
    }
    if (n == 0) break;
    got += n;
    if (got % 4096 != 0) break;  // the file ended mid-page
  }
  return got;
}

}  // namespace

void refuse_io_uring_for_testing(bool refuse) { refuse_io_uring = refuse; }

PageCacheState page_cache_state(int fd, int64_t offset, int64_t bytes) {
  if (cachestat_missing.load(std::memory_order_relaxed)) return PageCacheState::kUnknown;
  const int64_t page = 4096;
  const int64_t first = offset / page * page;
  const int64_t pages = (offset + bytes - first + page - 1) / page;
  CachestatRange range{static_cast<uint64_t>(first), static_cast<uint64_t>(pages * page)};
  Cachestat cs{};
  if (::syscall(kCachestatSyscall, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS || errno == EPERM) cachestat_missing = true;  // never on this kernel
    return PageCacheState::kUnknown;
  }
  return static_cast<int64_t>(cs.nr_cache) >= pages ? PageCacheState::kCached
                                                    : PageCacheState::kNotCached;
}

#ifdef PAGEDKV_WITH_LIBURING
struct DirectReads::Ring {
  io_uring ring{};
  bool ready = false;
  ~Ring() {
    if (ready) io_uring_queue_exit(&ring);
  }
};
#else
struct DirectReads::Ring {};
#endif

DirectReads::DirectReads(int depth) : depth_(std::max(depth, 1)) {}

DirectReads::~DirectReads() = default;

bool DirectReads::uses_io_uring() const { return ring_ != nullptr; }

bool DirectReads::ensure_buffers(int64_t bytes) {
  if (bytes <= buffer_bytes_ && !buffers_.empty()) return true;
  buffers_.clear();
  buffer_bytes_ = 0;
  const int64_t size = (bytes + 4095) / 4096 * 4096;
  for (int i = 0; i < depth_; ++i) {
    void* p = nullptr;
    if (::posix_memalign(&p, 4096, static_cast<size_t>(size)) != 0) {
      buffers_.clear();
      return false;
    }
    buffers_.emplace_back(static_cast<unsigned char*>(p));
  }
  buffer_bytes_ = size;
  return true;
}

bool DirectReads::run(const std::vector<Read>& reads, const Done& done) {
  if (reads.empty()) return true;
  int64_t largest = 4096;
  for (const Read& r : reads) {
    if (r.iov == nullptr) largest = std::max(largest, r.bytes);
  }
  if (!ensure_buffers(largest)) return false;
#ifdef PAGEDKV_WITH_LIBURING
  if (!ring_tried_) {
    ring_tried_ = true;
    auto ring = std::make_unique<Ring>();
    ring->ready =
        !refuse_io_uring && io_uring_queue_init(static_cast<unsigned>(depth_), &ring->ring, 0) == 0;
    if (ring->ready) ring_ = std::move(ring);
  }
  if (ring_ != nullptr) {
    run_ring(reads, done);
    return true;
  }
#endif
  run_one_at_a_time(reads, done);
  return true;
}

void DirectReads::run_one_at_a_time(const std::vector<Read>& reads, const Done& done) {
  unsigned char* buf = buffers_[0].get();
  for (const Read& r : reads) {
    int err = 0;
    const int64_t got = finish_read(r, buf, 0, &err);
    done(r.tag, r.iov != nullptr ? nullptr : buf, got, err);
  }
}

#ifdef PAGEDKV_WITH_LIBURING
void DirectReads::run_ring(const std::vector<Read>& reads, const Done& done) {
  io_uring* ring = &ring_->ring;
  std::vector<int> free_slots;
  for (int i = depth_ - 1; i >= 0; --i) free_slots.push_back(i);
  std::vector<size_t> slot_read(static_cast<size_t>(depth_));
  size_t next = 0;
  int in_flight = 0;
  // The ring refused a submit or a wait: reads may still land in the buffers, so they are
  // given up (leaked, never reused) and what is not done is read one at a time into new ones.
  // A read into the caller's iovecs must be over before run() returns: its completion is
  // waited for a while longer (and the read done again, which lands the same bytes).
  const auto abandon_ring = [&] {
    for (int tries = 0; in_flight > 0 && tries < 1000; ++tries) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_peek_cqe(ring, &cqe) == 0 && cqe != nullptr) {
        io_uring_cqe_seen(ring, cqe);
        --in_flight;
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& b : buffers_) (void)b.release();
    buffers_.clear();
    const int64_t bytes = buffer_bytes_;
    ring_.reset();
    std::vector<Read> rest(reads.begin() + static_cast<std::ptrdiff_t>(next), reads.end());
    for (size_t s = 0; s < slot_read.size(); ++s) {
      if (std::find(free_slots.begin(), free_slots.end(), static_cast<int>(s)) ==
          free_slots.end()) {
        rest.push_back(reads[slot_read[s]]);
      }
    }
    if (ensure_buffers(bytes)) {
      run_one_at_a_time(rest, done);
    } else {
      for (const Read& r : rest) done(r.tag, nullptr, 0, ENOMEM);
    }
  };
  while (next < reads.size() || in_flight > 0) {
    // Fill every free slot, then wait for one completion.
    while (next < reads.size() && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      const int slot = free_slots.back();
      free_slots.pop_back();
      const Read& r = reads[next];
      if (r.iov != nullptr) {
        io_uring_prep_readv(sqe, r.fd, r.iov, static_cast<unsigned>(r.iovcnt),
                            static_cast<uint64_t>(r.offset));
      } else {
        io_uring_prep_read(sqe, r.fd, buffers_[static_cast<size_t>(slot)].get(),
                           static_cast<unsigned>(r.bytes), static_cast<uint64_t>(r.offset));
      }
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      slot_read[static_cast<size_t>(slot)] = next++;
      ++in_flight;
    }
    const int submitted = io_uring_submit(ring);
    if (submitted < 0 && submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
      abandon_ring();
      return;
    }
    io_uring_cqe* cqe = nullptr;
    const int w = io_uring_wait_cqe(ring, &cqe);
    if (w == -EINTR) continue;
    if (w < 0) {
      abandon_ring();
      return;
    }
    const auto slot = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    --in_flight;
    const Read& r = reads[slot_read[slot]];
    unsigned char* buf = buffers_[slot].get();
    int err = 0;
    int64_t got = 0;
    if (res >= 0) {
      got = res;
      if (got < r.bytes && got % 4096 == 0 && got > 0) got = finish_read(r, buf, got, &err);
    } else if (res == -EAGAIN || res == -EINTR) {
      got = finish_read(r, buf, 0, &err);  // not started: read it here
    } else {
      err = -res;
    }
    done(r.tag, r.iov != nullptr ? nullptr : buf, got, err);
    free_slots.push_back(static_cast<int>(slot));
  }
}
#else
void DirectReads::run_ring(const std::vector<Read>& reads, const Done& done) {
  run_one_at_a_time(reads, done);
}
#endif

}  // namespace pagedkv::detail
