#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/logging.hpp"
#include "common/nvtx.hpp"
#include "core/control_plane.hpp"
#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {
namespace {

// Grows on demand (UploadArena); small, so that creating a cache is cheap.
constexpr size_t kInitialUploadBytes = 64 << 10;

// The bytes one build_batch of `shape` uploads (kv_cache.cpp upload_batch: slot mapping, block
// tables, sequence lengths and CSR), twice over, so that a chunk also holds the next step's
// smaller uploads before it rolls over, and a step's upload_to_device (build_vllm_batch_into's
// fixed-width block table, upload_append_indices) besides. The block tables' row stride grows
// geometrically: up to twice the longest row.
size_t step_upload_bytes(const StepShape& shape) {
  const size_t b = static_cast<size_t>(shape.max_batch);
  const size_t m = static_cast<size_t>(shape.max_blocks_per_sequence);
  const size_t slots = 8 * static_cast<size_t>(shape.max_tokens);
  const size_t tables = 4 * b * 2 * m;
  const size_t csr = 4 * (b + 1) + 4 * b * m + 4 * b;
  const size_t alignment = 6 * 256;  // one region per array, each 256-byte aligned
  return 2 * (slots + tables + 4 * b + csr + alignment);
}

// An upload arena's chunk size and count: sized up front for the step shape (every chunk, so a
// step of that shape never allocates), else one small chunk that grows on demand.
size_t upload_arena_bytes(const KvCacheOptions& options) {
  return std::max(kInitialUploadBytes, step_upload_bytes(options.step_shape));
}
size_t upload_arena_chunks(const KvCacheOptions& options) {
  const StepShape& shape = options.step_shape;
  return shape.max_batch > 0 || shape.max_tokens > 0 ? runtime::UploadArena::kMaxChunks : 1;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// kInvalidArgument unless `tokens` holds `n_each` tokens for each of `ids` (the commit_batch
// checks that need no sequence).
Status check_commit_tokens(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                           int64_t n_each) {
  if (n_each < 0) return invalid_argument("commit_batch: n_each must be >= 0");
  const bool sized = n_each == 0 ? tokens.empty()
                                 : tokens.size() % static_cast<size_t>(n_each) == 0 &&
                                       tokens.size() / static_cast<size_t>(n_each) == ids.size();
  if (!sized) {
    return invalid_argument("commit_batch: " + std::to_string(tokens.size()) + " tokens for " +
                            std::to_string(ids.size()) + " sequences of " + std::to_string(n_each) +
                            " each");
  }
  return ok_status();
}

// kInvalidArgument unless every K/V group's heads split over `tp` ranks (a latent group is whole
// on every rank).
Status check_heads_split(const CacheConfig& config, int32_t tp) {
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const CacheConfig c = config.num_groups() > 1 ? config.group_config(g) : config;
    if (c.kv_kind != KvKind::kLatent && c.num_kv_heads % tp != 0) {
      return invalid_argument("tp_size: group " + std::to_string(g) + "'s " +
                              std::to_string(c.num_kv_heads) + " KV heads do not split over " +
                              std::to_string(tp) + " ranks");
    }
  }
  return ok_status();
}

// The backend and stream options: the checks create() makes before it takes any backend.
Status check_backends(const CacheConfig& config, const KvCacheOptions& options, bool stored) {
  if (options.backend != nullptr && options.device != -1) {
    return invalid_argument("device: the cache is given a backend, which has its own device");
  }
  if (options.native_compute_stream != nullptr && options.compute_stream != Stream{}) {
    return invalid_argument("native_compute_stream: set either it or compute_stream, not both");
  }
  const int32_t tp = options.tp_size;
  if (tp < 1) return invalid_argument("tp_size: must be >= 1, got " + std::to_string(tp));
  if (!options.rank_backends.empty()) {
    if (options.rank_backends.size() != static_cast<size_t>(tp)) {
      return invalid_argument("rank_backends: " + std::to_string(options.rank_backends.size()) +
                              " backends for tp_size " + std::to_string(tp) +
                              " (one per rank, or none)");
    }
    if (options.backend != nullptr || options.device != -1) {
      return invalid_argument("rank_backends: set either them or backend and device");
    }
    for (size_t r = 0; r < options.rank_backends.size(); ++r) {
      if (options.rank_backends[r] == nullptr) {
        return invalid_argument("rank_backends: rank " + std::to_string(r) + "'s is null");
      }
    }
  }
  if (!options.rank_native_compute_streams.empty()) {
    if (options.rank_native_compute_streams.size() != static_cast<size_t>(tp) || tp == 1) {
      return invalid_argument("rank_native_compute_streams: " +
                              std::to_string(options.rank_native_compute_streams.size()) +
                              " streams for tp_size " + std::to_string(tp) +
                              " (one per rank of a tensor-parallel cache, or none)");
    }
    for (size_t r = 0; r < options.rank_native_compute_streams.size(); ++r) {
      if (options.rank_native_compute_streams[r] == nullptr) {
        return invalid_argument("rank_native_compute_streams: rank " + std::to_string(r) +
                                "'s is null");
      }
    }
  }
  if (tp == 1) return ok_status();
  if (options.backend != nullptr || options.device != -1) {
    return invalid_argument(
        "tp_size: a tensor-parallel cache takes one backend per rank (rank_backends), or creates "
        "one on each device 0..tp_size-1; backend and device are for one rank");
  }
  if (options.compute_stream != Stream{} || options.native_compute_stream != nullptr) {
    return invalid_argument(
        "tp_size: compute_stream and native_compute_stream are one rank's; a tensor-parallel "
        "cache takes rank_native_compute_streams, one per rank");
  }
  if (options.storage != nullptr || !options.group_storage.empty()) {
    return invalid_argument(
        "tp_size: each rank stores its share of the heads in a store of its own: give "
        "rank_storage, not storage or group_storage");
  }
  const size_t stores = static_cast<size_t>(tp) * static_cast<size_t>(config.num_groups());
  if (!options.rank_storage.empty() && options.rank_storage.size() != stores) {
    return invalid_argument("rank_storage: " + std::to_string(options.rank_storage.size()) +
                            " stores for " + std::to_string(tp) + " ranks of " +
                            std::to_string(config.num_groups()) +
                            " groups (one per rank and group, or none)");
  }
  for (int32_t g = 0; stored && g < config.num_groups(); ++g) {
    const CacheConfig c = config.num_groups() > 1 ? config.group_config(g) : config;
    if (c.kv_kind == KvKind::kLatent && options.rank_storage[static_cast<size_t>(g)] != nullptr) {
      return unimplemented(
          "rank_storage: a latent group is whole on every rank; storing it once for all ranks "
          "is not built yet");
    }
  }
  return check_heads_split(config, tp);
}

// One rank's part of a group: its slice of the KV heads; a latent group is whole on every rank.
CacheConfig rank_part(const CacheConfig& group, int32_t tp_size) {
  CacheConfig c = group;
  if (c.kv_kind != KvKind::kLatent) c.num_kv_heads /= tp_size;
  return c;
}

}  // namespace

StatusOr<CacheConfig> rank_config(const CacheConfig& model, int32_t tp_size) {
  PAGEDKV_RETURN_IF_ERROR(model.validate());
  if (tp_size < 1) return invalid_argument("tp_size: must be >= 1, got " + std::to_string(tp_size));
  PAGEDKV_RETURN_IF_ERROR(check_heads_split(model, tp_size));
  if (model.groups.empty()) return rank_part(model, tp_size);
  CacheConfig out = model;
  for (KvGroup& g : out.groups) {
    if (g.kv_kind != KvKind::kLatent) g.num_kv_heads /= tp_size;
  }
  return out;
}

using runtime::part;

Status KvCache::Impl::create_rank(int32_t r, const KvCacheOptions& options) {
  Rank& rank = ranks[static_cast<size_t>(r)];
  Backend& be = *rank.backend;
  std::vector<runtime::TierPools> pools;
  for (const CacheConfig& c : shard_configs) {
    GroupPool pool;
    const int64_t block_bytes = c.block_bytes();
    auto t0 = std::chrono::steady_clock::now();
    PAGEDKV_ASSIGN_OR_RETURN(
        pool.device, be.allocate_device(static_cast<size_t>(block_bytes * c.num_device_blocks)));
    pool_info.device_bytes += block_bytes * c.num_device_blocks;
    pool_info.device_alloc_ms += ms_since(t0);
    rank.groups.push_back(std::move(pool));  // freed with the rank from here on
    GroupPool& p = rank.groups.back();
    if (c.num_host_blocks > 0) {
      t0 = std::chrono::steady_clock::now();
      PAGEDKV_ASSIGN_OR_RETURN(
          p.host, be.allocate_pinned(static_cast<size_t>(block_bytes * c.num_host_blocks)));
      pool_info.host_bytes += block_bytes * c.num_host_blocks;
      pool_info.host_alloc_ms += ms_since(t0);
    }
    runtime::TierPools tier_pools{p.device, c.num_device_blocks, p.host, c.num_host_blocks,
                                  block_bytes};
    if (p.host != nullptr) {
      // A host pool the device cannot address leaves the batched copy, which needs no mapping.
      StatusOr<void*> mapped = be.mapped_device_pointer(p.host);
      if (mapped.ok()) {
        tier_pools.host_mapped = *mapped;
        pool_info.host_mapped = true;
      } else {
        detail::logger().info("KvCache: host pool not mapped ({}); transfers use batched copies",
                              mapped.status().to_string());
      }
    }
    pools.push_back(tier_pools);
  }
  runtime::TransferOptions transfer_options;
  transfer_options.kernel_block_bytes = options.transfer_kernel_block_bytes;
  PAGEDKV_ASSIGN_OR_RETURN(rank.transfers,
                           runtime::TransferEngine::create(be, pools, transfer_options));
  pool_info.transfer_kernel = rank.transfers->uses_kernel();
  PAGEDKV_ASSIGN_OR_RETURN(
      rank.uploads, runtime::UploadArena::create(be, rank.compute, upload_arena_bytes(options),
                                                 upload_arena_chunks(options)));
  return ok_status();
}

StatusOr<std::unique_ptr<KvCache>> KvCache::create(const CacheConfig& model_config,
                                                   KvCacheOptions options) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::create");
  PAGEDKV_RETURN_IF_ERROR(model_config.validate());
  const int32_t num_groups = model_config.num_groups();
  // One group given as groups[0]: that group's config. Several: the control plane checks their
  // shape (the group that attends furthest back owns the blocks).
  const CacheConfig config = num_groups > 1 ? model_config : model_config.group_config(0);
  if (num_groups > 1 && options.storage != nullptr) {
    return invalid_argument(
        "storage: a cache of several groups takes one store per group: set group_storage");
  }
  if (!options.group_storage.empty() &&
      options.group_storage.size() != static_cast<size_t>(num_groups)) {
    return invalid_argument("group_storage: " + std::to_string(options.group_storage.size()) +
                            " stores for " + std::to_string(num_groups) +
                            " groups (one per group, or none)");
  }
  if (num_groups == 1 && !options.group_storage.empty()) {
    options.storage = options.group_storage[0];  // one group: the same as `storage`
    options.group_storage.clear();
  }
  const bool any_group_store =
      std::any_of(options.group_storage.begin(), options.group_storage.end(),
                  [](const StorageTier* s) { return s != nullptr; });
  const bool stored = options.storage != nullptr || any_group_store ||
                      std::any_of(options.rank_storage.begin(), options.rank_storage.end(),
                                  [](const StorageTier* s) { return s != nullptr; });
  if (options.tp_size == 1 && !options.rank_storage.empty()) {
    return invalid_argument(
        "rank_storage: for a tensor-parallel cache; one rank takes storage or group_storage");
  }
  if (options.transfer_kernel_block_bytes < 0) {
    return invalid_argument("transfer_kernel_block_bytes: negative (" +
                            std::to_string(options.transfer_kernel_block_bytes) + ")");
  }
  const StepShape& step = options.step_shape;
  if (step.max_batch < 0 || step.max_blocks_per_sequence < 0 || step.max_tokens < 0) {
    return invalid_argument(
        "step_shape: max_batch, max_blocks_per_sequence and max_tokens must be >= 0");
  }
  if (config.mode != CacheMode::kPaged) {
    return unimplemented("mode: dense mode is not available through KvCache yet");
  }
  if (options.record_step_plans && stored) {
    return unimplemented(
        "record_step_plans: not with a storage tier (its write-backs and fetches are not in "
        "step plans yet)");
  }
  const int32_t tp = options.tp_size;
  PAGEDKV_RETURN_IF_ERROR(check_backends(config, options, stored));
  auto impl = std::make_unique<Impl>();
  Impl& cache = *impl;
  cache.config = config;
  cache.record_plans = options.record_step_plans;
  cache.ranks.resize(static_cast<size_t>(tp));
  for (int32_t r = 0; r < tp; ++r) {
    Impl::Rank& rank = cache.ranks[static_cast<size_t>(r)];
    if (options.backend != nullptr) {
      rank.backend = options.backend;
    } else if (!options.rank_backends.empty()) {
      rank.backend = options.rank_backends[static_cast<size_t>(r)];
    } else {
      // Rank r on GPU r; the CPU and null backends' ranks all share the host's memory (ordinal
      // 0, where DLPack puts every CPU array).
      const BackendKind kind = r == 0 ? config.backend : cache.ranks[0].backend->kind();
      const int32_t device =
          tp == 1 ? options.device : (r == 0 || kind == BackendKind::kCuda ? r : -1);
      PAGEDKV_ASSIGN_OR_RETURN(rank.owned_backend, create_backend(kind, device));
      rank.backend = rank.owned_backend.get();
    }
  }
  cache.ranks[0].compute = options.compute_stream;
  for (int32_t r = 0; r < tp; ++r) {
    Impl::Rank& rank = cache.ranks[static_cast<size_t>(r)];
    void* native = options.native_compute_stream;  // one rank's
    if (tp > 1 && !options.rank_native_compute_streams.empty()) {
      native = options.rank_native_compute_streams[static_cast<size_t>(r)];
    }
    if (native != nullptr) {
      PAGEDKV_ASSIGN_OR_RETURN(rank.compute, rank.backend->wrap_stream(native));
    }
  }

  core::ControlOptions control_options;
  control_options.clock = options.clock;
  control_options.enable_events = options.enable_events;
  control_options.event_capacity = options.event_capacity;
  control_options.report_host_drops = stored;
  PAGEDKV_ASSIGN_OR_RETURN(cache.control, core::ControlPlane::create(config, control_options));
  cache.full_group = cache.control->full_group();
  cache.layers = config.layer_groups();
  for (int32_t g = 0; g < num_groups; ++g) {
    cache.group_configs.push_back(num_groups > 1 ? config.group_config(g) : config);
    cache.shard_configs.push_back(rank_part(cache.group_configs.back(), tp));
  }
  cache.built.assign(static_cast<size_t>(num_groups), nullptr);
  for (int32_t r = 0; r < tp; ++r) {
    PAGEDKV_RETURN_IF_ERROR(cache.create_rank(r, options));
  }
  cache.batch_uploads.resize(static_cast<size_t>(num_groups));
  if (tp > 1) {  // each step's batch metadata packed once for all ranks
    std::vector<runtime::UploadTarget> targets;
    for (const Impl::Rank& rank : cache.ranks) targets.push_back({rank.backend, rank.compute});
    PAGEDKV_ASSIGN_OR_RETURN(cache.batch_arena,
                             runtime::UploadArena::create(targets, upload_arena_bytes(options),
                                                          upload_arena_chunks(options)));
  }
  if (stored) {  // a lane per group and rank
    std::vector<runtime::StorageLink::GroupStore> stores;
    for (int32_t r = 0; r < tp; ++r) {
      Impl::Rank& rank = cache.ranks[static_cast<size_t>(r)];
      for (int32_t g = 0; g < num_groups; ++g) {
        const Impl::GroupPool& p = rank.groups[static_cast<size_t>(g)];
        runtime::StorageLink::GroupStore gs;
        gs.store = tp > 1            ? options.rank_storage[static_cast<size_t>(r * num_groups + g)]
                   : num_groups == 1 ? options.storage
                                     : options.group_storage[static_cast<size_t>(g)];
        gs.config = cache.shard_config(g);
        gs.group = g;
        gs.rank = r;
        gs.tp_size = tp;
        gs.device_pool = p.device;
        gs.host_pool = p.host;
        gs.backend = rank.backend;
        gs.copy_stream = rank.transfers->copy_stream();
        gs.compute = rank.compute;
        stores.push_back(gs);
      }
    }
    PAGEDKV_ASSIGN_OR_RETURN(cache.storage,
                             runtime::StorageLink::create(stores, num_groups, cache.full_group,
                                                          options.storage_staging_blocks));
  }
  int64_t device_blocks = 0, host_blocks = 0;
  for (const CacheConfig& g : cache.group_configs) {
    device_blocks += g.num_device_blocks;
    host_blocks += g.num_host_blocks;
  }
  detail::logger().info(
      "KvCache: {} group(s) on {} rank(s); device pools {} blocks, {:.1f} MiB in {:.2f} ms; "
      "host pools {} blocks, {:.1f} MiB pinned in {:.2f} ms; transfers by {}",
      num_groups, tp, device_blocks, cache.pool_info.device_bytes / 1048576.0,
      cache.pool_info.device_alloc_ms, host_blocks, cache.pool_info.host_bytes / 1048576.0,
      cache.pool_info.host_alloc_ms,
      cache.pool_info.transfer_kernel ? "copy kernel" : "batched copy");
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvCache::~KvCache() = default;

const CacheConfig& KvCache::config() const { return impl_->config; }

Backend& KvCache::backend(int32_t rank) { return *impl_->ranks[static_cast<size_t>(rank)].backend; }

Stream KvCache::compute_stream(int32_t rank) const {
  return impl_->ranks[static_cast<size_t>(rank)].compute;
}

int32_t KvCache::tp_size() const { return impl_->num_ranks(); }

const PoolInfo& KvCache::pool_info() const { return impl_->pool_info; }

PoolRef KvCache::device_pool() const { return impl_->device_pool(impl_->full_group); }

int32_t KvCache::num_groups() const { return impl_->num_groups(); }

int32_t KvCache::full_group() const { return impl_->full_group; }

const CacheConfig& KvCache::group_config(int32_t g) const { return impl_->group_config(g); }

PoolRef KvCache::device_pool(int32_t g, int32_t rank) const { return impl_->device_pool(g, rank); }

const CacheConfig& KvCache::shard_config(int32_t g) const { return impl_->shard_config(g); }

StatusOr<LayerGroup> KvCache::layer_group(int32_t layer) const {
  return find_layer_group(impl_->layers, layer);
}

StatusOr<int64_t> KvCache::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                        const SequenceOptions& options, int64_t max_cached) {
  PAGEDKV_KV_CACHE_CALL(add_sequence);
  PAGEDKV_RETURN_IF_ERROR(impl_->refuse_if_applying_plans("add_sequence"));
  impl_->poll_storage_quietly();
  return impl_->changed(impl_->control->add_sequence(id, prompt, options, max_cached));
}

StatusOr<int64_t> KvCache::cached_prefix(const std::vector<TokenId>& prompt, NamespaceId ns,
                                         int64_t max_cached) const {
  PAGEDKV_RETURN_IF_ERROR(impl_->broken);
  return impl_->control->cached_prefix(prompt, ns, max_cached);
}

StatusOr<std::vector<int64_t>> KvCache::reserve(SequenceId id, int64_t n) {
  PAGEDKV_KV_CACHE_CALL(reserve);
  impl_->poll_storage_quietly();
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, impl_->control->plan_reserve(id, n));
  std::vector<int64_t> slots = plan.slots();
  PAGEDKV_RETURN_IF_ERROR(impl_->carry_out(plan));
  return slots;
}

StatusOr<std::vector<int64_t>> KvCache::reserve_batch(const std::vector<SequenceId>& ids,
                                                      int64_t n_each) {
  std::vector<int64_t> slots;
  PAGEDKV_RETURN_IF_ERROR(reserve_batch_into(ids, n_each, &slots));
  return slots;
}

Status KvCache::reserve_batch_into(const std::vector<SequenceId>& ids, int64_t n_each,
                                   std::vector<int64_t>* slots) {
  if (slots != nullptr) slots->clear();  // what an error leaves
  PAGEDKV_KV_CACHE_CALL(reserve_batch);
  impl_->poll_storage_quietly();
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, impl_->control->plan_reserve_batch(ids, n_each));
  if (slots != nullptr) slots->assign(plan.slots().begin(), plan.slots().end());
  const Status st = impl_->carry_out(plan);
  if (!st.ok() && slots != nullptr) slots->clear();
  return st;
}

Status KvCache::commit(SequenceId id, const std::vector<TokenId>& tokens) {
  PAGEDKV_KV_CACHE_CALL(commit);
  return impl_->commit_tokens(id, tokens.data(), static_cast<int64_t>(tokens.size()));
}

Status KvCache::commit_batch(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                             int64_t n_each) {
  PAGEDKV_KV_CACHE_CALL(commit_batch);
  PAGEDKV_RETURN_IF_ERROR(check_commit_tokens(ids, tokens, n_each));
  // The control plane checks every member before it commits any.
  PAGEDKV_RETURN_IF_ERROR(impl_->changed(impl_->control->commit_batch(ids, tokens.data(), n_each)));
  for (Impl::Rank& r : impl_->ranks) {
    for (Impl::GroupPool& g : r.groups) {
      if (g.slot_uploads.empty()) continue;
      for (SequenceId id : ids) g.slot_uploads.erase(id);
    }
  }
  return ok_status();
}

Status KvCache::rollback(SequenceId id, int64_t length) {
  PAGEDKV_KV_CACHE_CALL(rollback);
  PAGEDKV_RETURN_IF_ERROR(impl_->changed(impl_->control->rollback(id, length)));
  impl_->forget_slot_uploads(id);
  return ok_status();
}

Status KvCache::fork(SequenceId parent, SequenceId child) {
  PAGEDKV_KV_CACHE_CALL(fork);
  return impl_->changed(impl_->control->fork(parent, child));
}

Status KvCache::finish(SequenceId id) {
  PAGEDKV_KV_CACHE_CALL(finish);
  PAGEDKV_RETURN_IF_ERROR(impl_->changed(impl_->control->finish(id)));
  impl_->forget(id);
  return ok_status();
}

Status KvCache::erase(SequenceId id) {
  PAGEDKV_KV_CACHE_CALL(erase);
  PAGEDKV_RETURN_IF_ERROR(impl_->changed(impl_->control->erase(id)));
  impl_->forget(id);
  return ok_status();
}

Status KvCache::set_active(const std::vector<SequenceId>& ids) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::set_active");
  PAGEDKV_RETURN_IF_ERROR(impl_->broken);
  return impl_->control->set_active(ids);
}

Status KvCache::set_priority(SequenceId id, int32_t priority) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::set_priority");
  PAGEDKV_RETURN_IF_ERROR(impl_->broken);
  return impl_->control->set_priority(id, priority);
}

Status KvCache::offload(SequenceId id) {
  PAGEDKV_KV_CACHE_CALL(offload);
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, impl_->control->plan_offload(id));
  return impl_->carry_out(plan);
}

Status KvCache::restore(SequenceId id) {
  PAGEDKV_KV_CACHE_CALL(restore);
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, impl_->control->plan_restore(id));
  return impl_->carry_out(plan);
}

Status KvCache::prefetch(const std::vector<SequenceId>& ids) {
  PAGEDKV_KV_CACHE_CALL(prefetch);
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, impl_->control->plan_prefetch(ids));
  return impl_->carry_out(plan);
}

StatusOr<SequenceResidency> KvCache::residency(SequenceId id) {
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.refuse_in_capture("residency"));
  PAGEDKV_ASSIGN_OR_RETURN(Residency r, c.control->residency(id));
  // In flight until its last job is done on every rank.
  for (Impl::Rank& rank : c.ranks) {
    auto job = rank.last_job.find(id);
    if (job == rank.last_job.end()) continue;
    PAGEDKV_ASSIGN_OR_RETURN(bool done, rank.transfers->is_complete(job->second));
    if (!done) return SequenceResidency::kInFlight;
    rank.last_job.erase(job);
  }
  return r.offloaded ? SequenceResidency::kHost : SequenceResidency::kDevice;
}

std::vector<SequenceId> KvCache::drain_evicted_sequences() {
  return std::exchange(impl_->evicted, {});
}

Status KvCache::synchronize() {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::synchronize");
  PAGEDKV_RETURN_IF_ERROR(impl_->refuse_in_capture("synchronize"));
  for (Impl::Rank& r : impl_->ranks) {
    PAGEDKV_RETURN_IF_ERROR(r.transfers->synchronize());
    PAGEDKV_RETURN_IF_ERROR(r.backend->synchronize_stream(r.compute));
  }
  return ok_status();
}

}  // namespace pagedkv
