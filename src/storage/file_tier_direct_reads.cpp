// FileTier (file_tier.hpp): reads of the runs the page cache does not hold, around it
// (FileTierOptions::direct_read_depth > 0). A run is read as the aligned span that covers it, with
// O_DIRECT on the segment opened again (through /proc/self/fd: the same file even after a rename
// or deletion), several spans in flight (DirectReads); each block's payload is copied out of the
// span and verified as a buffered read's would be. Cold reads then leave the host's cached pages
// alone (as direct_io does for appends); runs the page cache holds (a block read again soon, a
// prefix many requests share) are still read from it. The copy out of the span costs what the
// page cache's copy does, so this is not faster where the page cache is cheap (docs/storage.md).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "storage/file_io.hpp"
#include "storage/file_tier.hpp"

namespace pagedkv::detail {

namespace {

std::atomic<bool> force_direct_reads{false};

}  // namespace

void force_direct_reads_for_testing(bool force) { force_direct_reads = force; }

bool FileTier::is_cold(const std::vector<Want>& wants, Run run) const {
  if (force_direct_reads) return true;
  return page_cache_state(wants[run.first].seg->fd, wants[run.first].offset,
                          run_bytes(wants, run)) == PageCacheState::kNotCached;
}

void FileTier::read_direct(int thread, BlockIo* blocks, const std::vector<Want>& wants,
                           const std::vector<Run>& runs, ReadScratch* scratch) {
  auto& reader = readers_[static_cast<size_t>(thread)];
  if (reader == nullptr) reader = std::make_unique<DirectReads>(options_.direct_read_depth);
  // Each segment opened once for the batch; a run whose segment cannot be opened with O_DIRECT
  // (or whose read is refused with EINVAL) is read through the page cache instead.
  std::vector<std::pair<const Segment*, int>> fds;
  const auto direct_fd = [&fds](const Segment& seg) {
    for (const auto& [s, fd] : fds) {
      if (s == &seg) return fd;
    }
    const std::string self = "/proc/self/fd/" + std::to_string(seg.fd);
    const int fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    fds.emplace_back(&seg, fd);
    return fd;
  };
  std::vector<DirectReads::Read> reads;
  std::vector<Run> buffered;
  for (size_t t = 0; t < runs.size(); ++t) {
    const Run& run = runs[t];
    const int fd = direct_fd(*wants[run.first].seg);
    if (fd < 0) {
      buffered.push_back(run);
      continue;
    }
    const int64_t start = wants[run.first].offset / kDirectAlign * kDirectAlign;
    const int64_t end = wants[run.first].offset + run_bytes(wants, run);
    const int64_t span = (end - start + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    reads.push_back(DirectReads::Read{fd, start, span, t});
  }
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  int64_t direct = 0;
  const auto done = [&](size_t t, const unsigned char* data, int64_t got, int err) {
    const Run& run = runs[t];
    if (err == EINVAL) {  // O_DIRECT refused for this file or span
      buffered.push_back(run);
      return;
    }
    const int64_t start = wants[run.first].offset / kDirectAlign * kDirectAlign;
    for (size_t j = 0; j < run.k; ++j) {
      const Want& w = wants[run.first + j];
      BlockIo& b = blocks[w.i];
      const int64_t at = w.offset - start;  // the record's header within the span
      const bool whole = got >= at + record_bytes_;
      if (err == 0 && whole) std::memcpy(b.data, data + at + kReadHeadBytes, payload);
      finish_get(w, b, data == nullptr ? nullptr : data + at, err != 0 ? errno_text(err) : "",
                 whole);
      if (b.error.empty()) ++direct;
    }
  };
  if (!reader->run(reads, done)) {
    for (const DirectReads::Read& r : reads) buffered.push_back(runs[r.tag]);
  }
  for (const auto& [s, fd] : fds) {
    if (fd >= 0) ::close(fd);
  }
  for (const Run& run : buffered) read_buffered(blocks, wants, run, scratch);
  count_direct_gets(direct);
}

}  // namespace pagedkv::detail
