// The FileTier's segment files (docs/storage.md): a 32-byte segment header naming the layout, then
// records appended one after another. A record is a 40-byte record header followed by its body;
// a block record's body is the stored block format (block_format.hpp), so a block reads the same
// from a segment as from Redis. Little-endian, every header with its own CRC-32C.
// Version 1 packs the records. Version 2 (written for O_DIRECT, FileTierOptions::direct_io)
// aligns them: the header names an alignment A, the first record starts at A and each record is
// zero-padded to a multiple of A, so that every append is whole aligned blocks. A seal is not
// padded (it ends the file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pagedkv/storage_tier.hpp"

namespace pagedkv::detail {

inline constexpr size_t kSegmentHeaderBytes = 32;
inline constexpr size_t kRecordHeaderBytes = 40;
/// "PKSG" and "PKSR" in file order.
inline constexpr uint32_t kSegmentMagic = 0x47534B50u;
inline constexpr uint32_t kRecordMagic = 0x52534B50u;
inline constexpr uint16_t kSegmentFormatVersion = 1;
inline constexpr uint16_t kAlignedSegmentFormatVersion = 2;
/// The largest record alignment a version 2 segment may name.
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

/// Writes the 32 segment header bytes for a store of `fingerprint` and `block_bytes`, with
/// records packed (`align` 1: version 1) or aligned to `align` bytes (a power of two: version 2).
void encode_segment_header(uint64_t fingerprint, uint64_t block_bytes, uint32_t align,
                           unsigned char* out);
/// Empty when the 32 bytes at `in` are a segment header of this layout (and sets *align: 1 for
/// packed records), else why not.
std::string check_segment_header(const unsigned char* in, uint64_t fingerprint,
                                 uint64_t block_bytes, uint32_t* align);
/// Where the first record of a segment of records aligned to `align` starts.
inline int64_t first_record_offset(uint32_t align) {
  return align > 1 ? int64_t{align} : static_cast<int64_t>(kSegmentHeaderBytes);
}
/// From one record to the next: `record_bytes` (header and body) rounded up to `align`.
inline int64_t record_stride(int64_t record_bytes, uint32_t align) {
  return (record_bytes + align - 1) / align * align;
}

/// The seed of a segment's record header CRCs: its id, so that the records a recycled file held
/// in an earlier life (under another id) never read as records of its new one.
uint32_t record_seed(uint64_t segment_id);
/// Writes the 40 record header bytes of `h` to `out`, for a segment whose record_seed is `seed`.
void encode_record_header(const RecordHeader& h, uint32_t seed, unsigned char* out);
/// Decodes the 40 bytes at `in` into *h: empty when magic, size, CRC (with `seed`) and type are
/// valid, else why not (a torn or scribbled record, or one of the file's earlier life).
std::string decode_record_header(const unsigned char* in, uint32_t seed, RecordHeader* h);

}  // namespace pagedkv::detail
