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
