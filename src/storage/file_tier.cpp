// FileTier (file_tier.hpp): construction, lookups, and the batches of puts and gets the I/O
// threads run; make_file_tier.
#include "storage/file_tier.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.hpp"
#include "storage/crc32c.hpp"
#include "storage/file_io.hpp"

namespace pagedkv {
namespace detail {

constexpr size_t kReadRunBytes = size_t{512} << 10;  // a get's preadv: adjacent records up to this

FileTier::FileTier(const StorageLayout& layout, const FileTierOptions& options)
    : QueuedStorageTier(layout, options.threads, options.max_queued_blocks),
      options_(options),
      store_dir_(options.directory + "/" + hex16(fingerprint_)),
      active_(static_cast<size_t>(options.threads)),
      stages_(static_cast<size_t>(options.threads)),
      readers_(static_cast<size_t>(options.threads)) {}

FileTier::~FileTier() {
  stop_workers();
  for (size_t t = 0; t < active_.size(); ++t) seal(static_cast<int>(t));
  release_free_files(&free_);
}

RecordShape FileTier::new_segment_shape(bool direct_io, bool direct_reads, int64_t block_bytes) {
  const bool whole_pages = block_bytes % kDirectAlign == 0;
  if (whole_pages && (direct_io || (direct_reads && block_bytes >= kInPlaceBlockBytes))) {
    return RecordShape::payload_aligned(kDirectAlign);
  }
  if (direct_io) return RecordShape{kDirectAlign, kReadHeadBytes};
  return RecordShape{};
}

int64_t FileTier::effective_segment_bytes(const FileTierOptions& o, const RecordShape& shape,
                                          int64_t block_bytes) {
  int64_t s = o.segment_bytes;
  if (o.max_bytes > 0) s = std::min(s, o.max_bytes / 4);
  return std::max<int64_t>(s, smallest_segment(shape, block_bytes));
}

Status FileTier::open() {
  std::string error;
  if (!detail::make_dirs(store_dir_, &error)) {
    return unavailable("make_file_tier: cannot create the directory " + error);
  }
  const std::string probe = store_dir_ + "/.probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return unavailable("make_file_tier: cannot write in " + store_dir_ + ": " + errno_text(errno));
  }
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) {
    return unavailable("make_file_tier: cannot write in " + store_dir_ + ": " +
                       errno_text(write_errno));
  }
  if (options_.direct_io || options_.direct_read_depth > 0) {
    std::string why;
    if (probe_direct_io(&why)) {
      direct_reads_ = options_.direct_read_depth > 0;
      shape_ = new_segment_shape(options_.direct_io, direct_reads_, layout_.block_bytes);
    } else {
      logger().warn(
          "DISK storage tier: O_DIRECT is not supported in {} ({}); reading{} through the "
          "page cache",
          store_dir_, why, options_.direct_io ? " and writing" : "");
    }
  }
  segment_bytes_ = effective_segment_bytes(options_, shape_, layout_.block_bytes);
  stage_bytes_ = static_cast<size_t>(
      std::max<int64_t>(static_cast<int64_t>(kStageBytes), shape_.stride(layout_.block_bytes)));
  detail::remove_free_files(store_dir_);  // a dead process's, never read
  rescan_directory(/*at_open=*/true);
  reclaim_over_bound();
  start_workers();
  return ok_status();
}

StatusOr<size_t> FileTier::batch_exists(const std::vector<StorageKey>& keys) {
  size_t n = 0;
  bool caught_up = false;
  for (const StorageKey& k : keys) {
    if (lookup(k, nullptr)) {
      ++n;
      continue;
    }
    // Not in this instance's index: another live store on the directory may have written it.
    if (caught_up) break;
    catch_up();
    caught_up = true;
    if (!lookup(k, nullptr)) break;
    ++n;
  }
  return n;
}

StatusOr<std::vector<bool>> FileTier::exists_each(const std::vector<StorageKey>& keys) {
  std::vector<bool> out(keys.size());
  bool missed = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i] = lookup(keys[i], nullptr);
    missed = missed || !out[i];
  }
  if (!missed) return out;
  catch_up();  // once: another live store on the directory may have written the others
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i]) out[i] = lookup(keys[i], nullptr);
  }
  return out;
}

void FileTier::put_blocks(int thread, BlockIo* blocks, size_t n) {
  const size_t body = kBlockHeaderBytes + static_cast<size_t>(layout_.block_bytes);
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  // Through the page cache, per record: its header and the block header (and in version 3 the
  // zeros up to the payload) from `heads`, the payload from where it is (a borrowed put's is the
  // caller's memory), and an aligned record's padding from `zeros`: two or three iovecs per
  // record. O_DIRECT appends are staged instead (append_aligned).
  std::vector<unsigned char> heads;
  std::vector<unsigned char> zeros;
  std::vector<iovec> iov;
  size_t i = 0;
  while (i < n) {
    std::string error;
    SegmentPtr seg = active_segment(thread, &error);
    if (seg == nullptr) {
      for (; i < n; ++i) blocks[i].error = error;
      break;
    }
    const int64_t start = seg->bytes;
    const int64_t stride = stride_of(*seg);
    const bool staged = seg->direct_fd >= 0;
    const bool empty = start == seg->shape.first_record();
    const auto head = static_cast<size_t>(seg->shape.payload_at);
    const size_t tail = padding_after(*seg);
    // Room for the records and, later, the seal.
    const int64_t room = segment_bytes_ - start - static_cast<int64_t>(kRecordHeaderBytes);
    size_t k = std::min({n - i, staged ? stage_records(*seg) : kMaxRunRecords / (tail > 0 ? 2 : 1),
                         static_cast<size_t>(std::max<int64_t>(0, room / stride))});
    if (k == 0 && empty) k = 1;
    if (k == 0) {
      seal(thread);
      continue;
    }
    if (staged) {
      error = append_aligned(thread, *seg, blocks + i, k, start);
    } else {
      heads.resize(std::max(heads.size(), k * head));  // zeros past each record's headers
      zeros.resize(std::max(zeros.size(), tail));
      iov.resize(std::max(iov.size(), 3 * k));
      int count = 0;
      for (size_t j = 0; j < k; ++j) {
        RecordHeader h;
        h.key = blocks[i + j].key;
        h.body_bytes = body;
        unsigned char* p = heads.data() + j * head;
        encode_record_header(h, detail::record_seed(seg->id), p);
        std::memcpy(p + kRecordHeaderBytes, blocks[i + j].header, kBlockHeaderBytes);
        iov[static_cast<size_t>(count++)] = {p, head};
        iov[static_cast<size_t>(count++)] = {blocks[i + j].data, payload};
        if (tail > 0) iov[static_cast<size_t>(count++)] = {zeros.data(), tail};
      }
      error = detail::pwritev_all(seg->fd, iov.data(), count, start);
    }
    if (error.empty() && options_.fsync && ::fdatasync(seg->fd) != 0) {
      error = "fdatasync: " + errno_text(errno);
    }
    if (!error.empty()) {
      // Nothing of the chunk becomes visible; cut the segment back so that later appends
      // follow the last good record, or stop appending to it when even that fails.
      if (::ftruncate(seg->fd, start) == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        total_bytes_ += start - seg->seen_bytes;
        seg->seen_bytes = start;
      } else {
        retire(thread);
      }
      for (size_t j = 0; j < k; ++j) blocks[i + j].error = seg->path + ": " + error;
      i += k;
      continue;
    }
    publish(seg, blocks + i, k, start);
    i += k;
  }
  reclaim_over_bound();
}

void FileTier::get_blocks(int thread, BlockIo* blocks, size_t n) {
  std::vector<Want> wants;
  wants.reserve(n);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      auto it = index_.find(blocks[i].key);
      if (it == index_.end()) {
        blocks[i].error = "not stored";
        continue;
      }
      it->second.seg->last_used = ++clock_;
      wants.push_back(Want{i, it->second.seg, it->second.offset});
    }
  }
  std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
    return a.seg->id != b.seg->id ? a.seg->id < b.seg->id : a.offset < b.offset;
  });
  // Runs of adjacent records, each read with one preadv from the page cache (short enough that
  // the checksums then read the blocks from the CPU's cache, not from memory), or, with
  // direct_read_depth, those the page cache does not hold with O_DIRECT, after the others.
  constexpr size_t kMaxRun = kMaxRunRecords / 2;  // four iovecs a record, within IOV_MAX
  ReadScratch scratch;
  std::vector<Run> cold;
  for (size_t r = 0; r < wants.size();) {
    const Segment& seg = *wants[r].seg;
    const int64_t stride = stride_of(seg);
    const size_t max_run =
        std::max<size_t>(1, std::min(kMaxRun, kReadRunBytes / static_cast<size_t>(stride)));
    size_t k = 1;
    while (r + k < wants.size() && k < max_run && wants[r + k].seg == wants[r].seg &&
           wants[r + k].offset == wants[r].offset + static_cast<int64_t>(k) * stride) {
      ++k;
    }
    const Run run{r, k};
    if (direct_reads_ && is_cold(wants, run)) {
      cold.push_back(run);
    } else {
      read_buffered(blocks, wants, run, &scratch);
    }
    r += k;
  }
  if (!cold.empty()) read_direct(thread, blocks, wants, cold, &scratch);
}

int64_t FileTier::run_bytes(const std::vector<Want>& wants, Run run) const {
  const Segment& seg = *wants[run.first].seg;
  return static_cast<int64_t>(run.k - 1) * stride_of(seg) + record_end(seg);
}

void FileTier::read_buffered(BlockIo* blocks, const std::vector<Want>& wants, Run run,
                             ReadScratch* scratch) {
  const Segment& seg = *wants[run.first].seg;
  const int64_t stride = stride_of(seg);
  const auto payload = static_cast<size_t>(layout_.block_bytes);
  // An aligned record's padding: after its payload (`tail`) and, in version 3, between its
  // headers and its payload (`lead`); read into one scratch buffer and ignored.
  const size_t tail = padding_after(seg);
  const auto lead = static_cast<size_t>(seg.shape.payload_at - kReadHeadBytes);
  if (std::max(tail, lead) > scratch->pad.size()) scratch->pad.resize(std::max(tail, lead));
  if (scratch->heads.size() < run.k * kReadHeadBytes) scratch->heads.resize(run.k * kReadHeadBytes);
  if (scratch->iov.size() < 4 * run.k) scratch->iov.resize(4 * run.k);
  int count = 0;
  for (size_t j = 0; j < run.k; ++j) {
    if (j > 0 && tail > 0) scratch->iov[static_cast<size_t>(count++)] = {scratch->pad.data(), tail};
    scratch->iov[static_cast<size_t>(count++)] = {scratch->heads.data() + j * kReadHeadBytes,
                                                  kReadHeadBytes};
    if (lead > 0) scratch->iov[static_cast<size_t>(count++)] = {scratch->pad.data(), lead};
    scratch->iov[static_cast<size_t>(count++)] = {blocks[wants[run.first + j].i].data, payload};
  }
  std::string error;
  const int64_t got =
      detail::preadv_all(seg.fd, scratch->iov.data(), count, wants[run.first].offset, &error);
  for (size_t j = 0; j < run.k; ++j) {
    const Want& w = wants[run.first + j];
    BlockIo& b = blocks[w.i];
    const int64_t end = static_cast<int64_t>(j) * stride + record_end(seg);
    finish_get(w, b, scratch->heads.data() + j * kReadHeadBytes, got < 0 ? error : "", got >= end);
  }
}

void FileTier::finish_get(const Want& w, BlockIo& b, const unsigned char* head,
                          const std::string& read_error, bool whole) {
  bool damaged = false;
  if (!read_error.empty()) {
    b.error = read_error;
  } else if (!whole) {
    b.error = "the segment ends before the record (truncated)";
  } else {
    b.error = verify(*w.seg, head, b, &damaged);
  }
  if (!b.error.empty()) forget(b.key, w.seg, w.offset, damaged);
}

bool FileTier::remove_block(int, const StorageKey& key) {
  Loc loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    loc = it->second;
    unindex(it);
  }
  mark_removed(loc.seg, loc.offset, key);
  drop_if_dead(loc.seg);
  return true;
}

std::string FileTier::verify(const Segment& seg, const unsigned char* head, const BlockIo& b,
                             bool* damaged) {
  RecordHeader h;
  std::string why = detail::decode_record_header(head, detail::record_seed(seg.id), &h);
  if (why.empty() && h.type == RecordType::kRemoved) return "removed";
  if (why.empty() && (h.type != RecordType::kBlock || !(h.key == b.key))) {
    why = "the record names another key";
  }
  const auto payload = static_cast<uint64_t>(layout_.block_bytes);
  uint32_t want = 0;
  if (why.empty()) {
    why =
        detail::check_block_header(head + kRecordHeaderBytes, fingerprint_, b.key, payload, &want);
  }
  if (why.empty() && detail::crc32c(b.data, static_cast<size_t>(payload)) != want) {
    why = "payload checksum mismatch";
  }
  *damaged = !why.empty();
  return why;
}

}  // namespace detail

StatusOr<std::unique_ptr<StorageTier>> make_file_tier(const StorageLayout& layout,
                                                      const FileTierOptions& options) {
  Status s = detail::validate_storage_layout(layout);
  if (!s.ok()) return Status(s.code(), "make_file_tier: " + s.message());
  s = detail::check_queue_options(options.threads, options.max_queued_blocks);
  if (!s.ok()) return Status(s.code(), "make_file_tier: " + s.message());
  if (options.directory.empty()) return invalid_argument("make_file_tier: directory is empty");
  if (options.segment_bytes <= 0) {
    return invalid_argument("make_file_tier: segment_bytes: must be positive, got " +
                            std::to_string(options.segment_bytes));
  }
  if (options.direct_read_depth < 0 || options.direct_read_depth > 256) {
    return invalid_argument("make_file_tier: direct_read_depth: must be in [0, 256], got " +
                            std::to_string(options.direct_read_depth));
  }
  // The smallest store: one segment of one block (aligned records with direct_io).
  const int64_t smallest = detail::FileTier::smallest_segment(
      detail::FileTier::new_segment_shape(options.direct_io, options.direct_read_depth > 0,
                                          layout.block_bytes),
      layout.block_bytes);
  if (options.max_bytes < 0 || (options.max_bytes > 0 && options.max_bytes < smallest)) {
    return invalid_argument(
        "make_file_tier: max_bytes: must be 0 (no bound) or at least one segment of one block (" +
        std::to_string(smallest) + " bytes), got " + std::to_string(options.max_bytes));
  }
  auto tier = std::make_unique<detail::FileTier>(layout, options);
  s = tier->open();
  if (!s.ok()) return s;
  return std::unique_ptr<StorageTier>(std::move(tier));
}

}  // namespace pagedkv
