// A randomized end-to-end test of KvCache on real bytes: sequences with shared prefixes are
// added, extended, rolled back, forked, finished, erased, offloaded and restored under memory
// pressure in both tiers. The reference model is each live sequence's token list: the K/V of a
// position is a pure function of (position, token, layer, part, head, dim), so after any mix of
// prefix reuse, copy-on-write and tier moves, a gathered sequence must match it byte for byte.
//
// PAGEDKV_E2E_STEPS sets the number of steps (the suite runs the default below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

constexpr int64_t kDefaultSteps = 20000;

class RandomWorkload {
 public:
  RandomWorkload(uint64_t seed) : rng_(seed) {
    config_.num_layers = 2;
    config_.num_kv_heads = 2;
    config_.head_dim = 16;
    config_.block_size = 4;
    config_.num_device_blocks = 24;
    config_.num_host_blocks = 32;
    config_.max_sequence_length = 64;
    config_.backend = BackendKind::kCpu;
    CpuBackendOptions options;
    options.copy_delay = std::chrono::microseconds(50);  // transfers really lag behind
    backend_ = create_cpu_backend(options);
    KvCacheOptions o;
    o.backend = backend_.get();
    cache_ = std::move(KvCache::create(config_, o)).value();
    const size_t max_elems = static_cast<size_t>(config_.num_layers) * config_.max_sequence_length *
                             config_.num_kv_heads * config_.head_dim;
    input_k_ = std::make_unique<DeviceBuffer>(*backend_, max_elems * 2);
    input_v_ = std::make_unique<DeviceBuffer>(*backend_, max_elems * 2);
    out_k_ = std::make_unique<DeviceBuffer>(*backend_, max_elems * 2);
    out_v_ = std::make_unique<DeviceBuffer>(*backend_, max_elems * 2);
    for (int p = 0; p < 4; ++p) {  // shared system prompts
      std::vector<TokenId> prefix;
      const int len = 4 + static_cast<int>(rng_() % 14);
      for (int i = 0; i < len; ++i) prefix.push_back(static_cast<TokenId>(rng_() % 50));
      prefixes_.push_back(prefix);
    }
  }

  void run(int64_t steps) {
    for (int64_t step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) {
      step_ = step;
      const int op = static_cast<int>(rng_() % 100);
      if (op < 15 || model_.empty())
        add();
      else if (op < 55)
        extend(pick(), 1 + static_cast<int>(rng_() % 3));
      else if (op < 62)
        rollback(pick());
      else if (op < 67)
        fork(pick());
      else if (op < 74)
        finish_or_erase(pick(), rng_() % 2 == 0);
      else if (op < 82)
        offload(pick());
      else if (op < 88)
        restore(pick());
      else if (op < 92)
        set_active();
      else
        verify(pick());
      drop_evicted();
      const Status inv = cache_->check_invariants();
      ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv.to_string();
    }
    for (const auto& [id, tokens] : model_) {
      if (::testing::Test::HasFatalFailure()) return;
      verify(id);
    }
  }

  int64_t verified() const { return verified_; }
  int64_t exhausted() const { return exhausted_; }

 private:
  SequenceId pick() {
    auto it = model_.begin();
    std::advance(it, static_cast<long>(rng_() % model_.size()));
    return it->first;
  }

  void add() {
    const SequenceId id = next_id_++;
    std::vector<TokenId> prompt;
    if (rng_() % 3 != 0) prompt = prefixes_[rng_() % prefixes_.size()];
    const int tail = 1 + static_cast<int>(rng_() % 10);
    for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<TokenId>(rng_() % 50));
    auto cached = cache_->add_sequence(id, prompt);
    ASSERT_TRUE(cached.ok()) << cached.status().to_string();
    ASSERT_LT(*cached, static_cast<int64_t>(prompt.size()));
    model_[id] = std::vector<TokenId>(prompt.begin(), prompt.begin() + *cached);
    std::vector<TokenId> rest(prompt.begin() + *cached, prompt.end());
    if (!write_tokens(id, rest)) {
      // Out of blocks for the prompt: the scheduler would preempt; we erase it.
      ASSERT_TRUE(cache_->erase(id).ok());
      model_.erase(id);
    }
  }

  // Reserves, writes and commits `tokens` after the sequence's committed tokens. False when the
  // cache is out of blocks (nothing changed).
  bool write_tokens(SequenceId id, const std::vector<TokenId>& tokens) {
    std::vector<TokenId>& model = model_[id];
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return true;
    if (static_cast<int64_t>(model.size()) + n > config_.max_sequence_length) {
      EXPECT_EQ(cache_->reserve(id, n).status().code(), StatusCode::kOutOfRange);
      return true;
    }
    auto slots = cache_->reserve(id, n);
    if (!slots.ok()) {
      EXPECT_EQ(slots.status().code(), StatusCode::kResourceExhausted)
          << slots.status().to_string();
      ++exhausted_;
      return false;
    }
    const int64_t start = static_cast<int64_t>(model.size());
    const int64_t row = config_.num_kv_heads * config_.head_dim;
    std::vector<uint16_t> k, v;  // [layers][n, heads, dim]
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const std::vector<uint16_t> lk = model_rows(config_, l, 0, tokens, start);
      const std::vector<uint16_t> lv = model_rows(config_, l, 1, tokens, start);
      k.insert(k.end(), lk.begin(), lk.end());
      v.insert(v.end(), lv.begin(), lv.end());
    }
    upload(*input_k_, k);
    upload(*input_v_, v);
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const size_t offset = static_cast<size_t>(l * n * row) * 2;
      const Status s =
          cache_->write_kv(id, l, static_cast<char*>(input_k_->data()) + offset,
                           static_cast<char*>(input_v_->data()) + offset, DType::kFloat16);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    const Status c = cache_->commit(id, tokens);
    EXPECT_TRUE(c.ok()) << c.to_string();
    model.insert(model.end(), tokens.begin(), tokens.end());
    return true;
  }

  // Blocking upload of a prefix of a device buffer; earlier kernels reading it are ordered
  // before the copy on the same stream.
  void upload(DeviceBuffer& dst, const std::vector<uint16_t>& src) {
    ASSERT_TRUE(backend_
                    ->copy_async(dst.data(), src.data(), src.size() * 2, CopyKind::kHostToDevice,
                                 cache_->compute_stream())
                    .ok());
    ASSERT_TRUE(backend_->synchronize_stream(cache_->compute_stream()).ok());
  }

  void extend(SequenceId id, int n) {
    std::vector<TokenId> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(static_cast<TokenId>(rng_() % 50));
    write_tokens(id, tokens);
  }

  void rollback(SequenceId id) {
    std::vector<TokenId>& model = model_[id];
    const int64_t length = static_cast<int64_t>(rng_() % (model.size() + 1));
    ASSERT_TRUE(cache_->rollback(id, length).ok());
    model.resize(static_cast<size_t>(length));
  }

  void fork(SequenceId parent) {
    const SequenceId child = next_id_++;
    const Status s = cache_->fork(parent, child);
    if (!s.ok()) {  // an offloaded parent cannot be forked
      ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
      return;
    }
    model_[child] = model_[parent];
  }

  void finish_or_erase(SequenceId id, bool finish) {
    ASSERT_TRUE((finish ? cache_->finish(id) : cache_->erase(id)).ok());
    model_.erase(id);
  }

  void offload(SequenceId id) {
    const Status s = cache_->offload(id);
    if (!s.ok()) {
      ASSERT_TRUE(s.code() == StatusCode::kFailedPrecondition ||
                  s.code() == StatusCode::kResourceExhausted)
          << s.to_string();
    }
  }

  void restore(SequenceId id) {
    const Status s = cache_->restore(id);
    if (!s.ok()) {
      ASSERT_TRUE(s.code() == StatusCode::kFailedPrecondition ||
                  s.code() == StatusCode::kResourceExhausted)
          << s.to_string();
    }
  }

  void set_active() {
    std::vector<SequenceId> active;
    for (const auto& [id, tokens] : model_) {
      if (rng_() % 4 == 0) active.push_back(id);
    }
    const Status s = cache_->set_active(active);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }

  void verify(SequenceId id) {
    auto residency = cache_->residency(id);
    ASSERT_TRUE(residency.ok());
    if (*residency != SequenceResidency::kDevice) {
      const Status s =
          cache_->restore(id);  // kFailedPrecondition: not offloaded (a restore in flight)
      if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) return;  // no room now
    }
    const std::vector<TokenId>& model = model_[id];
    const int64_t n = static_cast<int64_t>(model.size());
    if (n == 0) return;
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const Status s = cache_->gather_layer(id, l, out_k_->data(), out_v_->data(), DType::kFloat16,
                                            PackedLayout::kTokenMajor);
      if (s.code() == StatusCode::kFailedPrecondition) return;  // still offloaded: no room
      ASSERT_TRUE(s.ok()) << "step " << step_ << ": " << s.to_string();
      ASSERT_TRUE(cache_->synchronize().ok());
      std::vector<uint16_t> k(static_cast<size_t>(n * config_.num_kv_heads * config_.head_dim)),
          v(k.size());
      ASSERT_TRUE(
          backend_->copy_async(k.data(), out_k_->data(), k.size() * 2, CopyKind::kDeviceToHost, {})
              .ok());
      ASSERT_TRUE(
          backend_->copy_async(v.data(), out_v_->data(), v.size() * 2, CopyKind::kDeviceToHost, {})
              .ok());
      ASSERT_TRUE(backend_->synchronize_stream({}).ok());
      for (int64_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < config_.num_kv_heads; ++h)
          for (int32_t d = 0; d < config_.head_dim; ++d) {
            const size_t i =
                static_cast<size_t>((t * config_.num_kv_heads + h) * config_.head_dim + d);
            ASSERT_EQ(k[i], kv_value(t, model[static_cast<size_t>(t)], l, 0, h, d))
                << "step " << step_ << " seq " << id << " layer " << l << " pos " << t << " head "
                << h;
            ASSERT_EQ(v[i], kv_value(t, model[static_cast<size_t>(t)], l, 1, h, d))
                << "step " << step_ << " seq " << id << " layer " << l << " pos " << t;
          }
    }
    ++verified_;
  }

  void drop_evicted() {
    for (SequenceId id : cache_->drain_evicted_sequences()) {
      ASSERT_EQ(model_.count(id), 1u) << "evicted an unknown sequence " << id;
      model_.erase(id);
    }
  }

  std::mt19937_64 rng_;
  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<DeviceBuffer> input_k_, input_v_, out_k_, out_v_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<SequenceId, std::vector<TokenId>> model_;
  SequenceId next_id_ = 1;
  int64_t step_ = 0;
  int64_t verified_ = 0;
  int64_t exhausted_ = 0;
};

int64_t steps_from_env() {
  const char* s = std::getenv("PAGEDKV_E2E_STEPS");
  return s != nullptr ? std::atoll(s) : kDefaultSteps;
}

TEST(KvCacheRandomized, EveryGatheredByteMatchesTheModel) {
  for (uint64_t seed : {1u, 2u}) {
    RandomWorkload w(seed);
    w.run(steps_from_env() / 2);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_GT(w.verified(), 100) << "seed " << seed;
    RecordProperty("verified_sequences_seed" + std::to_string(seed),
                   static_cast<int>(w.verified()));
  }
}

}  // namespace
}  // namespace pagedkv
