// FileTier (file_tier.hpp): the segments this store appends to, the index, removal, and the
// size bound (whole least recently used segments dropped; dead segments' files reused).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/logging.hpp"
#include "storage/file_io.hpp"
#include "storage/file_tier.hpp"

namespace pagedkv::detail {

SegmentPtr FileTier::active_segment(int thread, std::string* error) {
  SegmentPtr& active = active_[static_cast<size_t>(thread)];
  if (active != nullptr) return active;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    // Registered before the file exists, so that a rescan never takes it for another store's.
    auto seg = std::make_shared<Segment>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      seg->id = next_segment_id_++;
      seg->path = detail::segment_path(store_dir_, seg->id);
      seg->ours = seg->mine = true;
      segments_[seg->id] = seg;
    }
    const auto unregister = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      segments_.erase(seg->id);
    };
    const char* path = seg->path.c_str();
    int fd = take_free_file(seg->path);
    if (fd < 0) fd = ::open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {  // the directory was removed under us: make it again
      std::string ignored;
      detail::make_dirs(store_dir_, &ignored);
      fd = ::open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
      const int e = errno;
      unregister();
      if (e == EEXIST) continue;  // another store on the directory made it
      *error = "create " + seg->path + ": " + errno_text(e);
      return nullptr;
    }
    // Held while we append: another store never reclaims a segment that is being written.
    ::flock(fd, LOCK_EX | LOCK_NB);
    {
      std::lock_guard<std::mutex> lock(mu_);
      seg->fd = fd;  // the segment closes it from here on
    }
    seg->shape = shape_;
    if (options_.direct_io && shape_.align > 1) open_direct(*seg);
    std::string why = write_segment_header(thread, *seg);
    if (why.empty() && options_.fsync && !detail::fsync_dir(store_dir_, &why)) {
      why = "fsync: " + why;
    }
    if (!why.empty()) {
      ::unlink(path);
      unregister();
      *error = seg->path + ": " + why;
      return nullptr;
    }
    struct stat st {};
    const int64_t size = ::fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
    std::lock_guard<std::mutex> lock(mu_);
    seg->bytes = seg->shape.first_record();
    seg->seen_bytes = std::max(seg->bytes, size);  // a recycled file keeps its old length
    seg->last_used = ++clock_;
    total_bytes_ += seg->seen_bytes;
    active = seg;
    return seg;
  }
  *error = "no free segment name in " + store_dir_;
  return nullptr;
}

void FileTier::seal(int thread) {
  SegmentPtr& seg = active_[static_cast<size_t>(thread)];
  if (seg == nullptr) return;
  unsigned char head[kRecordHeaderBytes];
  RecordHeader h;
  h.type = RecordType::kSeal;
  encode_record_header(h, detail::record_seed(seg->id), head);
  iovec iov{head, sizeof(head)};
  // The seal ends the file: a recycled one is cut after it.
  const int64_t end = seg->bytes + static_cast<int64_t>(kRecordHeaderBytes);
  const bool sealed = detail::pwritev_all(seg->fd, &iov, 1, seg->bytes).empty() &&
                      (seg->seen_bytes <= end || ::ftruncate(seg->fd, end) == 0) &&
                      (!options_.fsync || ::fdatasync(seg->fd) == 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sealed) {
      seg->sealed = true;
      total_bytes_ += end - seg->seen_bytes;
      seg->bytes = seg->seen_bytes = end;
    }
    seg->ours = false;
  }
  close_direct(*seg);
  ::flock(seg->fd, LOCK_UN);
  drop_if_dead(seg);
  seg = nullptr;
}

void FileTier::retire(int thread) {
  SegmentPtr& seg = active_[static_cast<size_t>(thread)];
  {
    std::lock_guard<std::mutex> lock(mu_);
    seg->ours = false;
  }
  close_direct(*seg);
  ::flock(seg->fd, LOCK_UN);
  seg = nullptr;
}

void FileTier::publish(const SegmentPtr& seg, const BlockIo* blocks, size_t k, int64_t start) {
  std::vector<std::pair<int64_t, StorageKey>> duplicates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t j = 0; j < k; ++j) {
      const int64_t offset = start + static_cast<int64_t>(j) * stride_of(*seg);
      // Two puts of one key raced: keep the first, so that a remove() finds every copy.
      if (!index_.emplace(blocks[j].key, Loc{seg, offset}).second) {
        duplicates.emplace_back(offset, blocks[j].key);
        continue;
      }
      seg->keys.push_back(blocks[j].key);
      ++seg->live;
    }
    const int64_t end = start + static_cast<int64_t>(k) * stride_of(*seg);
    const int64_t seen = std::max(seg->seen_bytes, end);
    total_bytes_ += seen - seg->seen_bytes;
    seg->seen_bytes = seen;
    seg->bytes = end;
    seg->last_used = ++clock_;
  }
  for (const auto& [offset, key] : duplicates) mark_removed(seg, offset, key);
}

bool FileTier::lookup(const StorageKey& k, Loc* loc) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(k);
  if (it == index_.end()) return false;
  it->second.seg->last_used = ++clock_;
  if (loc != nullptr) *loc = it->second;
  return true;
}

void FileTier::unindex(Index::iterator it) {
  --it->second.seg->live;
  index_.erase(it);
}

void FileTier::forget(const StorageKey& key, const SegmentPtr& seg, int64_t offset, bool damaged) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || it->second.seg != seg || it->second.offset != offset) return;
    unindex(it);
  }
  if (damaged) {
    mark_removed(seg, offset, key);
    drop_if_dead(seg);
    count_removed(1);
    detail::logger().warn("DISK storage tier: dropped an unreadable block at {}:{}", seg->path,
                          offset);
  }
}

void FileTier::mark_removed(const SegmentPtr& seg, int64_t offset, const StorageKey& key) {
  unsigned char head[kRecordHeaderBytes];
  RecordHeader h;
  h.type = RecordType::kRemoved;
  h.key = key;
  h.body_bytes = kBlockHeaderBytes + static_cast<uint64_t>(layout_.block_bytes);
  encode_record_header(h, detail::record_seed(seg->id), head);
  iovec iov{head, sizeof(head)};
  if (!detail::pwritev_all(seg->fd, &iov, 1, offset).empty()) return;
  if (options_.fsync) ::fdatasync(seg->fd);
}

bool FileTier::nobody_appends(const Segment& seg) {
  return seg.sealed ||
         (seg.seen_bytes > seg.shape.first_record() && ::flock(seg.fd, LOCK_EX | LOCK_NB) == 0);
}

void FileTier::drop_if_dead(const SegmentPtr& seg) {
  bool recycle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(seg->id);
    if (seg->live != 0 || seg->ours || it == segments_.end() || it->second != seg ||
        !nobody_appends(*seg)) {
      return;
    }
    drop_locked(seg);
    // Never another store's: it may still read (and mark) records at the old offsets.
    recycle = seg->mine && seg.use_count() == 1 && free_.size() < active_.size() &&
              (options_.max_bytes <= 0 ||
               total_bytes_ + free_bytes_ + seg->seen_bytes <= options_.max_bytes);
  }
  if (recycle) {
    const std::string path = store_dir_ + "/" + hex16(seg->id) + detail::kFreeSuffix;
    if (::rename(seg->path.c_str(), path.c_str()) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(FreeFile{seg->fd, path, seg->seen_bytes});
      free_bytes_ += seg->seen_bytes;
      seg->fd = -1;  // the free list owns it now
      return;
    }
  }
  ::unlink(seg->path.c_str());
}

int FileTier::take_free_file(const std::string& path) {
  FreeFile f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return -1;
    f = std::move(free_.back());
    free_.pop_back();
    free_bytes_ -= f.bytes;
  }
  const bool linked = ::link(f.path.c_str(), path.c_str()) == 0;
  ::unlink(f.path.c_str());
  if (linked) return f.fd;
  ::close(f.fd);
  return -1;
}

void FileTier::release_free_files(std::vector<FreeFile>* files) {
  for (FreeFile& f : *files) {
    ::close(f.fd);
    ::unlink(f.path.c_str());
  }
}

void FileTier::reclaim_over_bound() {
  if (options_.max_bytes <= 0) return;
  std::vector<SegmentPtr> dropped;
  std::vector<FreeFile> unused;
  int64_t blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (total_bytes_ + free_bytes_ > options_.max_bytes) {
      if (!free_.empty()) {  // files kept for reuse go first
        free_bytes_ -= free_.back().bytes;
        unused.push_back(std::move(free_.back()));
        free_.pop_back();
        continue;
      }
      SegmentPtr victim;
      for (const auto& [id, seg] : segments_) {
        if (!seg->ours && !seg->busy && (victim == nullptr || seg->last_used < victim->last_used)) {
          victim = seg;
        }
      }
      if (victim != nullptr && !nobody_appends(*victim)) {
        victim->busy = true;  // another live store appends to it; looked at again next time
        continue;
      }
      if (victim == nullptr) break;
      blocks += victim->live;
      drop_locked(victim);
      dropped.push_back(std::move(victim));
    }
  }
  release_free_files(&unused);
  for (const SegmentPtr& seg : dropped) ::unlink(seg->path.c_str());
  count_removed(blocks);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, seg] : segments_) seg->busy = false;
}

void FileTier::drop_locked(const SegmentPtr& seg) {
  for (const StorageKey& k : seg->keys) {
    auto it = index_.find(k);
    if (it != index_.end() && it->second.seg == seg) unindex(it);
  }
  total_bytes_ -= seg->seen_bytes;
  segments_.erase(seg->id);
}

}  // namespace pagedkv::detail
