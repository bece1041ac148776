// pagedkv-demo: a KvCache on the default backend (the GPU when one is present, else the CPU
// backend) runs a few requests: a prompt is written and committed, a second request reuses its
// cached prefix, one sequence is offloaded to the pinned host tier and restored, and every
// sequence is gathered back and checked element by element. It prints what it did.
// (The full serving simulator, pagedkv-sim, will replace it.)
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"

namespace {

using pagedkv::DType;
using pagedkv::Status;
using pagedkv::StatusOr;
using pagedkv::TokenId;

// A distinct, never-zero fp16 value for (position, token, layer, part, head, dim).
uint16_t demo_value(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t head,
                    int32_t d) {
  const int64_t h =
      (pos * 40503 + token * 7919 + layer * 97 + part * 31 + head * 131 + d * 17) % 4001;
  return pagedkv::float_to_half_bits(0.25f + static_cast<float>(h) / 1024.0f);
}

class Demo {
 public:
  explicit Demo(std::unique_ptr<pagedkv::KvCache> cache) : cache_(std::move(cache)) {}

  // Reserves, writes every layer and commits `tokens` after the sequence's first `start` tokens.
  Status append(pagedkv::SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    const pagedkv::CacheConfig& c = cache_->config();
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<int64_t> slots,
                             cache_->reserve(id, static_cast<int64_t>(tokens.size())));
    const int64_t n = static_cast<int64_t>(tokens.size()), row = c.num_kv_heads * c.head_dim;
    std::vector<uint16_t> k(static_cast<size_t>(n * row)), v(k.size());
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      for (int64_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < c.num_kv_heads; ++h)
          for (int32_t d = 0; d < c.head_dim; ++d) {
            const size_t i = static_cast<size_t>(t * row + h * c.head_dim + d);
            k[i] = demo_value(start + t, tokens[static_cast<size_t>(t)], layer, 0, h, d);
            v[i] = demo_value(start + t, tokens[static_cast<size_t>(t)], layer, 1, h, d);
          }
      PAGEDKV_ASSIGN_OR_RETURN(void* dk, upload(k));
      PAGEDKV_ASSIGN_OR_RETURN(void* dv, upload(v));
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv(id, layer, dk, dv, DType::kFloat16));
      PAGEDKV_RETURN_IF_ERROR(cache_->synchronize());
      release(dk);
      release(dv);
    }
    std::printf("write     seq %llu: %lld token%s at positions %lld..%lld, slots %lld..%lld\n",
                static_cast<unsigned long long>(id), static_cast<long long>(n), n == 1 ? "" : "s",
                static_cast<long long>(start), static_cast<long long>(start + n - 1),
                static_cast<long long>(slots.front()), static_cast<long long>(slots.back()));
    return cache_->commit(id, tokens);
  }

  // Gathers every layer of `id` and counts elements that differ from demo_value.
  StatusOr<int64_t> verify(pagedkv::SequenceId id, const std::vector<TokenId>& tokens) {
    const pagedkv::CacheConfig& c = cache_->config();
    const int64_t n = static_cast<int64_t>(tokens.size());
    const size_t elems = static_cast<size_t>(n * c.num_kv_heads * c.head_dim);
    int64_t wrong = 0;
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      PAGEDKV_ASSIGN_OR_RETURN(void* dk, cache_->backend().allocate_device(elems * 2));
      PAGEDKV_ASSIGN_OR_RETURN(void* dv, cache_->backend().allocate_device(elems * 2));
      PAGEDKV_RETURN_IF_ERROR(cache_->gather_layer(id, layer, dk, dv, DType::kFloat16,
                                                   pagedkv::PackedLayout::kTokenMajor));
      std::vector<uint16_t> k(elems), v(elems);
      PAGEDKV_RETURN_IF_ERROR(download(k, dk));
      PAGEDKV_RETURN_IF_ERROR(download(v, dv));
      release(dk);
      release(dv);
      for (int64_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < c.num_kv_heads; ++h)
          for (int32_t d = 0; d < c.head_dim; ++d) {
            const size_t i = static_cast<size_t>((t * c.num_kv_heads + h) * c.head_dim + d);
            const TokenId tok = tokens[static_cast<size_t>(t)];
            wrong += k[i] != demo_value(t, tok, layer, 0, h, d);
            wrong += v[i] != demo_value(t, tok, layer, 1, h, d);
          }
    }
    return wrong;
  }

  pagedkv::KvCache& cache() { return *cache_; }

 private:
  StatusOr<void*> upload(const std::vector<uint16_t>& host) {
    PAGEDKV_ASSIGN_OR_RETURN(void* d, cache_->backend().allocate_device(host.size() * 2));
    PAGEDKV_RETURN_IF_ERROR(cache_->backend().copy_async(d, host.data(), host.size() * 2,
                                                         pagedkv::CopyKind::kHostToDevice,
                                                         cache_->compute_stream()));
    return d;
  }
  Status download(std::vector<uint16_t>& host, const void* d) {
    PAGEDKV_RETURN_IF_ERROR(cache_->backend().copy_async(host.data(), d, host.size() * 2,
                                                         pagedkv::CopyKind::kDeviceToHost,
                                                         cache_->compute_stream()));
    return cache_->synchronize();
  }
  void release(void* d) { cache_->backend().free_device(d); }

  std::unique_ptr<pagedkv::KvCache> cache_;
};

int fail(const Status& s) {
  std::fprintf(stderr, "pagedkv-demo: %s\n", s.to_string().c_str());
  return 1;
}

Status run() {
  pagedkv::CacheConfig config;
  config.num_layers = 4;
  config.num_kv_heads = 4;
  config.head_dim = 64;
  config.block_size = 16;
  config.num_device_blocks = 64;
  config.num_host_blocks = 64;
  config.dtype = DType::kFloat16;
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<pagedkv::KvCache> cache,
                           pagedkv::KvCache::create(config));
  const pagedkv::PoolInfo& pools = cache->pool_info();
  std::printf("backend   %s\n", cache->backend().description().c_str());
  std::printf(
      "pools     device %lld blocks (%.1f MiB, %.2f ms), host %lld blocks pinned (%.1f MiB, %.2f "
      "ms); "
      "%d layers x %d KV heads x %d dims, %s, %s, %d tokens per block\n",
      static_cast<long long>(config.num_device_blocks), pools.device_bytes / 1048576.0,
      pools.device_alloc_ms, static_cast<long long>(config.num_host_blocks),
      pools.host_bytes / 1048576.0, pools.host_alloc_ms, config.num_layers, config.num_kv_heads,
      config.head_dim, pagedkv::dtype_name(config.dtype),
      pagedkv::page_layout_name(config.page_layout), config.block_size);
  Demo demo(std::move(cache));
  pagedkv::KvCache& kv = demo.cache();

  std::vector<TokenId> system_prompt(40);
  for (int i = 0; i < 40; ++i) system_prompt[static_cast<size_t>(i)] = 1000 + i;
  std::vector<TokenId> a = system_prompt, b = system_prompt;
  for (TokenId t : {1, 2, 3, 4, 5}) a.push_back(t);
  for (TokenId t : {7, 8, 9}) b.push_back(t);

  PAGEDKV_ASSIGN_OR_RETURN(int64_t cached_a, kv.add_sequence(1, a));
  std::printf("add       seq 1: %zu prompt tokens, %lld already cached\n", a.size(),
              static_cast<long long>(cached_a));
  PAGEDKV_RETURN_IF_ERROR(demo.append(1, a, 0));
  PAGEDKV_ASSIGN_OR_RETURN(int64_t cached_b, kv.add_sequence(2, b));
  std::printf(
      "add       seq 2: %zu prompt tokens, %lld already cached (the shared system prompt)\n",
      b.size(), static_cast<long long>(cached_b));
  PAGEDKV_RETURN_IF_ERROR(
      demo.append(2, std::vector<TokenId>(b.begin() + cached_b, b.end()), cached_b));
  for (TokenId next = 50; next < 53; ++next) {  // three decode steps of seq 1
    PAGEDKV_RETURN_IF_ERROR(demo.append(1, {next}, static_cast<int64_t>(a.size())));
    a.push_back(next);
  }
  PAGEDKV_RETURN_IF_ERROR(kv.offload(2));
  PAGEDKV_RETURN_IF_ERROR(kv.synchronize());
  std::printf("offload   seq 2 to the pinned host tier\n");
  PAGEDKV_RETURN_IF_ERROR(kv.restore(2));
  std::printf("restore   seq 2 to the device\n");

  int64_t wrong = 0;
  for (auto [id, tokens] :
       {std::make_pair(pagedkv::SequenceId{1}, a), std::make_pair(pagedkv::SequenceId{2}, b)}) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t w, demo.verify(id, tokens));
    std::printf("gather    seq %llu: %zu tokens x %d layers, K and V: %lld mismatches\n",
                static_cast<unsigned long long>(id), tokens.size(), config.num_layers,
                static_cast<long long>(w));
    wrong += w;
  }
  const pagedkv::ControlStats s = kv.stats();
  std::printf(
      "stats     device blocks %lld used / %lld free; prefix hit tokens %lld of %lld; "
      "offloads %lld, restores %lld, copy-on-write %lld\n",
      static_cast<long long>(s.device.used_blocks), static_cast<long long>(s.device.free_blocks),
      static_cast<long long>(s.prefix_hit_tokens), static_cast<long long>(s.prefix_query_tokens),
      static_cast<long long>(s.sequences_offloaded), static_cast<long long>(s.sequences_restored),
      static_cast<long long>(s.copy_on_write));
  PAGEDKV_RETURN_IF_ERROR(kv.check_invariants());
  if (wrong != 0)
    return pagedkv::internal_error(std::to_string(wrong) + " elements read back wrong");
  std::printf("verified  OK: every gathered element matches what was written; invariants hold\n");
  return pagedkv::ok_status();
}

}  // namespace

int main() {
  const Status s = run();
  return s.ok() ? 0 : fail(s);
}
