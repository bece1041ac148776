// FileTier: one file per block under <directory>/<fingerprint>/<hash & 0xff>/ (docs/storage.md;
// the 256 subdirectories are made when their first block is written).
// A put writes a temporary file in <directory>/<fingerprint>/tmp and renames it into place (the
// commit); a get opens the file and reads header and payload with one preadv, then verifies them.
// The in-memory LRU (rebuilt from the directory at startup, oldest modification first) bounds
// the bytes; lookups that miss it look at the directory, so blocks another process wrote are
// found too.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "common/logging.hpp"
#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"
#include "storage/queued_tier.hpp"

namespace pagedkv {
namespace {

using detail::hex16;
using detail::kBlockHeaderBytes;

std::string errno_text(int e) { return std::string(std::strerror(e)); }

struct KeyHash {
  size_t operator()(const StorageKey& k) const {
    return static_cast<size_t>(k.block_hash ^ (k.ns * 0x9E3779B97F4A7C15ull));
  }
};

// mkdir that accepts an existing directory.
bool make_dir(const std::string& path, std::string* error) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return true;
    *error = path + ": exists and is not a directory";
    return false;
  }
  *error = path + ": " + errno_text(errno);
  return false;
}

bool make_dirs(const std::string& path, std::string* error) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || prefix.back() == '/') continue;
      if (!make_dir(prefix, error)) return false;
    }
  }
  return true;
}

bool write_all(int fd, const unsigned char* p, size_t n, std::string* error) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(done));
    if (w < 0) {
      if (errno == EINTR) continue;
      *error = "write: " + errno_text(errno);
      return false;
    }
    if (w == 0) {
      *error = "write: no progress";
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}

bool parse_hex16(const char* s, uint64_t* out) {
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

constexpr char kBlockSuffix[] = ".blk";
constexpr size_t kBlockNameLength = 16 + 1 + 16 + 4;  // <ns>-<hash>.blk

class FileTier final : public detail::QueuedStorageTier {
 public:
  FileTier(const StorageLayout& layout, const FileTierOptions& options)
      : QueuedStorageTier(layout, options.threads, options.max_queued_blocks),
        options_(options),
        store_dir_(options.directory + "/" + hex16(fingerprint_)),
        tmp_dir_(store_dir_ + "/tmp"),
        file_bytes_(static_cast<int64_t>(kBlockHeaderBytes) + layout.block_bytes) {}

  ~FileTier() override { stop_workers(); }

  // Creates the directories, checks they can be written, removes temporary files of dead
  // processes and indexes the blocks already there.
  Status open() {
    std::string error;
    if (!make_dirs(store_dir_, &error) || !make_dir(tmp_dir_, &error)) {
      return unavailable("make_file_tier: cannot create the directory " + error);
    }
    const std::string probe = tmp_path();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      return unavailable("make_file_tier: cannot write in " + tmp_dir_ + ": " + errno_text(errno));
    }
    const bool wrote = ::write(fd, "x", 1) == 1;
    const int write_errno = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!wrote) {
      return unavailable("make_file_tier: cannot write in " + tmp_dir_ + ": " +
                         errno_text(write_errno));
    }
    remove_stale_temporaries();
    index_existing_blocks();
    start_workers();
    return ok_status();
  }

  const char* medium() const override { return "DISK"; }

  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override {
    size_t n = 0;
    for (const StorageKey& k : keys) {
      if (touch(k)) {
        ++n;
        continue;
      }
      // Not in this instance's index: another process (or instance) may have written it.
      struct stat st {};
      if (::stat(block_path(k).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          st.st_size != file_bytes_) {
        break;
      }
      insert(k);
      ++n;
    }
    return n;
  }

 protected:
  std::string put_block(int, const StorageKey& key, const unsigned char* stored,
                        size_t n) override {
    const std::string tmp = tmp_path();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {  // the directory was removed under us: make it again
      std::string ignored;
      make_dirs(tmp_dir_, &ignored);
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) return "create " + tmp + ": " + errno_text(errno);
    std::string error;
    bool ok = write_all(fd, stored, n, &error);
    if (ok && options_.fsync && ::fsync(fd) != 0) {
      error = "fsync: " + errno_text(errno);
      ok = false;
    }
    if (::close(fd) != 0 && ok) {
      error = "close: " + errno_text(errno);
      ok = false;
    }
    if (!ok) {
      ::unlink(tmp.c_str());
      return error;
    }
    {
      // The commit. Under the key's stripe, so that an eviction or a removal of the same key
      // cannot unlink the new file after deciding on the old one.
      std::lock_guard<std::mutex> stripe(stripe_for(key));
      const std::string path = block_path(key);
      int rc = ::rename(tmp.c_str(), path.c_str());
      if (rc != 0 && errno == ENOENT) {  // the first block of its subdirectory
        std::string ignored;
        make_dir(fanout_dir(key.block_hash), &ignored);
        rc = ::rename(tmp.c_str(), path.c_str());
      }
      if (rc != 0) {
        error = "rename to " + path + ": " + errno_text(errno);
        ::unlink(tmp.c_str());
        return error;
      }
      if (options_.fsync && !fsync_dir(fanout_dir(key.block_hash), &error)) {
        // Not durable: take it back, so that a failed put leaves nothing visible.
        ::unlink(path.c_str());
        erase(key);
        return error;
      }
      insert(key);
    }
    evict_over_bound(key);
    return {};
  }

  // A block file of the right size is there: rewriting it would only cost a flush (ext4 flushes
  // a file renamed over another) for the same bytes. A damaged one is found by the next get,
  // which deletes it, and the put after that writes it again.
  bool already_stored(int, const StorageKey& key) override {
    struct stat st {};
    if (::stat(block_path(key).c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size != file_bytes_) {
      return false;
    }
    insert(key);
    return true;
  }

  std::string get_block(int, const StorageKey& key, void* dst) override {
    const std::string path = block_path(key);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int e = errno;
      if (e == ENOENT) erase(key);
      return e == ENOENT ? std::string("not stored") : "open: " + errno_text(e);
    }
    std::string why = read_and_verify(fd, key, dst);
    struct stat st {};
    const bool have_stat = why.empty() || ::fstat(fd, &st) == 0;
    ::close(fd);
    if (!why.empty()) {
      // A corrupt, truncated or foreign file will never read back: delete it (unless a put
      // replaced it meanwhile), so that lookups stop finding it.
      if (have_stat) discard(key, st);
      return why;
    }
    touch(key);  // not insert: the size bound may have deleted the file while it was read
    return {};
  }

  bool remove_block(int, const StorageKey& key) override {
    std::lock_guard<std::mutex> stripe(stripe_for(key));
    erase(key);
    return ::unlink(block_path(key).c_str()) == 0;
  }

 private:
  struct Entry {
    StorageKey key;
  };

  std::string fanout_dir(uint64_t block_hash) const {
    static const char kDigits[] = "0123456789abcdef";
    const char name[3] = {kDigits[(block_hash >> 4) & 0xF], kDigits[block_hash & 0xF], '\0'};
    return store_dir_ + "/" + name;
  }

  std::string block_path(const StorageKey& k) const {
    return fanout_dir(k.block_hash) + "/" + hex16(k.ns) + "-" + hex16(k.block_hash) + kBlockSuffix;
  }

  // <pid>-<sequence>.tmp: the pid lets a later process tell a dead writer's leftovers.
  std::string tmp_path() {
    return tmp_dir_ + "/" + std::to_string(::getpid()) + "-" + std::to_string(tmp_seq_++) + ".tmp";
  }

  std::mutex& stripe_for(const StorageKey& k) { return stripes_[KeyHash()(k) % stripes_.size()]; }

  std::string read_and_verify(int fd, const StorageKey& key, void* dst) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return "fstat: " + errno_text(errno);
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    if (st.st_size != file_bytes_) {
      return "file size " + std::to_string(st.st_size) + " bytes, expected " +
             std::to_string(file_bytes_) + " (truncated or foreign)";
    }
    std::array<unsigned char, kBlockHeaderBytes> header{};
    const auto payload = static_cast<size_t>(layout_.block_bytes);
    size_t done = 0;
    const size_t total = kBlockHeaderBytes + payload;
    while (done < total) {
      iovec iov[2];
      int count = 0;
      if (done < kBlockHeaderBytes) {
        iov[count++] = {header.data() + done, kBlockHeaderBytes - done};
        iov[count++] = {dst, payload};
      } else {
        iov[count++] = {static_cast<unsigned char*>(dst) + (done - kBlockHeaderBytes),
                        total - done};
      }
      const ssize_t r = ::preadv(fd, iov, count, static_cast<off_t>(done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return "read: " + errno_text(errno);
      }
      if (r == 0) return "file ends early (truncated)";
      done += static_cast<size_t>(r);
    }
    uint32_t want = 0;
    std::string why = detail::check_block_header(header.data(), fingerprint_, key,
                                                 static_cast<uint64_t>(payload), &want);
    if (!why.empty()) return why;
    if (detail::crc32c(dst, payload) != want) return "payload checksum mismatch";
    return {};
  }

  void discard(const StorageKey& key, const struct stat& read) {
    std::lock_guard<std::mutex> stripe(stripe_for(key));
    struct stat now {};
    const std::string path = block_path(key);
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == read.st_ino && now.st_dev == read.st_dev &&
        ::unlink(path.c_str()) == 0) {
      count_removed(1);
      detail::logger().warn("DISK storage tier: removed unreadable block file {}", path);
    }
    erase(key);
  }

  static bool fsync_dir(const std::string& dir, std::string* error) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      *error = "open " + dir + ": " + errno_text(errno);
      return false;
    }
    const bool ok = ::fsync(fd) == 0;
    if (!ok) *error = "fsync " + dir + ": " + errno_text(errno);
    ::close(fd);
    return ok;
  }

  // ---- the LRU index (front: most recently used) ----

  bool touch(const StorageKey& k) {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(k);
    if (it == index_.end()) return false;
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }

  void insert(const StorageKey& k) {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(k);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
    lru_.push_front(Entry{k});
    index_.emplace(k, lru_.begin());
    total_bytes_ += file_bytes_;
  }

  void erase(const StorageKey& k) {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(k);
    if (it == index_.end()) return;
    lru_.erase(it->second);
    index_.erase(it);
    total_bytes_ -= file_bytes_;
  }

  bool indexed(const StorageKey& k) {
    std::lock_guard<std::mutex> lock(index_mu_);
    return index_.count(k) != 0;
  }

  // Deletes least recently used blocks (never `keep`, the block just written) while the store
  // holds more than max_bytes.
  void evict_over_bound(const StorageKey& keep) {
    if (options_.max_bytes <= 0) return;
    std::vector<StorageKey> victims;
    {
      std::lock_guard<std::mutex> lock(index_mu_);
      while (total_bytes_ > options_.max_bytes && !lru_.empty()) {
        auto last = std::prev(lru_.end());
        if (last->key == keep) {
          if (lru_.size() == 1) break;
          lru_.splice(lru_.begin(), lru_, last);
          continue;
        }
        victims.push_back(last->key);
        index_.erase(last->key);
        lru_.erase(last);
        total_bytes_ -= file_bytes_;
      }
    }
    for (const StorageKey& v : victims) {
      std::lock_guard<std::mutex> stripe(stripe_for(v));
      if (indexed(v)) continue;  // written (or found) again since: keep it
      if (::unlink(block_path(v).c_str()) == 0) count_removed(1);
    }
  }

  void remove_stale_temporaries() {
    DIR* d = ::opendir(tmp_dir_.c_str());
    if (d == nullptr) return;
    const pid_t self = ::getpid();
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const long pid = std::strtol(name.c_str(), nullptr, 10);
      if (pid <= 0 || pid == self) continue;
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        ::unlink((tmp_dir_ + "/" + name).c_str());
      }
    }
    ::closedir(d);
  }

  void index_existing_blocks() {
    struct Found {
      int64_t mtime_ns;
      StorageKey key;
    };
    std::vector<Found> found;
    for (uint64_t b = 0; b < 256; ++b) {
      const std::string dir = fanout_dir(b);
      DIR* d = ::opendir(dir.c_str());
      if (d == nullptr) continue;
      while (dirent* e = ::readdir(d)) {
        const char* name = e->d_name;
        StorageKey k;
        if (std::strlen(name) != kBlockNameLength || name[16] != '-' ||
            std::strcmp(name + 33, kBlockSuffix) != 0 || !parse_hex16(name, &k.ns) ||
            !parse_hex16(name + 17, &k.block_hash) || (k.block_hash & 0xFF) != b) {
          continue;
        }
        struct stat st {};
        if (::stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        found.push_back(
            Found{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, k});
      }
      ::closedir(d);
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
    for (const Found& f : found) insert(f.key);  // the newest ends up in front
    if (!found.empty()) {
      detail::logger().info("DISK storage tier: {} blocks found in {}", found.size(), store_dir_);
      // Over the bound (a smaller max_bytes than last time): evict down to it now.
      evict_over_bound(found.back().key);
    }
  }

  const FileTierOptions options_;
  const std::string store_dir_;
  const std::string tmp_dir_;
  const int64_t file_bytes_;
  std::atomic<uint64_t> tmp_seq_{0};
  std::array<std::mutex, 64> stripes_;

  std::mutex index_mu_;
  std::list<Entry> lru_;
  std::unordered_map<StorageKey, std::list<Entry>::iterator, KeyHash> index_;
  int64_t total_bytes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<StorageTier>> make_file_tier(const StorageLayout& layout,
                                                      const FileTierOptions& options) {
  Status s = detail::validate_storage_layout(layout);
  if (!s.ok()) return Status(s.code(), "make_file_tier: " + s.message());
  s = detail::check_queue_options(options.threads, options.max_queued_blocks);
  if (!s.ok()) return Status(s.code(), "make_file_tier: " + s.message());
  if (options.directory.empty()) return invalid_argument("make_file_tier: directory is empty");
  const int64_t file_bytes = static_cast<int64_t>(kBlockHeaderBytes) + layout.block_bytes;
  if (options.max_bytes < 0 || (options.max_bytes > 0 && options.max_bytes < file_bytes)) {
    return invalid_argument(
        "make_file_tier: max_bytes: must be 0 (no bound) or at least one "
        "block file (" +
        std::to_string(file_bytes) + " bytes), got " + std::to_string(options.max_bytes));
  }
  auto tier = std::make_unique<FileTier>(layout, options);
  s = tier->open();
  if (!s.ok()) return s;
  return std::unique_ptr<StorageTier>(std::move(tier));
}

}  // namespace pagedkv
