// Entry points of the CUDA backend library, callable from host C++ without CUDA headers.
#pragma once

#include <memory>

#include "pagedkv/backend.hpp"

namespace pagedkv::cuda {

/// Number of CUDA devices visible to this process (0 when there is no driver or device).
int device_count();

/// A backend on CUDA device `device` (-1: the current one); kUnavailable when there is none,
/// kInvalidArgument for a device that is not present.
StatusOr<std::unique_ptr<Backend>> create_cuda_backend(int device = -1);

}  // namespace pagedkv::cuda
