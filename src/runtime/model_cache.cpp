// ModelKvCache: the model-level shapes over the one KvCache that holds every group (see the
// header).
#include "pagedkv/model_cache.hpp"

#include <string>
#include <utility>

#include "common/nvtx.hpp"

namespace pagedkv {

namespace {

std::string group_name(const CacheConfig& c, int32_t g) {
  std::string s = "group " + std::to_string(g);
  if (!c.groups.empty() && !c.groups[static_cast<size_t>(g)].name.empty()) {
    s += " (" + c.groups[static_cast<size_t>(g)].name + ")";
  }
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<ModelKvCache>> ModelKvCache::create(const CacheConfig& config,
                                                             ModelKvCacheOptions options) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::create");
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (options.cache.storage != nullptr || !options.cache.group_storage.empty()) {
    return invalid_argument(
        "storage: give a ModelKvCache its storage tiers per group "
        "(ModelKvCacheOptions::storage)");
  }
  const int32_t n = config.num_groups();
  if (!options.storage.empty() && static_cast<int32_t>(options.storage.size()) != n) {
    return invalid_argument("storage: " + std::to_string(options.storage.size()) +
                            " storage tiers for " + std::to_string(n) + " groups");
  }
  // The one cache checks the stores (one per group, none shared) and the groups' shape.
  options.cache.group_storage = std::move(options.storage);
  std::unique_ptr<ModelKvCache> model(new ModelKvCache());
  model->config_ = config;
  PAGEDKV_ASSIGN_OR_RETURN(model->cache_, KvCache::create(config, std::move(options.cache)));
  return model;
}

ModelKvCache::~ModelKvCache() = default;

Status ModelKvCache::check_group(int32_t g) const {
  if (g < 0 || g >= num_groups()) {
    return out_of_range("group " + std::to_string(g) + " outside the model's " +
                        std::to_string(num_groups()) + " groups");
  }
  return ok_status();
}

Status ModelKvCache::check_batch(const ModelBatch& batch) const {
  if (static_cast<int32_t>(batch.groups.size()) != num_groups()) {
    return invalid_argument("batch: " + std::to_string(batch.groups.size()) +
                            " groups, the model has " + std::to_string(num_groups()));
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    const DeviceBatch& b = batch.groups[static_cast<size_t>(g)];
    if (!cache_->built_here(b) || b.group != g) {
      return invalid_argument("batch: " + group_name(config_, g) +
                              "'s batch was not built by this model's build_batch");
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------- sequences

StatusOr<int64_t> ModelKvCache::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                             const SequenceOptions& options) {
  return cache_->add_sequence(id, prompt, options);
}

StatusOr<std::vector<std::vector<int64_t>>> ModelKvCache::reserve(SequenceId id, int64_t n) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::reserve");
  std::vector<std::vector<int64_t>> slots;
  PAGEDKV_ASSIGN_OR_RETURN(std::vector<int64_t> owner, cache_->reserve(id, n));
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (g == cache_->full_group()) {
      slots.push_back(std::move(owner));
      continue;
    }
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<int64_t> s, cache_->reserved_slots(id, g));
    slots.push_back(std::move(s));
  }
  return slots;
}

Status ModelKvCache::reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each) {
  // The slots are not returned: build_batch gives each group's as its slot mapping.
  return cache_->reserve_batch_into(ids, n_each, nullptr);
}

Status ModelKvCache::write_kv(SequenceId id, int32_t layer, const void* key, const void* value,
                              DType input_dtype, int64_t row_stride) {
  return cache_->write_kv(id, layer, key, value, input_dtype, row_stride);
}

Status ModelKvCache::write_kv_batch(const ModelBatch& batch, int32_t layer, const void* key,
                                    const void* value, DType input_dtype, int64_t row_stride) {
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, layer_group(layer));
  return cache_->write_kv_batch(batch.groups[static_cast<size_t>(lg.group)], layer, key, value,
                                input_dtype, row_stride);
}

Status ModelKvCache::write_kv_batch_all_layers(const ModelBatch& batch, int32_t g, const void* key,
                                               const void* value, DType input_dtype,
                                               int64_t row_stride, int64_t layer_stride) {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  return cache_->write_kv_batch_all_layers(batch.groups[static_cast<size_t>(g)], key, value,
                                           input_dtype, row_stride, layer_stride);
}

Status ModelKvCache::commit(SequenceId id, const std::vector<TokenId>& tokens) {
  return cache_->commit(id, tokens);
}

Status ModelKvCache::commit_batch(const std::vector<SequenceId>& ids,
                                  const std::vector<TokenId>& tokens, int64_t n_each) {
  return cache_->commit_batch(ids, tokens, n_each);
}

Status ModelKvCache::rollback(SequenceId id, int64_t length) {
  return cache_->rollback(id, length);
}

Status ModelKvCache::fork(SequenceId parent, SequenceId child) {
  return cache_->fork(parent, child);
}

Status ModelKvCache::finish(SequenceId id) { return cache_->finish(id); }

Status ModelKvCache::erase(SequenceId id) { return cache_->erase(id); }

Status ModelKvCache::set_active(const std::vector<SequenceId>& ids) {
  return cache_->set_active(ids);
}

Status ModelKvCache::set_priority(SequenceId id, int32_t priority) {
  return cache_->set_priority(id, priority);
}

// ---------------------------------------------------------------- tiers

Status ModelKvCache::offload(SequenceId id) { return cache_->offload(id); }

Status ModelKvCache::restore(SequenceId id) { return cache_->restore(id); }

Status ModelKvCache::prefetch(const std::vector<SequenceId>& ids) { return cache_->prefetch(ids); }

StatusOr<SequenceResidency> ModelKvCache::residency(SequenceId id) { return cache_->residency(id); }

std::vector<SequenceId> ModelKvCache::drain_evicted_sequences() {
  return cache_->drain_evicted_sequences();
}

// ---------------------------------------------------------------- storage

StatusOr<int64_t> ModelKvCache::fetch_from_storage(const std::vector<TokenId>& prompt,
                                                   const SequenceOptions& options) {
  return cache_->fetch_from_storage(prompt, options);
}

Status ModelKvCache::poll_storage() { return cache_->poll_storage(); }

int64_t ModelKvCache::storage_in_flight() const { return cache_->storage_in_flight(); }

Status ModelKvCache::flush_storage() { return cache_->flush_storage(); }

// ---------------------------------------------------------------- reading

StatusOr<ModelBatch> ModelKvCache::build_batch(const std::vector<SequenceId>& ids,
                                               const BatchOptions& options) {
  ModelBatch batch;
  PAGEDKV_ASSIGN_OR_RETURN(batch.groups, cache_->build_batches(ids, options));
  return batch;
}

StatusOr<device::PagedKvView> ModelKvCache::device_view(const ModelBatch& batch, int32_t g,
                                                        KvScales scales) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  return cache_->device_view(batch.groups[static_cast<size_t>(g)], scales);
}

Status ModelKvCache::gather_layer(SequenceId id, int32_t layer, void* key_out, void* value_out,
                                  DType packed_dtype, PackedLayout packed_layout,
                                  int64_t position_begin, int64_t num_tokens) {
  return cache_->gather_layer(id, layer, key_out, value_out, packed_dtype, packed_layout,
                              position_begin, num_tokens);
}

}  // namespace pagedkv
