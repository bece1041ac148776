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
// With kCopy, the bytes read are also stored to `out` (one pass over the input).
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42_serial(const unsigned char* p,
                                                               unsigned char* out, size_t n,
                                                               uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // unaligned load without undefined behaviour
    if (kCopy) std::memcpy(out, &v, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    if (kCopy) out += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n > 0) {
    if (kCopy) *out++ = *p;
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  return c;
}

// The crc32 instruction has a latency of three cycles and a throughput of one, so three
// independent streams over adjacent stretches of `kStretch` bytes run about three times as fast;
// their registers are then joined by "appending kStretch zero bytes" to the earlier ones (a
// linear map on the 32-bit register, tabulated per byte of it).
template <size_t kStretch>
struct Shift {
  std::array<std::array<uint32_t, 256>, 4> table{};
  Shift() {
    std::array<uint32_t, 32> basis{};  // the map applied to each single bit
    for (int bit = 0; bit < 32; ++bit) basis[bit] = zeros(1u << bit);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b) {
          if ((v >> b) & 1u) r ^= basis[static_cast<size_t>(8 * k + b)];
        }
        table[static_cast<size_t>(k)][v] = r;
      }
    }
  }
  __attribute__((target("sse4.2"))) static uint32_t zeros(uint32_t c) {
    uint64_t c64 = c;
    for (size_t i = 0; i < kStretch / 8; ++i) c64 = _mm_crc32_u64(c64, 0);
    return static_cast<uint32_t>(c64);
  }
  uint32_t operator()(uint32_t c) const {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
  }
};

template <size_t kStretch, bool kCopy>
__attribute__((target("sse4.2"))) uint32_t three_streams(const unsigned char*& p,
                                                         unsigned char*& out, size_t& n,
                                                         uint32_t c) {
  static const Shift<kStretch> shift;
  while (n >= 3 * kStretch) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStretch; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kStretch + i, 8);
      std::memcpy(&v2, p + 2 * kStretch + i, 8);
      if (kCopy) {
        std::memcpy(out + i, &v0, 8);
        std::memcpy(out + kStretch + i, &v1, 8);
        std::memcpy(out + 2 * kStretch + i, &v2, 8);
      }
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = shift(c) ^ static_cast<uint32_t>(c2);
    p += 3 * kStretch;
    if (kCopy) out += 3 * kStretch;
    n -= 3 * kStretch;
  }
  return c;
}

template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, unsigned char* out,
                                                        size_t n, uint32_t c) {
  c = three_streams<8192, kCopy>(p, out, n, c);
  c = three_streams<256, kCopy>(p, out, n, c);
  return crc32c_sse42_serial<kCopy>(p, out, n, c);
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
  if (cpu_has_sse42()) {
    unsigned char* none = nullptr;
    return ~crc32c_sse42<false>(static_cast<const unsigned char*>(data), none, n, ~crc);
  }
#endif
  return crc32c_portable(data, n, crc);
}

uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc) {
#if PAGEDKV_CRC32C_X86
  if (cpu_has_sse42()) {
    return ~crc32c_sse42<true>(static_cast<const unsigned char*>(src),
                               static_cast<unsigned char*>(dst), n, ~crc);
  }
#endif
  std::memcpy(dst, src, n);
  return crc32c_portable(dst, n, crc);
}

bool crc32c_uses_hardware() {
#if PAGEDKV_CRC32C_X86
  return cpu_has_sse42();
#else
  return false;
#endif
}

}  // namespace pagedkv::detail
