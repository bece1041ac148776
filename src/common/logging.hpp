// The library's one named logger ("pagedkv"). Host .cpp files only; never in public headers,
// .cu or .cuh files. The host application's default logger is left alone.
#pragma once

#include <spdlog/spdlog.h>

namespace pagedkv::detail {

/// The "pagedkv" logger, writing to stderr. Its level comes from PAGEDKV_LOG_LEVEL
/// (trace, debug, info, warn, error, off; default info).
spdlog::logger& logger();

}  // namespace pagedkv::detail
