// Default implementations of the optional Backend methods.
#include "pagedkv/backend.hpp"

namespace pagedkv {

StatusOr<void*> Backend::mapped_device_pointer(void* pinned) {
  if (pinned == nullptr) return invalid_argument("mapped_device_pointer: null pointer");
  return unimplemented("mapped_device_pointer: " + description() +
                       " does not map pinned memory into the device's address space");
}

}  // namespace pagedkv
