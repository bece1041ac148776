// ModelKvCache's storage calls: each group's storage tier, the window groups fetching for the
// hit the full-attention groups reach (see the header).
#include <algorithm>

#include "common/nvtx.hpp"
#include "pagedkv/model_cache.hpp"

namespace pagedkv {

StatusOr<int64_t> ModelKvCache::fetch_from_storage(const std::vector<TokenId>& prompt,
                                                   const SequenceOptions& options) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::fetch_from_storage");
  // A window group's blocks serve one hit length only, so it fetches for the longest hit the
  // full-attention groups reach once their own blocks land.
  int64_t reach = -1;  // no bound yet
  int64_t blocks = 0;
  for (const bool window : {false, true}) {
    for (int32_t g = 0; g < num_planes(); ++g) {
      if ((group(g).config().sliding_window > 0) != window) continue;
      StatusOr<StorageFetch> f = group(g).fetch_prefix_from_storage(prompt, options, reach);
      if (!f.ok()) return in_group(g, f.status());
      blocks += f->blocks;
      if (!window) reach = reach < 0 ? f->reach : std::min(reach, f->reach);
    }
  }
  return blocks;
}

Status ModelKvCache::poll_storage() {
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_RETURN_IF_ERROR(in_group(g, group(g).poll_storage()));
  }
  return ok_status();
}

int64_t ModelKvCache::storage_in_flight() const {
  int64_t n = 0;
  for (int32_t g = 0; g < num_planes(); ++g) n += group(g).storage_in_flight();
  return n;
}

Status ModelKvCache::flush_storage() {
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_RETURN_IF_ERROR(in_group(g, group(g).flush_storage()));
  }
  return ok_status();
}

}  // namespace pagedkv
