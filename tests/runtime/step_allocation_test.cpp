// A decode step allocates nothing once the cache knows the largest step (KvCacheOptions::
// step_shape): the upload arena is sized at creation. 512 sequences whose block tables outgrow
// the arena's default chunk run 24 decode steps through the batched calls (reserve_batch,
// build_batch with CSR, write_kv_batch_all_layers, commit_batch) on a fault-injecting backend
// that counts allocations: none with the shape, some without it (the arena grows in the step).
// A negative field is refused.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

constexpr int32_t kBatch = 512;
constexpr int32_t kPrompt = 100;  // 25 blocks of 4 tokens
constexpr int32_t kSteps = 24;    // up to 31 blocks
constexpr int32_t kMaxBlocks = 32;

CacheConfig decode_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = 4;
  c.num_device_blocks = kBatch * kMaxBlocks;
  c.max_sequence_length = kMaxBlocks * 4;
  c.backend = BackendKind::kCpu;
  return c;
}

// The allocations the decode steps make, after the prompts are in.
int64_t step_allocations(const StepShape& shape) {
  std::unique_ptr<Backend> inner = create_cpu_backend({});
  FaultInjectionBackend faults(*inner);
  const CacheConfig c = decode_config();
  KvCacheOptions o;
  o.backend = &faults;
  o.step_shape = shape;
  auto cache = KvCache::create(c, o);
  EXPECT_OK(cache);
  if (!cache.ok()) return -1;
  KvCache& kv = **cache;
  std::vector<SequenceId> ids;
  std::vector<TokenId> prompt(kPrompt);
  for (SequenceId id = 1; id <= kBatch; ++id) {
    for (int32_t i = 0; i < kPrompt; ++i) prompt[static_cast<size_t>(i)] = TokenId(id * 1000 + i);
    EXPECT_OK(kv.add_sequence(id, prompt));
    EXPECT_OK(kv.reserve(id, kPrompt));
    EXPECT_OK(kv.commit(id, prompt));  // the prompt's K/V is not what this test looks at
    ids.push_back(id);
  }
  const size_t row = static_cast<size_t>(c.num_kv_heads * c.head_dim);
  DeviceBuffer k(*inner, 2 * kBatch * row * 2), v(*inner, 2 * kBatch * row * 2);
  const std::vector<TokenId> next(kBatch, 7);
  const int64_t before = faults.count(FaultKind::kAllocation);
  for (int32_t step = 0; step < kSteps; ++step) {
    EXPECT_OK(kv.reserve_batch(ids, 1));
    BatchOptions csr;
    csr.build_csr = true;
    auto batch = kv.build_batch(ids, csr);
    EXPECT_OK(batch);
    if (!batch.ok()) return -1;
    EXPECT_OK(kv.write_kv_batch_all_layers(*batch, k.data(), v.data(), DType::kFloat16));
    EXPECT_OK(kv.commit_batch(ids, next, 1));
  }
  EXPECT_OK(kv.synchronize());
  EXPECT_OK(kv.check_invariants());
  return faults.count(FaultKind::kAllocation) - before;
}

TEST(StepAllocationTest, ADecodeStepOfTheStepShapeAllocatesNothing) {
  EXPECT_EQ(step_allocations(StepShape{kBatch, kMaxBlocks, kBatch}), 0);
}

TEST(StepAllocationTest, WithoutAShapeTheArenaGrowsInTheStep) {
  EXPECT_GT(step_allocations(StepShape{}), 0)
      << "the block tables of 512 sequences outgrow the default 64 KiB chunk";
}

TEST(StepAllocationTest, ANegativeShapeIsRefused) {
  KvCacheOptions o;
  o.step_shape.max_batch = -1;
  EXPECT_EQ(KvCache::create(decode_config(), o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
