// The chained block hash as docs/events.md states it, written again here so the tests never take
// an expected hash from the code under test.
#pragma once

#include <cstdint>
#include <vector>

namespace pagedkv::testing {

inline uint64_t ref_mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// "pagedkv0" in ASCII, xored with the namespace id.
inline uint64_t ref_root_hash(uint64_t ns) { return ref_mix(ns ^ 0x70616765646b7630ull); }

// The 128-bit product of x and wyhash's wyp0, its halves xored; written with 32-bit partial
// products so that it does not share the code under test's unsigned __int128.
inline uint64_t ref_fold(uint64_t x) {
  const uint64_t m = 0xa0761d6478bd642full;
  const uint64_t x0 = x & 0xffffffffu, x1 = x >> 32, m0 = m & 0xffffffffu, m1 = m >> 32;
  const uint64_t p00 = x0 * m0, p01 = x0 * m1, p10 = x1 * m0, p11 = x1 * m1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  const uint64_t lo = (p00 & 0xffffffffu) | (mid << 32);
  const uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
  return lo ^ hi;
}

inline uint64_t ref_block_hash(uint64_t parent, const std::vector<int32_t>& tokens) {
  // Word j holds tokens 2j (low half) and 2j + 1 (high half; 0 past the end of an odd block).
  uint64_t digest = 0;
  for (size_t j = 0; 2 * j < tokens.size(); ++j) {
    const uint64_t lo = static_cast<uint32_t>(tokens[2 * j]);
    const uint64_t hi = 2 * j + 1 < tokens.size() ? static_cast<uint32_t>(tokens[2 * j + 1]) : 0;
    digest += ref_fold((lo | hi << 32) + (j + 1) * 0x9e3779b97f4a7c15ull);
  }
  return ref_mix(parent ^ (digest + tokens.size()));
}

// The chained hashes of a prompt's full blocks of `block_size` tokens in namespace 0.
inline std::vector<uint64_t> ref_prompt_hashes(const std::vector<int32_t>& prompt,
                                               size_t block_size) {
  std::vector<uint64_t> out;
  uint64_t parent = ref_root_hash(0);
  for (size_t b = 0; b + block_size <= prompt.size(); b += block_size) {
    parent = ref_block_hash(
        parent, std::vector<int32_t>(prompt.begin() + b, prompt.begin() + b + block_size));
    out.push_back(parent);
  }
  return out;
}

}  // namespace pagedkv::testing
