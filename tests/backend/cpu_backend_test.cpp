// Behaviour specific to the CPU backend and to backend selection.
#include "pagedkv/cpu_backend.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "pagedkv/backend.hpp"

namespace pagedkv {
namespace {

TEST(CpuBackend, EnqueueReturnsBeforeTheWorkRuns) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::milliseconds(100);
  auto be = create_cpu_backend(options);
  auto stream = be->create_stream();
  ASSERT_TRUE(stream.ok());
  std::vector<char> src(1024, 'x');
  std::vector<char> dst(1024, 'o');
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      be->copy_async(dst.data(), src.data(), src.size(), CopyKind::kHostToHost, *stream).ok());
  const auto queued = std::chrono::steady_clock::now() - start;
  EXPECT_LT(queued, std::chrono::milliseconds(50)) << "copy_async blocked the caller";
  EXPECT_EQ(dst[0], 'o') << "the delayed copy already happened";
  ASSERT_TRUE(be->synchronize_stream(*stream).ok());
  EXPECT_EQ(dst, src);
  be->destroy_stream(*stream);
}

TEST(CpuBackend, MemoryLimitGivesResourceExhausted) {
  CpuBackendOptions options;
  options.device_memory_limit = 4096;
  options.pinned_memory_limit = 1024;
  auto be = create_cpu_backend(options);
  auto a = be->allocate_device(4000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(be->allocate_device(256).status().code(), StatusCode::kResourceExhausted);
  be->free_device(*a);
  auto b = be->allocate_device(4096);  // freed memory can be had again
  EXPECT_TRUE(b.ok());
  be->free_device(*b);
  EXPECT_EQ(be->allocate_pinned(2048).status().code(), StatusCode::kResourceExhausted);
}

TEST(BackendSelection, AutoPicksCudaOnlyWithADevice) {
  auto be = create_backend(BackendKind::kAuto);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  EXPECT_EQ((*be)->kind(), cuda_device_available() ? BackendKind::kCuda : BackendKind::kCpu);
}

TEST(BackendSelection, ExplicitCudaWithoutDeviceIsUnavailable) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  auto be = create_backend(BackendKind::kCuda);
  EXPECT_EQ(be.status().code(), StatusCode::kUnavailable);
}

TEST(BackendSelection, UnknownKindIsInvalid) {
  EXPECT_EQ(create_backend(static_cast<BackendKind>(9)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
