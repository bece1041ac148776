// Reading the FileTier's segments back: their names, opening one (its header must name this
// layout), and scanning its records to rebuild the index. A scan stops at the first record that
// is torn or damaged and ignores the rest of the segment, so a crash mid-append costs only the
// records it was writing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/storage_tier.hpp"
#include "storage/segment_format.hpp"

namespace pagedkv::detail {

/// One segment file. The store's lock guards the fields below `mtime_ns`.
struct Segment {
  uint64_t id = 0;
  std::string path;
  int fd = -1;
  // O_DIRECT appends (FileTierOptions::direct_io): the file opened again with O_DIRECT, while
  // this store appends to it; -1 otherwise (appends then go through `fd`).
  int direct_fd = -1;
  RecordShape shape;       // how its records are laid out (segment_format.hpp)
  int64_t mtime_ns = 0;    // when opened
  bool ours = false;       // one of this store's I/O threads appends to it
  bool mine = false;       // this store made it (only such a file is reused once dead)
  bool sealed = false;     // ends with a seal record: its writer closed it
  int64_t bytes = 0;       // the valid prefix: the header and whole records
  int64_t seen_bytes = 0;  // the file's size when last looked at (more than bytes: a torn tail)
  int64_t live = 0;        // blocks of it in the index
  uint64_t last_used = 0;
  bool busy = false;             // reclaim: another live store holds it (its flock)
  std::vector<StorageKey> keys;  // blocks indexed in it (some removed since)

  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();
};
using SegmentPtr = std::shared_ptr<Segment>;

/// A dead segment's file kept for reuse: <dir>/<id: 16 hex>.free (deleted at startup).
inline constexpr char kFreeSuffix[] = ".free";
/// Deletes the files kept for reuse in `dir`.
void remove_free_files(const std::string& dir);

/// <dir>/<id: 16 hex>.seg
std::string segment_path(const std::string& dir, uint64_t id);
/// The ids of the segment files in `dir`, ascending.
std::vector<uint64_t> list_segments(const std::string& dir);
/// Opens a segment (read-write where allowed) and checks its header; null when it cannot be
/// opened or is not a segment of this layout (such a file is never read again).
SegmentPtr open_segment(const std::string& dir, uint64_t id, uint64_t fingerprint,
                        int64_t block_bytes);

/// What a scan of a segment found after `seg.bytes`.
struct ScanResult {
  std::vector<std::pair<int64_t, StorageKey>> blocks;  // record offset, key: live blocks
  int64_t end = 0;                                     // the new valid prefix
  int64_t size = 0;                                    // the file's size
  bool sealed = false;                                 // it reached the seal
  std::string torn;  // why it stopped before the end of the file (empty: it did not)
};

/// Scans the records of `seg` from `seg.bytes`: every record header (CRC, type, size) and block
/// header (layout, key); and the payload CRC too unless the segment is sealed (a sealed
/// segment's writer finished every record in it, so only a crash can tear an unsealed one).
ScanResult scan_segment(const Segment& seg, uint64_t fingerprint, int64_t block_bytes);

}  // namespace pagedkv::detail
