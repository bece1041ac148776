#include "storage/segment_format.hpp"

#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"

namespace pagedkv::detail {
namespace {

constexpr size_t kSegmentCrcOffset = kSegmentHeaderBytes - 4;
constexpr size_t kRecordCrcOffset = kRecordHeaderBytes - 4;

}  // namespace

void encode_segment_header(uint64_t fingerprint, uint64_t block_bytes, const RecordShape& shape,
                           unsigned char* out) {
  const bool aligned = shape.align > 1;
  const uint16_t version = !aligned ? kSegmentFormatVersion
                           : shape.payload_at == kReadHeadBytes
                               ? kAlignedSegmentFormatVersion
                               : kPayloadAlignedSegmentFormatVersion;
  put_le(out + 0, kSegmentMagic, 4);
  put_le(out + 4, version, 2);
  put_le(out + 6, kSegmentHeaderBytes, 2);
  put_le(out + 8, fingerprint, 8);
  put_le(out + 16, block_bytes, 8);
  put_le(out + 24, aligned ? shape.align : 0, 4);
  put_le(out + kSegmentCrcOffset, crc32c(out, kSegmentCrcOffset), 4);
}

std::string check_segment_header(const unsigned char* in, uint64_t fingerprint,
                                 uint64_t block_bytes, RecordShape* shape) {
  if (get_le(in, 4) != kSegmentMagic) return "bad segment magic";
  if (get_le(in + kSegmentCrcOffset, 4) != crc32c(in, kSegmentCrcOffset)) {
    return "segment header checksum mismatch";
  }
  const uint64_t version = get_le(in + 4, 2);
  if (version == kSegmentFormatVersion) {
    *shape = RecordShape{};
  } else if (version == kAlignedSegmentFormatVersion ||
             version == kPayloadAlignedSegmentFormatVersion) {
    const uint64_t a = get_le(in + 24, 4);
    // At least the header, so that the first record never overlaps it; and in version 3 more
    // than a record's two headers, which its first unit holds.
    const uint64_t least =
        version == kAlignedSegmentFormatVersion ? kSegmentHeaderBytes : kReadHeadBytes;
    if (a < least || a > kMaxRecordAlign || (a & (a - 1)) != 0) {
      return "bad record alignment " + std::to_string(a);
    }
    const auto align = static_cast<uint32_t>(a);
    *shape = version == kAlignedSegmentFormatVersion ? RecordShape{align, kReadHeadBytes}
                                                     : RecordShape::payload_aligned(align);
  } else {
    return "unknown segment format version";
  }
  if (get_le(in + 6, 2) != kSegmentHeaderBytes) return "bad segment header size";
  if (get_le(in + 8, 8) != fingerprint) return "layout fingerprint differs";
  if (get_le(in + 16, 8) != block_bytes) return "block size differs";
  return {};
}

uint32_t record_seed(uint64_t segment_id) {
  return static_cast<uint32_t>(segment_id ^ (segment_id >> 32));
}

void encode_record_header(const RecordHeader& h, uint32_t seed, unsigned char* out) {
  put_le(out + 0, kRecordMagic, 4);
  put_le(out + 4, static_cast<uint16_t>(h.type), 2);
  put_le(out + 6, kRecordHeaderBytes, 2);
  put_le(out + 8, h.key.ns, 8);
  put_le(out + 16, h.key.block_hash, 8);
  put_le(out + 24, h.body_bytes, 8);
  put_le(out + kRecordCrcOffset, crc32c(out, kRecordCrcOffset, seed), 4);
}

std::string decode_record_header(const unsigned char* in, uint32_t seed, RecordHeader* h) {
  if (get_le(in, 4) != kRecordMagic) return "bad record magic";
  if (get_le(in + kRecordCrcOffset, 4) != crc32c(in, kRecordCrcOffset, seed)) {
    return "record header checksum mismatch";
  }
  if (get_le(in + 6, 2) != kRecordHeaderBytes) return "bad record header size";
  const uint64_t type = get_le(in + 4, 2);
  if (type < static_cast<uint64_t>(RecordType::kBlock) ||
      type > static_cast<uint64_t>(RecordType::kSeal)) {
    return "unknown record type " + std::to_string(type);
  }
  h->type = static_cast<RecordType>(type);
  h->key.ns = get_le(in + 8, 8);
  h->key.block_hash = get_le(in + 16, 8);
  h->body_bytes = get_le(in + 24, 8);
  return {};
}

}  // namespace pagedkv::detail
