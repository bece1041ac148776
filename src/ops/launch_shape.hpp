// How the data-plane ops split their work over the index space, and a test hook to force it.
#pragma once

#include <cstdint>

#include "pagedkv/backend.hpp"

namespace pagedkv::ops_detail {

/// kWide: a whole row (or block) per index, the CPU backend's shape; kNarrow: the GPU's shape,
/// rows cut into vector-sized chunks, a power of two of indices per row (one vector per index for
/// blocks); kAuto: by backend kind.
enum class LaunchShape { kAuto = 0, kWide = 1, kNarrow = 2 };

/// The threads the narrow shape assumes a device keeps resident at once where the backend does
/// not say (Backend::max_resident_threads() 0, the CPU backend): an H100's or H200's 132 SMs x
/// 2048.
inline constexpr int64_t kModelResidentThreads = int64_t{132} * 2048;

/// Forces a shape for every later op on any backend (tests use it to run the GPU's shape on the
/// CPU backend); a positive `resident_threads` also stands in for the backend's
/// max_resident_threads(), so a test picks how many lanes rows get. Not thread-safe; kAuto (and
/// 0) restores the default.
void set_launch_shape_for_testing(LaunchShape shape, int64_t resident_threads = 0);

/// True when `backend` should get one row (or block) per index.
bool wide_launch(const Backend& backend);

/// The resident threads the narrow shape sizes its lanes by: the value forced for testing, else
/// the backend's max_resident_threads(), else kModelResidentThreads.
int64_t resident_threads(const Backend& backend);

/// Lanes per row in the narrow shape, a power of two: the fewest that cover `segs_per_row`
/// chunks, at most a warp (kernels::kWarpRowLanes); then, while `rows` rows of twice as many
/// lanes still fit in `resident_threads` (a decode step's few rows leave the device half idle
/// otherwise), twice as many, up to one lane per chunk and kernels::kMaxRowLanes. A pure
/// function of its arguments (all >= 0; 0 segments give 1, 0 rows never grow past a warp).
int64_t row_lanes(int64_t segs_per_row, int64_t rows, int64_t resident_threads);

}  // namespace pagedkv::ops_detail
