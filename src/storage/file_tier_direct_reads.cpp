// FileTier (file_tier.hpp): reads of the runs the page cache does not hold, around it
// (FileTierOptions::direct_read_depth > 0), with O_DIRECT on the segment opened again (through
// /proc/self/fd: the same file even after a rename or deletion). Cold reads then leave the host's
// cached pages alone (as direct_io does for appends); runs the page cache holds (a block read
// again soon, a prefix many requests share) are still read from it.
// Several runs are in flight at once (DirectReads). A run of a version 3 segment (payloads at
// aligned offsets: FileTier::new_segment_shape) into aligned destinations is read
// in place: one vectored read puts each payload straight into its destination, with no copy
// (what vLLM's fs tier does with the primary tier's rows). Any other run is read as the aligned
// span that covers it, and each payload is copied out of the span; that copy costs what the page
// cache's copy does. Either way each block is verified as a buffered read's would be.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
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
  // The runs read in place: where their header units (and padding) go in scratch->units, and
  // their iovecs, sized first (the reads point into both until they complete).
  constexpr size_t kStaged = SIZE_MAX;
  std::vector<size_t> units_at(runs.size(), kStaged);
  size_t units = 0;
  size_t iov_count = 0;
  for (size_t t = 0; t < runs.size(); ++t) {
    if (!readable_in_place(blocks, wants, runs[t])) continue;
    units_at[t] = units;
    units += in_place_unit_bytes(*wants[runs[t].first].seg, runs[t].k);
    iov_count += 3 * runs[t].k;
  }
  if (units > scratch->units_bytes) {
    scratch->units.reset(static_cast<unsigned char*>(std::aligned_alloc(kDirectAlign, units)));
    scratch->units_bytes = scratch->units == nullptr ? 0 : units;
    if (scratch->units == nullptr) units_at.assign(runs.size(), kStaged);  // copy out instead
  }
  std::vector<iovec> iovs;
  iovs.reserve(iov_count);
  std::vector<DirectReads::Read> reads;
  std::vector<Run> buffered;
  for (size_t t = 0; t < runs.size(); ++t) {
    const Run& run = runs[t];
    const int fd = direct_fd(*wants[run.first].seg);
    if (fd < 0) {
      buffered.push_back(run);
      continue;
    }
    if (units_at[t] != kStaged) {
      const size_t first = iovs.size();
      add_in_place_iovecs(blocks, wants, run, scratch->units.get() + units_at[t], &iovs);
      reads.push_back(DirectReads::Read{fd, wants[run.first].offset, run_bytes(wants, run), t,
                                        iovs.data() + first,
                                        static_cast<int>(iovs.size() - first)});
      continue;
    }
    const int64_t start = wants[run.first].offset / kDirectAlign * kDirectAlign;
    const int64_t end = wants[run.first].offset + run_bytes(wants, run);
    const int64_t span = (end - start + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    reads.push_back(DirectReads::Read{fd, start, span, t});
  }
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  int64_t direct = 0;
  int64_t in_place = 0;
  const auto done = [&](size_t t, const unsigned char* data, int64_t got, int err) {
    const Run& run = runs[t];
    if (err == EINVAL) {  // O_DIRECT refused for this file or span
      buffered.push_back(run);
      return;
    }
    const std::string read_error = err != 0 ? errno_text(err) : "";
    const Segment& seg = *wants[run.first].seg;
    const int64_t stride = stride_of(seg);
    if (units_at[t] != kStaged) {  // the payloads are in place, the header units in scratch
      const unsigned char* heads = scratch->units.get() + units_at[t];
      for (size_t j = 0; j < run.k; ++j) {
        const Want& w = wants[run.first + j];
        BlockIo& b = blocks[w.i];
        const int64_t end = static_cast<int64_t>(j) * stride + record_end(seg);
        finish_get(w, b, heads + j * seg.shape.payload_at, read_error, got >= end);
        if (b.error.empty()) ++in_place;
      }
      return;
    }
    const int64_t start = wants[run.first].offset / kDirectAlign * kDirectAlign;
    for (size_t j = 0; j < run.k; ++j) {
      const Want& w = wants[run.first + j];
      BlockIo& b = blocks[w.i];
      const int64_t at = w.offset - start;  // the record's header within the span
      const bool whole = got >= at + record_end(seg);
      if (err == 0 && whole) std::memcpy(b.data, data + at + seg.shape.payload_at, payload);
      finish_get(w, b, data == nullptr ? nullptr : data + at, read_error, whole);
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
  count_direct_gets(direct + in_place, in_place);
}

bool FileTier::readable_in_place(const BlockIo* blocks, const std::vector<Want>& wants,
                                 Run run) const {
  const RecordShape& shape = wants[run.first].seg->shape;
  if (shape.payload_at != shape.align || shape.align % kDirectAlign != 0 ||
      layout_.block_bytes % kDirectAlign != 0) {
    return false;
  }
  for (size_t j = 0; j < run.k; ++j) {
    if (reinterpret_cast<uintptr_t>(blocks[wants[run.first + j].i].data) % kDirectAlign != 0) {
      return false;
    }
  }
  return true;
}

size_t FileTier::in_place_unit_bytes(const Segment& seg, size_t k) const {
  // Each record's header unit, then one place for every record's padding after its payload.
  return k * seg.shape.payload_at + padding_after(seg);
}

void FileTier::add_in_place_iovecs(const BlockIo* blocks, const std::vector<Want>& wants, Run run,
                                   unsigned char* units, std::vector<iovec>* iovs) const {
  const Segment& seg = *wants[run.first].seg;
  const size_t head_unit = seg.shape.payload_at;
  const size_t tail = padding_after(seg);
  for (size_t j = 0; j < run.k; ++j) {
    if (j > 0 && tail > 0) iovs->push_back({units + run.k * head_unit, tail});
    iovs->push_back({units + j * head_unit, head_unit});
    iovs->push_back(
        {blocks[wants[run.first + j].i].data, static_cast<size_t>(layout_.block_bytes)});
  }
}

}  // namespace pagedkv::detail
