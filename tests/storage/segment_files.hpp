// The file store's segments as the tests see them, parsed here independently of the library
// (docs/storage.md): <dir>/<fingerprint>/<id: 16 hex>.seg, a 32-byte segment header, then
// records of a 40-byte record header (type at 4, ns at 8, hash at 16, body bytes at 24) and a
// body (a block: the 48-byte block header and the payload). Version 1 packs the records; in
// version 2 (O_DIRECT) the header names an alignment (at 24), the first record starts there and
// each record is padded to a multiple of it; version 3 is version 2 with each payload at the
// start of its record's second aligned unit (zeros between the headers and it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/storage_tier.hpp"
#include "storage/storage_test_util.hpp"

namespace pagedkv::testing {

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline uint64_t le_at(const std::string& s, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[off + size_t(i)]);
  return v;
}

/// The segment files of a layout's store in `dir`, oldest (lowest id) first.
inline std::vector<std::string> segment_files(const std::string& dir, const StorageLayout& l) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/" + hex(l.fingerprint()), ec)) {
    if (e.path().extension() == ".seg") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Total bytes of those files.
inline int64_t segment_bytes_on_disk(const std::string& dir, const StorageLayout& l) {
  int64_t n = 0;
  for (const std::string& p : segment_files(dir, l)) {
    n += static_cast<int64_t>(std::filesystem::file_size(p));
  }
  return n;
}

/// A segment's format version (at 4), record alignment (1 for packed records) and where a
/// block's payload starts in its record.
struct SegmentFormat {
  int version = 0;
  uint64_t align = 1;
  uint64_t first = 32;       // the first record's offset
  uint64_t payload_at = 88;  // from the record header
};
inline SegmentFormat segment_format(const std::string& bytes) {
  SegmentFormat f;
  if (bytes.size() < 32) return f;
  f.version = int(le_at(bytes, 4, 2));
  if (f.version == 2 || f.version == 3) f.align = f.first = le_at(bytes, 24, 4);
  if (f.version == 3) f.payload_at = f.align;
  return f;
}

/// Where a record is: its segment, the offset of its record header, its type.
struct RecordAt {
  std::string path;
  int64_t offset = 0;
  int type = 0;  // 1 block, 2 removed, 3 seal
  StorageKey key;
};

/// Every record of every segment, in file order (stops at a segment's first malformed record).
inline std::vector<RecordAt> all_records(const std::string& dir, const StorageLayout& l) {
  std::vector<RecordAt> out;
  for (const std::string& p : segment_files(dir, l)) {
    const std::string s = file_bytes(p);
    const SegmentFormat f = segment_format(s);
    size_t off = size_t(f.first);
    while (off + 40 <= s.size() && s.compare(off, 4, "PKSR") == 0) {
      RecordAt r{p, int64_t(off), int(le_at(s, off + 4, 2)),
                 StorageKey{le_at(s, off + 16, 8), le_at(s, off + 8, 8)}};
      out.push_back(r);
      // The headers (or version 3's first unit), then the payload: the body less its header.
      const size_t record = size_t(f.payload_at) + size_t(le_at(s, off + 24, 8)) - 48;
      off += (record + f.align - 1) / f.align * f.align;
    }
  }
  return out;
}

/// The live (type 1) block record of `key`, if any.
inline std::optional<RecordAt> block_record(const std::string& dir, const StorageLayout& l,
                                            const StorageKey& key) {
  for (const RecordAt& r : all_records(dir, l)) {
    if (r.type == 1 && r.key == key) return r;
  }
  return std::nullopt;
}

/// Writes `bytes` into a file at `offset` (in place).
inline void write_at(const std::string& path, int64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(offset);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace pagedkv::testing
