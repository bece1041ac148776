// A server's step loop over KvCache, complete and checked: requests that share a system prompt
// are prefilled one by one, then decoded together, one token per sequence per step, with the
// step's K/V written in ONE launch through the batch slot mapping (the path a server takes when
// it calls the kernel itself). At the end every sequence is gathered back and compared with
// what was written; the program exits non-zero on any mismatch.
//
// The "model" is a stand-in: the K/V of a token is a function of its position and token id.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/ops.hpp"

namespace {

using pagedkv::DType;
using pagedkv::SequenceId;
using pagedkv::Status;
using pagedkv::StatusOr;
using pagedkv::TokenId;

uint16_t model_kv(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t head,
                  int32_t d) {
  const int64_t h =
      (pos * 40503 + token * 7919 + layer * 97 + part * 31 + head * 131 + d * 17) % 4001;
  return pagedkv::float_to_half_bits(0.25f + static_cast<float>(h) / 1024.0f);
}

struct Request {
  SequenceId id;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  int32_t to_generate;
};

// Device scratch for one step's K/V input, [layers][tokens, heads, dim] fp16, reused each step.
class StepInput {
 public:
  StepInput(pagedkv::KvCache& kv, size_t max_tokens) : kv_(kv) {
    const pagedkv::CacheConfig& c = kv.config();
    row_ = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
    bytes_ = static_cast<size_t>(c.num_layers) * max_tokens * row_ * 2;
    k_ = kv.backend().allocate_device(bytes_).value_or(nullptr);
    v_ = kv.backend().allocate_device(bytes_).value_or(nullptr);
  }
  ~StepInput() {
    kv_.backend().free_device(k_);
    kv_.backend().free_device(v_);
  }
  bool ok() const { return k_ != nullptr && v_ != nullptr; }

  // Fills the K/V of `tokens` (token t at position positions[t]) for every layer and uploads it.
  Status fill(const std::vector<TokenId>& tokens, const std::vector<int64_t>& positions) {
    const pagedkv::CacheConfig& c = kv_.config();
    const size_t n = tokens.size();
    host_k_.assign(static_cast<size_t>(c.num_layers) * n * row_, 0);
    host_v_.assign(host_k_.size(), 0);
    for (int32_t l = 0; l < c.num_layers; ++l)
      for (size_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < c.num_kv_heads; ++h)
          for (int32_t d = 0; d < c.head_dim; ++d) {
            const size_t i = (static_cast<size_t>(l) * n + t) * row_ + h * c.head_dim + d;
            host_k_[i] = model_kv(positions[t], tokens[t], l, 0, h, d);
            host_v_[i] = model_kv(positions[t], tokens[t], l, 1, h, d);
          }
    // Same stream as the cache's kernels: the previous step's writes have read the buffers.
    pagedkv::Backend& be = kv_.backend();
    PAGEDKV_RETURN_IF_ERROR(be.copy_async(k_, host_k_.data(), host_k_.size() * 2,
                                          pagedkv::CopyKind::kHostToDevice, kv_.compute_stream()));
    PAGEDKV_RETURN_IF_ERROR(be.copy_async(v_, host_v_.data(), host_v_.size() * 2,
                                          pagedkv::CopyKind::kHostToDevice, kv_.compute_stream()));
    return be.synchronize_stream(kv_.compute_stream());  // the host buffers are reused
  }
  const void* key(int32_t layer, size_t n) const {
    return static_cast<const char*>(k_) + static_cast<size_t>(layer) * n * row_ * 2;
  }
  const void* value(int32_t layer, size_t n) const {
    return static_cast<const char*>(v_) + static_cast<size_t>(layer) * n * row_ * 2;
  }

 private:
  pagedkv::KvCache& kv_;
  size_t row_ = 0, bytes_ = 0;
  void* k_ = nullptr;
  void* v_ = nullptr;
  std::vector<uint16_t> host_k_, host_v_;
};

// Prefill: reserve the uncached part of the prompt, write every layer, commit.
Status prefill(pagedkv::KvCache& kv, StepInput& input, Request& r, int64_t* cached_out) {
  PAGEDKV_ASSIGN_OR_RETURN(int64_t cached, kv.add_sequence(r.id, r.tokens));
  const std::vector<TokenId> todo(r.tokens.begin() + cached, r.tokens.end());
  std::vector<int64_t> positions;
  for (size_t i = 0; i < todo.size(); ++i) positions.push_back(cached + static_cast<int64_t>(i));
  PAGEDKV_RETURN_IF_ERROR(kv.reserve(r.id, static_cast<int64_t>(todo.size())).status());
  PAGEDKV_RETURN_IF_ERROR(input.fill(todo, positions));
  for (int32_t l = 0; l < kv.config().num_layers; ++l) {
    PAGEDKV_RETURN_IF_ERROR(kv.write_kv(r.id, l, input.key(l, todo.size()),
                                        input.value(l, todo.size()), DType::kFloat16));
  }
  *cached_out = cached;
  return kv.commit(r.id, todo);
}

// One decode step for every running request: one reserve_batch, the batch metadata, the step's
// K/V of every layer with one launch per layer through the batch's slot mapping, one
// commit_batch.
Status decode_step(pagedkv::KvCache& kv, StepInput& input, std::vector<Request*>& running,
                   TokenId next_token) {
  std::vector<SequenceId> ids;
  std::vector<TokenId> tokens;
  std::vector<int64_t> positions;
  for (Request* r : running) {
    ids.push_back(r->id);
    tokens.push_back(next_token + static_cast<TokenId>(r->id));
    positions.push_back(static_cast<int64_t>(r->tokens.size()));
  }
  PAGEDKV_RETURN_IF_ERROR(kv.reserve_batch(ids, 1).status());
  PAGEDKV_RETURN_IF_ERROR(kv.set_active(ids));
  PAGEDKV_ASSIGN_OR_RETURN(pagedkv::DeviceBatch batch, kv.build_batch(ids));
  PAGEDKV_RETURN_IF_ERROR(input.fill(tokens, positions));
  for (int32_t l = 0; l < kv.config().num_layers; ++l) {
    // One slot per reserved token, in row order: row i of the input is running[i]'s token.
    PAGEDKV_RETURN_IF_ERROR(kv.write_kv_batch(batch, l, input.key(l, tokens.size()),
                                              input.value(l, tokens.size()), DType::kFloat16));
  }
  // (Attention would run here, reading batch.block_tables / seq_lens through the device view.)
  PAGEDKV_RETURN_IF_ERROR(kv.commit_batch(ids, tokens));
  for (size_t i = 0; i < running.size(); ++i) {
    running[i]->tokens.push_back(tokens[i]);
    --running[i]->to_generate;
  }
  return pagedkv::ok_status();
}

StatusOr<int64_t> count_mismatches(pagedkv::KvCache& kv, const Request& r) {
  const pagedkv::CacheConfig& c = kv.config();
  const size_t n = r.tokens.size();
  const size_t elems = n * static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  std::vector<uint16_t> k(elems), v(elems);
  PAGEDKV_ASSIGN_OR_RETURN(void* dk, kv.backend().allocate_device(elems * 2));
  PAGEDKV_ASSIGN_OR_RETURN(void* dv, kv.backend().allocate_device(elems * 2));
  int64_t wrong = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    PAGEDKV_RETURN_IF_ERROR(
        kv.gather_layer(r.id, l, dk, dv, DType::kFloat16, pagedkv::PackedLayout::kTokenMajor));
    PAGEDKV_RETURN_IF_ERROR(kv.backend().copy_async(
        k.data(), dk, elems * 2, pagedkv::CopyKind::kDeviceToHost, kv.compute_stream()));
    PAGEDKV_RETURN_IF_ERROR(kv.backend().copy_async(
        v.data(), dv, elems * 2, pagedkv::CopyKind::kDeviceToHost, kv.compute_stream()));
    PAGEDKV_RETURN_IF_ERROR(kv.synchronize());
    for (size_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < c.num_kv_heads; ++h)
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const size_t i = (t * c.num_kv_heads + h) * c.head_dim + d;
          const auto pos = static_cast<int64_t>(t);
          wrong += k[i] != model_kv(pos, r.tokens[t], l, 0, h, d);
          wrong += v[i] != model_kv(pos, r.tokens[t], l, 1, h, d);
        }
  }
  kv.backend().free_device(dk);
  kv.backend().free_device(dv);
  return wrong;
}

Status run() {
  pagedkv::CacheConfig config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.block_size = 8;
  config.num_device_blocks = 64;
  config.num_host_blocks = 32;
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<pagedkv::KvCache> kv, pagedkv::KvCache::create(config));
  StepInput input(*kv, 64);
  if (!input.ok()) return pagedkv::resource_exhausted("step input buffers");

  std::vector<TokenId> system_prompt;
  for (TokenId t = 0; t < 24; ++t) system_prompt.push_back(500 + t);
  std::vector<Request> requests;
  for (SequenceId id = 1; id <= 6; ++id) {
    Request r{id, system_prompt, static_cast<int32_t>(4 + id)};
    for (TokenId t = 0; t < static_cast<TokenId>(id); ++t) r.tokens.push_back(900 + t);
    requests.push_back(r);
  }
  std::vector<Request*> running;
  for (Request& r : requests) {
    int64_t cached = 0;
    PAGEDKV_RETURN_IF_ERROR(prefill(*kv, input, r, &cached));
    std::printf("prefill  seq %llu: %zu prompt tokens, %lld from the prefix cache\n",
                static_cast<unsigned long long>(r.id), r.tokens.size(),
                static_cast<long long>(cached));
    running.push_back(&r);
  }
  int steps = 0;
  for (TokenId next = 1000; !running.empty(); next += 16, ++steps) {
    PAGEDKV_RETURN_IF_ERROR(decode_step(*kv, input, running, next));
    for (size_t i = 0; i < running.size();) {
      if (running[i]->to_generate > 0) {
        ++i;
        continue;
      }
      PAGEDKV_ASSIGN_OR_RETURN(int64_t wrong, count_mismatches(*kv, *running[i]));
      std::printf("finish   seq %llu: %zu tokens, %lld mismatches\n",
                  static_cast<unsigned long long>(running[i]->id), running[i]->tokens.size(),
                  static_cast<long long>(wrong));
      if (wrong != 0) return pagedkv::internal_error("gathered K/V differs from what was written");
      PAGEDKV_RETURN_IF_ERROR(kv->finish(running[i]->id));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    PAGEDKV_RETURN_IF_ERROR(kv->check_invariants());
  }
  const pagedkv::ControlStats s = kv->stats();
  std::printf("decoded  %d steps; prefix hit tokens %lld of %lld; device blocks cached %lld\n",
              steps, static_cast<long long>(s.prefix_hit_tokens),
              static_cast<long long>(s.prefix_query_tokens),
              static_cast<long long>(s.device.cached_blocks));
  return pagedkv::ok_status();
}

}  // namespace

int main() {
  const Status s = run();
  if (!s.ok()) {
    std::fprintf(stderr, "server_step_loop: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
