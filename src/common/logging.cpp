#include "common/logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>

namespace pagedkv::detail {

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto log = std::make_shared<spdlog::logger>("pagedkv", std::move(sink));
    log->set_pattern("[%H:%M:%S.%e] [pagedkv] [%l] %v");
    const char* level = std::getenv("PAGEDKV_LOG_LEVEL");
    log->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::info);
    return log;
  }();
  return *instance;
}

}  // namespace pagedkv::detail
