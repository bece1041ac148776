// Entry points of the CUDA backend library, callable from host C++ without CUDA headers.
#pragma once

#include <memory>

#include "pagedkv/backend.hpp"

namespace pagedkv::cuda {

/// Number of CUDA devices visible to this process (0 when there is no driver or device).
int device_count();

/// A backend on the current CUDA device; kUnavailable when there is none.
StatusOr<std::unique_ptr<Backend>> create_cuda_backend();

}  // namespace pagedkv::cuda
