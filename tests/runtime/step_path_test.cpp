// The step path at realistic sizes: device arrays that outlive the uploads made after them
// (build_batch, the seed surface), randomized batches of up to 100,000 slots checked after the
// copies that read them ran, the batched step calls (reserve_batch, write_kv_batch,
// commit_batch) and how many launches and uploads a decode step costs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/seed_cache.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

// The CPU backend's "device" memory is host memory: after a synchronize it can be compared.
template <typename T>
::testing::AssertionResult same(const T* device, const std::vector<T>& host, const char* what) {
  if (host.empty() || std::memcmp(device, host.data(), host.size() * sizeof(T)) == 0) {
    return ::testing::AssertionSuccess();
  }
  size_t first = 0;
  while (device[first] == host[first]) ++first;
  return ::testing::AssertionFailure()
         << what << " differs from its host copy at element " << first << " of " << host.size();
}

// As same(), for a buffer of either backend: copied to the host first.
template <typename T>
::testing::AssertionResult same_download(DeviceBuffer& device, const std::vector<T>& host,
                                         const char* what) {
  const std::vector<T> got = device.download<T>();
  return same(got.data(), host, what);
}

::testing::AssertionResult batch_matches_host(const DeviceBatch& b) {
  const BatchMetadata& m = *b.host;
  for (auto r : {same(b.slot_mapping, m.slot_mapping, "slot_mapping"),
                 same(b.block_tables, m.block_tables, "block_tables"),
                 same(b.seq_lens, m.seq_lens, "seq_lens")}) {
    if (!r) return r;
  }
  if (b.indptr != nullptr) {
    for (auto r : {same(b.indptr, m.indptr, "indptr"), same(b.indices, m.indices, "indices"),
                   same(b.last_page_len, m.last_page_len, "last_page_len")}) {
      if (!r) return r;
    }
  }
  return ::testing::AssertionSuccess();
}

CacheConfig tiny_rows(int64_t num_blocks) {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = 16;
  c.num_device_blocks = num_blocks;
  c.backend = BackendKind::kCpu;
  c.enable_prefix_caching = false;
  return c;
}

struct BatchShape {
  int batch;
  int blocks_per_sequence;
};

class LargeBatchTest : public ::testing::TestWithParam<BatchShape> {};

// gpu-review S1-1: a batch whose arrays add up to more than the first upload chunk (a 64 KiB
// block table at 64 x 200 blocks; 128 KiB at 16 x 1,100, where the arena must grow) used to
// come back with slot_mapping and block_tables overwritten or freed in the same call.
TEST_P(LargeBatchTest, BuildBatchArraysMatchTheirHostCopyInEveryStep) {
  const BatchShape shape = GetParam();
  auto kv =
      std::move(KvCache::create(tiny_rows(int64_t{shape.batch} * (shape.blocks_per_sequence + 8))))
          .value();
  std::vector<SequenceId> ids;
  for (int s = 0; s < shape.batch; ++s) {
    std::vector<TokenId> prompt(size_t(16 * shape.blocks_per_sequence + s % 7 + 1), TokenId(s));
    ASSERT_OK(kv->add_sequence(s, prompt));
    ASSERT_OK(kv->reserve(s, int64_t(prompt.size())));
    ASSERT_OK(kv->commit(s, prompt));
    ids.push_back(s);
  }
  for (int step = 0; step < 6; ++step) {
    ASSERT_OK(kv->reserve_batch(ids, 1));
    BatchOptions o;
    o.build_csr = true;
    auto b = kv->build_batch(ids, o);
    ASSERT_OK(b);
    ASSERT_OK(kv->synchronize());
    ASSERT_TRUE(batch_matches_host(*b)) << "step " << step;
    ASSERT_OK(kv->commit_batch(ids, std::vector<TokenId>(ids.size(), 1)));
    ASSERT_OK(kv->check_invariants());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LargeBatchTest,
                         ::testing::Values(BatchShape{16, 100}, BatchShape{64, 200},
                                           BatchShape{128, 100}, BatchShape{8, 1100},
                                           BatchShape{16, 1100}));

// gpu-review S1-1: overwrite_layer of 1,500 tokens (750 KiB per K) wrote every key and value
// wrong; 3,000 tokens also freed the block table it had just uploaded.
TEST(SeedUploadTest, OverwriteLayerOfManyTokensReadsBackExactly) {
  for (int64_t tokens : {500, 1500, 3000}) {
    CacheConfig c;  // default: 4 layers x 4 heads x 64 dims fp16, block 16
    c.num_device_blocks = 4096;
    c.backend = BackendKind::kCpu;
    auto seed = std::move(SeedKvCache::create(c)).value();
    ASSERT_OK(seed->allocate_sequence(1, std::vector<TokenId>(size_t(tokens), 5)));
    const size_t n = size_t(c.num_kv_heads) * size_t(tokens) * size_t(c.head_dim);
    std::vector<uint16_t> k(n), v(n);
    std::mt19937 rng{static_cast<uint32_t>(tokens)};
    for (size_t i = 0; i < n; ++i) {
      k[i] = uint16_t(0x3c00 | (rng() & 0x3ff));
      v[i] = uint16_t(0xbc00 | (rng() & 0x3ff));
    }
    ASSERT_OK(seed->overwrite_layer(1, 0, k, v, tokens));
    auto out = seed->get_layer_as_onnx(1, 0);
    ASSERT_OK(out);
    EXPECT_EQ(out->key, k) << tokens << " tokens";
    EXPECT_EQ(out->value, v) << tokens << " tokens";
  }
}

// Random batches (up to 100,000 slots) built back to back while the compute stream lags behind
// (a 2 ms spin kernel before each batch's work; on the CPU backend every launch also sleeps):
// each batch's arrays are copied out by work queued after it, and only checked once all that
// work ran, so a region reused or freed too early shows up as a mismatch. Its CUDA twin runs the
// same steps on a GPU.
class UploadLifetimeTest : public testing::BackendParamTest {};

TEST_P(UploadLifetimeTest, RandomBatchesReadByLaterWorkMatchTheirHostCopies) {
  CpuBackendOptions slow;
  slow.kernel_delay = std::chrono::microseconds(2000);
  auto backend = testing::make_backend(kind(), slow);
  ASSERT_NE(backend, nullptr);
  KvCacheOptions o;
  o.backend = backend.get();
  CacheConfig config = tiny_rows(8000);
  config.backend = kind();
  auto kv = std::move(KvCache::create(config, o)).value();
  std::mt19937 rng(2026);
  struct Copied {
    BatchMetadata host;
    std::vector<std::unique_ptr<DeviceBuffer>> arrays;
  };
  std::vector<Copied> copies;
  SequenceId next_id = 0;
  int64_t largest = 0;
  for (int round = 0; round < 24; ++round) {
    const int batch = 1 + int(rng() % 400);
    const int64_t budget = 1 + int64_t(rng() % 100000);
    std::vector<SequenceId> ids;
    int64_t slots = 0;
    for (int s = 0; s < batch && slots < budget; ++s) {
      const int64_t n = std::min<int64_t>(budget - slots, 1 + int64_t(rng() % 2000));
      const SequenceId id = next_id++;
      ASSERT_OK(kv->add_sequence(id, {}));
      ASSERT_OK(kv->reserve(id, n));
      ids.push_back(id);
      slots += n;
    }
    largest = std::max(largest, slots);
    BatchOptions bo;
    bo.build_csr = rng() % 2 == 0;
    auto b = kv->build_batch(ids, bo);
    ASSERT_OK(b);
    // A kernel that lags (a spin), then copies that read the arrays behind it.
    ASSERT_OK(testing::launch_spin(*backend, kv->compute_stream(), 2'000'000));
    Copied c;
    c.host = *b->host;
    c.arrays.push_back(std::make_unique<DeviceBuffer>(*backend, 16 * size_t(slots)));
    c.arrays.push_back(std::make_unique<DeviceBuffer>(*backend, 16 * size_t(slots)));
    ASSERT_OK(kv->write_kv_batch(*b, 0, c.arrays[0]->data(), c.arrays[1]->data(), DType::kFloat16));
    auto copy_out = [&](const void* src, size_t bytes) {
      c.arrays.push_back(std::make_unique<DeviceBuffer>(*backend, bytes));
      ASSERT_OK(backend->copy_async(c.arrays.back()->data(), src, bytes, CopyKind::kDeviceToDevice,
                                    kv->compute_stream()));
    };
    const BatchMetadata& m = *b->host;
    copy_out(b->slot_mapping, m.slot_mapping.size() * 8);
    copy_out(b->block_tables, m.block_tables.size() * 4);
    copy_out(b->seq_lens, m.seq_lens.size() * 4);
    if (bo.build_csr) {
      copy_out(b->indptr, m.indptr.size() * 4);
      copy_out(b->indices, m.indices.size() * 4);
      copy_out(b->last_page_len, m.last_page_len.size() * 4);
    }
    copies.push_back(std::move(c));
    for (SequenceId id : ids) ASSERT_OK(kv->erase(id));  // room for the next round
    ASSERT_OK(kv->check_invariants());
  }
  ASSERT_OK(kv->synchronize());
  EXPECT_GT(largest, 20000);
  for (size_t r = 0; r < copies.size(); ++r) {
    const Copied& c = copies[r];
    EXPECT_TRUE(same_download<int64_t>(*c.arrays[2], c.host.slot_mapping, "slot_mapping"))
        << "round " << r;
    EXPECT_TRUE(same_download<int32_t>(*c.arrays[3], c.host.block_tables, "block_tables"))
        << "round " << r;
    EXPECT_TRUE(same_download<int32_t>(*c.arrays[4], c.host.seq_lens, "seq_lens")) << "round " << r;
    if (c.arrays.size() == 8) {
      EXPECT_TRUE(same_download<int32_t>(*c.arrays[5], c.host.indptr, "indptr")) << "round " << r;
      EXPECT_TRUE(same_download<int32_t>(*c.arrays[6], c.host.indices, "indices")) << "round " << r;
      EXPECT_TRUE(same_download<int32_t>(*c.arrays[7], c.host.last_page_len, "last_page_len"))
          << "round " << r;
    }
  }
  kv.reset();  // before the backend it runs on
}

INSTANTIATE_TEST_SUITE_P(Backends, UploadLifetimeTest, testing::runtime_backends(),
                         testing::backend_param_name);

CacheConfig step_config() {
  CacheConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 24;
  c.block_size = 4;
  c.num_device_blocks = 96;
  c.backend = BackendKind::kCpu;
  return c;
}

// Issue item 4: a decode step of B sequences and L layers through the batched calls is one
// upload and L write launches (one with write_kv_batch_all_layers), on real bytes.
TEST(BatchedStepTest, DecodeStepsWriteEveryTokenWithOneUploadAndOneLaunchPerLayer) {
  const CacheConfig c = step_config();
  auto cpu = create_cpu_backend();
  FaultInjectionBackend counted(*cpu);
  KvCacheOptions o;
  o.backend = &counted;
  auto kv = std::move(KvCache::create(c, o)).value();
  std::mt19937 rng(7);
  const int batch = 7;
  std::vector<SequenceId> ids;
  std::vector<std::vector<TokenId>> tokens(batch);
  const int64_t row = int64_t{c.num_kv_heads} * c.head_dim;
  for (int s = 0; s < batch; ++s) {
    const SequenceId id = 100 + s;
    for (int t = 0; t < 3 + s; ++t) tokens[size_t(s)].push_back(TokenId(rng() % 1000));
    ASSERT_OK(kv->add_sequence(id, tokens[size_t(s)]));
    ASSERT_OK(kv->reserve(id, int64_t(tokens[size_t(s)].size())));
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      DeviceBuffer dk(*cpu, tokens[size_t(s)].size() * size_t(row) * 2);
      DeviceBuffer dv(*cpu, dk.bytes());
      dk.upload(testing::model_rows(c, layer, 0, tokens[size_t(s)], 0));
      dv.upload(testing::model_rows(c, layer, 1, tokens[size_t(s)], 0));
      ASSERT_OK(kv->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
      ASSERT_OK(kv->synchronize());
    }
    ASSERT_OK(kv->commit(id, tokens[size_t(s)]));
    ids.push_back(id);
  }
  for (int step = 0; step < 9; ++step) {
    const bool all_layers = step % 3 == 2;
    std::vector<TokenId> next;
    for (int s = 0; s < batch; ++s) next.push_back(TokenId(rng() % 1000));
    // The model's K/V of this step, [layers][batch, heads, dim], ready before the step.
    std::vector<uint16_t> k, v;
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      for (int s = 0; s < batch; ++s) {
        const int64_t pos = int64_t(tokens[size_t(s)].size());
        for (int part = 0; part < 2; ++part) {
          const std::vector<uint16_t> r =
              testing::model_rows(c, layer, part, {next[size_t(s)]}, pos);
          (part == 0 ? k : v).insert((part == 0 ? k : v).end(), r.begin(), r.end());
        }
      }
    }
    DeviceBuffer dk(*cpu, k.size() * 2), dv(*cpu, v.size() * 2);
    dk.upload(k);
    dv.upload(v);

    counted.reset_counts();
    ASSERT_OK(kv->reserve_batch(ids, 1));
    auto b = kv->build_batch(ids);
    ASSERT_OK(b);
    const size_t layer_bytes = size_t(batch) * size_t(row) * 2;
    if (all_layers) {
      ASSERT_OK(kv->write_kv_batch_all_layers(*b, dk.data(), dv.data(), DType::kFloat16));
    } else {
      for (int32_t layer = 0; layer < c.num_layers; ++layer) {
        ASSERT_OK(kv->write_kv_batch(*b, layer, static_cast<char*>(dk.data()) + layer * layer_bytes,
                                     static_cast<char*>(dv.data()) + layer * layer_bytes,
                                     DType::kFloat16));
      }
    }
    ASSERT_OK(kv->commit_batch(ids, next));
    EXPECT_EQ(counted.count(FaultKind::kLaunch), all_layers ? 1 : c.num_layers) << "step " << step;
    EXPECT_EQ(counted.count(FaultKind::kCopy), 1) << "step " << step << ": uploads";
    // The batch is stale once committed: writing through it again is refused.
    EXPECT_EQ(kv->write_kv_batch(*b, 0, dk.data(), dv.data(), DType::kFloat16).code(),
              StatusCode::kFailedPrecondition);
    ASSERT_OK(kv->synchronize());
    for (int s = 0; s < batch; ++s) tokens[size_t(s)].push_back(next[size_t(s)]);
    ASSERT_OK(kv->check_invariants());
  }
  for (int s = 0; s < batch; ++s) {
    const std::vector<TokenId>& t = tokens[size_t(s)];
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      DeviceBuffer gk(*cpu, t.size() * size_t(row) * 2), gv(*cpu, gk.bytes());
      ASSERT_OK(kv->gather_layer(ids[size_t(s)], layer, gk.data(), gv.data(), DType::kFloat16,
                                 PackedLayout::kTokenMajor));
      ASSERT_OK(kv->synchronize());
      EXPECT_EQ(gk.download<uint16_t>(), testing::model_rows(c, layer, 0, t, 0))
          << s << "/" << layer;
      EXPECT_EQ(gv.download<uint16_t>(), testing::model_rows(c, layer, 1, t, 0))
          << s << "/" << layer;
    }
  }
}

TEST(BatchedStepTest, CommitBatchChecksEverythingBeforeCommittingAnything) {
  auto kv = std::move(KvCache::create(step_config())).value();
  for (SequenceId id : {1, 2, 3}) {
    ASSERT_OK(kv->add_sequence(id, {}));
  }
  ASSERT_OK(kv->reserve_batch({1, 2}, 2));  // 3 has nothing reserved
  auto unchanged = [&] {
    for (SequenceId id : {1, 2}) {
      EXPECT_EQ(*kv->length(id), 0);
      EXPECT_EQ(*kv->pending(id), 2);
    }
    EXPECT_OK(kv->check_invariants());
  };
  EXPECT_EQ(kv->commit_batch({1, 2, 3}, {5, 6, 7}).code(), StatusCode::kFailedPrecondition);
  unchanged();
  EXPECT_EQ(kv->commit_batch({1, 1}, {5, 6}).code(), StatusCode::kInvalidArgument);
  unchanged();
  EXPECT_EQ(kv->commit_batch({1, 2}, {5, 6, 7}).code(), StatusCode::kInvalidArgument);
  unchanged();
  EXPECT_EQ(kv->commit_batch({1, 2}, {5, 6, 7, 8, 9, 10}, 3).code(),
            StatusCode::kFailedPrecondition);
  unchanged();
  EXPECT_EQ(kv->commit_batch({1, 99}, {5, 6}).code(), StatusCode::kNotFound);
  unchanged();
  ASSERT_OK(kv->commit_batch({1, 2}, {5, 6, 7, 8}, 2));
  EXPECT_EQ(*kv->length(1), 2);
  EXPECT_EQ(*kv->length(2), 2);
  EXPECT_EQ(*kv->pending(1), 0);
  EXPECT_OK(kv->check_invariants());
}

TEST(BatchedStepTest, ReserveBatchReturnsTheSlotsOfEachSequenceInOrder) {
  auto kv = std::move(KvCache::create(step_config())).value();
  std::vector<SequenceId> ids = {4, 9, 2};
  for (SequenceId id : ids) ASSERT_OK(kv->add_sequence(id, {}));
  auto slots = kv->reserve_batch(ids, 3);
  ASSERT_OK(slots);
  ASSERT_EQ(slots->size(), 9u);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto blocks = kv->block_locations(ids[i]);
    ASSERT_OK(blocks);
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ((*slots)[i * 3 + size_t(t)], int64_t{(*blocks)[0].block} * 4 + t);
    }
    EXPECT_EQ(*kv->pending(ids[i]), 3);
  }
  EXPECT_EQ(kv->reserve_batch({4, 77}, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*kv->pending(4), 3);
}

// reserve_batch_into: the same slots as the sequences' reservations, written over what the
// caller's vector held; none asked for with a null vector; an empty vector on error, which
// changes nothing.
TEST(BatchedStepTest, ReserveBatchIntoWritesTheSlotsIntoTheCallersVector) {
  auto kv = std::move(KvCache::create(step_config())).value();
  const std::vector<SequenceId> ids = {4, 9, 2};
  for (SequenceId id : ids) ASSERT_OK(kv->add_sequence(id, {}));
  std::vector<int64_t> slots = {-5, -6, -7, -8};  // replaced, not appended to
  ASSERT_OK(kv->reserve_batch_into(ids, 2, &slots));
  ASSERT_EQ(slots.size(), 6u);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto blocks = kv->block_locations(ids[i]);
    ASSERT_OK(blocks);
    for (int64_t t = 0; t < 2; ++t) {
      EXPECT_EQ(slots[i * 2 + size_t(t)], int64_t{(*blocks)[0].block} * 4 + t);
    }
  }
  // A later step with the same vector: the next slots of each sequence.
  ASSERT_OK(kv->commit_batch(ids, {1, 2, 3, 4, 5, 6}, 2));
  ASSERT_OK(kv->reserve_batch_into(ids, 1, &slots));
  ASSERT_EQ(slots.size(), 3u);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto blocks = kv->block_locations(ids[i]);
    ASSERT_OK(blocks);
    EXPECT_EQ(slots[i], int64_t{(*blocks)[0].block} * 4 + 2);
    EXPECT_EQ(*kv->pending(ids[i]), 1);
  }
  // Null: reserved all the same.
  ASSERT_OK(kv->commit_batch(ids, {7, 8, 9}, 1));
  ASSERT_OK(kv->reserve_batch_into(ids, 1, nullptr));
  for (SequenceId id : ids) EXPECT_EQ(*kv->pending(id), 1);
  auto built = kv->build_batch(ids);
  ASSERT_OK(built);
  ASSERT_EQ(built->host->slot_mapping.size(), 3u);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto blocks = kv->block_locations(ids[i]);
    ASSERT_OK(blocks);
    EXPECT_EQ(built->host->slot_mapping[i], int64_t{(*blocks)[0].block} * 4 + 3);
  }
  // An unknown id: an error, the vector emptied, every reservation as it was.
  const Status st = kv->reserve_batch_into({4, 77}, 2, &slots);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(slots.empty());
  for (SequenceId id : ids) EXPECT_EQ(*kv->pending(id), 1);
  EXPECT_OK(kv->check_invariants());
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

// Issue item 2: the model computes K/V on its own stream. With native_compute_stream the cache
// queues its work there, so write_kv reads K/V that a slow kernel on that stream produced: a
// 100 ms spin, then a fill (on the CPU backend every launch also lags). Its CUDA twin runs on a
// real cudaStream_t.
class CallerStreamTest : public testing::BackendParamTest {};

TEST_P(CallerStreamTest, WriteKvOnTheCallersStreamSeesWhatTheModelQueuedBeforeIt) {
  CpuBackendOptions slow;
  slow.kernel_delay = std::chrono::microseconds(30000);  // the "model" kernel lags the host
  slow.run_inline_when_idle = false;
  auto backend = testing::make_backend(kind(), slow);
  ASSERT_NE(backend, nullptr);
  // The server's stream: on CUDA a real cudaStream_t (one the backend made stands for the
  // server's), on the CPU backend any non-null handle.
  int cpu_stream_token = 0;
  void* native = &cpu_stream_token;
  Stream server{};
  if (kind() == BackendKind::kCuda) {
    auto made = backend->create_stream();
    ASSERT_OK(made);
    server = *made;
    auto handle = backend->native_stream(server);
    ASSERT_OK(handle);
    native = *handle;
  }
  KvCacheOptions o;
  o.backend = backend.get();
  o.native_compute_stream = native;
  CacheConfig c = step_config();
  c.num_layers = 1;
  c.backend = kind();
  auto kv = std::move(KvCache::create(c, o)).value();
  auto wrapped = backend->native_stream(kv->compute_stream());
  ASSERT_OK(wrapped);
  EXPECT_EQ(*wrapped, native) << "the cache queues on another stream than the server's";
  // The model queues on its own stream: the backend's own handle on CUDA, the wrapped one on
  // the CPU backend (where the token names no stream of its own).
  const Stream model = kind() == BackendKind::kCuda ? server : kv->compute_stream();

  const int64_t row = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t n = 5;
  ASSERT_OK(kv->add_sequence(1, {}));
  ASSERT_OK(kv->reserve(1, n));
  DeviceBuffer k(*backend, size_t(n * row) * 2), v(*backend, k.bytes());
  k.upload(std::vector<uint16_t>(size_t(n * row), 0));
  v.upload(std::vector<uint16_t>(size_t(n * row), 0));
  // The model's work: busy for 100 ms, then a kernel that fills K and V (as 32-bit words). A
  // write_kv not ordered after it would read the zeros.
  ASSERT_OK(testing::launch_spin(*backend, model, 100'000'000));
  const uint32_t word = 0x3c003c00u;  // two fp16 ones
  for (void* dst : {k.data(), v.data()}) {
    kernels::FillBody fill{static_cast<uint32_t*>(dst), word};
    KernelLaunch l;
    l.kernel = KernelId::kFill;
    l.params = &fill;
    l.params_size = sizeof(fill);
    l.num_items = n * row / 2;
    ASSERT_OK(backend->launch(l, model));
  }
  ASSERT_OK(kv->write_kv(1, 0, k.data(), v.data(), DType::kFloat16));
  ASSERT_OK(kv->commit(1, std::vector<TokenId>(size_t(n), 3)));
  DeviceBuffer gk(*backend, k.bytes()), gv(*backend, k.bytes());
  ASSERT_OK(
      kv->gather_layer(1, 0, gk.data(), gv.data(), DType::kFloat16, PackedLayout::kTokenMajor));
  ASSERT_OK(kv->synchronize());
  EXPECT_EQ(gk.download<uint16_t>(), std::vector<uint16_t>(size_t(n * row), 0x3c00));
  EXPECT_EQ(gv.download<uint16_t>(), std::vector<uint16_t>(size_t(n * row), 0x3c00));
  kv.reset();  // before the backend it runs on
  if (kind() == BackendKind::kCuda) backend->destroy_stream(server);
}

INSTANTIATE_TEST_SUITE_P(Backends, CallerStreamTest, testing::runtime_backends(),
                         testing::backend_param_name);

// Issue item 6: an offloaded sequence whose blocks all stay on the device (a fork child shares
// every block of its parent, so nothing moves) was readable by gather_layer but refused by
// build_batch. Both now refuse it until it is restored.
TEST(OffloadedReadTest, AnOffloadedForkIsReadByNeitherGatherNorBuildBatchUntilRestored) {
  CacheConfig c = step_config();
  c.num_host_blocks = 16;
  auto backend = create_cpu_backend();
  KvCacheOptions o;
  o.backend = backend.get();
  auto kv = std::move(KvCache::create(c, o)).value();
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_OK(kv->add_sequence(1, {}));
  ASSERT_OK(kv->reserve(1, 8));
  ASSERT_OK(kv->commit(1, tokens));
  ASSERT_OK(kv->fork(1, 2));
  ASSERT_OK(kv->offload(2));
  ASSERT_EQ(*kv->residency(2), SequenceResidency::kHost);
  const size_t bytes = tokens.size() * size_t(c.num_kv_heads) * size_t(c.head_dim) * 2;
  DeviceBuffer k(*backend, bytes), v(*backend, bytes);
  EXPECT_EQ(
      kv->gather_layer(2, 0, k.data(), v.data(), DType::kFloat16, PackedLayout::kTokenMajor).code(),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv->build_batch({2}).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(kv->restore(2));
  EXPECT_OK(kv->gather_layer(2, 0, k.data(), v.data(), DType::kFloat16, PackedLayout::kTokenMajor));
  EXPECT_OK(kv->build_batch({2}));
  EXPECT_OK(kv->check_invariants());
}

// Found by tests/fuzz: build_batch rewrites the host metadata every DeviceBatch points to before
// it uploads; when the upload then failed, the earlier batch still counted as current and
// write_kv_batch wrote the failed build's row count through the earlier batch's slot array.
TEST(StaleBatchTest, AFailedBuildBatchMakesTheEarlierBatchStale) {
  auto cpu = create_cpu_backend();
  FaultInjectionBackend faults(*cpu);
  KvCacheOptions o;
  o.backend = &faults;
  auto kv = std::move(KvCache::create(step_config(), o)).value();
  for (SequenceId id : {1, 2}) ASSERT_OK(kv->add_sequence(id, {}));
  ASSERT_OK(kv->reserve_batch({1, 2}, 1));
  auto first = kv->build_batch({1, 2});
  ASSERT_OK(first);
  faults.fail_nth(FaultKind::kCopy, 1);
  EXPECT_FALSE(kv->build_batch({1}).ok());
  const size_t bytes = 2 * size_t(2 * 24) * 2;
  DeviceBuffer k(*cpu, bytes), v(*cpu, bytes);
  EXPECT_EQ(kv->write_kv_batch(*first, 0, k.data(), v.data(), DType::kFloat16).code(),
            StatusCode::kFailedPrecondition);
  // A refused call changes nothing, the batch's currency included.
  auto second = kv->build_batch({1, 2});
  ASSERT_OK(second);
  EXPECT_EQ(kv->add_sequence(1, {}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(kv->fork(77, 78).code(), StatusCode::kNotFound);
  EXPECT_OK(kv->write_kv_batch(*second, 0, k.data(), v.data(), DType::kFloat16));
  EXPECT_OK(kv->check_invariants());
}

// Two caches with the same sequences in the same state build batches of the same generation:
// only the owner check tells them apart, and a batch of one written through the other would
// land at the first cache's slots in the second's pool.
TEST(StaleBatchTest, ABatchAnotherCacheBuiltIsRefused) {
  auto cpu = create_cpu_backend();
  KvCacheOptions o;
  o.backend = cpu.get();
  auto a = std::move(KvCache::create(step_config(), o)).value();
  auto b = std::move(KvCache::create(step_config(), o)).value();
  for (KvCache* kv : {a.get(), b.get()}) {
    ASSERT_OK(kv->add_sequence(1, {}));
    ASSERT_OK(kv->reserve_batch({1}, 2));
  }
  auto from_a = a->build_batch({1});
  auto from_b = b->build_batch({1});
  ASSERT_OK(from_a);
  ASSERT_OK(from_b);
  ASSERT_EQ(from_a->generation, from_b->generation);
  EXPECT_TRUE(a->built_here(*from_a));
  EXPECT_FALSE(a->built_here(*from_b));
  // Two tokens of every layer, all ones.
  const size_t elems = 3 * 2 * size_t(2 * 24);
  const std::vector<uint16_t> ones(elems, 0x3C00);
  DeviceBuffer k(*cpu, elems * 2), v(*cpu, elems * 2);
  k.upload(ones);
  v.upload(ones);
  const PoolRef pool = a->device_pool();
  const auto pool_bytes = [&] {
    std::vector<uint16_t> all(static_cast<size_t>(pool.layout.block_elems() * pool.num_blocks));
    EXPECT_OK(a->synchronize());
    EXPECT_OK(
        cpu->copy_async(all.data(), pool.data, all.size() * 2, CopyKind::kDeviceToHost, Stream{}));
    EXPECT_OK(cpu->synchronize_stream(Stream{}));
    return all;
  };
  const std::vector<uint16_t> before = pool_bytes();
  const Status st = a->write_kv_batch(*from_b, 0, k.data(), v.data(), DType::kFloat16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("built by another cache"), std::string::npos) << st.message();
  EXPECT_EQ(a->write_kv_batch_all_layers(*from_b, k.data(), v.data(), DType::kFloat16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool_bytes() == before) << "a refused write changed the pool";
  EXPECT_OK(a->write_kv_batch(*from_a, 0, k.data(), v.data(), DType::kFloat16));
  EXPECT_FALSE(pool_bytes() == before) << "the owner's batch writes";
  EXPECT_OK(a->check_invariants());
}

TEST(CallerStreamOptionsTest, SeedKvCacheQueuesOnTheCallersStreamInBothModes) {
  for (CacheMode mode : {CacheMode::kPaged, CacheMode::kDense}) {
    auto backend = create_cpu_backend();
    int token = 0;
    SeedKvCacheOptions o;
    o.backend = backend.get();
    o.native_compute_stream = &token;
    CacheConfig c;
    c.mode = mode;
    c.num_device_blocks = 64;
    c.backend = BackendKind::kCpu;
    auto seed = SeedKvCache::create(c, o);
    ASSERT_OK(seed);
    EXPECT_EQ((*seed)->compute_stream(), *backend->wrap_stream(&token));
  }
}

TEST(CallerStreamOptionsTest, NativeAndBackendStreamTogetherAreRefused) {
  auto backend = create_cpu_backend();
  auto s = backend->create_stream();
  ASSERT_OK(s);
  int token = 0;
  KvCacheOptions o;
  o.backend = backend.get();
  o.compute_stream = *s;
  o.native_compute_stream = &token;
  EXPECT_EQ(KvCache::create(step_config(), o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
