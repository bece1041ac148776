// pagedkv-demo: creates a cache pool on the default backend, writes a few blocks through the
// pool layout, copies one block to another on the device, reads everything back and checks it.
// It prints what it did. (The full serving simulator, pagedkv-sim, replaces it.)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/layout.hpp"

namespace {

using pagedkv::KvPart;

// A distinct fp16 value per (block, layer, part, position, head, dim), never zero.
uint16_t demo_value(int64_t block, int32_t layer, int32_t part, int32_t pos, int32_t head,
                    int32_t dim) {
  const float v = 0.001f * static_cast<float>((block * 7919 + layer * 104729 + part * 31 +
                                               pos * 131 + head * 17 + dim) % 2000) + 0.5f;
  return pagedkv::float_to_half_bits(v);
}

int fail(const pagedkv::Status& s) {
  std::fprintf(stderr, "pagedkv-demo: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  pagedkv::CacheConfig config;
  config.num_layers = 4;
  config.num_kv_heads = 4;
  config.head_dim = 64;
  config.block_size = 16;
  config.num_device_blocks = 64;
  config.dtype = pagedkv::DType::kFloat16;
  if (pagedkv::Status s = config.validate(); !s.ok()) return fail(s);
  const pagedkv::PoolLayout layout = pagedkv::PoolLayout::from_config(config);

  auto created = pagedkv::create_backend(config.backend);
  if (!created.ok()) return fail(created.status());
  pagedkv::Backend& backend = **created;
  std::printf("backend        %s\n", backend.description().c_str());

  const size_t pool_bytes = static_cast<size_t>(config.block_bytes() * config.num_device_blocks);
  const auto t0 = std::chrono::steady_clock::now();
  auto pool = backend.allocate_device(pool_bytes);
  if (!pool.ok()) return fail(pool.status());
  const double alloc_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("pool           %lld blocks x %lld bytes = %.1f MiB (%s, %s, %d layers x %d heads x %d dims, block %d), allocated in %.2f ms\n",
              static_cast<long long>(config.num_device_blocks),
              static_cast<long long>(config.block_bytes()), pool_bytes / 1048576.0,
              pagedkv::dtype_name(config.dtype), pagedkv::page_layout_name(config.page_layout),
              config.num_layers, config.num_kv_heads, config.head_dim, config.block_size, alloc_ms);

  // Stage three blocks on the host through the layout object, then upload each as one copy.
  const int64_t blocks[] = {3, 17, 42};
  const size_t block_elems = static_cast<size_t>(layout.block_elems());
  std::vector<uint16_t> staging(block_elems);
  auto* base = static_cast<uint16_t*>(*pool);
  for (int64_t b : blocks) {
    for (int32_t l = 0; l < config.num_layers; ++l)
      for (int32_t part = 0; part < 2; ++part)
        for (int32_t p = 0; p < config.block_size; ++p)
          for (int32_t h = 0; h < config.num_kv_heads; ++h)
            for (int32_t d = 0; d < config.head_dim; ++d)
              staging[static_cast<size_t>(layout.element_offset(0, l, static_cast<KvPart>(part), p, h, d))] =
                  demo_value(b, l, part, p, h, d);
    if (auto s = backend.copy_async(base + layout.page_offset(b, 0, KvPart::kKey), staging.data(),
                                    block_elems * 2, pagedkv::CopyKind::kHostToDevice, {});
        !s.ok())
      return fail(s);
    if (auto s = backend.synchronize_stream({}); !s.ok()) return fail(s);  // staging is reused
    std::printf("write          block %2lld: %d layers x K,V x %d tokens (%zu bytes, one copy)\n",
                static_cast<long long>(b), config.num_layers, config.block_size, block_elems * 2);
  }

  // Copy-on-write style: duplicate block 17 into block 50 on the device.
  if (auto s = backend.copy_async(base + layout.page_offset(50, 0, KvPart::kKey),
                                  base + layout.page_offset(17, 0, KvPart::kKey), block_elems * 2,
                                  pagedkv::CopyKind::kDeviceToDevice, {});
      !s.ok())
    return fail(s);
  std::printf("copy           block 17 -> block 50 on the device\n");

  // Read back and check every element against the formula.
  std::vector<uint16_t> readback(block_elems);
  int64_t checked = 0, wrong = 0;
  const int64_t read_blocks[] = {3, 17, 42, 50};
  for (int64_t b : read_blocks) {
    if (auto s = backend.copy_async(readback.data(), base + layout.page_offset(b, 0, KvPart::kKey),
                                    block_elems * 2, pagedkv::CopyKind::kDeviceToHost, {});
        !s.ok())
      return fail(s);
    if (auto s = backend.synchronize_stream({}); !s.ok()) return fail(s);
    const int64_t source = b == 50 ? 17 : b;
    for (int32_t l = 0; l < config.num_layers; ++l)
      for (int32_t part = 0; part < 2; ++part)
        for (int32_t p = 0; p < config.block_size; ++p)
          for (int32_t h = 0; h < config.num_kv_heads; ++h)
            for (int32_t d = 0; d < config.head_dim; ++d) {
              const uint16_t got =
                  readback[static_cast<size_t>(layout.element_offset(0, l, static_cast<KvPart>(part), p, h, d))];
              wrong += got != demo_value(source, l, part, p, h, d);
              ++checked;
            }
    const float first = pagedkv::half_bits_to_float(readback[0]);
    std::printf("read           block %2lld: K[layer 0][token 0][head 0][0] = %.4f\n",
                static_cast<long long>(b), first);
  }
  backend.free_device(*pool);
  std::printf("verified       %lld elements, %lld mismatches: %s\n", static_cast<long long>(checked),
              static_cast<long long>(wrong), wrong == 0 ? "OK" : "FAILED");
  return wrong == 0 ? 0 : 1;
}
