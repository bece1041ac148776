// Helpers of the data-plane tests: an independent pool index formula, random data, byte-level
// element conversion through the (separately tested) dtype.hpp functions, and the launch-shape
// guard that runs the GPU's one-vector-per-index shape on the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/launch_shape.hpp"
#include "pagedkv/ops.hpp"
#include "support/backend_test.hpp"

namespace pagedkv::testing {

/// The model shape of a test pool.
struct Shape {
  int32_t layers = 2;
  int32_t heads = 4;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  PageLayout page_layout = PageLayout::kNHD;
  int64_t num_blocks = 8;
  DType dtype = DType::kFloat16;

  PoolLayout layout() const {
    PoolLayout l;
    l.num_layers = layers;
    l.num_kv_heads = heads;
    l.head_dim = head_dim;
    l.block_size = block_size;
    l.page_layout = page_layout;
    return l;
  }
  int64_t pool_elems() const {
    return num_blocks * layers * 2 * int64_t{block_size} * heads * head_dim;
  }
  size_t esize() const { return dtype_size(dtype); }
  std::string describe() const {
    return std::string(dtype_name(dtype)) + (page_layout == PageLayout::kNHD ? " NHD" : " HND") +
           " layers=" + std::to_string(layers) + " heads=" + std::to_string(heads) +
           " dim=" + std::to_string(head_dim) + " bs=" + std::to_string(block_size);
  }
};

/// Element index of (block, layer, part, pos, head, d), written from the layout description in
/// DESIGN.md and not from PoolLayout.
inline int64_t ref_index(const Shape& s, int64_t block, int layer, int part, int64_t pos, int head,
                         int d) {
  const int64_t page = int64_t{s.block_size} * s.heads * s.head_dim;
  const int64_t page_base = ((block * s.layers + layer) * 2 + part) * page;
  if (s.page_layout == PageLayout::kNHD) {
    return page_base + (pos * s.heads + head) * s.head_dim + d;
  }
  return page_base + (int64_t{head} * s.block_size + pos) * s.head_dim + d;
}

/// Random bytes (the poison of a pool before a write op).
inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

/// Random finite non-zero values of magnitude in [0.05, 2] stored as `t`.
inline std::vector<uint8_t> random_values(int64_t n, DType t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(0.05f, 2.0f);
  std::vector<uint8_t> v(static_cast<size_t>(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const float x = (rng() & 1) ? mag(rng) : -mag(rng);
    store_from_float(v.data(), t, i, x);
  }
  return v;
}

/// Copies one element from (src, st, si) to (dst, dt, di): raw bytes when the types match and no
/// scale applies, else through float (x / scale into an fp8 pool, x * scale out of it).
inline void ref_move(void* dst, DType dt, int64_t di, const void* src, DType st, int64_t si,
                     float scale, bool divide, bool scaled) {
  if (dt == st && !scaled) {
    const size_t es = dtype_size(dt);
    std::memcpy(static_cast<char*>(dst) + di * es, static_cast<const char*>(src) + si * es, es);
    return;
  }
  const float x = load_as_float(src, st, si);
  store_from_float(dst, dt, di, divide ? x / scale : x * scale);
}

/// Random positive scales for an fp8 pool: per layer or per (layer, head).
inline std::vector<float> random_scales(const Shape& s, ScaleGranularity g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.004f, 0.05f);
  const size_t n = g == ScaleGranularity::kPerHead ? size_t(s.layers) * s.heads : size_t(s.layers);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline float scale_of(const std::vector<float>& scales, ScaleGranularity g, const Shape& s,
                      int layer, int head) {
  if (g == ScaleGranularity::kNone) return 1.0f;
  return g == ScaleGranularity::kPerLayer ? scales[layer] : scales[size_t(layer) * s.heads + head];
}

/// `n` distinct physical blocks in a shuffled (non-contiguous) order.
inline std::vector<int32_t> shuffled_blocks(int64_t num_blocks, int64_t n, uint32_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(num_blocks));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(static_cast<size_t>(n));
  return all;
}

/// A launch shape the op tests run: the shape and the resident threads the narrow shape sizes
/// its lanes by (ops_detail::set_launch_shape_for_testing).
struct TestShape {
  ops_detail::LaunchShape shape;
  int64_t resident_threads;
  const char* name;
};

/// Runs the ops with one launch shape for its lifetime.
class LaunchShapeGuard {
 public:
  explicit LaunchShapeGuard(const TestShape& s) {
    ops_detail::set_launch_shape_for_testing(s.shape, s.resident_threads);
  }
  ~LaunchShapeGuard() { ops_detail::set_launch_shape_for_testing(ops_detail::LaunchShape::kAuto); }
};

/// The shapes every op test runs: the CPU's (a whole row per index), the GPU's with rows that
/// fill the device (a warp per row at most: 1 resident thread never lets a row grow past it) and
/// the GPU's with few rows (whole warps per row, up to one lane per chunk).
inline std::vector<TestShape> all_launch_shapes() {
  return {{ops_detail::LaunchShape::kWide, 0, "wide"},
          {ops_detail::LaunchShape::kNarrow, 1, "narrow, many rows"},
          {ops_detail::LaunchShape::kNarrow, int64_t{1} << 40, "narrow, few rows"}};
}

inline const char* shape_name(const TestShape& s) { return s.name; }

/// Bytes equal, reporting the first difference by index.
inline ::testing::AssertionResult bytes_equal(const std::vector<uint8_t>& want,
                                              const std::vector<uint8_t>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure()
             << "byte " << i << " differs: want " << int(want[i]) << " got " << int(got[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace pagedkv::testing
