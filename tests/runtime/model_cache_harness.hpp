// The harness of the ModelKvCache suites (model_cache_test.cpp, model_cache_random_test.cpp): a
// ModelKvCache on a backend of the test's kind, a reference of every live sequence's committed
// tokens, and the K/V of each (model layer, position, head, dim) a pure function of the token
// there (kv_model.hpp, with the model's layer index), so whatever prefix sharing, forks and
// tier moves happened, a sequence's bytes follow from its token list alone.
//
// Three read paths are checked against that reference, each returning the first problem found
// (empty when none) so that a test can also show that a changed byte is caught:
//  - gather_layer of every model layer: a window group from max(0, len - window) on, and
//    positions in blocks that fell out of the window refused with kOutOfRange;
//  - build_batch's tables: each group's rows are its block_locations, -1 where a block fell out
//    of the window, a block for every position the window needs;
//  - the device view: the reference decode attention (kernels/decode_attention.hpp) over every
//    model layer against float64 attention over the window, computed from the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/decode_attention.hpp"
#include "pagedkv/model_cache.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

/// Layers 0, 2, 4 full attention (group 0), 1, 3, 5 sliding window 64 (group 1), block 16.
inline CacheConfig two_groups(int64_t full_blocks, int64_t window_blocks) {
  CacheConfig c;
  c.num_layers = 6;
  c.block_size = 16;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2, 4};
  full.num_kv_heads = 2;
  full.head_dim = 16;
  full.num_device_blocks = full_blocks;
  KvGroup window;
  window.name = "window";
  window.layers = {1, 3, 5};
  window.num_kv_heads = 1;
  window.head_dim = 24;
  window.sliding_window = 64;
  window.num_device_blocks = window_blocks;
  c.groups = {full, window};
  return c;
}

/// The ModelKvCache fixture (see the file comment), parameterized by backend.
class ModelCacheHarness : public BackendParamTest {
 protected:
  /// Creates the cache (on a new backend of the test's kind); fails the test when it cannot.
  void make(CacheConfig config, ModelKvCacheOptions options = {}) {
    config.backend = kind();
    cache_.reset();  // before the backend it runs on
    ref_.clear();
    backend_ = make_backend(kind());
    ASSERT_NE(backend_, nullptr);
    options.cache.backend = backend_.get();
    auto c = ModelKvCache::create(config, options);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
    config_ = config;
    invariants();
  }

  /// Fails the test (and returns from it) when an invariant is broken.
  void invariants() const {
    const Status st = cache_->check_invariants();
    ASSERT_OK(st);
  }

  const CacheConfig& gconf(int32_t g) const { return cache_->group_config(g); }
  LayerGroup lg(int32_t layer) const { return *cache_->layer_group(layer); }
  bool latent(int32_t g) const { return gconf(g).kv_kind == KvKind::kLatent; }
  int64_t row_elems(int32_t g) const {
    return static_cast<int64_t>(gconf(g).num_kv_heads) * gconf(g).head_dim;
  }
  /// The first block a window group's window at `len` needs (0 without a window).
  int64_t window_first_block(int32_t g, int64_t len) const {
    const int32_t w = gconf(g).sliding_window;
    return w == 0 ? 0 : std::max<int64_t>(0, len - w) / gconf(g).block_size;
  }
  /// The first position a read of a sequence of `len` tokens in group `g` covers.
  int64_t window_begin(int32_t g, int64_t len) const {
    const int32_t w = gconf(g).sliding_window;
    return w == 0 ? 0 : std::max<int64_t>(0, len - w);
  }

  /// A refused call: `st` has `code` and a message containing `text`, `unchanged` (the
  /// fixture's snapshot after the call equals the one before), and the invariants hold.
  void expect_refusal(const Status& st, StatusCode code, const std::string& text,
                      bool unchanged) const {
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
    EXPECT_TRUE(unchanged) << "a refused call changed the cache: " << st.to_string();
    invariants();
  }

  /// The bytes of a device pool, read back after the work queued so far.
  std::vector<uint8_t> pool_bytes(const PoolRef& pool) {
    std::vector<uint8_t> bytes(static_cast<size_t>(pool.layout.block_elems() * pool.num_blocks) *
                               dtype_size(pool.dtype));
    EXPECT_OK(backend_->copy_async(bytes.data(), pool.data, bytes.size(), CopyKind::kDeviceToHost,
                                   Stream{}));
    EXPECT_OK(backend_->synchronize_stream(Stream{}));
    return bytes;
  }

  /// Copies host bytes into a new device buffer.
  std::unique_ptr<DeviceBuffer> to_device(const void* data, size_t bytes) {
    auto d = std::make_unique<DeviceBuffer>(*backend_, bytes);
    d->upload(data);
    return d;
  }

  /// Writes every model layer of `tokens` at positions start.. (reserved by the last reserve)
  /// with write_kv, keys only for a latent group.
  Status write_layers(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const CacheConfig& c = gconf(lg(layer).group);
      const std::vector<uint16_t> k = model_rows(c, layer, 0, tokens, start);
      auto dk = to_device(k.data(), k.size() * 2);
      std::unique_ptr<DeviceBuffer> dv;
      if (c.kv_kind != KvKind::kLatent) {
        const std::vector<uint16_t> v = model_rows(c, layer, 1, tokens, start);
        dv = to_device(v.data(), v.size() * 2);
      }
      const Status st =
          cache_->write_kv(id, layer, dk->data(), dv ? dv->data() : nullptr, DType::kFloat16);
      if (!st.ok()) return st;
      PAGEDKV_RETURN_IF_ERROR(cache_->synchronize());  // the staging buffers go out of scope
    }
    return ok_status();
  }

  /// Reserves, writes and commits `tokens` after the sequence's committed ones, keeping the
  /// reference in step. A failed reserve is returned (nothing committed).
  Status append(SequenceId id, const std::vector<TokenId>& tokens) {
    std::vector<TokenId>& ref = ref_[id];
    auto slots = cache_->reserve(id, static_cast<int64_t>(tokens.size()));
    if (!slots.ok()) return slots.status();
    if (static_cast<int32_t>(slots->size()) != cache_->num_groups()) {
      return internal_error("reserve returned " + std::to_string(slots->size()) + " slot lists");
    }
    PAGEDKV_RETURN_IF_ERROR(write_layers(id, tokens, static_cast<int64_t>(ref.size())));
    PAGEDKV_RETURN_IF_ERROR(cache_->commit(id, tokens));
    ref.insert(ref.end(), tokens.begin(), tokens.end());
    return ok_status();
  }

  /// Adds a sequence and appends the prompt's tokens after the hit (in one reserve); the
  /// returned hit (or error) is the add's. `appended` says whether the rest went in.
  StatusOr<int64_t> add_and_prefill(SequenceId id, const std::vector<TokenId>& prompt,
                                    Status* appended) {
    auto hit = cache_->add_sequence(id, prompt);
    if (!hit.ok()) return hit;
    ref_[id].assign(prompt.begin(), prompt.begin() + *hit);
    const std::vector<TokenId> rest(prompt.begin() + *hit, prompt.end());
    *appended = rest.empty() ? ok_status() : append(id, rest);
    return hit;
  }

  /// One decode step of `ids` through the batched calls: reserve_batch, build_batch,
  /// write_kv_batch of every model layer, commit_batch. A failed reserve_batch is returned.
  Status decode_step(const std::vector<SequenceId>& ids, const std::vector<TokenId>& next) {
    PAGEDKV_RETURN_IF_ERROR(cache_->reserve_batch(ids, 1));
    BatchOptions options;
    options.ring_window_tables = ring_tables_;
    PAGEDKV_ASSIGN_OR_RETURN(ModelBatch batch, cache_->build_batch(ids, options));
    return write_and_commit(batch, ids, next);
  }

  /// The rest of a decode step of `ids`, reserved and built into `batch`: write_kv_batch of
  /// every model layer, then commit_batch of `next`, keeping the reference in step.
  Status write_and_commit(const ModelBatch& batch, const std::vector<SequenceId>& ids,
                          const std::vector<TokenId>& next) {
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const int32_t g = lg(layer).group;
      const int64_t row = row_elems(g);
      std::vector<uint16_t> k(ids.size() * static_cast<size_t>(row)), v(k.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t pos = static_cast<int64_t>(ref_[ids[i]].size());
        const auto kr = model_rows(gconf(g), layer, 0, {next[i]}, pos);
        const auto vr = model_rows(gconf(g), layer, 1, {next[i]}, pos);
        std::copy(kr.begin(), kr.end(), k.begin() + static_cast<int64_t>(i) * row);
        std::copy(vr.begin(), vr.end(), v.begin() + static_cast<int64_t>(i) * row);
      }
      auto dk = to_device(k.data(), k.size() * 2);
      auto dv = to_device(v.data(), v.size() * 2);
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv_batch(
          batch, layer, dk->data(), latent(g) ? nullptr : dv->data(), DType::kFloat16));
      PAGEDKV_RETURN_IF_ERROR(cache_->synchronize());
    }
    PAGEDKV_RETURN_IF_ERROR(cache_->commit_batch(ids, next));
    for (size_t i = 0; i < ids.size(); ++i) ref_[ids[i]].push_back(next[i]);
    return ok_status();
  }

  /// Sequences dropped since the last call leave the reference; checks they left the cache.
  int64_t drain() {
    const std::vector<SequenceId> dropped = cache_->drain_evicted_sequences();
    for (SequenceId id : dropped) {
      EXPECT_EQ(ref_.erase(id), 1u) << "dropped sequence " << id << " was not live";
      EXPECT_FALSE(cache_->contains(id));
    }
    return static_cast<int64_t>(dropped.size());
  }

  /// Every live sequence in the cache with the reference's length and nothing reserved.
  std::string check_lengths() const {
    if (cache_->stats().sequences != static_cast<int64_t>(ref_.size())) {
      return "the cache holds " + std::to_string(cache_->stats().sequences) +
             " sequences, the reference " + std::to_string(ref_.size());
    }
    for (const auto& [id, tokens] : ref_) {
      const auto len = cache_->length(id);
      const auto pend = cache_->pending(id);
      if (!len.ok() || *len != static_cast<int64_t>(tokens.size()) || !pend.ok() || *pend != 0) {
        return "sequence " + std::to_string(id) + ": length " +
               (len.ok() ? std::to_string(*len) : len.status().to_string()) + " pending " +
               (pend.ok() ? std::to_string(*pend) : pend.status().to_string()) + ", reference " +
               std::to_string(tokens.size());
      }
    }
    return "";
  }

  /// gather_layer of every model layer of `id` (device-resident) against the reference; for
  /// a window group only the window, and positions in blocks it released give kOutOfRange.
  std::string check_gather(SequenceId id, int64_t* bytes_checked = nullptr) {
    const std::vector<TokenId>& tokens = ref_.at(id);
    const int64_t len = static_cast<int64_t>(tokens.size());
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const int32_t g = lg(layer).group;
      const CacheConfig& c = gconf(g);
      const int64_t begin = window_begin(g, len);
      const int64_t n = len - begin;
      const int32_t heads = c.num_kv_heads, dim = c.head_dim;
      const PackedLayout packed =
          (id + layer) % 2 == 0 ? PackedLayout::kTokenMajor : PackedLayout::kHeadMajor;
      const size_t elems = static_cast<size_t>(n * heads * dim);
      const std::vector<uint16_t> poison(elems + 4, 0xBEEF);
      DeviceBuffer k(*backend_, poison.size() * 2), v(*backend_, poison.size() * 2);
      k.upload(poison);
      v.upload(poison);
      const std::string where = "seq " + std::to_string(id) + " layer " + std::to_string(layer);
      const Status st = cache_->gather_layer(id, layer, k.data(), latent(g) ? nullptr : v.data(),
                                             DType::kFloat16, packed, begin);
      if (!st.ok()) return where + ": gather from " + std::to_string(begin) + ": " + st.to_string();
      if (!cache_->synchronize().ok()) return "synchronize failed";
      const std::vector<uint16_t> gk = k.download<uint16_t>(), gv = v.download<uint16_t>();
      for (int32_t part = 0; part < (latent(g) ? 1 : 2); ++part) {
        const std::vector<uint16_t>& got = part == 0 ? gk : gv;
        for (int64_t t = 0; t < n; ++t) {
          for (int32_t h = 0; h < heads; ++h) {
            for (int32_t d = 0; d < dim; ++d) {
              const int64_t at = packed == PackedLayout::kTokenMajor
                                     ? (t * heads + h) * dim + d
                                     : (static_cast<int64_t>(h) * n + t) * dim + d;
              const int64_t pos = begin + t;
              const uint16_t want =
                  kv_value(pos, tokens[static_cast<size_t>(pos)], layer, part, h, d);
              if (got[static_cast<size_t>(at)] != want) {
                return where + (part == 0 ? " key" : " value") + " position " +
                       std::to_string(pos) + " head " + std::to_string(h) + " dim " +
                       std::to_string(d) + ": got " + std::to_string(got[size_t(at)]) + ", want " +
                       std::to_string(want);
              }
            }
          }
        }
        for (size_t i = elems; i < poison.size(); ++i) {
          if (got[i] != 0xBEEF) return where + ": gather wrote past its tokens";
        }
      }
      if (bytes_checked != nullptr) *bytes_checked += static_cast<int64_t>(elems) * 2;
      // Positions in blocks the window group released are refused, not read.
      auto blocks = cache_->block_locations(id, g);
      if (!blocks.ok()) return where + ": " + blocks.status().to_string();
      int64_t first_live = 0;
      while (first_live < static_cast<int64_t>(blocks->size()) &&
             (*blocks)[static_cast<size_t>(first_live)].block < 0) {
        ++first_live;
      }
      if (first_live > window_first_block(g, len)) {
        return where + ": the window needs block " + std::to_string(window_first_block(g, len)) +
               ", the group holds from " + std::to_string(first_live);
      }
      if (c.sliding_window == 0 && first_live != 0) return where + ": a full group lost a block";
      if (first_live > 0) {
        for (int64_t pos : {int64_t{0}, first_live * c.block_size - 1}) {
          const Status o = cache_->gather_layer(id, layer, k.data(), latent(g) ? nullptr : v.data(),
                                                DType::kFloat16, packed, pos, 1);
          if (o.code() != StatusCode::kOutOfRange) {
            return where + ": gather of released position " + std::to_string(pos) + " gave " +
                   o.to_string();
          }
          ++out_of_range_checks_;
        }
      }
    }
    return "";
  }

  /// build_batch of `ids` (device-resident, nothing reserved): each group's tables against its
  /// block_locations, then the reference decode attention over every model layer through
  /// device_view against float64 attention over the reference's window.
  std::string check_view(const std::vector<SequenceId>& ids, bool csr, std::mt19937_64& rng) {
    BatchOptions bo;
    bo.build_csr = csr;
    bo.ring_window_tables = ring_tables_;
    auto batch = cache_->build_batch(ids, bo);
    if (!batch.ok()) return "build_batch: " + batch.status().to_string();
    if (static_cast<int32_t>(batch->groups.size()) != cache_->num_groups()) {
      return "build_batch: " + std::to_string(batch->groups.size()) + " groups";
    }
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      const BatchMetadata& m = *batch->groups[static_cast<size_t>(g)].host;
      const int32_t bs = gconf(g).block_size;
      for (size_t r = 0; r < ids.size(); ++r) {
        const int64_t len = static_cast<int64_t>(ref_.at(ids[r]).size());
        const std::string where = "group " + std::to_string(g) + " seq " + std::to_string(ids[r]);
        if (m.seq_lens[r] != len) return where + ": seq_len " + std::to_string(m.seq_lens[r]);
        auto blocks = cache_->block_locations(ids[r], g);
        if (!blocks.ok()) return where + ": " + blocks.status().to_string();
        const int64_t nb = (len + bs - 1) / bs;
        const bool ring =
            ring_tables_ && gconf(g).sliding_window > 0 && g != cache_->cache().full_group();
        if (m.ring_table != ring) return where + ": ring_table is " + std::to_string(m.ring_table);
        if (ring) {
          // Each held block in column i % width, every other column -1; the CSR in block order.
          std::vector<int32_t> want(static_cast<size_t>(m.max_blocks), -1);
          for (int64_t i = 0; i < nb; ++i) {
            const int32_t b = (*blocks)[static_cast<size_t>(i)].block;
            if (i >= window_first_block(g, len) && b < 0) return where + ": a hole in the window";
            if (b >= 0) want[static_cast<size_t>(i % m.max_blocks)] = b;
            if (csr && m.indices[size_t(m.indptr[r]) + size_t(i)] != b) {
              return where + ": CSR index " + std::to_string(i) + " is not the block";
            }
          }
          const int32_t* row = &m.block_tables[r * static_cast<size_t>(m.max_blocks)];
          if (std::vector<int32_t>(row, row + m.max_blocks) != want) {
            return where + ": the ring row is not the held blocks in their columns";
          }
          if (csr && m.indptr[r + 1] - m.indptr[r] != nb) return where + ": CSR row length";
          ++ring_rows_checked_;
          continue;
        }
        for (int64_t i = 0; i < m.max_blocks; ++i) {
          const int32_t got = m.block_tables[r * static_cast<size_t>(m.max_blocks) + size_t(i)];
          const int32_t want = i < nb ? (*blocks)[static_cast<size_t>(i)].block : -1;
          if (got != want) {
            return where + ": block table entry " + std::to_string(i) + " is " +
                   std::to_string(got) + ", want " + std::to_string(want);
          }
          if (i < nb && i >= window_first_block(g, len) && got < 0) {
            return where + ": no block for logical block " + std::to_string(i) + " in its window";
          }
          if (csr && i < nb && m.indices[size_t(m.indptr[r]) + size_t(i)] != want) {
            return where + ": CSR index " + std::to_string(i) + " differs from the table";
          }
        }
        if (csr && m.indptr[r + 1] - m.indptr[r] != nb) return where + ": CSR row length";
      }
    }
    // Attention through each group's view, one layer at a time.
    std::uniform_real_distribution<float> qd(-1.0f, 1.0f);
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const int32_t g = lg(layer).group;
      const CacheConfig& c = gconf(g);
      auto view = cache_->device_view(*batch, g);
      if (!view.ok()) return "device_view: " + view.status().to_string();
      if (view->sliding_window != c.sliding_window) return "device_view: wrong window";
      if (view->ring_table != (!csr && batch->groups[size_t(g)].host->ring_table)) {
        return "device_view: ring_table not the batch's";
      }
      const int32_t heads = c.num_kv_heads, dim = c.head_dim;
      const int32_t q_heads = heads * 2;
      const size_t n = ids.size();
      std::vector<float> q(n * static_cast<size_t>(q_heads * dim));
      for (float& x : q) x = qd(rng);
      auto dq = to_device(q.data(), q.size() * 4);
      const std::vector<float> poison(q.size(), std::nanf(""));
      auto dout = to_device(poison.data(), poison.size() * 4);
      kernels::DecodeAttentionBody body;
      body.view = *view;
      body.q = dq->data();
      body.q_dtype = DType::kFloat32;
      body.out = static_cast<float*>(dout->data());
      body.num_q_heads = q_heads;
      body.layer = lg(layer).layer;
      body.sm_scale = 1.0f / std::sqrt(static_cast<float>(dim));
      const KernelLaunch launch{KernelId::kDecodeAttention, &body, sizeof(body),
                                static_cast<int64_t>(n) * q_heads};
      const Stream stream = cache_->compute_stream();
      Status st = backend_->launch(launch, stream);
      if (st.ok()) st = backend_->synchronize_stream(stream);
      if (!st.ok()) return "decode attention: " + st.to_string();
      const std::vector<float> out = dout->download<float>();
      const int32_t v_dim = latent(g) ? c.head_dim - c.rope_dim : dim;
      for (size_t r = 0; r < n; ++r) {
        const std::vector<TokenId>& tokens = ref_.at(ids[r]);
        const int64_t len = static_cast<int64_t>(tokens.size());
        const int64_t first = window_begin(g, len);
        for (int32_t qh = 0; qh < q_heads; ++qh) {
          const int32_t kvh = qh / (q_heads / heads);
          const float* qv = &q[(r * static_cast<size_t>(q_heads) + size_t(qh)) * size_t(dim)];
          std::vector<double> scores;
          double max_s = -1e300;
          for (int64_t p = first; p < len; ++p) {
            double dot = 0;
            for (int32_t d = 0; d < dim; ++d) {
              dot += double(qv[d]) *
                     half_bits_to_float(kv_value(p, tokens[size_t(p)], layer, 0, kvh, d));
            }
            scores.push_back(dot * body.sm_scale);
            max_s = std::max(max_s, scores.back());
          }
          double denom = 0;
          for (double& s : scores) denom += (s = std::exp(s - max_s));
          for (int32_t d = 0; d < dim; ++d) {
            double want = 0;
            if (d < v_dim && !scores.empty()) {
              for (int64_t p = first; p < len; ++p) {
                const int32_t part = latent(g) ? 0 : 1;
                want += scores[size_t(p - first)] *
                        half_bits_to_float(kv_value(p, tokens[size_t(p)], layer, part, kvh, d));
              }
              want /= denom;
            }
            const float got = out[(r * size_t(q_heads) + size_t(qh)) * size_t(dim) + size_t(d)];
            if (!(std::fabs(got - want) <= 2e-3 * (1.0 + std::fabs(want)))) {
              return "attention seq " + std::to_string(ids[r]) + " layer " + std::to_string(layer) +
                     " q head " + std::to_string(qh) + " dim " + std::to_string(d) + ": got " +
                     std::to_string(got) + ", want " + std::to_string(want) + " (window from " +
                     std::to_string(first) + ")";
            }
          }
        }
      }
      ++attention_checks_;
    }
    return "";
  }

  /// The longest h the cache can share of `prompt` now (cached_prefix at bound h is h), by
  /// brute force over every length: what add_sequence must return.
  int64_t agreed_by_brute_force(const std::vector<TokenId>& prompt) const {
    for (int64_t h = static_cast<int64_t>(prompt.size()); h > 0; --h) {
      auto c = cache_->cache().cached_prefix(prompt, 0, h);
      if (c.ok() && *c == h) return h;
    }
    return 0;
  }

  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelKvCache> cache_;
  std::map<SequenceId, std::vector<TokenId>> ref_;  // committed tokens of each live sequence
  int64_t out_of_range_checks_ = 0;
  int64_t attention_checks_ = 0;
  // Every build_batch of the harness builds the window groups' tables as rings
  // (BatchOptions::ring_window_tables).
  bool ring_tables_ = false;
  int64_t ring_rows_checked_ = 0;
};

}  // namespace pagedkv::testing
