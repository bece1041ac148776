// Backend::copy_batch: scattered regions of odd sizes, bit-exact against a per-region reference on
// every backend, argument checks that queue nothing, stream order, and the fault-injection
// wrapper's count and record of batched calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::BackendTest;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

bool is_device(CopyKind kind, bool source) {
  switch (kind) {
    case CopyKind::kDeviceToDevice:
      return true;
    case CopyKind::kDeviceToHost:
      return source;
    case CopyKind::kHostToDevice:
      return !source;
    case CopyKind::kHostToHost:
      return false;
  }
  return false;
}

// A buffer in device or pinned memory with blocking fill and read-back.
class Buffer {
 public:
  Buffer(Backend& backend, size_t bytes, bool device)
      : backend_(backend), bytes_(bytes), device_(device) {
    auto p = device ? backend.allocate_device(bytes) : backend.allocate_pinned(bytes);
    EXPECT_OK(p);
    if (p.ok()) data_ = static_cast<uint8_t*>(*p);
  }
  ~Buffer() {
    if (device_) {
      backend_.free_device(data_);
    } else {
      backend_.free_pinned(data_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() const { return data_; }
  void write(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(bytes.size(), bytes_);
    ASSERT_OK(backend_.copy_async(data_, bytes.data(), bytes_,
                                  device_ ? CopyKind::kHostToDevice : CopyKind::kHostToHost,
                                  Stream{}));
    ASSERT_OK(backend_.synchronize_stream(Stream{}));
  }
  std::vector<uint8_t> read() {
    std::vector<uint8_t> out(bytes_);
    EXPECT_OK(backend_.copy_async(out.data(), data_, bytes_,
                                  device_ ? CopyKind::kDeviceToHost : CopyKind::kHostToHost,
                                  Stream{}));
    EXPECT_OK(backend_.synchronize_stream(Stream{}));
    return out;
  }

 private:
  Backend& backend_;
  size_t bytes_;
  bool device_;
  uint8_t* data_ = nullptr;
};

// `count` regions between `src` and `dst` of odd sizes up to `slot` bytes (some empty), each in
// its own slot on either side, the slots in random order: no two regions overlap.
std::vector<CopyRegion> scattered_regions(uint8_t* dst, const uint8_t* src, size_t count,
                                          size_t slot, std::mt19937& rng) {
  std::vector<size_t> src_slots(count), dst_slots(count);
  std::iota(src_slots.begin(), src_slots.end(), 0);
  std::iota(dst_slots.begin(), dst_slots.end(), 0);
  std::shuffle(src_slots.begin(), src_slots.end(), rng);
  std::shuffle(dst_slots.begin(), dst_slots.end(), rng);
  std::vector<CopyRegion> regions(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t bytes = rng() % 11 == 0 ? 0 : 1 + rng() % slot;
    const size_t src_at = src_slots[i] * slot + rng() % (slot - bytes + 1);
    const size_t dst_at = dst_slots[i] * slot + rng() % (slot - bytes + 1);
    regions[i] = CopyRegion{dst + dst_at, src + src_at, bytes};
  }
  return regions;
}

template <typename Tag>
class CopyBatchTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(CopyBatchTest, testing::AllBackends, testing::BackendName);

TYPED_TEST(CopyBatchTest, ScatteredRegionsMatchAPerRegionReference) {
  Backend& b = this->backend();
  auto stream = b.create_stream();
  ASSERT_OK(stream);
  std::mt19937 rng(20240611);
  const CopyKind kinds[] = {CopyKind::kDeviceToHost, CopyKind::kHostToDevice,
                            CopyKind::kDeviceToDevice, CopyKind::kHostToHost};
  for (CopyKind kind : kinds) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{33}, size_t{259}}) {
      const size_t slot = 1 + rng() % 3001;  // odd sizes, odd alignments
      const size_t bytes = count * slot;
      Buffer src(b, bytes, is_device(kind, /*source=*/true));
      Buffer dst(b, bytes, is_device(kind, /*source=*/false));
      const std::vector<uint8_t> src_bytes = random_bytes(bytes, static_cast<uint32_t>(rng()));
      std::vector<uint8_t> expected = random_bytes(bytes, static_cast<uint32_t>(rng()));  // poison
      src.write(src_bytes);
      dst.write(expected);
      const std::vector<CopyRegion> regions =
          scattered_regions(dst.data(), src.data(), count, slot, rng);
      for (const CopyRegion& r : regions) {  // the reference: one region at a time
        const size_t from = static_cast<const uint8_t*>(r.src) - src.data();
        const size_t to = static_cast<uint8_t*>(r.dst) - dst.data();
        std::memcpy(expected.data() + to, src_bytes.data() + from, r.bytes);
      }
      ASSERT_OK(b.copy_batch(regions.data(), regions.size(), kind, *stream));
      ASSERT_OK(b.synchronize_stream(*stream));
      EXPECT_EQ(dst.read(), expected) << "kind " << static_cast<int>(kind) << ", " << count
                                      << " regions of up to " << slot << " bytes";
    }
  }
  b.destroy_stream(*stream);
}

TYPED_TEST(CopyBatchTest, BadArgumentsAreRejectedAndQueueNothing) {
  Backend& b = this->backend();
  Buffer src(b, 256, /*device=*/true);
  Buffer dst(b, 256, /*device=*/true);
  src.write(random_bytes(256, 1));
  const std::vector<uint8_t> poison = random_bytes(256, 2);
  dst.write(poison);
  const CopyKind kind = CopyKind::kDeviceToDevice;

  EXPECT_OK(b.copy_batch(nullptr, 0, kind, Stream{}));  // count 0: a no-op
  const Status null_regions = b.copy_batch(nullptr, 3, kind, Stream{});
  EXPECT_EQ(null_regions.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_regions.message().find("null regions"), std::string::npos)
      << null_regions.message();

  // A good region first, then a bad one: the good one must not be copied either.
  CopyRegion regions[] = {{dst.data(), src.data(), 64}, {nullptr, src.data() + 64, 64}};
  const Status null_dst = b.copy_batch(regions, 2, kind, Stream{});
  EXPECT_EQ(null_dst.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_dst.message().find("region 1 of 2 has a null destination"), std::string::npos)
      << null_dst.message();
  regions[1] = CopyRegion{dst.data() + 64, nullptr, 64};
  EXPECT_NE(b.copy_batch(regions, 2, kind, Stream{}).message().find("null source"),
            std::string::npos);
  regions[1] = CopyRegion{nullptr, nullptr, 0};  // empty: skipped, not an error
  int unknown = 0;
  EXPECT_EQ(b.copy_batch(regions, 2, kind, Stream{&unknown}).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(b.synchronize_stream(Stream{}));
  EXPECT_EQ(dst.read(), poison) << "a rejected batch copied something";

  // The same batch with a good stream does copy (so the check above can fail).
  ASSERT_OK(b.copy_batch(regions, 2, kind, Stream{}));
  ASSERT_OK(b.synchronize_stream(Stream{}));
  EXPECT_NE(dst.read(), poison);
}

TYPED_TEST(CopyBatchTest, RunsInStreamOrderBetweenKernels) {
  Backend& b = this->backend();
  auto stream = b.create_stream();
  ASSERT_OK(stream);
  const size_t words = 4096;
  Buffer src(b, words * 4, /*device=*/true);
  Buffer dst(b, words * 4, /*device=*/true);
  dst.write(random_bytes(words * 4, 3));
  auto* src_words = reinterpret_cast<uint32_t*>(src.data());
  const kernels::FillBody before{src_words, 0x11111111u};
  const kernels::FillBody after{src_words, 0x22222222u};
  // Fill, copy (two halves, the second first), fill again: the copy sees the first fill only.
  ASSERT_OK(b.launch({KernelId::kFill, &before, sizeof(before), words}, *stream));
  const CopyRegion regions[] = {{dst.data() + words * 2, src.data() + words * 2, words * 2},
                                {dst.data(), src.data(), words * 2}};
  ASSERT_OK(b.copy_batch(regions, 2, CopyKind::kDeviceToDevice, *stream));
  ASSERT_OK(b.launch({KernelId::kFill, &after, sizeof(after), words}, *stream));
  ASSERT_OK(b.synchronize_stream(*stream));
  std::vector<uint8_t> expected(words * 4);
  for (size_t i = 0; i < words; ++i) std::memcpy(&expected[i * 4], &before.value, 4);
  EXPECT_EQ(dst.read(), expected);
  b.destroy_stream(*stream);
}

TEST(FaultInjectionCopyBatch, IsOneCopyCallThatCanFailAndIsRecorded) {
  auto inner = create_cpu_backend();
  FaultInjectionBackend fi(*inner);
  fi.record_copies(true);
  std::vector<uint8_t> src = random_bytes(300, 4), dst(300, 0xee);
  const std::vector<uint8_t> untouched = dst;
  const CopyRegion regions[] = {{dst.data(), src.data(), 100},
                                {dst.data() + 100, src.data() + 200, 50},
                                {dst.data() + 200, src.data() + 100, 99}};
  auto stream = fi.create_stream();
  ASSERT_OK(stream);

  fi.fail_nth(FaultKind::kCopy, 1);
  const Status failed = fi.copy_batch(regions, 3, CopyKind::kHostToHost, *stream);
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_EQ(failed.message(), "injected fault: copy #1 (copy_batch)");
  ASSERT_OK(fi.synchronize_stream(*stream));
  EXPECT_EQ(dst, untouched);

  ASSERT_OK(fi.copy_batch(regions, 3, CopyKind::kHostToHost, *stream));
  ASSERT_OK(fi.copy_async(dst.data() + 299, src.data(), 1, CopyKind::kHostToHost, Stream{}));
  ASSERT_OK(fi.synchronize_stream(*stream));
  ASSERT_OK(fi.synchronize_stream(Stream{}));
  EXPECT_EQ(fi.count(FaultKind::kCopy), 3);
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + 100, dst.begin()));
  EXPECT_TRUE(std::equal(src.begin() + 200, src.begin() + 250, dst.begin() + 100));
  EXPECT_EQ(dst[299], src[0]);

  const std::vector<CopyCall> calls = fi.copy_calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_TRUE(calls[0].batched);
  EXPECT_TRUE(calls[0].failed);
  EXPECT_EQ(calls[0].regions, 3u);
  EXPECT_EQ(calls[0].bytes, 249u);
  EXPECT_TRUE(calls[1].batched);
  EXPECT_FALSE(calls[1].failed);
  EXPECT_EQ(calls[1].stream, *stream);
  EXPECT_FALSE(calls[2].batched);
  EXPECT_EQ(calls[2].regions, 1u);
  EXPECT_EQ(calls[2].stream, Stream{});
  fi.reset_counts();
  EXPECT_TRUE(fi.copy_calls().empty());
  fi.destroy_stream(*stream);
}

}  // namespace
}  // namespace pagedkv
