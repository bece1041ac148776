// The CUDA backend produces the CPU backend's bytes for every op (skips without a device).
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

/// Runs `op` on a backend against fresh copies of the inputs; returns the pool and output bytes.
struct CrossRun {
  std::vector<uint8_t> pool, out;
};

CrossRun run_all_ops(Backend& be, const Shape& s, DType in_dtype) {
  const int tokens = 29;
  const int64_t row = int64_t{s.heads} * s.head_dim;
  auto key = random_values(tokens * row, in_dtype, 1),
       value = random_values(tokens * row, in_dtype, 2);
  std::vector<int64_t> slots;
  auto blocks = shuffled_blocks(s.num_blocks, 4, 3);
  for (int t = 0; t < tokens; ++t)
    slots.push_back(
        t % 5 == 4 ? -1 : blocks[size_t(t / s.block_size)] * s.block_size + t % s.block_size);
  std::vector<float> scales(size_t(s.layers * s.heads), 0.03f);
  const std::vector<int32_t> pairs = {blocks[0], blocks[3] == 0 ? 1 : 0};
  DeviceBuffer dpool(be, size_t(s.pool_elems()) * s.esize()), dk(be, key.size()),
      dv(be, value.size()), ds(be, slots.size() * 8), dsc(be, scales.size() * 4), dt(be, 16),
      dp(be, 8), dout(be, size_t(tokens * row * 4) * 2);
  dpool.upload(random_bytes(dpool.bytes(), 4));
  dk.upload(key);
  dv.upload(value);
  ds.upload(slots);
  dsc.upload(scales);
  dt.upload(blocks);
  dp.upload(pairs);
  dout.upload(std::vector<uint8_t>(dout.bytes(), 0xAB));
  PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
  const bool fp8 = s.dtype == DType::kFloat8E4M3;
  KvScales sc{static_cast<const float*>(dsc.data()), static_cast<const float*>(dsc.data()),
              fp8 ? ScaleGranularity::kPerHead : ScaleGranularity::kNone};
  WriteKvArgs w;
  w.key = dk.data();
  w.value = dv.data();
  w.input_dtype = in_dtype;
  w.num_tokens = tokens;
  w.slot_mapping = static_cast<const int64_t*>(ds.data());
  w.layer = 1;
  w.scales = sc;
  EXPECT_OK(write_kv(be, pool, w));
  CopyBlocksArgs cb;
  cb.pairs = dp.data();
  cb.num_pairs = 1;
  EXPECT_OK(copy_blocks(be, pool, cb));
  PackedLayerArgs g;
  g.key = dout.data();
  g.value = static_cast<char*>(dout.data()) + dout.bytes() / 2;
  g.packed_dtype = DType::kFloat32;
  g.block_table = static_cast<const int32_t*>(dt.data());
  g.block_table_len = 4;
  g.layer = 1;
  g.num_tokens = tokens;
  g.scales = sc;
  EXPECT_OK(gather_layer(be, pool, g));
  return {dpool.download<uint8_t>(), dout.download<uint8_t>()};
}

TEST(CudaCrossCheckTest, CudaMatchesCpuBitForBit) {
  if (!cuda_device_available()) {
    if (cuda_required()) FAIL() << kCudaRequiredMessage;
    GTEST_SKIP() << "no CUDA device: cross-check skipped";
  }
  auto cpu = create_backend(BackendKind::kCpu);
  auto gpu = create_backend(BackendKind::kCuda);
  ASSERT_OK(cpu);
  ASSERT_OK(gpu);
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3}) {
    for (PageLayout pl : {PageLayout::kNHD, PageLayout::kHND}) {
      Shape s{2, 3, 80, 8, pl, 8, t};
      SCOPED_TRACE(s.describe());
      const DType in = t == DType::kFloat8E4M3 ? DType::kBFloat16 : t;
      const CrossRun a = run_all_ops(**cpu, s, in);
      const CrossRun b = run_all_ops(**gpu, s, in);
      EXPECT_TRUE(bytes_equal(a.pool, b.pool));
      EXPECT_TRUE(bytes_equal(a.out, b.out));
    }
  }
}

}  // namespace
}  // namespace pagedkv::testing
