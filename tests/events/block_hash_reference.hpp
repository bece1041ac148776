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

inline uint64_t ref_block_hash(uint64_t parent, const std::vector<int32_t>& tokens) {
  uint64_t h = parent;
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    h = ref_mix(h ^ ((uint64_t{static_cast<uint32_t>(tokens[i])} << 32) |
                     static_cast<uint32_t>(tokens[i + 1])));
  }
  if (i < tokens.size()) h = ref_mix(h ^ static_cast<uint32_t>(tokens[i]) ^ 0xa5a5000000000000ull);
  return ref_mix(h + tokens.size());
}

}  // namespace pagedkv::testing
