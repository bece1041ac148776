// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every stored block:
// the SSE4.2 crc32 instruction where the CPU has it, a slice-by-8 table otherwise. Both give the
// same value; the tests check each against the published check value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv::detail {

/// The CRC-32C of `n` bytes, continuing `crc` (the CRC of the bytes before them; 0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
/// Copies `n` bytes from `src` to `dst` (not overlapping) and returns their CRC-32C, continuing
/// `crc`, in one pass over the bytes.
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);
/// The same, always with the portable table code.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
/// Whether crc32c() uses the CPU's crc32 instruction.
bool crc32c_uses_hardware();

}  // namespace pagedkv::detail
