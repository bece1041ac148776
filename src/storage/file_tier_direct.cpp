// FileTier (file_tier.hpp): O_DIRECT appends (FileTierOptions::direct_io). Records are staged in
// an aligned buffer per I/O thread, each padded to kDirectAlign, and written with one pwrite
// that bypasses the page cache: a put then neither waits for page-cache memory to be reclaimed
// nor evicts what the host keeps there. Reads, the seal and removal marks (small writes at
// aligned record starts, through the page cache) use the segment's ordinary descriptor; Linux
// keeps the two coherent (an O_DIRECT write drops the cached pages it covers).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/logging.hpp"
#include "storage/file_io.hpp"
#include "storage/file_tier.hpp"

namespace pagedkv::detail {

namespace {

std::atomic<bool> refuse_direct_io{false};

}  // namespace

void refuse_direct_io_for_testing(bool refuse) { refuse_direct_io = refuse; }

bool FileTier::probe_direct_io(std::string* why) const {
  if (refuse_direct_io) {
    *why = "open with O_DIRECT: " + errno_text(EINVAL) + " (refused for a test)";
    return false;
  }
  const std::string probe = store_dir_ + "/.probe-direct-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0) {
    *why = "open with O_DIRECT: " + errno_text(errno);
    return false;
  }
  void* page = std::aligned_alloc(kDirectAlign, kDirectAlign);
  bool ok = page != nullptr;
  if (ok) {
    std::memset(page, 0, kDirectAlign);
    ok = ::pwrite(fd, page, kDirectAlign, 0) == static_cast<ssize_t>(kDirectAlign);
    if (!ok) *why = "write with O_DIRECT: " + errno_text(errno);
  } else {
    *why = "cannot allocate an aligned page";
  }
  std::free(page);
  ::close(fd);
  ::unlink(probe.c_str());
  return ok;
}

void FileTier::open_direct(Segment& seg) {
  seg.direct_fd = ::open(seg.path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  if (seg.direct_fd < 0) {
    logger().warn(
        "DISK storage tier: {}: cannot open with O_DIRECT ({}); writing it through the "
        "page cache",
        seg.path, errno_text(errno));
  }
}

void FileTier::close_direct(Segment& seg) {
  if (seg.direct_fd >= 0) ::close(seg.direct_fd);
  seg.direct_fd = -1;
}

size_t FileTier::stage_records(const Segment& seg) const {
  return std::max<size_t>(1, stage_bytes_ / static_cast<size_t>(stride_of(seg)));
}

unsigned char* FileTier::stage(int thread) {
  auto& buf = stages_[static_cast<size_t>(thread)];
  if (buf == nullptr) {
    buf.reset(static_cast<unsigned char*>(std::aligned_alloc(kDirectAlign, stage_bytes_)));
  }
  return buf.get();
}

namespace {

// Writes [p, p + n) at `offset`: with O_DIRECT on *direct_fd while the transfer stays aligned,
// else on `fd`. An O_DIRECT write refused with EINVAL (a filesystem that takes O_DIRECT opens
// but not these writes) closes *direct_fd: the segment is written through the page cache from
// then on.
std::string write_staged(int fd, int* direct_fd, const unsigned char* p, size_t n, int64_t offset,
                         const std::string& path) {
  size_t done = 0;
  bool aligned = true;
  while (done < n) {
    const bool direct = *direct_fd >= 0 && aligned;
    const ssize_t w = ::pwrite(direct ? *direct_fd : fd, p + done, n - done,
                               static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct) {
        logger().warn(
            "DISK storage tier: {}: O_DIRECT write refused ({}); writing it through the "
            "page cache",
            path, errno_text(errno));
        ::close(*direct_fd);
        *direct_fd = -1;
        continue;
      }
      return "write: " + errno_text(errno);
    }
    if (w == 0) return "write: no progress";
    done += static_cast<size_t>(w);
    aligned = done % kDirectAlign == 0;  // a short write leaves the rest unaligned
  }
  return {};
}

}  // namespace

std::string FileTier::write_segment_header(int thread, Segment& seg) {
  unsigned char head[kSegmentHeaderBytes];
  encode_segment_header(fingerprint_, static_cast<uint64_t>(layout_.block_bytes), seg.shape, head);
  const uint32_t align = seg.shape.align;
  if (align <= 1) {
    iovec iov{head, sizeof(head)};
    return pwritev_all(seg.fd, &iov, 1, 0);
  }
  unsigned char* page = stage(thread);
  if (page == nullptr) return "cannot allocate the O_DIRECT staging buffer";
  // The whole first unit: a recycled file's old bytes before the first record are zeroed too.
  std::memset(page, 0, align);
  std::memcpy(page, head, sizeof(head));
  return write_staged(seg.fd, &seg.direct_fd, page, align, 0, seg.path);
}

std::string FileTier::append_aligned(int thread, Segment& seg, const BlockIo* blocks, size_t k,
                                     int64_t start) {
  unsigned char* buf = stage(thread);
  if (buf == nullptr) return "cannot allocate the O_DIRECT staging buffer";
  const auto stride = static_cast<size_t>(stride_of(seg));
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  const uint64_t body = kBlockHeaderBytes + payload;
  const size_t at = seg.shape.payload_at;
  for (size_t j = 0; j < k; ++j) {
    unsigned char* p = buf + j * stride;
    RecordHeader h;
    h.key = blocks[j].key;
    h.body_bytes = body;
    encode_record_header(h, record_seed(seg.id), p);
    std::memcpy(p + kRecordHeaderBytes, blocks[j].header, kBlockHeaderBytes);
    // The padding (between the headers and a version 3 payload, and after the payload): never
    // read, zeros for tidiness.
    std::memset(p + kReadHeadBytes, 0, at - kReadHeadBytes);
    std::memcpy(p + at, blocks[j].data, payload);
    std::memset(p + at + payload, 0, stride - at - payload);
  }
  return write_staged(seg.fd, &seg.direct_fd, buf, k * stride, start, seg.path);
}

}  // namespace pagedkv::detail
