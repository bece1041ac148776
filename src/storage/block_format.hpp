// The bytes of one stored block, shared by the file and Redis stores (docs/storage.md): a 48-byte
// little-endian header naming the layout fingerprint, the key and the payload's length and
// CRC-32C, followed by the payload (the block's bytes). Also the layout checks and key names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pagedkv/storage_tier.hpp"

namespace pagedkv::detail {

/// The little-endian integers of the stored formats (block headers, segment records).
inline void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline constexpr size_t kBlockHeaderBytes = 48;
/// "PKVS" in file order.
inline constexpr uint32_t kBlockMagic = 0x53564B50u;
inline constexpr uint16_t kBlockFormatVersion = 1;

/// The fields of a block header (the checksums are computed by encode / checked by decode).
struct BlockHeader {
  uint64_t fingerprint = 0;
  StorageKey key;
  uint64_t payload_bytes = 0;
  uint32_t payload_crc = 0;
};

/// Writes the 48 header bytes of `h` (with the header's own CRC) to `out`.
void encode_block_header(const BlockHeader& h, unsigned char* out);

/// Checks the 48 header bytes at `in`: magic, version, header CRC, and that they name
/// `fingerprint`, `key` and `payload_bytes`. Returns an empty string when they do (and sets
/// *payload_crc), else why not.
std::string check_block_header(const unsigned char* in, uint64_t fingerprint, const StorageKey& key,
                               uint64_t payload_bytes, uint32_t* payload_crc);

/// Checks a whole stored block (header then payload, `n` bytes): the header as above and the
/// payload's CRC. Returns an empty string when it is valid, else why not.
std::string check_stored_block(const unsigned char* data, size_t n, uint64_t fingerprint,
                               const StorageKey& key, uint64_t payload_bytes);

/// `v` as 16 lower-case hex digits.
std::string hex16(uint64_t v);

/// Ok, or kInvalidArgument naming the first bad field of `layout` (positive shape, known dtype and
/// page layout, block_bytes equal to the shape's).
Status validate_storage_layout(const StorageLayout& layout);

/// The fingerprint's hash: 64-bit FNV-1a.
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace pagedkv::detail
