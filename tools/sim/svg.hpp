// A hand-built SVG chart of a run: blocks per tier and the prefix hit rate over the steps.
#pragma once

#include <string>

#include "pagedkv/config.hpp"
#include "pagedkv/status.hpp"
#include "scheduler.hpp"

namespace pagedkv {
namespace sim {

/// The chart as a standalone SVG document (opens in a browser).
std::string render_svg(const CacheConfig& cache, const SimResult& r, const std::string& title);

/// Writes render_svg() to `path`; kUnavailable when it cannot be written.
Status write_svg(const std::string& path, const CacheConfig& cache, const SimResult& r,
                 const std::string& title);

}  // namespace sim
}  // namespace pagedkv
