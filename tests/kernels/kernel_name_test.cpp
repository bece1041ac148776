// kernel_name(): the short names logs, errors and NVTX ranges use are the KernelId names
// without their leading 'k'.
#include <gtest/gtest.h>

#include <string>

#include "kernels/registry.hpp"

namespace pagedkv {
namespace {

TEST(KernelName, IsTheIdWithoutItsLeadingK) {
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kFill)), "Fill");
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kPagedRows)), "PagedRows");
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kPagedRowsRaw)), "PagedRowsRaw");
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kCopyBlocks)), "CopyBlocks");
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kDecodeAttention)), "DecodeAttention");
  EXPECT_EQ(std::string(kernels::kernel_name(KernelId::kSpin)), "Spin");
  EXPECT_EQ(std::string(kernels::kernel_name(static_cast<KernelId>(9999))), "unknown");
}

}  // namespace
}  // namespace pagedkv
