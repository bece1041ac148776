// FileTier: blocks appended to segment files under <directory>/<fingerprint>/ (docs/storage.md,
// segment_format.hpp). Each I/O thread appends whole batches to its own segment with one pwritev
// (and one fdatasync with `fsync`), then publishes the blocks in an in-memory index, so a get
// finds a block only once all of its bytes are written. A get reads a run of adjacent records
// with one preadv straight into the destinations and verifies every block. remove() rewrites the
// block's record header in place as removed. The size bound drops whole least recently used
// segments. At startup the index is rebuilt by scanning the segments (segment_scan.hpp).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/logging.hpp"
#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"
#include "storage/file_io.hpp"
#include "storage/queued_tier.hpp"
#include "storage/segment_format.hpp"
#include "storage/segment_scan.hpp"

namespace pagedkv {
namespace {

using detail::errno_text;
using detail::hex16;
using detail::kBlockHeaderBytes;
using detail::kRecordHeaderBytes;
using detail::kSegmentHeaderBytes;
using detail::RecordHeader;
using detail::RecordType;
using detail::Segment;
using detail::SegmentPtr;

struct KeyHash {
  size_t operator()(const StorageKey& k) const {
    return static_cast<size_t>(k.block_hash ^ (k.ns * 0x9E3779B97F4A7C15ull));
  }
};

// Records per preadv / pwritev: two iovecs each, within IOV_MAX (1024).
constexpr size_t kMaxRunRecords = 512;
constexpr size_t kReadHeadBytes = kRecordHeaderBytes + kBlockHeaderBytes;
constexpr size_t kReadRunBytes = size_t{128} << 10;
// Directory timestamps move in steps of a timer tick (up to 10 ms); twice that is racy.
constexpr int64_t kRacyNs = 20'000'000;

int64_t ns_of(const timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return ns_of(t);
}

class FileTier final : public detail::QueuedStorageTier {
 public:
  FileTier(const StorageLayout& layout, const FileTierOptions& options)
      : QueuedStorageTier(layout, options.threads, options.max_queued_blocks),
        options_(options),
        store_dir_(options.directory + "/" + hex16(fingerprint_)),
        record_bytes_(static_cast<int64_t>(kReadHeadBytes) + layout.block_bytes),
        segment_bytes_(effective_segment_bytes(options, record_bytes_)),
        active_(static_cast<size_t>(options.threads)) {}

  ~FileTier() override {
    stop_workers();
    for (size_t t = 0; t < active_.size(); ++t) seal(static_cast<int>(t));
    release_free_files(&free_);
  }

  // The largest segment: options.segment_bytes, and with a size bound at most a quarter of it
  // (reclaim drops whole segments), but always room for one record and the seal.
  static int64_t effective_segment_bytes(const FileTierOptions& o, int64_t record_bytes) {
    int64_t s = o.segment_bytes;
    if (o.max_bytes > 0) s = std::min(s, o.max_bytes / 4);
    return std::max<int64_t>(
        s, static_cast<int64_t>(kSegmentHeaderBytes + kRecordHeaderBytes) + record_bytes);
  }

  // Creates the directory, checks it can be written, and indexes the segments already there.
  Status open() {
    std::string error;
    if (!detail::make_dirs(store_dir_, &error)) {
      return unavailable("make_file_tier: cannot create the directory " + error);
    }
    const std::string probe = store_dir_ + "/.probe-" + std::to_string(::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return unavailable("make_file_tier: cannot write in " + store_dir_ + ": " +
                         errno_text(errno));
    }
    const bool wrote = ::write(fd, "x", 1) == 1;
    const int write_errno = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!wrote) {
      return unavailable("make_file_tier: cannot write in " + store_dir_ + ": " +
                         errno_text(write_errno));
    }
    detail::remove_free_files(store_dir_);  // a dead process's, never read
    rescan_directory(/*at_open=*/true);
    reclaim_over_bound();
    start_workers();
    return ok_status();
  }

  const char* medium() const override { return "DISK"; }

  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override {
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

 protected:
  size_t max_batch_blocks() const override { return kMaxRunRecords; }

  std::string put_block(int thread, const StorageKey& key, const unsigned char* stored,
                        size_t) override {
    BlockIo b{key, const_cast<unsigned char*>(stored), {}};
    put_blocks(thread, &b, 1);
    return b.error;
  }

  std::string get_block(int thread, const StorageKey& key, void* dst) override {
    BlockIo b{key, static_cast<unsigned char*>(dst), {}};
    get_blocks(thread, &b, 1);
    return b.error;
  }

  // A key names its bytes (the chained hash of the prefix, the namespace and the layout): a
  // stored one needs no second copy. A damaged one is found by the next get, which forgets it.
  bool already_stored(int, const StorageKey& key) override { return lookup(key, nullptr); }

  void put_blocks(int thread, BlockIo* blocks, size_t n) override {
    const size_t body = kBlockHeaderBytes + static_cast<size_t>(layout_.block_bytes);
    std::vector<unsigned char> heads(std::min(n, kMaxRunRecords) * kRecordHeaderBytes);
    std::vector<iovec> iov(2 * std::min(n, kMaxRunRecords));
    size_t i = 0;
    while (i < n) {
      std::string error;
      SegmentPtr seg = active_segment(thread, &error);
      if (seg == nullptr) {
        for (; i < n; ++i) blocks[i].error = error;
        break;
      }
      const int64_t start = seg->bytes;
      const bool empty = start == static_cast<int64_t>(kSegmentHeaderBytes);
      // Room for the records and, later, the seal.
      const int64_t room = segment_bytes_ - start - static_cast<int64_t>(kRecordHeaderBytes);
      size_t k = std::min(
          {n - i, kMaxRunRecords, static_cast<size_t>(std::max<int64_t>(0, room / record_bytes_))});
      if (k == 0 && empty) k = 1;
      if (k == 0) {
        seal(thread);
        continue;
      }
      for (size_t j = 0; j < k; ++j) {
        RecordHeader h;
        h.key = blocks[i + j].key;
        h.body_bytes = body;
        encode_record_header(h, detail::record_seed(seg->id),
                             heads.data() + j * kRecordHeaderBytes);
        iov[2 * j] = {heads.data() + j * kRecordHeaderBytes, kRecordHeaderBytes};
        iov[2 * j + 1] = {blocks[i + j].data, body};
      }
      error = detail::pwritev_all(seg->fd, iov.data(), static_cast<int>(2 * k), start);
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

  void get_blocks(int, BlockIo* blocks, size_t n) override {
    struct Want {
      size_t i;
      SegmentPtr seg;
      int64_t offset;
    };
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
    const auto payload = static_cast<size_t>(layout_.block_bytes);
    std::vector<unsigned char> heads(std::min(n, kMaxRunRecords) * kReadHeadBytes);
    std::vector<iovec> iov(2 * std::min(n, kMaxRunRecords));
    for (size_t r = 0; r < wants.size();) {
      // A run of adjacent records: one preadv. Runs are short enough that the checksums then
      // read the blocks from the CPU's cache, not from memory.
      const size_t max_run = std::max<size_t>(
          1, std::min(kMaxRunRecords, kReadRunBytes / static_cast<size_t>(record_bytes_)));
      size_t k = 1;
      while (r + k < wants.size() && k < max_run && wants[r + k].seg == wants[r].seg &&
             wants[r + k].offset == wants[r].offset + static_cast<int64_t>(k) * record_bytes_) {
        ++k;
      }
      for (size_t j = 0; j < k; ++j) {
        iov[2 * j] = {heads.data() + j * kReadHeadBytes, kReadHeadBytes};
        iov[2 * j + 1] = {blocks[wants[r + j].i].data, payload};
      }
      std::string error;
      const int64_t got = detail::preadv_all(wants[r].seg->fd, iov.data(), static_cast<int>(2 * k),
                                             wants[r].offset, &error);
      for (size_t j = 0; j < k; ++j) {
        const Want& w = wants[r + j];
        BlockIo& b = blocks[w.i];
        bool damaged = false;
        if (got < 0) {
          b.error = error;
        } else if (got < static_cast<int64_t>(j + 1) * record_bytes_) {
          b.error = "the segment ends before the record (truncated)";
        } else {
          b.error = verify(*w.seg, heads.data() + j * kReadHeadBytes, b, &damaged);
        }
        if (!b.error.empty()) forget(b.key, w.seg, w.offset, damaged);
      }
      r += k;
    }
  }

  bool remove_block(int, const StorageKey& key) override {
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

 private:
  // A dead segment's file kept for reuse (renamed to <id>.free).
  struct FreeFile {
    int fd = -1;
    std::string path;
    int64_t bytes = 0;
  };

  struct Loc {
    SegmentPtr seg;
    int64_t offset = 0;  // of the record header
  };
  using Index = std::unordered_map<StorageKey, Loc, KeyHash>;

  // Checks a record read by a get: its header (a block of this key), the block header and the
  // payload's CRC. Sets *damaged when the record is corrupt (not merely removed).
  std::string verify(const Segment& seg, const unsigned char* head, const BlockIo& b,
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
      why = detail::check_block_header(head + kRecordHeaderBytes, fingerprint_, b.key, payload,
                                       &want);
    }
    if (why.empty() && detail::crc32c(b.data, static_cast<size_t>(payload)) != want) {
      why = "payload checksum mismatch";
    }
    *damaged = !why.empty();
    return why;
  }

  // ---- segments this store appends to ----

  SegmentPtr active_segment(int thread, std::string* error) {
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
      unsigned char head[kSegmentHeaderBytes];
      detail::encode_segment_header(fingerprint_, static_cast<uint64_t>(layout_.block_bytes), head);
      iovec iov{head, sizeof(head)};
      std::string why = detail::pwritev_all(fd, &iov, 1, 0);
      if (why.empty() && options_.fsync && !detail::fsync_dir(store_dir_, &why)) {
        why = "fsync: " + why;
      }
      if (!why.empty()) {
        ::close(fd);
        ::unlink(path);
        unregister();
        *error = seg->path + ": " + why;
        return nullptr;
      }
      struct stat st {};
      const int64_t size = ::fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
      std::lock_guard<std::mutex> lock(mu_);
      seg->fd = fd;
      seg->bytes = static_cast<int64_t>(kSegmentHeaderBytes);
      seg->seen_bytes = std::max(seg->bytes, size);  // a recycled file keeps its old length
      seg->last_used = ++clock_;
      total_bytes_ += seg->seen_bytes;
      active = seg;
      return seg;
    }
    *error = "no free segment name in " + store_dir_;
    return nullptr;
  }

  // Closes the thread's segment with a seal record (a restart then trusts its records' headers
  // and need not re-read their payloads).
  void seal(int thread) {
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
    ::flock(seg->fd, LOCK_UN);
    drop_if_dead(seg);
    seg = nullptr;
  }

  // Stops appending to the thread's segment without sealing it (after a failed write).
  void retire(int thread) {
    SegmentPtr& seg = active_[static_cast<size_t>(thread)];
    {
      std::lock_guard<std::mutex> lock(mu_);
      seg->ours = false;
    }
    ::flock(seg->fd, LOCK_UN);
    seg = nullptr;
  }

  // Makes `k` records just written at `start` visible.
  void publish(const SegmentPtr& seg, const BlockIo* blocks, size_t k, int64_t start) {
    std::vector<std::pair<int64_t, StorageKey>> duplicates;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t j = 0; j < k; ++j) {
        const int64_t offset = start + static_cast<int64_t>(j) * record_bytes_;
        // Two puts of one key raced: keep the first, so that a remove() finds every copy.
        if (!index_.emplace(blocks[j].key, Loc{seg, offset}).second) {
          duplicates.emplace_back(offset, blocks[j].key);
          continue;
        }
        seg->keys.push_back(blocks[j].key);
        ++seg->live;
      }
      const int64_t end = start + static_cast<int64_t>(k) * record_bytes_;
      const int64_t seen = std::max(seg->seen_bytes, end);
      total_bytes_ += seen - seg->seen_bytes;
      seg->seen_bytes = seen;
      seg->bytes = end;
      seg->last_used = ++clock_;
    }
    for (const auto& [offset, key] : duplicates) mark_removed(seg, offset, key);
  }

  // ---- the index ----

  bool lookup(const StorageKey& k, Loc* loc) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(k);
    if (it == index_.end()) return false;
    it->second.seg->last_used = ++clock_;
    if (loc != nullptr) *loc = it->second;
    return true;
  }

  void unindex(Index::iterator it) {
    --it->second.seg->live;
    index_.erase(it);
  }

  // A get failed: lookups stop finding the block. A damaged record is also marked removed on
  // disk, so that a restart does not index it again.
  void forget(const StorageKey& key, const SegmentPtr& seg, int64_t offset, bool damaged) {
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

  // Rewrites a block record's header as removed (one small write; the body stays).
  void mark_removed(const SegmentPtr& seg, int64_t offset, const StorageKey& key) {
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

  // Whether no other live store appends to a segment that is not ours: sealed, or it holds a
  // record and its writer's flock is gone. (A new, empty one may not be locked yet.)
  static bool nobody_appends(const Segment& seg) {
    return seg.sealed || (seg.seen_bytes > static_cast<int64_t>(kSegmentHeaderBytes) &&
                          ::flock(seg.fd, LOCK_EX | LOCK_NB) == 0);
  }

  // A segment with no live block left is garbage: deleted at once, without waiting for the size
  // bound (unless something still appends to it).
  // Its file is kept for reuse by a later segment when nothing else holds it, the free list
  // has room and the bound allows: rewriting pages a file already has in the page cache costs
  // much less than allocating new ones.
  void drop_if_dead(const SegmentPtr& seg) {
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

  // A free file renamed to `path` (link: never over an existing name), or -1 when none.
  int take_free_file(const std::string& path) {
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

  void release_free_files(std::vector<FreeFile>* files) {
    for (FreeFile& f : *files) {
      ::close(f.fd);
      ::unlink(f.path.c_str());
    }
  }

  // ---- the size bound ----

  // Drops least recently used segments (never one being appended to) while the store is over
  // max_bytes; their blocks simply miss from then on.
  void reclaim_over_bound() {
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
          if (!seg->ours && !seg->busy &&
              (victim == nullptr || seg->last_used < victim->last_used)) {
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

  void drop_locked(const SegmentPtr& seg) {
    for (const StorageKey& k : seg->keys) {
      auto it = index_.find(k);
      if (it != index_.end() && it->second.seg == seg) unindex(it);
    }
    total_bytes_ -= seg->seen_bytes;
    segments_.erase(seg->id);
  }

  // ---- what is on disk: startup, and other stores on the directory ----

  // Indexes the segments not known yet, and forgets those another store deleted. At startup the
  // least recently used order is that of the segments' modification times.
  void rescan_directory(bool at_open) {
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
      detail::logger().info("DISK storage tier: {} blocks in {} segments in {}", blocks,
                            found.size(), store_dir_);
    }
  }

  // Adds the blocks a scan found; returns how many. At startup a second copy of a key is
  // marked removed (only one copy may stay live, or a remove() would leave one behind).
  int64_t index_scanned(const SegmentPtr& seg, const detail::ScanResult& scan, bool new_segment,
                        bool at_open) {
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

  // Finds what other live stores on the directory wrote since we last looked: new segments
  // (when the directory changed) and records appended to their unsealed ones.
  void catch_up() {
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

  const FileTierOptions options_;
  const std::string store_dir_;
  const int64_t record_bytes_;      // record header, block header and payload
  const int64_t segment_bytes_;     // a segment takes records while they (and a seal) fit
  std::vector<SegmentPtr> active_;  // per I/O thread: the segment it appends to, or null

  std::mutex mu_;
  Index index_;
  std::map<uint64_t, SegmentPtr> segments_;
  uint64_t clock_ = 0;          // least recently used order: a segment's last_used is a tick of it
  int64_t total_bytes_ = 0;     // of the segments' files
  std::vector<FreeFile> free_;  // at most one per I/O thread
  int64_t free_bytes_ = 0;
  uint64_t next_segment_id_ = 1;
  int64_t dir_mtime_ns_ = 0;  // the directory's modification time at the last listing
  int64_t listed_ns_ = 0;     // when that listing began (CLOCK_REALTIME)
};

}  // namespace

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
  // The smallest store: one segment of one block.
  const int64_t smallest =
      static_cast<int64_t>(kSegmentHeaderBytes + 2 * kRecordHeaderBytes + kBlockHeaderBytes) +
      layout.block_bytes;
  if (options.max_bytes < 0 || (options.max_bytes > 0 && options.max_bytes < smallest)) {
    return invalid_argument(
        "make_file_tier: max_bytes: must be 0 (no bound) or at least one segment of one block (" +
        std::to_string(smallest) + " bytes), got " + std::to_string(options.max_bytes));
  }
  auto tier = std::make_unique<FileTier>(layout, options);
  s = tier->open();
  if (!s.ok()) return s;
  return std::unique_ptr<StorageTier>(std::move(tier));
}

}  // namespace pagedkv
