// Typed-test support: the same test body instantiated for each backend. The CUDA instantiation
// skips with a clear message where no device is present (or the build has no CUDA).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/backend.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

/// True when PAGEDKV_REQUIRE_CUDA=1: a GPU run (scripts/gpu-run.sh) sets it, so a CUDA test that
/// finds no device fails instead of skipping, and a run that skips everything cannot pass.
inline bool cuda_required() {
  const char* v = std::getenv("PAGEDKV_REQUIRE_CUDA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
inline constexpr const char* kCudaRequiredMessage =
    "PAGEDKV_REQUIRE_CUDA=1 but no CUDA device is usable (or this build has no CUDA backend)";

struct CpuBackendTag {
  static constexpr BackendKind kKind = BackendKind::kCpu;
};
struct CudaBackendTag {
  static constexpr BackendKind kKind = BackendKind::kCuda;
};

using AllBackends = ::testing::Types<CpuBackendTag, CudaBackendTag>;

/// Names typed-test instantiations "Cpu" and "Cuda" instead of 0 and 1.
struct BackendName {
  template <typename Tag>
  static std::string GetName(int) {
    return Tag::kKind == BackendKind::kCpu ? "Cpu" : "Cuda";
  }
};

/// Fixture holding one backend of the tag's kind.
template <typename Tag>
class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Tag::kKind == BackendKind::kCuda && !cuda_device_available()) {
      if (cuda_required()) FAIL() << kCudaRequiredMessage;
      GTEST_SKIP() << (cuda_backend_built() ? "no CUDA device present"
                                            : "this build has no CUDA backend")
                   << ": the CUDA instantiation is skipped";
    }
    auto backend = create_backend(Tag::kKind);
    ASSERT_OK(backend);
    backend_ = std::move(backend).value();
  }

  Backend& backend() { return *backend_; }

  std::unique_ptr<Backend> backend_;
};

/// Device memory owned by a test, with blocking upload and download helpers.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, size_t bytes) : backend_(&backend), bytes_(bytes) {
    auto ptr = backend.allocate_device(bytes == 0 ? 1 : bytes);
    EXPECT_OK(ptr);
    if (ptr.ok()) data_ = *ptr;
  }
  ~DeviceBuffer() { backend_->free_device(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  /// Copies `bytes()` bytes from `src` into the buffer and waits.
  void upload(const void* src) {
    ASSERT_OK(backend_->copy_async(data_, src, bytes_, CopyKind::kHostToDevice, Stream{}));
    ASSERT_OK(backend_->synchronize_stream(Stream{}));
  }
  template <typename T>
  void upload(const std::vector<T>& src) {
    ASSERT_EQ(src.size() * sizeof(T), bytes_);
    upload(static_cast<const void*>(src.data()));
  }
  /// Waits for the default stream, then copies the buffer out.
  template <typename T>
  std::vector<T> download() {
    std::vector<T> out(bytes_ / sizeof(T));
    EXPECT_OK(backend_->synchronize_stream(Stream{}));
    EXPECT_OK(backend_->copy_async(out.data(), data_, bytes_, CopyKind::kDeviceToHost, Stream{}));
    EXPECT_OK(backend_->synchronize_stream(Stream{}));
    return out;
  }

 private:
  Backend* backend_;
  size_t bytes_;
  void* data_ = nullptr;
};

/// Queues the spin kernel (kernels::SpinBody) on `stream` for `nanoseconds` over `indices`
/// indices: a model kernel's stand-in that keeps the stream (and with enough indices the SMs)
/// busy, on either backend.
inline Status launch_spin(Backend& backend, Stream stream, int64_t nanoseconds,
                          int64_t indices = 1) {
  const kernels::SpinBody spin{nanoseconds};
  KernelLaunch launch;
  launch.kernel = KernelId::kSpin;
  launch.params = &spin;
  launch.params_size = sizeof(spin);
  launch.num_items = indices;
  return backend.launch(launch, stream);
}

}  // namespace pagedkv::testing
