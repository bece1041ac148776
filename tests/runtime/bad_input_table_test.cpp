// The bad-input table: every public entry point of KvCache, the data-plane ops and the config,
// fed one bad input per row. Each row must fail with the expected code and a message naming the
// problem, and leave the cache exactly as it was: stats, each sequence's length, pending count,
// block locations and residency, the gathered bytes of every device-resident sequence and the
// raw bytes of the device pool.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/ops.hpp"
#include "pagedkv/seed_cache.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::model_rows;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();

// Sequences of the fixture: 1 and 2 written (2 active), 3 written then offloaded, 4 written with
// two more tokens reserved (pending), 5 added then erased.
constexpr SequenceId kSeqA = 1, kSeqActive = 2, kSeqOffloaded = 3, kSeqPending = 4;
constexpr SequenceId kSeqErased = 5, kSeqUnknown = 99;
const std::vector<SequenceId> kLiveIds = {kSeqA, kSeqActive, kSeqOffloaded, kSeqPending};

CacheConfig table_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 3;
  c.head_dim = 32;
  c.block_size = 4;
  c.num_device_blocks = 16;
  c.num_host_blocks = 16;
  c.dtype = DType::kFloat16;
  c.max_sequence_length = 64;
  c.backend = BackendKind::kCpu;
  return c;
}

std::vector<TokenId> tokens_from(int n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// Everything a row may not change.
struct Snapshot {
  ControlStats stats;  // every field (operator== from PAGEDKV_CONTROL_STATS_FIELDS)
  std::vector<int64_t> lengths, pendings;
  std::vector<std::vector<BlockLocation>> locations;
  std::vector<int> residencies;
  std::vector<std::vector<uint16_t>> gathered;  // per device-resident sequence and layer, K then V
  std::vector<uint8_t> device_pool;
  std::vector<SequenceId> contained;
};

// The prepared cache and the buffers rows pass to it. Buffers hold real K/V and slot/block ids of
// sequence 1, so an op that wrongly accepted a bad row would change the pool.
struct Ctx {
  CacheConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<DeviceBuffer> key, value;  // kMaxTokens rows of fp16, model data
  std::unique_ptr<DeviceBuffer> slots;       // int64 slots of sequence 1's first tokens
  std::unique_ptr<DeviceBuffer> table;       // int32 block ids of sequence 1
  std::unique_ptr<DeviceBuffer> indptr;      // int32 {0, 6}
  std::unique_ptr<DeviceBuffer> pairs;       // int32 {block of seq 1, block of seq 2}
  static constexpr int64_t kMaxTokens = 16;

  // Drops buffers, then the cache, then the backend they live on.
  void reset() {
    pairs.reset();
    indptr.reset();
    table.reset();
    slots.reset();
    value.reset();
    key.reset();
    cache.reset();
    backend.reset();
  }
  ~Ctx() { reset(); }

  PoolRef pool() const { return cache->device_pool(); }
  Stream stream() const { return cache->compute_stream(); }
  Backend& be() { return *backend; }
  // A misaligned (odd) address inside a real buffer.
  static void* odd(const std::unique_ptr<DeviceBuffer>& b) {
    return static_cast<char*>(b->data()) + 1;
  }

  WriteKvArgs write_args() const {
    WriteKvArgs a;
    a.key = key->data();
    a.value = value->data();
    a.num_tokens = 4;
    a.slot_mapping = static_cast<const int64_t*>(slots->data());
    return a;
  }
  WriteKvAllLayersArgs all_layers_args() const {
    WriteKvAllLayersArgs a;
    a.key = key->data();
    a.value = value->data();
    a.num_tokens = 4;
    a.slot_mapping = static_cast<const int64_t*>(slots->data());
    return a;
  }
  PackedLayerArgs layer_args() const {
    PackedLayerArgs a;
    a.key = key->data();
    a.value = value->data();
    a.block_table = static_cast<const int32_t*>(table->data());
    a.block_table_len = 2;
    a.num_tokens = 6;
    return a;
  }
  PackedBatchArgs batch_args() const {
    PackedBatchArgs a;
    a.key = key->data();
    a.value = value->data();
    a.block_tables = static_cast<const int32_t*>(table->data());
    a.max_blocks_per_seq = 2;
    a.indptr = static_cast<const int32_t*>(indptr->data());
    a.batch_size = 1;
    a.total_tokens = 6;
    return a;
  }
  ScatterHeadRangeArgs scatter_args() const {
    ScatterHeadRangeArgs a;
    a.key = key->data();
    a.value = value->data();
    a.block_table = static_cast<const int32_t*>(table->data());
    a.block_table_len = 2;
    a.num_heads = 3;
    a.num_tokens = 6;
    return a;
  }
  Status gather(SequenceId id, int32_t layer = 0, void* k = nullptr, void* v = nullptr,
                DType dtype = DType::kFloat16, PackedLayout layout = PackedLayout::kHeadMajor,
                int64_t begin = 0, int64_t n = -1) {
    return cache->gather_layer(id, layer, k == nullptr ? key->data() : k,
                               v == nullptr ? value->data() : v, dtype, layout, begin, n);
  }
};

struct Row {
  const char* name;
  std::function<Status(Ctx&)> call;
  StatusCode code;
  const char* message;
};

// A creation that must fail; the cache it would make is destroyed at once.
Status create_status(const CacheConfig& config, const CpuBackendOptions& options) {
  auto backend = create_cpu_backend(options);
  KvCacheOptions o;
  o.backend = backend.get();
  return KvCache::create(config, o).status();
}

// A pool view of the cache's own bytes with a huge layout (one block of up to 2^42 bytes), for
// rows whose linear-side extent only overflows with such a shape. Validation must reject the row
// before any launch: an op that accepted it would write past the real pool.
PoolRef huge_pool(const Ctx& c, int32_t num_kv_heads, int32_t head_dim, int32_t block_size) {
  PoolRef p = c.pool();
  p.layout.num_layers = 1;
  p.layout.num_kv_heads = num_kv_heads;
  p.layout.head_dim = head_dim;
  p.layout.block_size = block_size;
  p.num_blocks = 1;
  return p;
}

// Everything a SeedKvCache row may not change: each sequence's length, both parts of every
// layer as ONNX arrays, and the figures of stats().
std::vector<int64_t> seed_snapshot(SeedKvCache& cache, const std::vector<SequenceId>& ids,
                                   std::vector<std::vector<uint16_t>>* bytes) {
  const SeedKvCacheStats st = cache.stats();
  std::vector<int64_t> out = {st.bytes_used,        st.bytes_capacity,      st.blocks_total,
                              st.blocks_free,       st.sequences,           st.evicted_blocks,
                              st.evicted_sequences, st.cpu_offloaded_blocks};
  for (SequenceId id : ids) {
    auto len = cache.sequence_length(id);
    out.push_back(len.ok() ? *len : -1);
    for (int32_t layer = 0; layer < cache.config().num_layers; ++layer) {
      auto onnx = cache.get_layer_as_onnx(id, layer);
      if (!onnx.ok()) {
        out.push_back(-2);
        continue;
      }
      bytes->push_back(onnx->key);
      bytes->push_back(onnx->value);
    }
  }
  return out;
}

// A SeedKvCache row: a cache of `mode` whose sequence 1 holds 5 advanced positions (and, paged,
// 2 more written, not advanced), fed `call`. Returns the call's status, or kInternal when the
// call changed the cache: the table then reports a wrong code.
Status seed_row(CacheMode mode, const std::function<Status(SeedKvCache&)>& call) {
  CacheConfig config = table_config();
  config.mode = mode;
  config.dense_initial_length = 8;
  auto created = SeedKvCache::create(config);
  if (!created.ok()) return created.status();
  SeedKvCache& cache = **created;
  const int64_t row = int64_t{config.num_kv_heads} * config.head_dim;
  PAGEDKV_RETURN_IF_ERROR(cache.allocate_sequence(1, tokens_from(5, 10)).status());
  for (int64_t pos = 0; pos < 7; ++pos) {
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      std::vector<uint16_t> k(static_cast<size_t>(row)), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = static_cast<uint16_t>(0x3000 + (pos * 131 + layer * 17 + i) % 2048);
        v[i] = static_cast<uint16_t>(0x3400 + (pos * 71 + layer * 29 + i) % 2048);
      }
      PAGEDKV_RETURN_IF_ERROR(cache.append_token(1, layer, pos, k, v, TokenId{10} + pos));
    }
    if (pos < 5) PAGEDKV_RETURN_IF_ERROR(cache.advance_sequence(1));
  }
  std::vector<std::vector<uint16_t>> bytes_before, bytes_after;
  const std::vector<int64_t> before = seed_snapshot(cache, {1}, &bytes_before);
  const Status s = call(cache);
  const std::vector<int64_t> after = seed_snapshot(cache, {1}, &bytes_after);
  if (before != after || bytes_before != bytes_after) {
    return internal_error("the failed call changed the SeedKvCache (" + s.to_string() + ")");
  }
  return s;
}

class BadInputTableTest : public ::testing::Test {
 protected:
  // Reserves, writes every layer and commits `tokens` at positions start.. of `id`.
  void append(SequenceId id, const std::vector<TokenId>& tokens, int64_t start, bool commit) {
    auto slots = ctx_.cache->reserve(id, static_cast<int64_t>(tokens.size()));
    ASSERT_OK(slots);
    for (int32_t layer = 0; layer < ctx_.config.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(ctx_.config, layer, 0, tokens, start);
      const std::vector<uint16_t> v = model_rows(ctx_.config, layer, 1, tokens, start);
      DeviceBuffer dk(*ctx_.backend, k.size() * 2), dv(*ctx_.backend, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      ASSERT_OK(ctx_.cache->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
      ASSERT_OK(ctx_.cache->synchronize());
    }
    if (commit) {
      ASSERT_OK(ctx_.cache->commit(id, tokens));
    }
  }

  void prepare() {
    ctx_.reset();
    ctx_.config = table_config();
    ctx_.backend = create_cpu_backend();
    KvCacheOptions o;
    o.backend = ctx_.backend.get();
    auto c = KvCache::create(ctx_.config, o);
    ASSERT_OK(c);
    ctx_.cache = std::move(c).value();
    KvCache& cache = *ctx_.cache;

    const std::vector<TokenId> a = tokens_from(6, 100), b = tokens_from(5, 200),
                               c3 = tokens_from(7, 300), d = tokens_from(4, 400),
                               e = tokens_from(3, 500);
    ASSERT_OK(cache.add_sequence(kSeqA, a));
    append(kSeqA, a, 0, true);
    ASSERT_OK(cache.add_sequence(kSeqActive, b));
    append(kSeqActive, b, 0, true);
    ASSERT_OK(cache.add_sequence(kSeqOffloaded, c3));
    append(kSeqOffloaded, c3, 0, true);
    ASSERT_OK(cache.add_sequence(kSeqPending, d));
    append(kSeqPending, d, 0, true);
    append(kSeqPending, {450, 451}, 4, /*commit=*/false);
    ASSERT_OK(cache.add_sequence(kSeqErased, e));
    append(kSeqErased, e, 0, true);
    ASSERT_OK(cache.erase(kSeqErased));
    ASSERT_OK(cache.set_active({kSeqActive}));
    ASSERT_OK(cache.offload(kSeqOffloaded));
    ASSERT_OK(cache.synchronize());
    auto r = cache.residency(kSeqOffloaded);
    ASSERT_OK(r);
    ASSERT_EQ(*r, SequenceResidency::kHost);
    ASSERT_EQ(*cache.pending(kSeqPending), 2);

    // Row buffers with real data: model K/V, sequence 1's slots and blocks.
    Backend& be = *ctx_.backend;
    const size_t row_elems = static_cast<size_t>(ctx_.config.num_kv_heads * ctx_.config.head_dim);
    const std::vector<uint16_t> kv = model_rows(ctx_.config, 0, 0, tokens_from(16, 900), 0);
    ctx_.key = std::make_unique<DeviceBuffer>(be, Ctx::kMaxTokens * row_elems * 2);
    ctx_.value = std::make_unique<DeviceBuffer>(be, Ctx::kMaxTokens * row_elems * 2);
    ctx_.key->upload(kv);
    ctx_.value->upload(kv);
    auto locs = cache.block_locations(kSeqA);
    ASSERT_OK(locs);
    std::vector<int32_t> table;
    for (const BlockLocation& l : *locs) table.push_back(l.block);
    ASSERT_EQ(table.size(), 2u);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < Ctx::kMaxTokens; ++t) {
      slots.push_back(static_cast<int64_t>(table[static_cast<size_t>(t / 4) % 2]) * 4 + t % 4);
    }
    ctx_.slots = std::make_unique<DeviceBuffer>(be, slots.size() * 8);
    ctx_.slots->upload(slots);
    ctx_.table = std::make_unique<DeviceBuffer>(be, table.size() * 4);
    ctx_.table->upload(table);
    ctx_.indptr = std::make_unique<DeviceBuffer>(be, 2 * 4);
    ctx_.indptr->upload(std::vector<int32_t>{0, 6});
    auto locs_b = cache.block_locations(kSeqActive);
    ASSERT_OK(locs_b);
    ctx_.pairs = std::make_unique<DeviceBuffer>(be, 2 * 4);
    ctx_.pairs->upload(std::vector<int32_t>{table[0], (*locs_b)[0].block});
    ASSERT_OK(cache.check_invariants());
  }

  // A cache with no host tier holding the live ids in the states offload must refuse without a
  // host tier: 1 with blocks of its own, 2 a fork of 1 (every block shared), 3 empty (no blocks
  // at all), 4 with two reserved tokens pending.
  void prepare_without_host_tier() {
    ctx_.reset();
    ctx_.config = table_config();
    ctx_.config.num_host_blocks = 0;
    ctx_.backend = create_cpu_backend();
    KvCacheOptions o;
    o.backend = ctx_.backend.get();
    auto c = KvCache::create(ctx_.config, o);
    ASSERT_OK(c);
    ctx_.cache = std::move(c).value();
    KvCache& cache = *ctx_.cache;
    const std::vector<TokenId> a = tokens_from(6, 100), d = tokens_from(4, 400);
    ASSERT_OK(cache.add_sequence(kSeqA, a));
    append(kSeqA, a, 0, true);
    ASSERT_OK(cache.fork(kSeqA, kSeqActive));
    ASSERT_OK(cache.add_sequence(kSeqOffloaded, {}));
    ASSERT_OK(cache.add_sequence(kSeqPending, d));
    append(kSeqPending, d, 0, true);
    append(kSeqPending, {450, 451}, 4, /*commit=*/false);
    ASSERT_OK(cache.synchronize());
    const size_t row_bytes =
        static_cast<size_t>(ctx_.config.num_kv_heads * ctx_.config.head_dim) * 2;
    ctx_.key = std::make_unique<DeviceBuffer>(*ctx_.backend, Ctx::kMaxTokens * row_bytes);
    ctx_.value = std::make_unique<DeviceBuffer>(*ctx_.backend, Ctx::kMaxTokens * row_bytes);
    ASSERT_OK(cache.check_invariants());
  }

  Snapshot snapshot() {
    Snapshot s;
    KvCache& cache = *ctx_.cache;
    EXPECT_OK(cache.synchronize());
    s.stats = cache.stats();
    for (SequenceId id : {kSeqA, kSeqActive, kSeqOffloaded, kSeqPending, kSeqErased, kSeqUnknown}) {
      if (cache.contains(id)) s.contained.push_back(id);
    }
    for (SequenceId id : kLiveIds) {
      auto len = cache.length(id);
      auto pend = cache.pending(id);
      auto locs = cache.block_locations(id);
      auto res = cache.residency(id);
      EXPECT_OK(len) << "sequence " << id;
      EXPECT_OK(pend) << "sequence " << id;
      EXPECT_OK(locs) << "sequence " << id;
      EXPECT_OK(res) << "sequence " << id;
      if (!(len.ok() && pend.ok() && locs.ok() && res.ok())) continue;
      s.lengths.push_back(*len);
      s.pendings.push_back(*pend);
      s.locations.push_back(*locs);
      s.residencies.push_back(static_cast<int>(*res));
      if (*res != SequenceResidency::kDevice) continue;
      const size_t elems =
          static_cast<size_t>(*len * ctx_.config.num_kv_heads * ctx_.config.head_dim);
      for (int32_t layer = 0; layer < ctx_.config.num_layers; ++layer) {
        DeviceBuffer k(*ctx_.backend, elems * 2), v(*ctx_.backend, elems * 2);
        const Status g = cache.gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                            PackedLayout::kTokenMajor);
        EXPECT_OK(g);
        EXPECT_OK(cache.synchronize());
        s.gathered.push_back(k.download<uint16_t>());
        s.gathered.push_back(v.download<uint16_t>());
      }
    }
    const PoolRef pool = cache.device_pool();
    s.device_pool.resize(static_cast<size_t>(cache.pool_info().device_bytes));
    Backend& be = *ctx_.backend;
    EXPECT_OK(be.copy_async(s.device_pool.data(), pool.data, s.device_pool.size(),
                            CopyKind::kDeviceToHost, Stream{}));
    EXPECT_OK(be.synchronize_stream(Stream{}));
    EXPECT_OK(cache.check_invariants());
    return s;
  }

  void expect_same(const Snapshot& a, const Snapshot& b) {
    EXPECT_TRUE(a.stats == b.stats) << "stats changed: " << testing::stats_diff(a.stats, b.stats);
    EXPECT_EQ(a.contained, b.contained) << "set of sequences changed";
    EXPECT_EQ(a.lengths, b.lengths) << "a length changed";
    EXPECT_EQ(a.pendings, b.pendings) << "a pending count changed";
    EXPECT_TRUE(a.locations == b.locations) << "block locations changed";
    EXPECT_EQ(a.residencies, b.residencies) << "a residency changed";
    EXPECT_TRUE(a.gathered == b.gathered) << "gathered bytes changed";
    EXPECT_TRUE(a.device_pool == b.device_pool) << "device pool bytes changed";
  }

  Ctx ctx_;
};

std::vector<Row> rows() {
  using S = StatusCode;
  const DType kBadDType = static_cast<DType>(97);
  std::vector<Row> r = {
      // ---- KvCache: ids ----
      {"add_sequence duplicate id",
       [](Ctx& c) {
         return c.cache->add_sequence(kSeqA, {1, 2}).status();
       },
       S::kAlreadyExists, "already exists"},
      {"add_sequence prompt past max_sequence_length",
       [](Ctx& c) { return c.cache->add_sequence(50, tokens_from(65, 1)).status(); },
       S::kOutOfRange, "max_sequence_length"},
      {"add_sequence retention_priority out of range",
       [](Ctx& c) {
         SequenceOptions o;
         o.retention_priority = 101;
         return c.cache->add_sequence(50, {1, 2}, o).status();
       },
       S::kInvalidArgument, "retention_priority"},
      {"add_sequence negative retention_duration",
       [](Ctx& c) {
         SequenceOptions o;
         o.retention_duration_ns = -1;
         return c.cache->add_sequence(50, {1, 2}, o).status();
       },
       S::kInvalidArgument, "retention_duration_ns"},
      {"reserve unknown id", [](Ctx& c) { return c.cache->reserve(kSeqUnknown, 1).status(); },
       S::kNotFound, "does not exist"},
      {"reserve erased id", [](Ctx& c) { return c.cache->reserve(kSeqErased, 1).status(); },
       S::kNotFound, "does not exist"},
      {"reserve negative n", [](Ctx& c) { return c.cache->reserve(kSeqA, -1).status(); },
       S::kInvalidArgument, "n must be >= 0"},
      {"reserve past max_sequence_length",
       [](Ctx& c) { return c.cache->reserve(kSeqA, 59).status(); }, S::kOutOfRange,
       "max_sequence_length"},
      {"reserve int64 max tokens",
       [](Ctx& c) { return c.cache->reserve(kSeqA, kInt64Max).status(); }, S::kOutOfRange,
       "max_sequence_length"},
      // ---- KvCache::write_kv ----
      {"write_kv unknown id",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqUnknown, 0, c.key->data(), c.value->data(), DType::kFloat16);
       },
       S::kNotFound, "does not exist"},
      {"write_kv erased id",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqErased, 0, c.key->data(), c.value->data(), DType::kFloat16);
       },
       S::kNotFound, "does not exist"},
      {"write_kv before reserve",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqA, 0, c.key->data(), c.value->data(), DType::kFloat16);
       },
       S::kFailedPrecondition, "nothing reserved"},
      {"write_kv of an offloaded sequence",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqOffloaded, 0, c.key->data(), c.value->data(),
                                  DType::kFloat16);
       },
       S::kFailedPrecondition, "nothing reserved"},
      {"write_kv layer past num_layers",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 2, c.key->data(), c.value->data(), DType::kFloat16);
       },
       S::kOutOfRange, "layer 2"},
      {"write_kv negative layer",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, -1, c.key->data(), c.value->data(), DType::kFloat16);
       },
       S::kOutOfRange, "layer -1"},
      {"write_kv null key",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, nullptr, c.value->data(), DType::kFloat16);
       },
       S::kInvalidArgument, "key: null"},
      {"write_kv null value",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), nullptr, DType::kFloat16);
       },
       S::kInvalidArgument, "value: null"},
      {"write_kv misaligned key",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, Ctx::odd(c.key), c.value->data(),
                                  DType::kFloat16);
       },
       S::kInvalidArgument, "key: pointer not aligned"},
      {"write_kv fp8 input into an fp16 pool",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(),
                                  DType::kFloat8E4M3);
       },
       S::kInvalidArgument, "input_dtype: fp8"},
      {"write_kv unknown dtype",
       [kBadDType](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(), kBadDType);
       },
       S::kInvalidArgument, "input_dtype: unknown dtype"},
      {"write_kv row_stride shorter than a row",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(), DType::kFloat16,
                                  10);
       },
       S::kInvalidArgument, "row_stride"},
      {"write_kv negative row_stride",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(), DType::kFloat16,
                                  -96);
       },
       S::kInvalidArgument, "row_stride"},
      {"write_kv int64 max row_stride",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(), DType::kFloat16,
                                  kInt64Max);
       },
       S::kInvalidArgument, "row_stride"},
      {"write_kv row_stride past 64-bit byte offsets",
       [](Ctx& c) {
         return c.cache->write_kv(kSeqPending, 0, c.key->data(), c.value->data(), DType::kFloat16,
                                  kInt64Max / 2);
       },
       S::kInvalidArgument, "row_stride"},
      // ---- commit / rollback / fork / finish / erase ----
      {"commit more than reserved",
       [](Ctx& c) {
         return c.cache->commit(kSeqPending, {1, 2, 3});
       },
       S::kFailedPrecondition, "only"},
      {"commit with nothing reserved", [](Ctx& c) { return c.cache->commit(kSeqA, {1}); },
       S::kFailedPrecondition, "only"},
      {"commit unknown id", [](Ctx& c) { return c.cache->commit(kSeqUnknown, {1}); }, S::kNotFound,
       "does not exist"},
      {"rollback past length", [](Ctx& c) { return c.cache->rollback(kSeqA, 7); }, S::kOutOfRange,
       "rollback: length 7"},
      {"rollback negative length", [](Ctx& c) { return c.cache->rollback(kSeqA, -1); },
       S::kOutOfRange, "rollback: length -1"},
      {"rollback erased id", [](Ctx& c) { return c.cache->rollback(kSeqErased, 0); }, S::kNotFound,
       "does not exist"},
      {"fork unknown parent", [](Ctx& c) { return c.cache->fork(kSeqUnknown, 60); }, S::kNotFound,
       "does not exist"},
      {"fork into an existing child", [](Ctx& c) { return c.cache->fork(kSeqA, kSeqActive); },
       S::kAlreadyExists, "already exists"},
      {"fork of an offloaded parent", [](Ctx& c) { return c.cache->fork(kSeqOffloaded, 60); },
       S::kFailedPrecondition, "offloaded"},
      {"finish unknown id", [](Ctx& c) { return c.cache->finish(kSeqUnknown); }, S::kNotFound,
       "does not exist"},
      {"erase already erased id", [](Ctx& c) { return c.cache->erase(kSeqErased); }, S::kNotFound,
       "does not exist"},
      // ---- scheduling ----
      {"set_active unknown id",
       [](Ctx& c) {
         return c.cache->set_active({kSeqA, kSeqUnknown});
       },
       S::kNotFound, "does not exist"},
      // Duplicates and offloaded ids are accepted by set_active's contract (kNotFound only).
      {"set_active erased id", [](Ctx& c) { return c.cache->set_active({kSeqErased}); },
       S::kNotFound, "does not exist"},
      {"commit of an offloaded sequence",
       [](Ctx& c) { return c.cache->commit(kSeqOffloaded, {1}); }, S::kFailedPrecondition, "only"},
      {"build_batch erased id", [](Ctx& c) { return c.cache->build_batch({kSeqErased}).status(); },
       S::kNotFound, "does not exist"},
      {"set_priority unknown id", [](Ctx& c) { return c.cache->set_priority(kSeqUnknown, 1); },
       S::kNotFound, "does not exist"},
      // ---- tiers ----
      {"offload unknown id", [](Ctx& c) { return c.cache->offload(kSeqUnknown); }, S::kNotFound,
       "does not exist"},
      {"offload twice", [](Ctx& c) { return c.cache->offload(kSeqOffloaded); },
       S::kFailedPrecondition, "is offloaded"},
      {"offload an active sequence", [](Ctx& c) { return c.cache->offload(kSeqActive); },
       S::kFailedPrecondition, "is active"},
      {"restore a sequence that is not offloaded", [](Ctx& c) { return c.cache->restore(kSeqA); },
       S::kFailedPrecondition, "is not offloaded"},
      {"restore erased id", [](Ctx& c) { return c.cache->restore(kSeqErased); }, S::kNotFound,
       "does not exist"},
      {"residency unknown id", [](Ctx& c) { return c.cache->residency(kSeqUnknown).status(); },
       S::kNotFound, "does not exist"},
      // ---- reading ----
      {"gather_layer of an offloaded sequence", [](Ctx& c) { return c.gather(kSeqOffloaded); },
       S::kFailedPrecondition, "offloaded"},
      {"gather_layer unknown id", [](Ctx& c) { return c.gather(kSeqUnknown); }, S::kNotFound,
       "does not exist"},
      {"gather_layer layer past num_layers", [](Ctx& c) { return c.gather(kSeqA, 2); },
       S::kOutOfRange, "layer 2"},
      {"gather_layer position past length",
       [](Ctx& c) {
         return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat16, PackedLayout::kHeadMajor, 7);
       },
       S::kOutOfRange, "position_begin 7"},
      {"gather_layer negative position",
       [](Ctx& c) {
         return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat16, PackedLayout::kHeadMajor, -1);
       },
       S::kOutOfRange, "position_begin -1"},
      {"gather_layer length past the committed tokens",
       [](Ctx& c) {
         return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat16, PackedLayout::kHeadMajor, 2,
                         5);
       },
       S::kOutOfRange, "run past"},
      {"gather_layer int64 max length",
       [](Ctx& c) {
         return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat16, PackedLayout::kHeadMajor, 1,
                         kInt64Max);
       },
       S::kOutOfRange, "run past"},
      {"gather_layer null key_out",
       [](Ctx& c) {
         return c.cache->gather_layer(kSeqA, 0, nullptr, c.value->data(), DType::kFloat16,
                                      PackedLayout::kHeadMajor);
       },
       S::kInvalidArgument, "key: null"},
      {"gather_layer misaligned value_out",
       [](Ctx& c) { return c.gather(kSeqA, 0, nullptr, Ctx::odd(c.value)); }, S::kInvalidArgument,
       "value: pointer not aligned"},
      {"gather_layer unknown packed layout",
       [](Ctx& c) {
         return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat16, static_cast<PackedLayout>(7));
       },
       S::kInvalidArgument, "packed_layout"},
      {"gather_layer fp8 out of an fp16 pool",
       [](Ctx& c) { return c.gather(kSeqA, 0, nullptr, nullptr, DType::kFloat8E4M3); },
       S::kInvalidArgument, "packed_dtype: fp8"},
      {"build_batch unknown id",
       [](Ctx& c) {
         return c.cache->build_batch({kSeqA, kSeqUnknown}).status();
       },
       S::kNotFound, "does not exist"},
      {"build_batch offloaded sequence",
       [](Ctx& c) { return c.cache->build_batch({kSeqOffloaded}).status(); },
       S::kFailedPrecondition, "offloaded"},
      {"build_batch duplicate id",
       [](Ctx& c) {
         return c.cache->build_batch({kSeqA, kSeqA}).status();
       },
       S::kInvalidArgument, "twice"},
      {"length unknown id", [](Ctx& c) { return c.cache->length(kSeqUnknown).status(); },
       S::kNotFound, "does not exist"},
      {"pending erased id", [](Ctx& c) { return c.cache->pending(kSeqErased).status(); },
       S::kNotFound, "does not exist"},
      {"block_locations unknown id",
       [](Ctx& c) { return c.cache->block_locations(kSeqUnknown).status(); }, S::kNotFound,
       "does not exist"},
      {"block_geometry group past num_groups",
       [](Ctx& c) { return c.cache->block_geometry(1, Tier::kDevice).status(); }, S::kOutOfRange,
       "group 1"},
      {"block_geometry storage tier",
       [](Ctx& c) { return c.cache->block_geometry(0, Tier::kStorage).status(); },
       S::kInvalidArgument, "storage tier"},
      {"pair_block_runs block past the pool",
       [](Ctx& c) {
         const BlockGeometry g = *c.cache->block_geometry(0, Tier::kDevice);
         return pair_block_runs(g, {0}, g, {static_cast<int32_t>(g.num_blocks)}).status();
       },
       S::kInvalidArgument, "dst_ids[0]"},
      // ---- data-plane ops on the cache's pool ----
      {"op write_kv layer past num_layers",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.layer = 2;
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "layer 2"},
      {"op write_kv negative num_tokens",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.num_tokens = -1;
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "num_tokens: negative"},
      {"op write_kv null slot_mapping",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.slot_mapping = nullptr;
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "slot_mapping: null"},
      {"op write_kv misaligned slot_mapping",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.slot_mapping = reinterpret_cast<const int64_t*>(static_cast<char*>(c.slots->data()) + 4);
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "slot_mapping: pointer not aligned"},
      {"op write_kv pool with zero blocks",
       [](Ctx& c) {
         PoolRef p = c.pool();
         p.num_blocks = 0;
         return write_kv(c.be(), p, c.write_args(), c.stream());
       },
       S::kInvalidArgument, "pool.num_blocks"},
      {"op write_kv null pool",
       [](Ctx& c) {
         PoolRef p = c.pool();
         p.data = nullptr;
         return write_kv(c.be(), p, c.write_args(), c.stream());
       },
       S::kInvalidArgument, "pool.data: null"},
      {"op write_kv pool layout with zero heads",
       [](Ctx& c) {
         PoolRef p = c.pool();
         p.layout.num_kv_heads = 0;
         return write_kv(c.be(), p, c.write_args(), c.stream());
       },
       S::kInvalidArgument, "pool.layout"},
      {"op write_kv scales on an fp16 pool",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.scales.granularity = ScaleGranularity::kPerLayer;
         a.scales.k = static_cast<const float*>(c.key->data());
         a.scales.v = static_cast<const float*>(c.value->data());
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "scales: only an fp8 pool"},
      {"op write_kv int64 max row_stride",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.row_stride = kInt64Max;
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "row_stride"},
      {"op write_kv num_tokens past the slot_mapping's 64-bit offsets",
       [](Ctx& c) {
         WriteKvArgs a = c.write_args();
         a.num_tokens = kInt64Max / 4;
         return write_kv(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "num_tokens"},
      {"op write_kv pool layout overflowing 64-bit offsets",
       [](Ctx& c) {
         PoolRef p = c.pool();
         p.layout.head_dim = 1 << 30;
         p.layout.block_size = 1 << 30;
         return write_kv(c.be(), p, c.write_args(), c.stream());
       },
       S::kInvalidArgument, "pool.layout"},
      {"op write_kv pool num_blocks overflowing 64-bit offsets",
       [](Ctx& c) {
         PoolRef p = c.pool();
         p.num_blocks = kInt64Max;
         return write_kv(c.be(), p, c.write_args(), c.stream());
       },
       S::kInvalidArgument, "pool.num_blocks"},
      {"op write_kv_all_layers layer_stride shorter than a layer",
       [](Ctx& c) {
         WriteKvAllLayersArgs a = c.all_layers_args();
         a.layer_stride = 96;
         return write_kv_all_layers(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "layer_stride"},
      {"op write_kv_all_layers int64 max row_stride",
       [](Ctx& c) {
         WriteKvAllLayersArgs a = c.all_layers_args();
         a.row_stride = kInt64Max;
         return write_kv_all_layers(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "row_stride"},
      {"op write_kv_all_layers int64 max layer_stride",
       [](Ctx& c) {
         WriteKvAllLayersArgs a = c.all_layers_args();
         a.layer_stride = kInt64Max;
         return write_kv_all_layers(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "layer_stride"},
      {"op write_kv_all_layers layer_stride past 64-bit byte offsets",
       [](Ctx& c) {
         WriteKvAllLayersArgs a = c.all_layers_args();
         a.layer_stride = kInt64Max / 2;
         return write_kv_all_layers(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "layer_stride"},
      {"op scatter_head_range heads past num_kv_heads",
       [](Ctx& c) {
         ScatterHeadRangeArgs a = c.scatter_args();
         a.head_begin = 1;
         return scatter_head_range(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "head_begin + num_heads"},
      {"op scatter_head_range negative head_begin",
       [](Ctx& c) {
         ScatterHeadRangeArgs a = c.scatter_args();
         a.head_begin = -1;
         a.num_heads = 1;
         return scatter_head_range(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "head_begin + num_heads"},
      {"op scatter_head_range positions past the block table",
       [](Ctx& c) {
         ScatterHeadRangeArgs a = c.scatter_args();
         a.position_begin = 3;
         return scatter_head_range(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "exceeds block_table_len"},
      {"op scatter_head_range num_tokens overflowing 64-bit offsets",
       [](Ctx& c) {
         ScatterHeadRangeArgs a = c.scatter_args();
         a.num_heads = 1;
         a.block_table_len = kInt32Max;
         a.num_tokens = int64_t{1} << 50;
         return scatter_head_range(c.be(), huge_pool(c, 1, 1 << 20, 1 << 20), a, c.stream());
       },
       S::kInvalidArgument, "num_tokens"},
      {"op import_layer num_tokens overflowing 64-bit offsets",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.block_table_len = kInt32Max;
         a.num_tokens = int64_t{1} << 50;
         return import_layer(c.be(), huge_pool(c, 1, 1 << 20, 1 << 20), a, c.stream());
       },
       S::kInvalidArgument, "num_tokens"},
      {"op gather_layer token-major num_tokens past 64-bit byte offsets",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.packed_layout = PackedLayout::kTokenMajor;
         a.block_table_len = kInt32Max;
         a.num_tokens = int64_t{1} << 42;  // 2^62 elements: the offset fits, the byte one not
         return gather_layer(c.be(), huge_pool(c, 1, 1 << 20, 1 << 20), a, c.stream());
       },
       S::kInvalidArgument, "num_tokens"},
      {"op import_layer int64 overflowing positions",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.position_begin = kInt64Max;
         a.num_tokens = kInt64Max;
         return import_layer(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "exceeds block_table_len"},
      {"op import_layer negative block_table_len",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.block_table_len = -1;
         return import_layer(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "block_table_len: negative"},
      {"op import_layer null block_table",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.block_table = nullptr;
         return import_layer(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "block_table: null"},
      {"op import_layer misaligned key",
       [](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.key = Ctx::odd(c.key);
         return import_layer(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "key: pointer not aligned"},
      {"op import_layer unknown packed dtype",
       [kBadDType](Ctx& c) {
         PackedLayerArgs a = c.layer_args();
         a.packed_dtype = kBadDType;
         return import_layer(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "packed_dtype: unknown dtype"},
      {"op import_layer_batch total_tokens overflowing int32 indptr",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.total_tokens = int64_t{kInt32Max} + 1;
         return import_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kOutOfRange, "does not fit the int32 indptr"},
      {"op import_layer_batch negative batch_size",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.batch_size = -1;
         return import_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "batch_size: negative"},
      {"op import_layer_batch zero max_blocks_per_seq",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.max_blocks_per_seq = 0;
         return import_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "max_blocks_per_seq"},
      {"op import_layer_batch tokens with an empty batch",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.batch_size = 0;
         return import_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "total_tokens: positive with an empty batch"},
      {"op import_layer_batch null indptr",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.indptr = nullptr;
         return import_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "indptr: null"},
      {"op gather_layer_batch total_tokens overflowing 64-bit offsets",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.total_tokens = kInt32Max;
         return gather_layer_batch(c.be(), huge_pool(c, 1 << 13, 1 << 20, 1), a, c.stream());
       },
       S::kInvalidArgument, "total_tokens"},
      {"op gather_layer_batch negative total_tokens",
       [](Ctx& c) {
         PackedBatchArgs a = c.batch_args();
         a.total_tokens = -6;
         return gather_layer_batch(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "total_tokens: negative"},
      {"op copy_blocks negative num_pairs",
       [](Ctx& c) {
         CopyBlocksArgs a;
         a.pairs = c.pairs->data();
         a.num_pairs = -1;
         return copy_blocks(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "num_pairs: negative"},
      {"op copy_blocks unknown index type",
       [](Ctx& c) {
         CopyBlocksArgs a;
         a.pairs = c.pairs->data();
         a.num_pairs = 1;
         a.index_type = static_cast<IndexType>(5);
         return copy_blocks(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "index_type"},
      {"op copy_blocks int64 pairs misaligned",
       [](Ctx& c) {
         CopyBlocksArgs a;
         a.pairs = static_cast<char*>(c.pairs->data()) + 4;
         a.num_pairs = 1;
         a.index_type = IndexType::kInt64;
         return copy_blocks(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "pairs: pointer not aligned"},
      {"op copy_blocks num_pairs past 64-bit offsets",
       [](Ctx& c) {
         CopyBlocksArgs a;
         a.pairs = c.pairs->data();
         a.num_pairs = kInt64Max / 2;
         return copy_blocks(c.be(), c.pool(), a, c.stream());
       },
       S::kInvalidArgument, "num_pairs"},
      {"op build_indptr_scratch_bytes negative batch",
       [](Ctx& c) { return build_indptr_scratch_bytes(c.be(), -1).status(); }, S::kInvalidArgument,
       "batch_size: negative"},
      {"op build_indptr null seq_lens",
       [](Ctx& c) {
         BuildIndptrArgs a;
         a.indptr = static_cast<int32_t*>(c.indptr->data());
         a.batch_size = 1;
         return build_indptr(c.be(), a, c.stream());
       },
       S::kInvalidArgument, "seq_lens: null"},
      // ---- SeedKvCache (a cache of its own per row; seed_row checks it is unchanged) ----
      {"seed overwrite_layer int64 max src_capacity (dense)",
       [](Ctx&) {
         return seed_row(CacheMode::kDense, [](SeedKvCache& s) {
           const std::vector<uint16_t> kv(5 * 3 * 32, 0x3c00);
           return s.overwrite_layer(1, 0, kv, kv, 5, kInt64Max);
         });
       },
       S::kInvalidArgument, "src_capacity"},
      {"seed overwrite_layer int64 max src_capacity (paged)",
       [](Ctx&) {
         return seed_row(CacheMode::kPaged, [](SeedKvCache& s) {
           const std::vector<uint16_t> kv(5 * 3 * 32, 0x3c00);
           return s.overwrite_layer(1, 0, kv, kv, 5, kInt64Max);
         });
       },
       S::kInvalidArgument, "src_capacity"},
      {"seed advance_sequence_by int64 max (dense)",
       [](Ctx&) {
         return seed_row(CacheMode::kDense,
                         [](SeedKvCache& s) { return s.advance_sequence_by(1, kInt64Max); });
       },
       S::kInvalidArgument, "delta"},
      {"seed advance_sequence_by int64 max (paged)",
       [](Ctx&) {
         return seed_row(CacheMode::kPaged,
                         [](SeedKvCache& s) { return s.advance_sequence_by(1, kInt64Max); });
       },
       S::kInvalidArgument, "delta"},
      {"seed append_head_range_seq_first int64 max pos_start",
       [](Ctx&) {
         return seed_row(CacheMode::kDense, [](SeedKvCache& s) {
           const std::vector<uint16_t> kv(2 * 32, 0x3c00);
           return s.append_head_range_seq_first(1, 0, 0, kInt64Max, kv, kv);
         });
       },
       S::kOutOfRange, "pos_start"},
      // ---- config and creation ----
      {"config zero head_dim",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.head_dim = 0;
         return k.validate();
       },
       S::kInvalidArgument, "head_dim"},
      {"config negative block_size",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.block_size = -4;
         return k.validate();
       },
       S::kInvalidArgument, "block_size"},
      {"config block ids past int32",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.num_device_blocks = int64_t{kInt32Max} + 1;
         return k.validate();
       },
       S::kInvalidArgument, "num_device_blocks"},
      {"config negative num_host_blocks",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.num_host_blocks = -1;
         return k.validate();
       },
       S::kInvalidArgument, "num_host_blocks"},
      {"config pool overflowing 64-bit offsets",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.num_device_blocks = kInt32Max;
         k.head_dim = 1 << 30;
         return k.validate();
       },
       S::kInvalidArgument, "overflows"},
      {"config page overflowing int64",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.block_size = 1 << 30;
         k.num_kv_heads = 1 << 10;
         k.head_dim = 1 << 30;
         return k.validate();
       },
       S::kInvalidArgument, "head_dim: one block"},
      {"config block overflowing int64",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.block_size = 1 << 30;
         k.head_dim = 1 << 30;
         return k.validate();
       },
       S::kInvalidArgument, "num_layers: one block"},
      {"config host pool overflowing int64",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.head_dim = 1 << 26;
         k.num_host_blocks = kInt32Max;
         return k.validate();
       },
       S::kInvalidArgument, "num_host_blocks"},
      {"config dense buffer overflowing int64",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.mode = CacheMode::kDense;
         k.head_dim = 1 << 30;
         k.max_sequence_length = kInt32Max;
         return k.validate();
       },
       S::kInvalidArgument, "max_sequence_length"},
      {"create with a zero-layer config",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.num_layers = 0;
         return create_status(k, {});
       },
       S::kInvalidArgument, "num_layers"},
      {"create in dense mode",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.mode = CacheMode::kDense;
         return create_status(k, {});
       },
       S::kUnimplemented, "dense"},
      {"create with a host pool overflowing int64",
       [](Ctx&) {
         CacheConfig k = table_config();
         k.head_dim = 1 << 26;
         k.num_host_blocks = kInt32Max;
         return create_status(k, {});
       },
       S::kInvalidArgument, "num_host_blocks"},
      {"create with a device pool past device_memory_limit",
       [](Ctx&) {
         CpuBackendOptions o;
         o.device_memory_limit = 4096;
         return create_status(table_config(), o);
       },
       S::kResourceExhausted, "device"},
      {"create with a host pool past pinned_memory_limit",
       [](Ctx&) {
         CpuBackendOptions o;
         o.pinned_memory_limit = 4096;
         return create_status(table_config(), o);
       },
       S::kResourceExhausted, "pinned"},
  };
  return r;
}

// The table, built once: one test per row, named after it.
const std::vector<Row>& table() {
  static const std::vector<Row> t = rows();
  return t;
}

// A row's name as a test name: letters and digits, words joined by '_'; a name that two rows
// share gets its index.
std::string row_test_name(const ::testing::TestParamInfo<size_t>& info) {
  auto sanitize = [](const std::string& name) {
    std::string out;
    bool gap = false;
    for (char ch : name) {
      if (std::isalnum(static_cast<unsigned char>(ch)) != 0) {
        if (gap && !out.empty()) out += '_';
        out += ch;
        gap = false;
      } else {
        gap = true;
      }
    }
    return out;
  };
  const std::string name = sanitize(table()[info.param].name);
  for (size_t i = 0; i < table().size(); ++i) {
    if (i != info.param && sanitize(table()[i].name) == name) {
      return name + "_" + std::to_string(info.param);
    }
  }
  return name;
}

class BadInputRowTest : public BadInputTableTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(BadInputRowTest, FailsWithItsCodeAndMessageAndChangesNothing) {
  const Row& row = table()[GetParam()];
  SCOPED_TRACE(row.name);
  prepare();
  if (::testing::Test::HasFatalFailure()) return;
  const Snapshot before = snapshot();
  const Status s = row.call(ctx_);
  EXPECT_EQ(s.code(), row.code) << s.to_string();
  EXPECT_NE(s.message().find(row.message), std::string::npos)
      << "message \"" << s.message() << "\" does not name \"" << row.message << "\"";
  expect_same(before, snapshot());
}

INSTANTIATE_TEST_SUITE_P(Rows, BadInputRowTest, ::testing::Range(size_t{0}, table().size()),
                         row_test_name);

TEST(BadInputTable, CoversEveryEntryPointWithAtLeastFortyRows) {
  EXPECT_GE(table().size(), 40u);
  std::cout << "[ bad-input table: " << table().size() << " rows ]\n";
}

// Without a host tier (num_host_blocks = 0) offload is refused for every sequence, whatever
// blocks it holds. Before, a sequence with nothing of its own to move (a fork, an empty one) was
// "offloaded" in place: gather_layer still read it while build_batch refused it.
TEST_F(BadInputTableTest, OffloadWithoutAHostTierIsRefusedAndChangesNothing) {
  for (SequenceId id : kLiveIds) {
    SCOPED_TRACE("sequence " + std::to_string(id));
    prepare_without_host_tier();
    if (::testing::Test::HasFatalFailure()) return;
    const Snapshot before = snapshot();
    const Status s = ctx_.cache->offload(id);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_NE(s.message().find("there is no host tier: num_host_blocks is 0"), std::string::npos)
        << s.message();
    expect_same(before, snapshot());
    // Every reader agrees that the sequence is still on the device.
    auto residency = ctx_.cache->residency(id);
    ASSERT_OK(residency);
    EXPECT_EQ(*residency, SequenceResidency::kDevice);
    EXPECT_OK(ctx_.cache->build_batch({id}));
    const Status g = ctx_.gather(id);
    EXPECT_OK(g);
    EXPECT_OK(ctx_.cache->synchronize());
  }
}

}  // namespace
}  // namespace pagedkv
