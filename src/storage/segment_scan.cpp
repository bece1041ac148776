#include "storage/segment_scan.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"
#include "storage/file_io.hpp"
#include "storage/segment_format.hpp"

namespace pagedkv::detail {
namespace {

constexpr char kSuffix[] = ".seg";
constexpr size_t kNameLength = 16 + 4;

bool parse_id(const char* s, uint64_t* out) {
  if (std::strlen(s) != kNameLength || std::strcmp(s + 16, kSuffix) != 0) return false;
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

// pread of exactly n bytes; false when the file is shorter or the read fails.
bool read_at(int fd, void* p, size_t n, int64_t offset) {
  iovec iov{p, n};
  std::string error;
  return preadv_all(fd, &iov, 1, offset, &error) == static_cast<int64_t>(n);
}

}  // namespace

Segment::~Segment() {
  if (fd >= 0) ::close(fd);
  if (direct_fd >= 0) ::close(direct_fd);
}

std::string segment_path(const std::string& dir, uint64_t id) {
  return dir + "/" + hex16(id) + kSuffix;
}

std::vector<uint64_t> list_segments(const std::string& dir) {
  std::vector<uint64_t> ids;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ids;
  while (dirent* e = ::readdir(d)) {
    uint64_t id = 0;
    if (parse_id(e->d_name, &id)) ids.push_back(id);
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void remove_free_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const size_t n = std::strlen(kFreeSuffix);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() == 16 + n && name.compare(16, n, kFreeSuffix) == 0) {
      ::unlink((dir + "/" + name).c_str());
    }
  }
  ::closedir(d);
}

SegmentPtr open_segment(const std::string& dir, uint64_t id, uint64_t fingerprint,
                        int64_t block_bytes) {
  const std::string path = segment_path(dir, id);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && (errno == EACCES || errno == EROFS))
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = path;
  seg->fd = fd;
  struct stat st {};
  unsigned char head[kSegmentHeaderBytes];
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !read_at(fd, head, sizeof(head), 0) ||
      !check_segment_header(head, fingerprint, static_cast<uint64_t>(block_bytes), &seg->shape)
           .empty()) {
    return nullptr;
  }
  seg->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  seg->bytes = seg->seen_bytes = seg->shape.first_record();
  return seg;
}

ScanResult scan_segment(const Segment& seg, uint64_t fingerprint, int64_t block_bytes) {
  ScanResult out;
  out.end = seg.bytes;
  struct stat st {};
  if (::fstat(seg.fd, &st) != 0) {
    out.torn = "fstat: " + errno_text(errno);
    out.size = seg.seen_bytes;
    return out;
  }
  out.size = static_cast<int64_t>(st.st_size);
  const auto body = static_cast<int64_t>(kBlockHeaderBytes) + block_bytes;
  const auto head_bytes = static_cast<int64_t>(kRecordHeaderBytes);
  const int64_t stride = seg.shape.stride(block_bytes);
  // From a record header to the end of its payload.
  const int64_t record = seg.shape.payload_at + block_bytes;
  const uint32_t seed = record_seed(seg.id);
  // A sealed segment (its last record a seal) was finished by its writer: headers suffice.
  bool trusted = false;
  if (out.size >= head_bytes + seg.shape.first_record()) {
    unsigned char tail[kRecordHeaderBytes];
    RecordHeader h;
    trusted = read_at(seg.fd, tail, sizeof(tail), out.size - head_bytes) &&
              decode_record_header(tail, seed, &h).empty() && h.type == RecordType::kSeal;
  }
  std::vector<unsigned char> payload;
  if (!trusted) payload.resize(static_cast<size_t>(block_bytes));
  unsigned char head[kRecordHeaderBytes + kBlockHeaderBytes];
  int64_t off = out.end;
  while (off + head_bytes <= out.size) {
    const bool whole = off + record <= out.size;
    if (!read_at(seg.fd, head, whole ? sizeof(head) : kRecordHeaderBytes, off)) {
      out.torn = "unreadable record header";
      break;
    }
    RecordHeader h;
    out.torn = decode_record_header(head, seed, &h);
    if (!out.torn.empty()) break;
    if (h.type == RecordType::kSeal) {
      out.sealed = true;
      off += head_bytes;
      break;
    }
    if (h.body_bytes != static_cast<uint64_t>(body)) {
      out.torn = "record body of " + std::to_string(h.body_bytes) + " bytes";
      break;
    }
    if (!whole) {
      out.torn = "the last record is cut short";
      break;
    }
    if (h.type == RecordType::kBlock) {
      uint32_t crc = 0;
      out.torn = check_block_header(head + kRecordHeaderBytes, fingerprint, h.key,
                                    static_cast<uint64_t>(block_bytes), &crc);
      if (!out.torn.empty()) break;
      if (!trusted) {
        if (!read_at(seg.fd, payload.data(), payload.size(), off + seg.shape.payload_at)) {
          out.torn = "unreadable payload";
          break;
        }
        if (crc32c(payload.data(), payload.size()) != crc) {
          out.torn = "payload checksum mismatch";
          break;
        }
      }
      out.blocks.emplace_back(off, h.key);
    }
    // An aligned segment's padding is not checked: a crash that cut it spared the record.
    off += stride;
  }
  if (out.torn.empty() && !out.sealed && off < out.size) out.torn = "a partial record header";
  out.end = off;
  return out;
}

}  // namespace pagedkv::detail
