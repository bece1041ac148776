// build_indptr, the device view's accessors (block-table and CSR forms, FlashInfer / vLLM
// argument helpers) and the reference decode attention body run through a backend.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.hpp"
#include "kernels/decode_attention.hpp"
#include "pagedkv/device/paged_view.cuh"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

template <typename Tag>
class IndptrViewTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(IndptrViewTest, AllBackends, BackendName);

TYPED_TEST(IndptrViewTest, BuildIndptrIsTheExclusivePrefixSum) {
  Backend& be = this->backend();
  for (int32_t n : {0, 1, 7, 513}) {
    SCOPED_TRACE(n);
    std::vector<int32_t> lens(static_cast<size_t>(n));
    std::mt19937 rng(n);
    for (auto& l : lens) l = int32_t(rng() % 300);
    std::vector<int32_t> want = {0};
    for (int32_t l : lens) want.push_back(want.back() + l);
    auto scratch_bytes = build_indptr_scratch_bytes(be, n);
    ASSERT_OK(scratch_bytes);
    DeviceBuffer dlens(be, lens.size() * 4), dout(be, want.size() * 4),
        dscratch(be, *scratch_bytes + 1);
    if (n > 0) dlens.upload(lens);
    dout.upload(std::vector<int32_t>(want.size(), -77));
    for (auto shape : all_launch_shapes()) {
      LaunchShapeGuard guard(shape);
      BuildIndptrArgs a;
      a.seq_lens = static_cast<const int32_t*>(dlens.data());
      a.indptr = static_cast<int32_t*>(dout.data());
      a.batch_size = n;
      a.scratch = dscratch.data();
      a.scratch_bytes = *scratch_bytes;
      ASSERT_OK(build_indptr(be, a));
      EXPECT_EQ(dout.download<int32_t>(), want);
    }
  }
  BuildIndptrArgs bad;
  bad.batch_size = 3;
  bad.indptr = nullptr;
  const Status st = build_indptr(be, bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("indptr"), std::string::npos);
}

TEST(PagedViewTest, AccessorsMatchTheIndependentFormulaInBothForms) {
  for (PageLayout pl : {PageLayout::kNHD, PageLayout::kHND}) {
    Shape s;
    s.layers = 3;
    s.heads = 3;
    s.head_dim = 80;
    s.block_size = 16;
    s.page_layout = pl;
    s.num_blocks = 12;
    // Two sequences: 20 tokens in blocks {4, 9}, 33 in {1, 11, 0}.
    const std::vector<int32_t> tables = {4, 9, -1, 1, 11, 0}, seq_lens = {20, 33};
    const std::vector<int32_t> indptr = {0, 2, 5}, indices = {4, 9, 1, 11, 0}, last = {4, 1};
    std::vector<uint8_t> pool(size_t(s.pool_elems()) * 2);
    auto bt = device::make_block_table_view(pool.data(), s.layout(), DType::kFloat16, s.num_blocks,
                                            tables.data(), 3, seq_lens.data(), 2);
    auto csr = device::make_csr_view(pool.data(), s.layout(), DType::kFloat16, s.num_blocks,
                                     indptr.data(), indices.data(), last.data(), 2);
    for (int seq = 0; seq < 2; ++seq) {
      EXPECT_EQ(bt.seq_len(seq), seq_lens[size_t(seq)]);
      EXPECT_EQ(csr.seq_len(seq), seq_lens[size_t(seq)]);
      for (int64_t pos = 0; pos < seq_lens[size_t(seq)]; pos += 3)
        for (int layer = 0; layer < 3; ++layer)
          for (int h = 0; h < 3; ++h)
            for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
              const int64_t want = ref_index(s, tables[size_t(seq * 3 + pos / 16)], layer,
                                             int(part), pos % 16, h, 0);
              ASSERT_EQ(bt.offset(seq, layer, part, h, pos), want);
              ASSERT_EQ(csr.offset(seq, layer, part, h, pos), want);
              ASSERT_EQ(static_cast<char*>(csr.address(seq, layer, part, h, pos)) -
                            reinterpret_cast<char*>(pool.data()),
                        want * 2);
            }
    }
    // FlashInfer / vLLM argument shapes address the same elements.
    const auto fi = device::flashinfer_args(csr, 2);
    const auto vl = device::vllm_args(bt, 2);
    const int64_t pos = 17, h = 2, block = 9;
    const int64_t want = ref_index(s, block, 2, 1, pos % 16, int(h), 0);
    EXPECT_EQ((static_cast<char*>(fi.v_data) - reinterpret_cast<char*>(pool.data())) / 2 +
                  block * fi.stride_page + (pos % 16) * fi.stride_n + h * fi.stride_h,
              want);
    EXPECT_EQ((static_cast<char*>(vl.value_cache) - reinterpret_cast<char*>(pool.data())) / 2 +
                  block * vl.block_stride + (pos % 16) * vl.token_stride + h * vl.head_stride,
              want);
  }
}

TYPED_TEST(IndptrViewTest, DecodeAttentionBodyMatchesDoubleReference) {
  Backend& be = this->backend();
  Shape s;
  s.layers = 2;
  s.heads = 2;
  s.head_dim = 64;
  s.block_size = 8;
  s.page_layout = PageLayout::kHND;
  s.num_blocks = 8;
  s.dtype = DType::kFloat8E4M3;
  const int q_heads = 4;
  const std::vector<int32_t> tables = {3, 6, 1, 0}, lens = {13, 5};  // max 2 blocks per seq
  auto pool = random_values(s.pool_elems(), s.dtype, 3);
  const std::vector<float> scales = {0.5f, 0.25f, 0.125f, 2.0f};  // per (layer, head)
  auto q = random_values(2 * q_heads * 64, DType::kFloat32, 4);
  DeviceBuffer dpool(be, pool.size()), dt(be, 16), dl(be, 8), ds(be, 16), dq(be, q.size()),
      dout(be, size_t(2 * q_heads * 64 * 4));
  dpool.upload(pool);
  dt.upload(tables);
  dl.upload(lens);
  ds.upload(scales);
  dq.upload(q);
  kernels::DecodeAttentionBody body;
  body.view = device::make_block_table_view(
      dpool.data(), s.layout(), s.dtype, s.num_blocks, static_cast<const int32_t*>(dt.data()), 2,
      static_cast<const int32_t*>(dl.data()), 2,
      KvScales{static_cast<const float*>(ds.data()), static_cast<const float*>(ds.data()),
               ScaleGranularity::kPerHead});
  body.q = dq.data();
  body.q_dtype = DType::kFloat32;
  body.out = static_cast<float*>(dout.data());
  body.num_q_heads = q_heads;
  body.layer = 1;
  body.sm_scale = 0.125f;
  KernelLaunch launch{KernelId::kDecodeAttention, &body, sizeof(body), 2 * q_heads};
  ASSERT_OK(be.launch(launch, Stream{}));
  auto got = dout.download<float>();
  const float* qf = reinterpret_cast<const float*>(q.data());
  for (int seq = 0; seq < 2; ++seq)
    for (int qh = 0; qh < q_heads; ++qh) {
      const int kvh = qh / 2;
      const double sc = scales[size_t(2 + kvh)];
      auto kv = [&](int part, int64_t p, int d) {
        const int64_t i = ref_index(s, tables[size_t(seq * 2 + p / 8)], 1, part, p % 8, kvh, d);
        return double(fp8_e4m3_bits_to_float(pool[size_t(i)])) * sc;
      };
      std::vector<double> w(static_cast<size_t>(lens[size_t(seq)]));
      double mx = -1e300, den = 0;
      for (int64_t p = 0; p < lens[size_t(seq)]; ++p) {
        double dot = 0;
        for (int d = 0; d < 64; ++d) dot += double(qf[(seq * q_heads + qh) * 64 + d]) * kv(0, p, d);
        w[size_t(p)] = dot * 0.125;
        mx = std::max(mx, w[size_t(p)]);
      }
      for (auto& x : w) den += (x = std::exp(x - mx));
      for (int d = 0; d < 64; ++d) {
        double o = 0;
        for (int64_t p = 0; p < lens[size_t(seq)]; ++p) o += w[size_t(p)] * kv(1, p, d);
        EXPECT_NEAR(got[size_t((seq * q_heads + qh) * 64 + d)], o / den, 1e-4);
      }
    }
}

}  // namespace
}  // namespace pagedkv::testing
