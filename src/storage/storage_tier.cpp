// The defaults of StorageTier's optional calls, for stores that have nothing faster.
#include "pagedkv/storage_tier.hpp"

namespace pagedkv {

StatusOr<std::vector<bool>> StorageTier::exists_each(const std::vector<StorageKey>& keys) {
  std::vector<bool> out;
  out.reserve(keys.size());
  for (const StorageKey& k : keys) {
    StatusOr<size_t> n = batch_exists({k});
    if (!n.ok()) return n.status();
    out.push_back(*n == 1);
  }
  return out;
}

StatusOr<std::vector<StorageCompletion>> StorageTier::wait(const std::vector<uint64_t>&, int64_t) {
  return Status(StatusCode::kUnimplemented,
                std::string("wait: the ") + medium() + " storage tier has none; poll() instead");
}

}  // namespace pagedkv
