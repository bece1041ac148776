// FileTier: blocks appended to segment files under <directory>/<fingerprint>/ (docs/storage.md,
// segment_format.hpp). Each I/O thread appends whole batches to its own segment with one pwritev
// (and one fdatasync with `fsync`), then publishes the blocks in an in-memory index, so a get
// finds a block only once all of its bytes are written. A get reads a run of adjacent records
// with one preadv straight into the destinations and verifies every block. remove() rewrites the
// block's record header in place as removed. The size bound drops whole least recently used
// segments. At startup the index is rebuilt by scanning the segments (segment_scan.hpp).
// With FileTierOptions::direct_io the segments are written with O_DIRECT from aligned staging
// buffers, records aligned to kDirectAlign (segment_format.hpp, version 2, or 3 for blocks of
// whole pages). With direct_read_depth a get reads the runs the page cache does not hold around
// it, with O_DIRECT, several at once; version 3 runs (also written, through the page cache, for
// blocks of whole pages from kInPlaceBlockBytes) straight into page-aligned destinations.
// The class is defined across file_tier.cpp (puts, gets, lookups), file_tier_segments.cpp
// (appending, the index, removal and reclaim), file_tier_direct.cpp (O_DIRECT appends),
// file_tier_direct_reads.cpp (O_DIRECT reads) and file_tier_scan.cpp (what is on disk).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/block_format.hpp"
#include "storage/direct_reads.hpp"
#include "storage/file_io.hpp"
#include "storage/queued_tier.hpp"
#include "storage/segment_format.hpp"
#include "storage/segment_scan.hpp"

namespace pagedkv::detail {

struct FileKeyHash {
  size_t operator()(const StorageKey& k) const {
    return static_cast<size_t>(k.block_hash ^ (k.ns * 0x9E3779B97F4A7C15ull));
  }
};

// Records per preadv / pwritev: two iovecs each, within IOV_MAX (1024).
inline constexpr size_t kMaxRunRecords = 512;
// O_DIRECT's alignment of offsets, lengths and buffers: the page size, which every Linux
// filesystem that takes O_DIRECT accepts (most need only the logical sector, 512 B).
inline constexpr uint32_t kDirectAlign = 4096;
// The smallest block that reads around the page cache lay out for reads in place without
// direct_io: the page each record then takes more is at most 1/16 of it.
inline constexpr int64_t kInPlaceBlockBytes = int64_t{16} * kDirectAlign;
// An O_DIRECT append stages its records in a buffer of about this size per I/O thread.
inline constexpr size_t kStageBytes = size_t{2} << 20;

// Test seam: while set, stores made from then on find O_DIRECT refused (as tmpfs did before
// Linux 6.6) and fall back to writing through the page cache.
void refuse_direct_io_for_testing(bool refuse);
// Test seam: while set, every get of a store that reads around the page cache does so, as if the
// page cache held none of its blocks.
void force_direct_reads_for_testing(bool force);

class FileTier final : public QueuedStorageTier {
 public:
  FileTier(const StorageLayout& layout, const FileTierOptions& options);

  ~FileTier() override;

  // How new segments lay out records of `block_bytes`. With direct_io (O_DIRECT appends):
  // aligned to kDirectAlign (version 2), their payloads too where block_bytes is a multiple of it
  // (version 3: then no larger than version 2's records). With direct_reads alone: version 3 for
  // blocks of whole pages of at least kInPlaceBlockBytes (cold gets then read them in place; a
  // record takes one page more than packed), else packed (version 1).
  static RecordShape new_segment_shape(bool direct_io, bool direct_reads, int64_t block_bytes);

  // The smallest segment of records shaped so: its header, one record and the seal.
  static int64_t smallest_segment(const RecordShape& shape, int64_t block_bytes) {
    return shape.first_record() + shape.stride(block_bytes) +
           static_cast<int64_t>(kRecordHeaderBytes);
  }

  // The largest segment: options.segment_bytes, and with a size bound at most a quarter of it
  // (reclaim drops whole segments), but never below smallest_segment().
  static int64_t effective_segment_bytes(const FileTierOptions& o, const RecordShape& shape,
                                         int64_t block_bytes);

  // Creates the directory, checks it can be written, and indexes the segments already there.
  Status open();

  const char* medium() const override { return "DISK"; }

  StatusOr<size_t> batch_exists(const std::vector<StorageKey>& keys) override;

  StatusOr<std::vector<bool>> exists_each(const std::vector<StorageKey>& keys) override;

 protected:
  size_t max_batch_blocks() const override { return kMaxRunRecords; }

  std::string put_block(int thread, const StorageKey& key, const unsigned char* header,
                        const unsigned char* payload) override {
    BlockIo b{key, const_cast<unsigned char*>(payload), header, {}};
    put_blocks(thread, &b, 1);
    return b.error;
  }

  std::string get_block(int thread, const StorageKey& key, void* dst) override {
    BlockIo b{key, static_cast<unsigned char*>(dst), nullptr, {}};
    get_blocks(thread, &b, 1);
    return b.error;
  }

  // A key names its bytes (the chained hash of the prefix, the namespace and the layout): a
  // stored one needs no second copy. A damaged one is found by the next get, which forgets it.
  bool already_stored(int, const StorageKey& key) override { return lookup(key, nullptr); }

  void put_blocks(int thread, BlockIo* blocks, size_t n) override;

  void get_blocks(int, BlockIo* blocks, size_t n) override;

  bool remove_block(int, const StorageKey& key) override;

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
  using Index = std::unordered_map<StorageKey, Loc, FileKeyHash>;

  // Checks a record read by a get: its header (a block of this key), the block header and the
  // payload's CRC. Sets *damaged when the record is corrupt (not merely removed).
  std::string verify(const Segment& seg, const unsigned char* head, const BlockIo& b,
                     bool* damaged);

  // ---- gets ----

  // A block a get reads: blocks[i], whose record starts at `offset` of `seg`.
  struct Want {
    size_t i;
    SegmentPtr seg;
    int64_t offset;
  };
  // Records adjacent in one segment, wants[first, first + k): read at once.
  struct Run {
    size_t first;
    size_t k;
  };
  // A get's buffers for the headers of a run and its iovecs, reused from run to run; `units`:
  // kDirectAlign-aligned, for reads in place (their record headers' units and the padding).
  struct ReadScratch {
    std::vector<unsigned char> heads;
    std::vector<iovec> iov;
    std::vector<unsigned char> pad;
    std::unique_ptr<unsigned char, FreeAligned> units;
    size_t units_bytes = 0;
  };
  // The bytes from the run's first record header to the end of its last record.
  int64_t run_bytes(const std::vector<Want>& wants, Run run) const;
  // Reads a run through the page cache, straight into the blocks' destinations.
  void read_buffered(BlockIo* blocks, const std::vector<Want>& wants, Run run,
                     ReadScratch* scratch);
  // Whether the page cache lacks some of the run (file_tier_direct_reads.cpp).
  bool is_cold(const std::vector<Want>& wants, Run run) const;
  // Reads runs around the page cache, several in flight on the thread's DirectReads: in place
  // where they can be, the others as aligned spans copied out; those that cannot be read so
  // with read_buffered.
  void read_direct(int thread, BlockIo* blocks, const std::vector<Want>& wants,
                   const std::vector<Run>& runs, ReadScratch* scratch);
  // Whether a run can be read in place: a version 3 segment, payloads of whole aligned units,
  // every destination aligned.
  bool readable_in_place(const BlockIo* blocks, const std::vector<Want>& wants, Run run) const;
  // The aligned scratch an in-place read of `k` records of `seg` needs: a header unit each and
  // one place for the padding between them.
  size_t in_place_unit_bytes(const Segment& seg, size_t k) const;
  // The iovecs of such a read: each record's header unit into `units`, its payload straight into
  // the block's destination, the padding between records into the place after the units.
  void add_in_place_iovecs(const BlockIo* blocks, const std::vector<Want>& wants, Run run,
                           unsigned char* units, std::vector<iovec>* iovs) const;
  // Sets b.error from how the read went (`read_error`; `whole`: the record was all read) and
  // verify(), and forgets the block when it failed.
  void finish_get(const Want& w, BlockIo& b, const unsigned char* head,
                  const std::string& read_error, bool whole);

  // ---- segments this store appends to ----

  int64_t stride_of(const Segment& seg) const { return seg.shape.stride(layout_.block_bytes); }
  // From a record's header to the end of its payload.
  int64_t record_end(const Segment& seg) const {
    return seg.shape.payload_at + layout_.block_bytes;
  }
  // An aligned record's zeros after its payload, up to the next record.
  size_t padding_after(const Segment& seg) const {
    return static_cast<size_t>(stride_of(seg) - record_end(seg));
  }

  // Whether O_DIRECT writes work in the store's directory (a probe file written with it); when
  // not, *why says what failed. tmpfs, for one, refuses O_DIRECT (EINVAL).
  bool probe_direct_io(std::string* why) const;

  // Opens seg.direct_fd for a segment that takes O_DIRECT appends; without it (a filesystem
  // that refuses it only for some files) the segment is written through the page cache.
  void open_direct(Segment& seg);
  // Closes it once the segment takes no more appends.
  static void close_direct(Segment& seg);

  // Writes a new segment's header: the 32 bytes, or for an aligned segment a whole first
  // alignment unit (the header then zeros). Empty string, or why it failed.
  std::string write_segment_header(int thread, Segment& seg);

  // Appends `k` blocks at `start` as aligned records (stride_of(seg) apart, zero-padded) from
  // the thread's staging buffer: with O_DIRECT where seg.direct_fd is open, buffered otherwise
  // (also after O_DIRECT fails with EINVAL). k * stride_of(seg) must fit stage_records().
  std::string append_aligned(int thread, Segment& seg, const BlockIo* blocks, size_t k,
                             int64_t start);

  // How many aligned records of `seg` an append stages at once (at least one).
  size_t stage_records(const Segment& seg) const;

  // The thread's staging buffer (kDirectAlign-aligned, stage_bytes_), made on first use; null
  // when it cannot be allocated.
  unsigned char* stage(int thread);

  SegmentPtr active_segment(int thread, std::string* error);

  // Closes the thread's segment with a seal record (a restart then trusts its records' headers
  // and need not re-read their payloads).
  void seal(int thread);

  // Stops appending to the thread's segment without sealing it (after a failed write).
  void retire(int thread);

  // Makes `k` records just written at `start` visible.
  void publish(const SegmentPtr& seg, const BlockIo* blocks, size_t k, int64_t start);

  // ---- the index ----

  bool lookup(const StorageKey& k, Loc* loc);

  void unindex(Index::iterator it);

  // A get failed: lookups stop finding the block. A damaged record is also marked removed on
  // disk, so that a restart does not index it again.
  void forget(const StorageKey& key, const SegmentPtr& seg, int64_t offset, bool damaged);

  // Rewrites a block record's header as removed (one small write; the body stays).
  void mark_removed(const SegmentPtr& seg, int64_t offset, const StorageKey& key);

  // Whether no other live store appends to a segment that is not ours: sealed, or it holds a
  // record and its writer's flock is gone. (A new, empty one may not be locked yet.)
  static bool nobody_appends(const Segment& seg);

  // A segment with no live block left is garbage: deleted at once, without waiting for the size
  // bound (unless something still appends to it).
  // Its file is kept for reuse by a later segment when nothing else holds it, the free list
  // has room and the bound allows: rewriting pages a file already has in the page cache costs
  // much less than allocating new ones.
  void drop_if_dead(const SegmentPtr& seg);

  // A free file renamed to `path` (link: never over an existing name), or -1 when none.
  int take_free_file(const std::string& path);

  void release_free_files(std::vector<FreeFile>* files);

  // ---- the size bound ----

  // Drops least recently used segments (never one being appended to) while the store is over
  // max_bytes; their blocks simply miss from then on.
  void reclaim_over_bound();

  void drop_locked(const SegmentPtr& seg);

  // ---- what is on disk: startup, and other stores on the directory ----

  // Indexes the segments not known yet, and forgets those another store deleted. At startup the
  // least recently used order is that of the segments' modification times.
  void rescan_directory(bool at_open);

  // Adds the blocks a scan found; returns how many. At startup a second copy of a key is
  // marked removed (only one copy may stay live, or a remove() would leave one behind).
  int64_t index_scanned(const SegmentPtr& seg, const detail::ScanResult& scan, bool new_segment,
                        bool at_open);

  // Finds what other live stores on the directory wrote since we last looked: new segments
  // (when the directory changed) and records appended to their unsealed ones.
  void catch_up();

  const FileTierOptions options_;
  const std::string store_dir_;
  // Set by open(), before the I/O threads start: the shape of new segments' records
  // (new_segment_shape, where O_DIRECT works; else packed), and the segment size.
  RecordShape shape_;
  int64_t segment_bytes_ = 0;  // a segment takes records while they (and a seal) fit
  size_t stage_bytes_ = 0;
  std::vector<SegmentPtr> active_;  // per I/O thread: the segment it appends to, or null
  std::vector<std::unique_ptr<unsigned char, FreeAligned>> stages_;  // per I/O thread
  // Set by open(): reads of runs the page cache does not hold go around it (direct_read_depth > 0
  // and O_DIRECT works here).
  bool direct_reads_ = false;
  std::vector<std::unique_ptr<DirectReads>> readers_;  // per I/O thread, made on first use

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

}  // namespace pagedkv::detail
