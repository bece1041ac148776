// How the data-plane ops split their work over the index space, and a test hook to force it.
#pragma once

#include "pagedkv/backend.hpp"

namespace pagedkv::ops_detail {

/// kWide: a whole row (or block) per index, the CPU backend's shape; kNarrow: the GPU's shape,
/// rows cut into vector-sized chunks, up to a warp's worth of indices per row (one vector per
/// index for blocks); kAuto: by backend kind.
enum class LaunchShape { kAuto = 0, kWide = 1, kNarrow = 2 };

/// Forces a shape for every later op on any backend (tests use it to run the GPU's shape on the
/// CPU backend). Not thread-safe; kAuto restores the default.
void set_launch_shape_for_testing(LaunchShape shape);

/// True when `backend` should get one row (or block) per index.
bool wide_launch(const Backend& backend);

}  // namespace pagedkv::ops_detail
