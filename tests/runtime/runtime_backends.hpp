// The runtime suites run on both backends as value parameters (kCpu, kCuda). The CUDA
// instantiation skips with a clear message where no device is usable, and fails instead under
// PAGEDKV_REQUIRE_CUDA=1 (scripts/gpu-run.sh), so a GPU run that skips everything cannot pass.
// CPU-only knobs (copy delays, memory limits: CpuBackendOptions) exist on the CPU backend only.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "pagedkv/backend.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

/// Both backends, for INSTANTIATE_TEST_SUITE_P (alone or inside ::testing::Combine).
inline auto runtime_backends() { return ::testing::Values(BackendKind::kCpu, BackendKind::kCuda); }

/// "Cpu" or "Cuda": the instantiation's name, so `--gtest_filter='*Cuda*'` selects the device.
inline const char* backend_label(BackendKind kind) {
  return kind == BackendKind::kCuda ? "Cuda" : "Cpu";
}

/// Names an instantiation whose parameter is a BackendKind.
inline std::string backend_param_name(const ::testing::TestParamInfo<BackendKind>& info) {
  return backend_label(info.param);
}

/// Returns normally when `kind` can run here. For kCuda without a usable device it marks the
/// current test skipped (failed under PAGEDKV_REQUIRE_CUDA=1); the caller (SetUp, or a test body
/// followed by `if (IsSkipped()) return;`) must not go on.
inline void require_backend(BackendKind kind) {
  if (kind != BackendKind::kCuda || cuda_device_available()) return;
  if (cuda_required()) FAIL() << kCudaRequiredMessage;
  GTEST_SKIP() << (cuda_backend_built() ? "no CUDA device present"
                                        : "this build has no CUDA backend")
               << ": the CUDA instantiation is skipped";
}

/// A backend of `kind` (kCpu or kCuda), checked to be of that kind: a CUDA instantiation that
/// silently ran on the CPU would prove nothing. `cpu_options` shape the CPU backend only: its
/// copy delays make transfers lag as a device's do on their own. Null (with a failure) when the
/// backend cannot be created.
inline std::unique_ptr<Backend> make_backend(BackendKind kind,
                                             const CpuBackendOptions& cpu_options = {}) {
  if (kind == BackendKind::kCpu) return create_cpu_backend(cpu_options);
  auto backend = create_backend(kind);
  EXPECT_OK(backend);
  if (!backend.ok()) return nullptr;
  EXPECT_EQ((*backend)->kind(), kind)
      << "asked for " << backend_label(kind) << ", got " << (*backend)->description();
  if ((*backend)->kind() != kind) return nullptr;
  return std::move(backend).value();
}

/// Fixture base of a suite parameterized by backend alone: skips in SetUp as above.
class BackendParamTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override { require_backend(GetParam()); }
  BackendKind kind() const { return GetParam(); }
};

}  // namespace pagedkv::testing
