// Default implementations of the optional Backend methods, and the names and checks of the
// backend enums.
#include <string>

#include "pagedkv/backend.hpp"

namespace pagedkv {

const char* stream_priority_name(StreamPriority priority) {
  switch (priority) {
    case StreamPriority::kNormal:
      return "normal";
    case StreamPriority::kLow:
      return "low";
  }
  return "unknown";
}

const char* copy_kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kHostToHost:
      return "host-to-host";
  }
  return "unknown";
}

Status validate_stream_priority(StreamPriority priority) {
  if (priority == StreamPriority::kNormal || priority == StreamPriority::kLow) return ok_status();
  return invalid_argument("create_stream: unknown stream priority " +
                          std::to_string(static_cast<int>(priority)));
}

StatusOr<void*> Backend::mapped_device_pointer(void* pinned) {
  if (pinned == nullptr) return invalid_argument("mapped_device_pointer: null pointer");
  return unimplemented("mapped_device_pointer: " + description() +
                       " does not map pinned memory into the device's address space");
}

}  // namespace pagedkv
