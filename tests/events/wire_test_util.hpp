// Bytes as hex, both ways, for the golden wire tests (encoder_golden_test.cpp,
// group_events_test.cpp): a golden message reads as the msgpack spec writes it.
#pragma once

#include <string>

namespace pagedkv::testing {

// Bytes from hex ("a4 0f ..."; spaces are ignored).
inline std::string H(const char* hex) {
  std::string out;
  int nibbles = 0;
  unsigned v = 0;
  for (const char* p = hex; *p; ++p) {
    if (*p == ' ') continue;
    v = v * 16 + static_cast<unsigned>(*p <= '9' ? *p - '0' : *p - 'a' + 10);
    if (++nibbles == 2) {
      out.push_back(static_cast<char>(v));
      nibbles = 0;
      v = 0;
    }
  }
  return out;
}

// Hex of bytes, a space after each byte (a failed comparison shows where they differ).
inline std::string hex_of(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += d[c >> 4];
    s += d[c & 15];
    s += ' ';
  }
  return s;
}

}  // namespace pagedkv::testing
