#include "storage/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define PAGEDKV_CRC32C_X86 1
#else
#define PAGEDKV_CRC32C_X86 0
#endif

namespace pagedkv::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

// table[k][b]: the CRC of byte b followed by k zero bytes (slice-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

const Tables& tables() {
  static const Tables t = [] {
    Tables r{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) != 0 ? kPolynomial : 0u);
      r[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (size_t k = 1; k < 8; ++k) r[k][b] = (r[k - 1][b] >> 8) ^ r[0][r[k - 1][b] & 0xFFu];
    }
    return r;
  }();
  return t;
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

#if PAGEDKV_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t n,
                                                        uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // unaligned load without undefined behaviour
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n > 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  return c;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2") != 0;
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  const Tables& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    const uint64_t v = load_le64(p) ^ c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^
        t[0][(v >> 56) & 0xFF];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
    --n;
  }
  return ~c;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if PAGEDKV_CRC32C_X86
  if (cpu_has_sse42()) return ~crc32c_sse42(static_cast<const unsigned char*>(data), n, ~crc);
#endif
  return crc32c_portable(data, n, crc);
}

bool crc32c_uses_hardware() {
#if PAGEDKV_CRC32C_X86
  return cpu_has_sse42();
#else
  return false;
#endif
}

}  // namespace pagedkv::detail
