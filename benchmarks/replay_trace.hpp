// The continuous-batching replay trace that pagedkv_bench_replay (KvCache, SeedKvCache) and the
// seed's Rust KvCache (benchmarks/seed_replay) both read, so that the same calls move the same
// bytes on both sides and what they read back can be compared by checksum. seed_replay's main.rs
// implements the K/V values and the checksum below again, in Rust; the two must stay equal.
//
// A trace is text, one op a line:
//   pagedkv-replay-trace 1
//   model <name> <layers> <kv heads> <head dim> <block size> <device blocks>
//   A <id> <n> <token> x n           admit: add the sequence, prefill what is not cached
//   D <n> (<id> <token>) x n         decode step: the running set, one new token each
//   P <id> <layer>                   read one layer packed [heads, length, head dim]
//   B <id> <length>                  roll back to `length` tokens
//   F <id>                           finish
//   T                                timing starts (ops before it are the untimed warm-up)
//
// K/V values: the keys (kv = 0) and values (kv = 1) of position `pos` in `layer`, head `h`,
// dim `d` are a hash of (chain[pos], layer, h, kv) stepped by d, where chain[pos] hashes the
// token ids of positions 0..pos. A real model's K/V at a position depends on the tokens up to
// it, and so does this: a sequence that hits a cached prefix reads the bytes it would have
// written. (A value of the sequence id would not do: the two caches hit different prefixes,
// pagedkv keeping finished sequences' blocks and the seed not.) The bits never form an fp16
// Inf or NaN.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace pagedkv::bench::replay {

inline constexpr uint64_t kGold = 0x9E3779B97F4A7C15ull;
inline constexpr uint64_t kChainStart = 0x5EED;
inline constexpr uint64_t kFnvStart = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnvPrime = 0x100000001b3ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// chain[pos] from chain[pos - 1] (kChainStart before position 0) and the token at pos.
inline uint64_t chain_next(uint64_t prev, uint64_t token, uint64_t pos) {
  return mix64(prev ^ (token * kGold) ^ (pos << 1));
}

/// One token's keys (kv 0) or values (kv 1) in one layer: [heads, head_dim] fp16 bits.
inline void fill_row(uint16_t* out, uint64_t chain, int32_t layer, int32_t heads, int32_t dim,
                     uint64_t kv) {
  for (int32_t h = 0; h < heads; ++h) {
    const uint64_t s = mix64(chain ^ (static_cast<uint64_t>(layer) << 40) ^
                             (static_cast<uint64_t>(h) << 24) ^ (kv + 1));
    for (int32_t d = 0; d < dim; ++d) {
      out[h * dim + d] =
          static_cast<uint16_t>((s + static_cast<uint64_t>(d) * kGold) >> 48) & uint16_t{0xBBFF};
    }
  }
}

inline uint64_t fnv(uint64_t acc, uint64_t word) { return (acc ^ word) * kFnvPrime; }

/// Folds `n` fp16 values (n a multiple of 4) into `acc` as little-endian 64-bit words.
inline uint64_t fnv_halves(uint64_t acc, const uint16_t* data, size_t n) {
  for (size_t i = 0; i + 4 <= n; i += 4) {
    const uint64_t w = uint64_t{data[i]} | uint64_t{data[i + 1]} << 16 |
                       uint64_t{data[i + 2]} << 32 | uint64_t{data[i + 3]} << 48;
    acc = fnv(acc, w);
  }
  return acc;
}

struct Model {
  std::string name;
  int32_t layers = 0, heads = 0, head_dim = 0, block_size = 16;
  int64_t blocks = 0;
};

enum class OpKind : uint8_t { kAdmit = 0, kDecode, kRead, kRollback, kFinish, kTimed };
inline constexpr int kOpKinds = 5;  // the timed kinds
inline const char* const kOpNames[kOpKinds] = {"admit", "decode", "read", "rollback", "finish"};

/// One line of a trace. kAdmit: ids[0], tokens = the prompt; kDecode: ids and tokens, one
/// each; kRead: ids[0], value = layer; kRollback: ids[0], value = length; kFinish: ids[0].
struct Op {
  OpKind kind = OpKind::kTimed;
  std::vector<uint64_t> ids;
  std::vector<int32_t> tokens;
  int64_t value = 0;
};

struct Trace {
  Model model;
  std::vector<Op> ops;
};

/// Reads a trace file; false (with `*error`) when it is not one.
inline bool read_trace(const std::string& path, Trace* trace, std::string* error) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line != "pagedkv-replay-trace 1") {
    *error = path + ": not a replay trace";
    return false;
  }
  std::string word;
  Model& m = trace->model;
  if (!std::getline(in, line) ||
      !(std::istringstream(line) >> word >> m.name >> m.layers >> m.heads >> m.head_dim >>
        m.block_size >> m.blocks) ||
      word != "model") {
    *error = path + ": bad model line";
    return false;
  }
  while (std::getline(in, line)) {
    std::istringstream s(line);
    char c = 0;
    if (!(s >> c)) continue;
    Op op;
    size_t n = 0;
    uint64_t id = 0;
    int32_t token = 0;
    bool ok = true;
    switch (c) {
      case 'T':
        op.kind = OpKind::kTimed;
        break;
      case 'A':
        op.kind = OpKind::kAdmit;
        ok = static_cast<bool>(s >> id >> n);
        op.ids.push_back(id);
        for (size_t i = 0; ok && i < n; ++i) {
          ok = static_cast<bool>(s >> token);
          op.tokens.push_back(token);
        }
        break;
      case 'D':
        op.kind = OpKind::kDecode;
        ok = static_cast<bool>(s >> n);
        for (size_t i = 0; ok && i < n; ++i) {
          ok = static_cast<bool>(s >> id >> token);
          op.ids.push_back(id);
          op.tokens.push_back(token);
        }
        break;
      case 'P':
      case 'B':
        op.kind = c == 'P' ? OpKind::kRead : OpKind::kRollback;
        ok = static_cast<bool>(s >> id >> op.value);
        op.ids.push_back(id);
        break;
      case 'F':
        op.kind = OpKind::kFinish;
        ok = static_cast<bool>(s >> id);
        op.ids.push_back(id);
        break;
      default:
        ok = false;
    }
    if (!ok) {
      *error = path + ": bad line: " + line.substr(0, 60);
      return false;
    }
    trace->ops.push_back(std::move(op));
  }
  return true;
}

}  // namespace pagedkv::bench::replay
