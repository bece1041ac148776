// KvCache's storage tier calls: the glue is runtime::StorageLink (storage_link.hpp).
#include "common/logging.hpp"
#include "common/nvtx.hpp"
#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "runtime/storage_link.hpp"
#include "runtime/transfer_engine.hpp"

namespace pagedkv {

StatusOr<int64_t> KvCache::fetch_from_storage(const std::vector<TokenId>& prompt,
                                              const SequenceOptions& options) {
  PAGEDKV_ASSIGN_OR_RETURN(StorageFetch f, fetch_prefix_from_storage(prompt, options, -1));
  return f.blocks;
}

StatusOr<StorageFetch> KvCache::fetch_prefix_from_storage(const std::vector<TokenId>& prompt,
                                                          const SequenceOptions& options,
                                                          int64_t max_cached) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::fetch_from_storage");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("fetch_from_storage"));
  if (storage_ == nullptr) {
    StorageFetch none;
    PAGEDKV_ASSIGN_OR_RETURN(none.reach, control_->cached_prefix(prompt, options.ns, max_cached));
    return none;
  }
  return storage_->fetch(*control_, prompt, options.ns, max_cached, transfers_->copy_stream(),
                         compute_);
}

Status KvCache::poll_storage() {
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("poll_storage"));
  if (storage_ == nullptr) return ok_status();
  return storage_->poll(*control_);
}

void KvCache::poll_storage_quietly() {
  if (storage_ == nullptr) return;
  const Status st = storage_->poll(*control_);
  if (!st.ok()) detail::logger().warn("KvCache: storage poll: {}", st.message());
}

int64_t KvCache::storage_in_flight() const { return control_->arrivals_in_flight(); }

Status KvCache::flush_storage() {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::flush_storage");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("flush_storage"));
  if (storage_ == nullptr) return ok_status();
  return storage_->flush(*control_);
}

}  // namespace pagedkv
