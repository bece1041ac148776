// Uses the installed headers and library: validates a config, creates the default backend,
// round-trips bytes through device memory. Exits 0 on success.
#include <cstdio>
#include <cstring>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/layout.hpp"

int main() {
  pagedkv::CacheConfig config;
  if (!config.validate().ok()) return 1;
  const pagedkv::PoolLayout layout = pagedkv::PoolLayout::from_config(config);
  auto backend = pagedkv::create_backend(pagedkv::BackendKind::kAuto);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().to_string().c_str());
    return 1;
  }
  std::vector<unsigned char> in(static_cast<size_t>(config.block_bytes())), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 31);
  auto device = (*backend)->allocate_device(in.size());
  if (!device.ok()) return 1;
  pagedkv::Backend& be = **backend;
  if (!be.copy_async(*device, in.data(), in.size(), pagedkv::CopyKind::kHostToDevice, {}).ok() ||
      !be.copy_async(out.data(), *device, in.size(), pagedkv::CopyKind::kDeviceToHost, {}).ok() ||
      !be.synchronize_stream({}).ok()) {
    return 1;
  }
  be.free_device(*device);
  const bool same = std::memcmp(in.data(), out.data(), in.size()) == 0;
  std::printf("consumer: %s, block of %lld elements, round trip %s\n", be.description().c_str(),
              static_cast<long long>(layout.block_elems()), same ? "ok" : "MISMATCH");
  return same ? 0 : 1;
}
