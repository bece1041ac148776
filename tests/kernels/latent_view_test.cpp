// The device view of a latent (MLA) pool: the latent vector of a token, and FlashInfer's MLA
// form (`ckv` and `kpe` as two slices of one page) address exactly the elements the layout
// description puts them at; the K/V argument shapes give no value pointer; the reference decode
// attention reads a latent pool in the weight-absorbed form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/decode_attention.hpp"
#include "pagedkv/device/paged_view.cuh"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

struct LatentViewCase {
  int32_t layers;
  int32_t head_dim;
  int32_t rope_dim;
  int32_t block_size;
  DType dtype;
};

const LatentViewCase kViewCases[] = {
    {3, 576, 64, 16, DType::kFloat16},
    {2, 37, 5, 3, DType::kBFloat16},
    {1, 37, 5, 1, DType::kFloat32},
    {4, 576, 64, 64, DType::kFloat8E4M3},
};

CacheConfig latent_config(const LatentViewCase& c) {
  CacheConfig cfg;
  cfg.kv_kind = KvKind::kLatent;
  cfg.num_kv_heads = 1;
  cfg.num_layers = c.layers;
  cfg.head_dim = c.head_dim;
  cfg.rope_dim = c.rope_dim;
  cfg.block_size = c.block_size;
  cfg.dtype = c.dtype;
  cfg.num_device_blocks = 6;
  return cfg;
}

/// Element index of dim `d` of the latent of (block, layer, pos): [blocks][layers][bs][dim].
int64_t latent_index(const LatentViewCase& c, int64_t block, int layer, int64_t pos, int d) {
  return ((block * c.layers + layer) * c.block_size + pos) * c.head_dim + d;
}

// Two sequences in CSR form over shuffled pages: 2 pages (last holding `bs` tokens) and 3 pages
// (last holding one).
struct Csr {
  std::vector<int32_t> indptr = {0, 2, 5};
  std::vector<int32_t> indices = {4, 1, 0, 5, 2};
  std::vector<int32_t> last_page_len;
};

TEST(LatentViewTest, LatentAndKpeOffsetsFollowTheLayoutDescription) {
  for (const auto& c : kViewCases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " dim " + std::to_string(c.head_dim));
    const CacheConfig cfg = latent_config(c);
    ASSERT_OK(cfg.validate());
    const PoolLayout layout = PoolLayout::from_config(cfg);
    EXPECT_TRUE(layout.is_latent());
    EXPECT_EQ(layout.ckv_dim(), c.head_dim - c.rope_dim);
    const int64_t es = int64_t(dtype_size(c.dtype));
    const auto bytes = random_values(cfg.num_device_blocks * layout.block_elems(), c.dtype, 7);
    void* pool = const_cast<uint8_t*>(bytes.data());
    std::vector<float> scales(size_t(c.layers));
    for (int l = 0; l < c.layers; ++l) scales[size_t(l)] = 0.01f * float(l + 1);
    const KvScales kv_scales = c.dtype == DType::kFloat8E4M3
                                   ? KvScales{scales.data(), nullptr, ScaleGranularity::kPerLayer}
                                   // no value scales
                                   : KvScales{};
    Csr csr;
    csr.last_page_len = {c.block_size, 1};
    const auto view =
        device::make_csr_view(pool, layout, c.dtype, cfg.num_device_blocks, csr.indptr.data(),
                              csr.indices.data(), csr.last_page_len.data(), 2, kv_scales);
    // The same sequences as a block table.
    const std::vector<int32_t> tables = {4, 1, -1, 0, 5, 2};
    const std::vector<int32_t> lens = {2 * c.block_size, 2 * c.block_size + 1};
    const auto bt_view = device::make_block_table_view(pool, layout, c.dtype, cfg.num_device_blocks,
                                                       tables.data(), 3, lens.data(), 2, kv_scales);
    for (int32_t s = 0; s < 2; ++s) {
      ASSERT_EQ(view.seq_len(s), lens[size_t(s)]);
      for (int64_t pos = 0; pos < lens[size_t(s)]; ++pos) {
        const int32_t block = csr.indices[size_t(csr.indptr[size_t(s)] + pos / c.block_size)];
        for (int layer = 0; layer < c.layers; ++layer) {
          const int64_t want = latent_index(c, block, layer, pos % c.block_size, 0);
          ASSERT_EQ(view.latent_offset(s, layer, pos), want);
          ASSERT_EQ(bt_view.latent_offset(s, layer, pos), want);
          ASSERT_EQ(view.kpe_offset(s, layer, pos), want + c.head_dim - c.rope_dim);
          ASSERT_EQ(view.latent_address(s, layer, pos), static_cast<char*>(pool) + want * es);
          ASSERT_EQ(view.kpe_address(s, layer, pos),
                    static_cast<char*>(pool) + (want + c.head_dim - c.rope_dim) * es);
          const float sc = c.dtype == DType::kFloat8E4M3 ? scales[size_t(layer)] : 1.0f;
          for (int d = 0; d < c.head_dim; d += 7) {
            ASSERT_EQ(view.load_latent(s, layer, pos, d),
                      load_as_float(bytes.data(), c.dtype, want + d) * sc);
          }
        }
      }
    }
  }
}

TEST(LatentViewTest, FlashInferMlaSlicesAddressCkvAndKpeOfEveryToken) {
  for (const auto& c : kViewCases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " dim " + std::to_string(c.head_dim));
    const CacheConfig cfg = latent_config(c);
    const PoolLayout layout = PoolLayout::from_config(cfg);
    const int64_t es = int64_t(dtype_size(c.dtype));
    std::vector<uint8_t> bytes(size_t(cfg.num_device_blocks * layout.block_elems() * es));
    char* pool = reinterpret_cast<char*>(bytes.data());
    Csr csr;
    csr.last_page_len = {c.block_size, 1};
    const auto view =
        device::make_csr_view(pool, layout, c.dtype, cfg.num_device_blocks, csr.indptr.data(),
                              csr.indices.data(), csr.last_page_len.data(), 2);
    const int32_t ckv = c.head_dim - c.rope_dim;
    for (int layer = 0; layer < c.layers; ++layer) {
      const device::FlashInferMlaPagedArgs a = device::flashinfer_mla_args(view, layer);
      EXPECT_EQ(a.head_dim_ckv, ckv);
      EXPECT_EQ(a.head_dim_kpe, c.rope_dim);
      EXPECT_EQ(a.kpe_offset, ckv);
      EXPECT_EQ(a.page_size, c.block_size);
      EXPECT_EQ(a.batch_size, 2);
      EXPECT_EQ(a.indptr, csr.indptr.data());
      EXPECT_EQ(a.indices, csr.indices.data());
      EXPECT_EQ(a.last_page_len, csr.last_page_len.data());
      // Both slices step by whole blocks between pages and by the latent width between tokens.
      EXPECT_EQ(a.stride_page_ckv, int64_t{c.layers} * c.block_size * c.head_dim);
      EXPECT_EQ(a.stride_page_kpe, a.stride_page_ckv);
      EXPECT_EQ(a.stride_n_ckv, c.head_dim);
      EXPECT_EQ(a.stride_n_kpe, c.head_dim);
      // Every element of every page of the layer, the way an MLA kernel forms its addresses.
      const char* ckv_data = static_cast<const char*>(a.ckv_data);
      const char* kpe_data = static_cast<const char*>(a.kpe_data);
      for (int64_t page = 0; page < cfg.num_device_blocks; ++page)
        for (int64_t n = 0; n < c.block_size; ++n) {
          for (int d = 0; d < ckv; ++d) {
            ASSERT_EQ(ckv_data + (page * a.stride_page_ckv + n * a.stride_n_ckv + d) * es,
                      pool + latent_index(c, page, layer, n, d) * es);
          }
          for (int d = 0; d < c.rope_dim; ++d) {
            ASSERT_EQ(kpe_data + (page * a.stride_page_kpe + n * a.stride_n_kpe + d) * es,
                      pool + latent_index(c, page, layer, n, ckv + d) * es);
          }
        }
    }
    // The K/V argument shapes carry the latent pages as keys and no values.
    const device::FlashInferPagedArgs fi = device::flashinfer_args(view, 1 % c.layers);
    EXPECT_EQ(fi.k_data, device::flashinfer_mla_args(view, 1 % c.layers).ckv_data);
    EXPECT_EQ(fi.v_data, nullptr);
    const std::vector<int32_t> tables = {4, 1}, lens = {c.block_size + 1};
    const auto bt = device::make_block_table_view(pool, layout, c.dtype, cfg.num_device_blocks,
                                                  tables.data(), 2, lens.data(), 1);
    const device::VllmPagedArgs v = device::vllm_args(bt, 0);
    EXPECT_EQ(v.key_cache, pool);
    EXPECT_EQ(v.value_cache, nullptr);
    EXPECT_EQ(v.block_stride, layout.block_elems());
  }
}

TEST(LatentViewTest, KeyValueViewsAreUnchanged) {
  // A K/V pool keeps its value pages right after the keys of each layer.
  CacheConfig cfg;
  cfg.num_layers = 2;
  cfg.num_kv_heads = 3;
  cfg.head_dim = 40;
  cfg.block_size = 4;
  const PoolLayout l = PoolLayout::from_config(cfg);
  EXPECT_FALSE(l.is_latent());
  EXPECT_EQ(l.num_parts, 2);
  EXPECT_EQ(l.layer_stride(), 2 * 4 * 3 * 40);
  std::vector<uint16_t> pool(size_t(l.block_elems()) * 2);
  const std::vector<int32_t> indptr = {0, 1}, indices = {1}, last = {4};
  const auto view = device::make_csr_view(pool.data(), l, DType::kFloat16, 2, indptr.data(),
                                          indices.data(), last.data(), 1);
  const auto fi = device::flashinfer_args(view, 1);
  EXPECT_EQ(fi.k_data, pool.data() + l.layer_stride());
  EXPECT_EQ(fi.v_data, pool.data() + l.layer_stride() + l.page_elems());
}

TEST(LatentViewTest, DecodeAttentionReadsTheLatentInAbsorbedForm) {
  // fp32 pool: scores over the whole latent, output the weighted sum of the ckv parts.
  LatentViewCase c{2, 37, 5, 3, DType::kFloat32};
  const CacheConfig cfg = latent_config(c);
  const PoolLayout layout = PoolLayout::from_config(cfg);
  auto pool = random_values(cfg.num_device_blocks * layout.block_elems(), DType::kFloat32, 3);
  const int32_t q_heads = 4, layer = 1;
  Csr csr;
  csr.last_page_len = {c.block_size, 1};
  const int32_t batch = 2;
  const auto q = random_values(int64_t{batch} * q_heads * c.head_dim, DType::kFloat32, 4);
  std::vector<float> out(size_t(batch) * q_heads * c.head_dim, 123.0f);
  kernels::DecodeAttentionBody body;
  body.view =
      device::make_csr_view(pool.data(), layout, DType::kFloat32, cfg.num_device_blocks,
                            csr.indptr.data(), csr.indices.data(), csr.last_page_len.data(), batch);
  body.q = q.data();
  body.q_dtype = DType::kFloat32;
  body.out = out.data();
  body.num_q_heads = q_heads;
  body.layer = layer;
  body.sm_scale = 0.3f;
  for (int64_t i = 0; i < int64_t{batch} * q_heads; ++i) body(i);

  const float* pf = reinterpret_cast<const float*>(pool.data());
  const float* qf = reinterpret_cast<const float*>(q.data());
  const int32_t ckv = c.head_dim - c.rope_dim;
  for (int32_t s = 0; s < batch; ++s) {
    const int64_t len = s == 0 ? 2 * c.block_size : 2 * c.block_size + 1;
    for (int32_t h = 0; h < q_heads; ++h) {
      const float* qv = qf + (int64_t{s} * q_heads + h) * c.head_dim;
      std::vector<double> scores(static_cast<size_t>(len));
      double mx = -1e30;
      for (int64_t p = 0; p < len; ++p) {
        const int32_t block = csr.indices[size_t(csr.indptr[size_t(s)] + p / c.block_size)];
        const float* lat = pf + latent_index(c, block, layer, p % c.block_size, 0);
        double dot = 0;
        for (int d = 0; d < c.head_dim; ++d) dot += double(qv[d]) * lat[d];
        scores[size_t(p)] = dot * 0.3;
        mx = std::max(mx, scores[size_t(p)]);
      }
      std::vector<double> o(static_cast<size_t>(ckv), 0.0);
      double denom = 0;
      for (int64_t p = 0; p < len; ++p) {
        const int32_t block = csr.indices[size_t(csr.indptr[size_t(s)] + p / c.block_size)];
        const float* lat = pf + latent_index(c, block, layer, p % c.block_size, 0);
        const double w = std::exp(scores[size_t(p)] - mx);
        denom += w;
        for (int d = 0; d < ckv; ++d) o[size_t(d)] += w * lat[d];
      }
      const float* got = out.data() + (int64_t{s} * q_heads + h) * c.head_dim;
      for (int d = 0; d < ckv; ++d) EXPECT_NEAR(got[d], o[size_t(d)] / denom, 1e-4) << d;
      for (int d = ckv; d < c.head_dim; ++d) EXPECT_EQ(got[d], 0.0f) << d;
    }
  }
}

}  // namespace
}  // namespace pagedkv::testing
