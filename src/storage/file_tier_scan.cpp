// FileTier (file_tier.hpp): what is on disk: the index rebuilt at startup, and what other live
// stores on the directory wrote since the last look.
#include <sys/stat.h>

#include <algorithm>
#include <ctime>

#include "common/logging.hpp"
#include "storage/file_io.hpp"
#include "storage/file_tier.hpp"

namespace pagedkv::detail {
namespace {

// Directory timestamps move in steps of a timer tick (up to 10 ms); twice that is racy.
constexpr int64_t kRacyNs = 20'000'000;

int64_t ns_of(const timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return ns_of(t);
}

}  // namespace

void FileTier::rescan_directory(bool at_open) {
  listed_ns_ = now_ns();  // before the stat: a change after it is seen as racy next time
  struct stat dir {};
  if (::stat(store_dir_.c_str(), &dir) == 0) dir_mtime_ns_ = ns_of(dir.st_mtim);
  std::vector<uint64_t> ids = detail::list_segments(store_dir_);
  std::vector<SegmentPtr> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : ids) next_segment_id_ = std::max(next_segment_id_, id + 1);
    // Gone from the directory: another store reclaimed them.
    std::vector<SegmentPtr> gone;
    for (const auto& [id, seg] : segments_) {
      if (!seg->ours && !std::binary_search(ids.begin(), ids.end(), id)) gone.push_back(seg);
    }
    for (const SegmentPtr& seg : gone) drop_locked(seg);
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [this](uint64_t id) { return segments_.count(id) != 0; }),
              ids.end());
  }
  for (uint64_t id : ids) {
    SegmentPtr seg = detail::open_segment(store_dir_, id, fingerprint_, layout_.block_bytes);
    if (seg != nullptr) found.push_back(std::move(seg));
  }
  if (at_open) {
    std::stable_sort(found.begin(), found.end(), [](const SegmentPtr& a, const SegmentPtr& b) {
      return a->mtime_ns < b->mtime_ns;
    });
  }
  int64_t blocks = 0;
  for (const SegmentPtr& seg : found) {
    detail::ScanResult scan = detail::scan_segment(*seg, fingerprint_, layout_.block_bytes);
    if (at_open && !scan.torn.empty()) {
      detail::logger().warn("DISK storage tier: {}: ignoring {} bytes after offset {} ({})",
                            seg->path, scan.size - scan.end, scan.end, scan.torn);
    }
    blocks += index_scanned(seg, scan, /*new_segment=*/true, at_open);
    if (at_open) drop_if_dead(seg);
  }
  if (at_open && blocks > 0) {
    detail::logger().info("DISK storage tier: {} blocks in {} segments in {}", blocks, found.size(),
                          store_dir_);
  }
}

int64_t FileTier::index_scanned(const SegmentPtr& seg, const detail::ScanResult& scan,
                                bool new_segment, bool at_open) {
  std::vector<std::pair<int64_t, StorageKey>> duplicates;
  int64_t added = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (new_segment) {
      seg->last_used = ++clock_;
      segments_[seg->id] = seg;
    } else {
      total_bytes_ -= seg->seen_bytes;
    }
    seg->bytes = scan.end;
    seg->seen_bytes = scan.size;
    seg->sealed = seg->sealed || scan.sealed;
    total_bytes_ += seg->seen_bytes;
    for (const auto& [offset, key] : scan.blocks) {
      if (!index_.emplace(key, Loc{seg, offset}).second) {
        if (at_open) duplicates.emplace_back(offset, key);
        continue;
      }
      seg->keys.push_back(key);
      ++seg->live;
      ++added;
    }
  }
  for (const auto& [offset, key] : duplicates) mark_removed(seg, offset, key);
  return added;
}

void FileTier::catch_up() {
  struct stat dir {};
  if (::stat(store_dir_.c_str(), &dir) != 0) return;
  // Listed again when the directory changed since, or when it changed so close to the last
  // listing that a change after it may not have moved the (coarse) timestamp: once per new
  // segment of anyone's, not once per lookup.
  const int64_t mtime = ns_of(dir.st_mtim);
  if (mtime != dir_mtime_ns_ || mtime + kRacyNs >= listed_ns_) {
    rescan_directory(/*at_open=*/false);
  }
  std::vector<SegmentPtr> growing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, seg] : segments_) {
      if (!seg->ours && !seg->sealed) growing.push_back(seg);
    }
  }
  for (const SegmentPtr& seg : growing) {
    struct stat st {};
    // More than the valid prefix: appended records (or a torn tail, read again).
    if (::fstat(seg->fd, &st) != 0 || st.st_size <= seg->bytes) continue;
    detail::ScanResult scan = detail::scan_segment(*seg, fingerprint_, layout_.block_bytes);
    index_scanned(seg, scan, /*new_segment=*/false, /*at_open=*/false);
  }
}

}  // namespace pagedkv::detail
