// ModelKvCache: one KvCache per KV group, kept in step (see the header).
#include "pagedkv/model_cache.hpp"

#include <algorithm>
#include <iterator>
#include <string>

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

// `st` with the group named in front of its message.
Status named(const CacheConfig& c, int32_t g, const Status& st) {
  if (st.ok() || c.num_groups() == 1) return st;
  return Status(st.code(), group_name(c, g) + ": " + st.message());
}

int rank(SequenceResidency r) {
  switch (r) {
    case SequenceResidency::kHost:
      return 2;
    case SequenceResidency::kInFlight:
      return 1;
    default:
      return 0;
  }
}

}  // namespace

StatusOr<std::unique_ptr<ModelKvCache>> ModelKvCache::create(const CacheConfig& config,
                                                             ModelKvCacheOptions options) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::create");
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (options.cache.storage != nullptr) {
    return invalid_argument(
        "storage: give a ModelKvCache its storage tiers per group "
        "(ModelKvCacheOptions::storage)");
  }
  const int32_t n = config.num_groups();
  if (!options.storage.empty() && static_cast<int32_t>(options.storage.size()) != n) {
    return invalid_argument("storage: " + std::to_string(options.storage.size()) +
                            " storage tiers for " + std::to_string(n) + " groups");
  }
  for (size_t g = 0; g < options.storage.size(); ++g) {
    for (size_t h = 0; h < g; ++h) {
      const StorageTier* a = options.storage[g];
      const StorageTier* b = options.storage[h];
      if (a == nullptr || b == nullptr) continue;
      if (a == b || a->layout().fingerprint() == b->layout().fingerprint()) {
        return invalid_argument(
            "storage: " + group_name(config, static_cast<int32_t>(h)) + " and " +
            group_name(config, static_cast<int32_t>(g)) +
            (a == b ? " share one store" : " have stores of one layout fingerprint") +
            ": give each group's store its own model id");
      }
    }
  }
  const bool any_store = std::any_of(options.storage.begin(), options.storage.end(),
                                     [](const StorageTier* t) { return t != nullptr; });
  std::unique_ptr<ModelKvCache> cache(new ModelKvCache());
  cache->config_ = config;
  cache->shared_ = options.share_blocks;
  for (int32_t g = 0; g < n; ++g) cache->group_configs_.push_back(config.group_config(g));
  KvCacheOptions group_options = options.cache;
  if (group_options.backend == nullptr) {
    PAGEDKV_ASSIGN_OR_RETURN(cache->owned_backend_, create_backend(config.backend));
    group_options.backend = cache->owned_backend_.get();
  }
  // The groups share the caller's stream: wrap it once, here.
  if (group_options.native_compute_stream != nullptr) {
    if (group_options.compute_stream != Stream{}) {
      return invalid_argument("native_compute_stream: set either it or compute_stream, not both");
    }
    PAGEDKV_ASSIGN_OR_RETURN(
        group_options.compute_stream,
        group_options.backend->wrap_stream(group_options.native_compute_stream));
    group_options.native_compute_stream = nullptr;
  }
  cache->layers_ = config.layer_groups();
  if (cache->shared_) {
    // One cache for every group; it checks their shape, and takes a store per group.
    if (any_store) group_options.group_storage = options.storage;
    PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> one, KvCache::create(config, group_options));
    cache->groups_.push_back(std::move(one));
    return cache;
  }
  for (int32_t g = 0; g < n; ++g) {
    KvCacheOptions o = group_options;
    o.storage = options.storage.empty() ? nullptr : options.storage[static_cast<size_t>(g)];
    StatusOr<std::unique_ptr<KvCache>> group = KvCache::create(config.group_config(g), o);
    if (!group.ok()) return named(config, g, group.status());
    cache->groups_.push_back(std::move(*group));
  }
  return cache;
}

ModelKvCache::~ModelKvCache() {
  groups_.clear();  // before the backend they use
}

Status ModelKvCache::in_group(int32_t p, const Status& st) const {
  return shared_ ? st : named(config_, p, st);
}

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
    if (!group(g).built_here(b) || (shared_ && b.group != g)) {
      return invalid_argument("batch: " + group_name(config_, g) +
                              "'s batch was not built by this model's build_batch");
    }
  }
  return ok_status();
}

StatusOr<LayerGroup> ModelKvCache::layer_group(int32_t layer) const {
  return find_layer_group(layers_, layer);
}

// ---------------------------------------------------------------- sequences

StatusOr<int64_t> ModelKvCache::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                             const SequenceOptions& options) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::add_sequence");
  if (contains(id)) return already_exists("sequence " + std::to_string(id) + " already exists");
  // The longest length every group can supply: each group answers the longest it can up to the
  // bound, which only falls, until all agree. A window group's usable lengths are not all the
  // lengths below its longest, so one pass is not enough.
  int64_t agreed = static_cast<int64_t>(prompt.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t g = 0; g < num_planes(); ++g) {
      StatusOr<int64_t> c = group(g).cached_prefix(prompt, options.ns, agreed);
      if (!c.ok()) return in_group(g, c.status());
      if (*c < agreed) {
        agreed = *c;
        changed = true;
      }
    }
  }
  for (int32_t g = 0; g < num_planes(); ++g) {
    StatusOr<int64_t> c = group(g).add_sequence(id, prompt, options, agreed);
    if (c.ok() && *c == agreed) continue;
    for (int32_t h = 0; h <= g; ++h) {
      if (group(h).contains(id)) (void)group(h).erase(id);
    }
    if (!c.ok()) return in_group(g, c.status());
    return internal_error(group_name(config_, g) + " shared " + std::to_string(*c) +
                          " tokens, not the " + std::to_string(agreed) + " every group agreed");
  }
  ids_.insert(id);
  return agreed;
}

void ModelKvCache::drop_reservations(const std::vector<SequenceId>& ids, int32_t upto) {
  for (int32_t g = 0; g < upto; ++g) {
    for (SequenceId id : ids) {
      StatusOr<int64_t> len = group(g).length(id);
      if (len.ok()) (void)group(g).rollback(id, *len);  // the same length: drops the reservation
    }
  }
}

StatusOr<std::vector<std::vector<int64_t>>> ModelKvCache::reserve(SequenceId id, int64_t n) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::reserve");
  std::vector<std::vector<int64_t>> slots;
  if (shared_) {
    KvCache& one = *groups_.front();
    const Status st = one.reserve(id, n).status();
    sync_evictions();
    PAGEDKV_RETURN_IF_ERROR(st);
    for (int32_t g = 0; g < num_groups(); ++g) {
      PAGEDKV_ASSIGN_OR_RETURN(std::vector<int64_t> s, one.reserved_slots(id, g));
      slots.push_back(std::move(s));
    }
    return slots;
  }
  for (int32_t g = 0; g < num_planes(); ++g) {
    StatusOr<std::vector<int64_t>> s = group(g).reserve(id, n);
    if (!s.ok()) {
      // Group 0 checks what every group would (id, n, length): nothing went ahead then.
      if (g > 0) drop_reservations({id}, num_planes());
      sync_evictions();
      return in_group(g, s.status());
    }
    slots.push_back(std::move(*s));
  }
  sync_evictions();
  return slots;
}

Status ModelKvCache::reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each) {
  PAGEDKV_NVTX_RANGE("pagedkv::ModelKvCache::reserve_batch");
  for (int32_t g = 0; g < num_planes(); ++g) {
    // The slots are not returned: build_batch gives each group's as its slot mapping.
    const Status st = group(g).reserve_batch_into(ids, n_each, nullptr);
    if (!st.ok()) {
      if (g > 0) drop_reservations(ids, num_planes());
      sync_evictions();
      return in_group(g, st);
    }
  }
  sync_evictions();
  return ok_status();
}

Status ModelKvCache::write_kv(SequenceId id, int32_t layer, const void* key, const void* value,
                              DType input_dtype, int64_t row_stride) {
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, layer_group(layer));
  if (shared_) return groups_.front()->write_kv(id, layer, key, value, input_dtype, row_stride);
  return in_group(lg.group,
                  group(lg.group).write_kv(id, lg.layer, key, value, input_dtype, row_stride));
}

Status ModelKvCache::write_kv_batch(const ModelBatch& batch, int32_t layer, const void* key,
                                    const void* value, DType input_dtype, int64_t row_stride) {
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, layer_group(layer));
  if (shared_) {
    return groups_.front()->write_kv_batch(batch.groups[static_cast<size_t>(lg.group)], layer, key,
                                           value, input_dtype, row_stride);
  }
  return in_group(lg.group,
                  group(lg.group).write_kv_batch(batch.groups[static_cast<size_t>(lg.group)],
                                                 lg.layer, key, value, input_dtype, row_stride));
}

Status ModelKvCache::write_kv_batch_all_layers(const ModelBatch& batch, int32_t g, const void* key,
                                               const void* value, DType input_dtype,
                                               int64_t row_stride, int64_t layer_stride) {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  return in_group(
      g, group(g).write_kv_batch_all_layers(batch.groups[static_cast<size_t>(g)], key, value,
                                            input_dtype, row_stride, layer_stride));
}

Status ModelKvCache::check_reserved_on_device(SequenceId id, const char* what) const {
  for (int32_t g = 1; g < num_planes(); ++g) {
    const StatusOr<int64_t> pend = group(g).pending(id);
    const StatusOr<int64_t> len = group(g).length(id);
    if (!pend.ok() || !len.ok() || *pend == 0) continue;  // group 0 reports these
    // kFailedPrecondition exactly when the group holds the sequence offloaded.
    const Status st = group(g).slot(id, *len).status();
    if (st.code() == StatusCode::kFailedPrecondition) {
      return failed_precondition(std::string(what) + ": sequence " + std::to_string(id) +
                                 " is offloaded in " + group_name(config_, g) +
                                 ": restore it first");
    }
  }
  return ok_status();
}

Status ModelKvCache::commit(SequenceId id, const std::vector<TokenId>& tokens) {
  // Every group has the same reservation, so what group 0 accepts, all accept, except where a
  // group offloaded the sequence to make room for another (each group picks its own victims).
  PAGEDKV_RETURN_IF_ERROR(check_reserved_on_device(id, "commit"));
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).commit(id, tokens);
    if (!st.ok()) {
      return g == 0 ? st
                    : internal_error("commit failed in " + group_name(config_, g) +
                                     " after group 0 took it: " + st.message());
    }
  }
  return ok_status();
}

Status ModelKvCache::commit_batch(const std::vector<SequenceId>& ids,
                                  const std::vector<TokenId>& tokens, int64_t n_each) {
  // Every group after the first checks before any commits, so that an error commits nothing
  // anywhere; group 0's commit_batch checks its own members before it commits any. The checks
  // memoise the resolved ids, so the commits below look nothing up again.
  for (int32_t g = 1; g < num_planes(); ++g) {
    const Status st = group(g).check_commit_batch(ids, tokens, n_each);
    if (st.ok()) continue;
    // The first group's error when it has one too (a bad id or count fails everywhere), as a
    // check of every group in order would report.
    const Status first = group(0).check_commit_batch(ids, tokens, n_each);
    return first.ok() ? in_group(g, st) : in_group(0, first);
  }
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).commit_batch(ids, tokens, n_each);
    if (!st.ok()) {
      return g == 0 ? in_group(0, st)
                    : internal_error("commit_batch failed in " + group_name(config_, g) +
                                     " after group 0 took it: " + st.message());
    }
  }
  return ok_status();
}

Status ModelKvCache::check_rollback(SequenceId id, int64_t length) const {
  PAGEDKV_ASSIGN_OR_RETURN(int64_t len, this->length(id));
  if (length <= 0 || length > len) return ok_status();  // 0 always works; group 0 checks range
  for (int32_t g = 0; g < num_planes(); ++g) {
    const CacheConfig& c = group(g).config();
    if (c.sliding_window == 0) continue;
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, group(g).block_locations(id));
    const int64_t first = std::max<int64_t>(0, length - c.sliding_window) / c.block_size;
    if (blocks[static_cast<size_t>(first)].block < 0) {
      return failed_precondition("rollback: " + group_name(config_, g) + " no longer holds token " +
                                 std::to_string(first * c.block_size) + " of sequence " +
                                 std::to_string(id) + ", which its window at length " +
                                 std::to_string(length) + " needs");
    }
  }
  return ok_status();
}

Status ModelKvCache::rollback(SequenceId id, int64_t length) {
  PAGEDKV_RETURN_IF_ERROR(check_rollback(id, length));
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).rollback(id, length);
    if (!st.ok()) {
      return g == 0 ? st
                    : internal_error("rollback failed in " + group_name(config_, g) +
                                     " after its check: " + st.message());
    }
  }
  return ok_status();
}

Status ModelKvCache::fork(SequenceId parent, SequenceId child) {
  // A parent offloaded in any group is refused before any group forks.
  PAGEDKV_ASSIGN_OR_RETURN(SequenceResidency r, residency(parent));
  if (r == SequenceResidency::kHost) {
    return failed_precondition("fork: sequence " + std::to_string(parent) + " is offloaded");
  }
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).fork(parent, child);
    if (!st.ok()) {
      for (int32_t h = 0; h < g; ++h) (void)group(h).erase(child);
      return in_group(g, st);
    }
  }
  ids_.insert(child);
  return ok_status();
}

Status ModelKvCache::finish(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(groups_.front()->finish(id));
  ids_.erase(id);
  for (int32_t g = 1; g < num_planes(); ++g) PAGEDKV_RETURN_IF_ERROR(group(g).finish(id));
  return ok_status();
}

Status ModelKvCache::erase(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(groups_.front()->erase(id));
  ids_.erase(id);
  for (int32_t g = 1; g < num_planes(); ++g) PAGEDKV_RETURN_IF_ERROR(group(g).erase(id));
  return ok_status();
}

Status ModelKvCache::set_active(const std::vector<SequenceId>& ids) {
  for (int32_t g = 0; g < num_planes(); ++g) PAGEDKV_RETURN_IF_ERROR(group(g).set_active(ids));
  return ok_status();
}

Status ModelKvCache::set_priority(SequenceId id, int32_t priority) {
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_RETURN_IF_ERROR(group(g).set_priority(id, priority));
  }
  return ok_status();
}

// ---------------------------------------------------------------- tiers

Status ModelKvCache::offload(SequenceId id) {
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).offload(id);
    if (!st.ok()) {
      for (int32_t h = 0; h < g; ++h) (void)group(h).restore(id);
      sync_evictions();
      return in_group(g, st);
    }
  }
  return ok_status();
}

Status ModelKvCache::restore(SequenceId id) {
  if (!contains(id)) return not_found("sequence " + std::to_string(id) + " not found");
  bool any = false;
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(SequenceResidency r, group(g).residency(id));
    if (r != SequenceResidency::kHost) continue;
    any = true;
    const Status st = group(g).restore(id);
    sync_evictions();
    if (!st.ok()) return in_group(g, st);
  }
  if (!any) {
    return failed_precondition("restore: sequence " + std::to_string(id) + " is not offloaded");
  }
  return ok_status();
}

Status ModelKvCache::prefetch(const std::vector<SequenceId>& ids) {
  for (int32_t g = 0; g < num_planes(); ++g) {
    const Status st = group(g).prefetch(ids);
    if (!st.ok()) return in_group(g, st);
  }
  sync_evictions();
  return ok_status();
}

StatusOr<SequenceResidency> ModelKvCache::residency(SequenceId id) {
  SequenceResidency worst = SequenceResidency::kDevice;
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(SequenceResidency r, group(g).residency(id));
    if (rank(r) > rank(worst)) worst = r;
  }
  return worst;
}

void ModelKvCache::sync_evictions() {
  std::vector<SequenceId> dropped;
  for (int32_t g = 0; g < num_planes(); ++g) {
    for (SequenceId id : group(g).drain_evicted_sequences()) dropped.push_back(id);
  }
  std::unordered_set<SequenceId> seen;
  for (SequenceId id : dropped) {
    if (!seen.insert(id).second) continue;
    for (int32_t g = 0; g < num_planes(); ++g) {
      if (group(g).contains(id)) (void)group(g).erase(id);
    }
    ids_.erase(id);
    evicted_.push_back(id);
  }
}

std::vector<SequenceId> ModelKvCache::drain_evicted_sequences() {
  sync_evictions();
  std::vector<SequenceId> out;
  out.swap(evicted_);
  return out;
}

// ---------------------------------------------------------------- reading

StatusOr<ModelBatch> ModelKvCache::build_batch(const std::vector<SequenceId>& ids,
                                               const BatchOptions& options) {
  ModelBatch batch;
  if (shared_) {
    PAGEDKV_ASSIGN_OR_RETURN(batch.groups, groups_.front()->build_batches(ids, options));
    return batch;
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    StatusOr<DeviceBatch> b = group(g).build_batch(ids, options);
    if (!b.ok()) return in_group(g, b.status());
    batch.groups.push_back(*b);
  }
  return batch;
}

StatusOr<device::PagedKvView> ModelKvCache::device_view(const ModelBatch& batch, int32_t g,
                                                        KvScales scales) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  PAGEDKV_RETURN_IF_ERROR(check_batch(batch));
  return group(g).device_view(batch.groups[static_cast<size_t>(g)], scales);
}

Status ModelKvCache::gather_layer(SequenceId id, int32_t layer, void* key_out, void* value_out,
                                  DType packed_dtype, PackedLayout packed_layout,
                                  int64_t position_begin, int64_t num_tokens) {
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, layer_group(layer));
  if (shared_) {
    return groups_.front()->gather_layer(id, layer, key_out, value_out, packed_dtype, packed_layout,
                                         position_begin, num_tokens);
  }
  return in_group(lg.group,
                  group(lg.group).gather_layer(id, lg.layer, key_out, value_out, packed_dtype,
                                               packed_layout, position_begin, num_tokens));
}

Status ModelKvCache::synchronize() {
  for (int32_t g = 0; g < num_planes(); ++g) PAGEDKV_RETURN_IF_ERROR(group(g).synchronize());
  return ok_status();
}

// ---------------------------------------------------------------- queries

StatusOr<std::vector<BlockLocation>> ModelKvCache::block_locations(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  return shared_ ? groups_.front()->block_locations(id, g) : group(g).block_locations(id);
}

StatusOr<int64_t> ModelKvCache::held_blocks(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  return shared_ ? groups_.front()->held_blocks(id, g) : group(g).held_blocks(id);
}

StatusOr<int64_t> ModelKvCache::held_bytes(SequenceId id) const {
  if (shared_) return groups_.front()->held_bytes(id);
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t n, group(g).held_bytes(id));
    bytes += n;
  }
  return bytes;
}

Status ModelKvCache::check_invariants() const {
  for (int32_t g = 0; g < num_planes(); ++g) {
    PAGEDKV_RETURN_IF_ERROR(in_group(g, group(g).check_invariants()));
  }
  // The groups in step: the same sequences, lengths and reservations.
  for (int32_t g = 0; g < num_planes(); ++g) {
    if (group(g).stats().sequences != static_cast<int64_t>(ids_.size())) {
      return internal_error("invariant: " + group_name(config_, g) + " holds " +
                            std::to_string(group(g).stats().sequences) + " sequences, the model " +
                            std::to_string(ids_.size()));
    }
  }
  for (SequenceId id : ids_) {
    const StatusOr<int64_t> len = group(0).length(id);
    const StatusOr<int64_t> pend = group(0).pending(id);
    for (int32_t g = 0; g < num_planes(); ++g) {
      const StatusOr<int64_t> l = group(g).length(id);
      const StatusOr<int64_t> p = group(g).pending(id);
      if (!len.ok() || !l.ok() || *l != *len || !p.ok() || *p != *pend) {
        return internal_error("invariant: sequence " + std::to_string(id) + " is not in step in " +
                              group_name(config_, g));
      }
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------- events

std::vector<ControlEvent> ModelKvCache::drain_events() {
  std::vector<ControlEvent> resyncs;
  std::vector<ControlEvent> events;
  for (int32_t g = 0; g < num_planes(); ++g) {
    for (ControlEvent& e : group(g).drain_events()) {
      if (!shared_) e.group = g;  // the one cache of shared blocks names the group itself
      (e.kind == EventKind::kEventsDropped ? resyncs : events).push_back(std::move(e));
    }
  }
  if (resyncs.empty()) return events;
  resyncs.insert(resyncs.end(), std::make_move_iterator(events.begin()),
                 std::make_move_iterator(events.end()));
  return resyncs;
}

}  // namespace pagedkv
