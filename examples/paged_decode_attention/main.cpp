// Paged decode attention against the device view, checked against float64 attention over the
// packed cache.
//
// 1. fill a paged pool with write_kv (slot mapping over shuffled blocks, one layer),
// 2. run DecodeAttentionBody (kernels/decode_attention.hpp: one query token per sequence,
//    grouped-query heads) on the default backend through the PagedKvView,
// 3. pack the same layer with gather_layer_batch and compute attention in double on the host,
// 4. exit non-zero when any output differs by more than the tolerance.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/decode_attention.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/device/paged_view.cuh"
#include "pagedkv/ops.hpp"

namespace {

using namespace pagedkv;  // NOLINT: an example program

struct DeviceVec {
  Backend* be;
  void* ptr = nullptr;
  size_t bytes;
  DeviceVec(Backend& b, size_t n) : be(&b), bytes(n) { ptr = b.allocate_device(n).value(); }
  ~DeviceVec() { be->free_device(ptr); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

bool check(const Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
  return s.ok();
}

int run() {
  auto backend_or = create_backend(BackendKind::kAuto);
  if (!backend_or.ok()) return check(backend_or.status(), "create_backend") ? 0 : 1;
  Backend& be = **backend_or;
  std::printf("backend: %s\n", be.description().c_str());

  PoolLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 128;
  layout.block_size = 16;
  layout.page_layout = PageLayout::kNHD;
  const int num_blocks = 64, q_heads = 8, layer = 1;
  const DType dtype = DType::kBFloat16;
  const std::vector<int32_t> lens = {1, 37, 100, 16};
  const int batch = static_cast<int>(lens.size());
  const int max_blocks = 7;
  const int64_t row = int64_t{layout.num_kv_heads} * layout.head_dim;

  // Block tables over shuffled blocks; slots of every cached token; indptr for the packing.
  std::mt19937 rng(42);
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<int32_t> tables(size_t(batch) * max_blocks, -1), indptr = {0};
  std::vector<int64_t> slots;
  size_t next = 0;
  for (int s = 0; s < batch; ++s) {
    for (int b = 0; b * layout.block_size < lens[size_t(s)]; ++b) {
      tables[size_t(s) * max_blocks + size_t(b)] = free_blocks[next++];
    }
    for (int p = 0; p < lens[size_t(s)]; ++p) {
      slots.push_back(int64_t{tables[size_t(s) * max_blocks + size_t(p / layout.block_size)]} *
                          layout.block_size +
                      p % layout.block_size);
    }
    indptr.push_back(indptr.back() + lens[size_t(s)]);
  }
  const int64_t total = indptr.back();
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> k(size_t(total * row)), v(size_t(total * row)),
      q(size_t(batch * q_heads * 128));
  for (auto* vec : {&k, &v, &q})
    for (auto& x : *vec) x = dist(rng);

  const size_t pool_bytes = size_t(num_blocks) * size_t(layout.block_elems()) * dtype_size(dtype);
  DeviceVec dpool(be, pool_bytes), dk(be, k.size() * 4), dv(be, v.size() * 4), dq(be, q.size() * 4),
      dslots(be, slots.size() * 8), dtables(be, tables.size() * 4), dlens(be, lens.size() * 4),
      dindptr(be, indptr.size() * 4), dout(be, q.size() * 4), dpk(be, k.size() * 4),
      dpv(be, v.size() * 4);
  const std::pair<DeviceVec*, const void*> uploads[] = {
      {&dk, k.data()},          {&dv, v.data()},           {&dq, q.data()},
      {&dslots, slots.data()},  {&dtables, tables.data()}, {&dlens, lens.data()},
      {&dindptr, indptr.data()}};
  for (const auto& [dst, src] : uploads) {
    if (!check(be.copy_async(dst->ptr, src, dst->bytes, CopyKind::kHostToDevice, {}), "upload"))
      return 1;
  }

  // 1. Write the layer (fp32 input, bf16 cache: converted on write).
  PoolRef pool{dpool.ptr, dtype, layout, num_blocks};
  WriteKvArgs w;
  w.key = dk.ptr;
  w.value = dv.ptr;
  w.input_dtype = DType::kFloat32;
  w.num_tokens = total;
  w.slot_mapping = dslots.as<int64_t>();
  w.layer = layer;
  if (!check(write_kv(be, pool, w), "write_kv")) return 1;

  // 2. Decode attention through the device view, on the backend.
  kernels::DecodeAttentionBody body;
  body.view =
      device::make_block_table_view(dpool.ptr, layout, dtype, num_blocks, dtables.as<int32_t>(),
                                    max_blocks, dlens.as<int32_t>(), batch);
  body.q = dq.ptr;
  body.q_dtype = DType::kFloat32;
  body.out = dout.as<float>();
  body.num_q_heads = q_heads;
  body.layer = layer;
  body.sm_scale = 1.0f / std::sqrt(128.0f);
  const KernelLaunch launch{KernelId::kDecodeAttention, &body, sizeof(body),
                            int64_t{batch} * q_heads};
  if (!check(be.launch(launch, {}), "decode attention launch")) return 1;

  // 3. The packed cache ([heads, len, dim] per sequence, fp32) for the reference.
  PackedBatchArgs g;
  g.key = dpk.ptr;
  g.value = dpv.ptr;
  g.packed_dtype = DType::kFloat32;
  g.packed_layout = PackedLayout::kHeadMajor;
  g.block_tables = dtables.as<int32_t>();
  g.max_blocks_per_seq = max_blocks;
  g.indptr = dindptr.as<int32_t>();
  g.batch_size = batch;
  g.total_tokens = total;
  g.layer = layer;
  if (!check(gather_layer_batch(be, pool, g), "gather_layer_batch")) return 1;

  std::vector<float> out(q.size()), pk(k.size()), pv(v.size());
  if (!check(be.copy_async(out.data(), dout.ptr, dout.bytes, CopyKind::kDeviceToHost, {}),
             "download") ||
      !check(be.copy_async(pk.data(), dpk.ptr, dpk.bytes, CopyKind::kDeviceToHost, {}),
             "download") ||
      !check(be.copy_async(pv.data(), dpv.ptr, dpv.bytes, CopyKind::kDeviceToHost, {}),
             "download") ||
      !check(be.synchronize_stream({}), "synchronize")) {
    return 1;
  }

  // 4. float64 attention over the packed cache.
  double max_err = 0.0;
  const int group = q_heads / layout.num_kv_heads;
  for (int s = 0; s < batch; ++s) {
    const int64_t len = lens[size_t(s)], base = int64_t{indptr[size_t(s)]} * row;
    for (int qh = 0; qh < q_heads; ++qh) {
      const int kvh = qh / group;
      const float* qv = &q[size_t((s * q_heads + qh) * 128)];
      std::vector<double> w_(static_cast<size_t>(len));
      double mx = -1e300, den = 0.0;
      for (int64_t p = 0; p < len; ++p) {
        double dot = 0.0;
        for (int d = 0; d < 128; ++d)
          dot += double(qv[d]) * pk[size_t(base + (kvh * len + p) * 128 + d)];
        w_[size_t(p)] = dot / std::sqrt(128.0);
        mx = std::max(mx, w_[size_t(p)]);
      }
      for (auto& x : w_) den += (x = std::exp(x - mx));
      for (int d = 0; d < 128; ++d) {
        double o = 0.0;
        for (int64_t p = 0; p < len; ++p)
          o += w_[size_t(p)] * pv[size_t(base + (kvh * len + p) * 128 + d)];
        max_err = std::max(max_err, std::fabs(o / den - out[size_t((s * q_heads + qh) * 128 + d)]));
      }
    }
  }
  const double tolerance = 1e-4;
  std::printf(
      "paged decode attention: batch %d, %d query heads over %d kv heads, max |err| = %.3g "
      "(tolerance %.1g)\n",
      batch, q_heads, layout.num_kv_heads, max_err, tolerance);
  if (!(max_err <= tolerance)) {
    std::fprintf(stderr, "MISMATCH\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

}  // namespace

int main() { return run(); }
