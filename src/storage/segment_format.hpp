// The FileTier's segment files (docs/storage.md): a 32-byte segment header naming the layout, then
// records appended one after another. A record is a 40-byte record header followed by its body;
// a block record's body is the stored block format (block_format.hpp), so a block reads the same
// from a segment as from Redis. Little-endian, every header with its own CRC-32C.
// Version 1 packs the records. Version 2 (written for O_DIRECT, FileTierOptions::direct_io)
// aligns them: the header names an alignment A, the first record starts at A and each record is
// zero-padded to a multiple of A, so that every append is whole aligned blocks. A seal is not
// padded (it ends the file). Version 3 (for blocks whose size is a multiple of A) is version 2
// with each block's payload at the start of the record's second unit (the two headers, then
// zeros up to A): a cold get then reads a payload straight into an aligned destination
// (file_tier_direct_reads.cpp). Its records take no more room than version 2's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pagedkv/storage_tier.hpp"
#include "storage/block_format.hpp"

namespace pagedkv::detail {

inline constexpr size_t kSegmentHeaderBytes = 32;
inline constexpr size_t kRecordHeaderBytes = 40;
// A block record's two headers (record and block): where its payload starts in versions 1 and 2.
inline constexpr size_t kReadHeadBytes = kRecordHeaderBytes + kBlockHeaderBytes;
/// "PKSG" and "PKSR" in file order.
inline constexpr uint32_t kSegmentMagic = 0x47534B50u;
inline constexpr uint32_t kRecordMagic = 0x52534B50u;
inline constexpr uint16_t kSegmentFormatVersion = 1;
inline constexpr uint16_t kAlignedSegmentFormatVersion = 2;
inline constexpr uint16_t kPayloadAlignedSegmentFormatVersion = 3;
/// The largest record alignment a version 2 or 3 segment may name.
inline constexpr uint32_t kMaxRecordAlign = uint32_t{1} << 20;

enum class RecordType : uint16_t {
  kBlock = 1,    // a stored block
  kRemoved = 2,  // a block record rewritten in place by remove(): skipped, its body still there
  kSeal = 3,     // the last record of a segment its writer closed cleanly (no body)
};

/// The fields of a record header (the magic, size and CRC are written by encode).
struct RecordHeader {
  RecordType type = RecordType::kBlock;
  StorageKey key;           // zero for a seal
  uint64_t body_bytes = 0;  // a block: kBlockHeaderBytes + block_bytes; a seal: 0
};

/// How a segment lays out its records (read from its header).
struct RecordShape {
  uint32_t align = 1;                    // records start at multiples of this (1: packed)
  uint32_t payload_at = kReadHeadBytes;  // a block's payload, from its record header

  /// From one record to the next: the payload's end rounded up to `align`.
  int64_t stride(int64_t block_bytes) const {
    return (payload_at + block_bytes + align - 1) / align * align;
  }
  /// Where the first record starts.
  int64_t first_record() const {
    return align > 1 ? int64_t{align} : static_cast<int64_t>(kSegmentHeaderBytes);
  }
  /// Version 3's shape, for `align` (a power of two >= 128).
  static RecordShape payload_aligned(uint32_t align) { return RecordShape{align, align}; }
};

/// Writes the 32 segment header bytes for a store of `fingerprint` and `block_bytes`, with
/// records packed (version 1), aligned (version 2) or with aligned payloads (version 3).
void encode_segment_header(uint64_t fingerprint, uint64_t block_bytes, const RecordShape& shape,
                           unsigned char* out);
/// Empty when the 32 bytes at `in` are a segment header of this layout (and sets *shape), else
/// why not.
std::string check_segment_header(const unsigned char* in, uint64_t fingerprint,
                                 uint64_t block_bytes, RecordShape* shape);

/// The seed of a segment's record header CRCs: its id, so that the records a recycled file held
/// in an earlier life (under another id) never read as records of its new one.
uint32_t record_seed(uint64_t segment_id);
/// Writes the 40 record header bytes of `h` to `out`, for a segment whose record_seed is `seed`.
void encode_record_header(const RecordHeader& h, uint32_t seed, unsigned char* out);
/// Decodes the 40 bytes at `in` into *h: empty when magic, size, CRC (with `seed`) and type are
/// valid, else why not (a torn or scribbled record, or one of the file's earlier life).
std::string decode_record_header(const unsigned char* in, uint32_t seed, RecordHeader* h);

}  // namespace pagedkv::detail
