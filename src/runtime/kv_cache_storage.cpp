// KvCache's storage tier calls: the glue is runtime::StorageLink (storage_link.hpp).
#include "common/logging.hpp"
#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {

StatusOr<int64_t> KvCache::fetch_from_storage(const std::vector<TokenId>& prompt,
                                              const SequenceOptions& options) {
  PAGEDKV_ASSIGN_OR_RETURN(StorageFetch f, fetch_prefix_from_storage(prompt, options, -1));
  return f.blocks;
}

StatusOr<StorageFetch> KvCache::fetch_prefix_from_storage(const std::vector<TokenId>& prompt,
                                                          const SequenceOptions& options,
                                                          int64_t max_cached) {
  PAGEDKV_KV_CACHE_CALL(fetch_from_storage);
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.refuse_if_applying_plans("fetch_from_storage"));
  if (c.storage == nullptr) {
    StorageFetch none;
    PAGEDKV_ASSIGN_OR_RETURN(none.reach, c.control->cached_prefix(prompt, options.ns, max_cached));
    return none;
  }
  return c.storage->fetch(*c.control, prompt, options.ns, max_cached);
}

Status KvCache::poll_storage() {
  PAGEDKV_RETURN_IF_ERROR(impl_->enter("poll_storage"));
  if (impl_->storage == nullptr) return ok_status();
  return impl_->storage->poll(*impl_->control);
}

void KvCache::Impl::poll_storage_quietly() {
  if (storage == nullptr) return;
  const Status st = storage->poll(*control);
  if (!st.ok()) detail::logger().warn("KvCache: storage poll: {}", st.message());
}

int64_t KvCache::storage_in_flight() const { return impl_->control->arrivals_in_flight(); }

Status KvCache::flush_storage() {
  PAGEDKV_KV_CACHE_CALL(flush_storage);
  if (impl_->storage == nullptr) return ok_status();
  return impl_->storage->flush(*impl_->control);
}

}  // namespace pagedkv
