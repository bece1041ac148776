// The argument checks shared by every backend's copy_batch().
#include <string>

#include "pagedkv/backend.hpp"

namespace pagedkv {

Status validate_copy_batch(const CopyRegion* regions, size_t count) {
  if (count == 0) return ok_status();
  if (regions == nullptr) {
    return invalid_argument("copy_batch: null regions for " + std::to_string(count) + " copies");
  }
  for (size_t i = 0; i < count; ++i) {
    const CopyRegion& r = regions[i];
    if (r.bytes == 0) continue;
    if (r.dst == nullptr || r.src == nullptr) {
      return invalid_argument("copy_batch: region " + std::to_string(i) + " of " +
                              std::to_string(count) + " has a null " +
                              (r.dst == nullptr ? "destination" : "source"));
    }
  }
  return ok_status();
}

}  // namespace pagedkv
