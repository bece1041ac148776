#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/logging.hpp"
#include "common/nvtx.hpp"
#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "runtime/storage_link.hpp"
#include "runtime/transfer_engine.hpp"
#include "runtime/upload_arena.hpp"

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

}  // namespace

using runtime::part;

StatusOr<std::unique_ptr<KvCache>> KvCache::create(const CacheConfig& model_config,
                                                   KvCacheOptions options) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::create");
  PAGEDKV_RETURN_IF_ERROR(model_config.validate());
  const int32_t num_groups = model_config.num_groups();
  // One group given as groups[0]: that group's config. Several: the control plane checks their
  // shape (a full-attention group to own the blocks, at most three window groups).
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
  const bool stored = options.storage != nullptr || any_group_store;
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
  std::unique_ptr<KvCache> cache(new KvCache());
  cache->config_ = config;
  if (options.backend != nullptr) {
    if (options.device != -1) {
      return invalid_argument("device: the cache is given a backend, which has its own device");
    }
    cache->backend_ = options.backend;
  } else {
    PAGEDKV_ASSIGN_OR_RETURN(cache->owned_backend_, create_backend(config.backend, options.device));
    cache->backend_ = cache->owned_backend_.get();
  }
  Backend& be = *cache->backend_;
  cache->compute_ = options.compute_stream;
  if (options.native_compute_stream != nullptr) {
    if (options.compute_stream != Stream{}) {
      return invalid_argument("native_compute_stream: set either it or compute_stream, not both");
    }
    PAGEDKV_ASSIGN_OR_RETURN(cache->compute_, be.wrap_stream(options.native_compute_stream));
  }

  core::ControlOptions control_options;
  control_options.clock = options.clock;
  control_options.enable_events = options.enable_events;
  control_options.event_capacity = options.event_capacity;
  control_options.report_host_drops = stored;
  PAGEDKV_ASSIGN_OR_RETURN(cache->control_, core::ControlPlane::create(config, control_options));
  cache->full_group_ = cache->control_->full_group();
  cache->layers_ = config.layer_groups();
  for (int32_t g = 0; g < num_groups; ++g) {
    GroupPool pool;
    pool.config = num_groups > 1 ? config.group_config(g) : config;
    cache->groups_.push_back(std::move(pool));
  }

  std::vector<runtime::TierPools> pools;
  for (GroupPool& group : cache->groups_) {
    const CacheConfig& c = group.config;
    const int64_t block_bytes = c.block_bytes();
    auto t0 = std::chrono::steady_clock::now();
    PAGEDKV_ASSIGN_OR_RETURN(
        group.device, be.allocate_device(static_cast<size_t>(block_bytes * c.num_device_blocks)));
    cache->pool_info_.device_bytes += block_bytes * c.num_device_blocks;
    cache->pool_info_.device_alloc_ms += ms_since(t0);
    if (c.num_host_blocks > 0) {
      t0 = std::chrono::steady_clock::now();
      PAGEDKV_ASSIGN_OR_RETURN(
          group.host, be.allocate_pinned(static_cast<size_t>(block_bytes * c.num_host_blocks)));
      cache->pool_info_.host_bytes += block_bytes * c.num_host_blocks;
      cache->pool_info_.host_alloc_ms += ms_since(t0);
    }
    runtime::TierPools p{group.device, c.num_device_blocks, group.host, c.num_host_blocks,
                         block_bytes};
    if (group.host != nullptr) {
      // A host pool the device cannot address leaves the batched copy, which needs no mapping.
      StatusOr<void*> mapped = be.mapped_device_pointer(group.host);
      if (mapped.ok()) {
        p.host_mapped = *mapped;
        cache->pool_info_.host_mapped = true;
      } else {
        detail::logger().info("KvCache: host pool not mapped ({}); transfers use batched copies",
                              mapped.status().to_string());
      }
    }
    pools.push_back(p);
  }
  runtime::TransferOptions transfer_options;
  transfer_options.kernel_block_bytes = options.transfer_kernel_block_bytes;
  PAGEDKV_ASSIGN_OR_RETURN(cache->transfers_,
                           runtime::TransferEngine::create(be, pools, transfer_options));
  cache->pool_info_.transfer_kernel = cache->transfers_->uses_kernel();
  if (stored) {
    std::vector<runtime::StorageLink::GroupStore> stores;
    for (int32_t g = 0; g < num_groups; ++g) {
      const GroupPool& p = cache->groups_[static_cast<size_t>(g)];
      StorageTier* store =
          num_groups == 1 ? options.storage : options.group_storage[static_cast<size_t>(g)];
      stores.push_back(runtime::StorageLink::GroupStore{store, p.config, p.device, p.host});
    }
    PAGEDKV_ASSIGN_OR_RETURN(cache->storage_,
                             runtime::StorageLink::create(be, stores, cache->full_group_,
                                                          options.storage_staging_blocks));
  }
  const StepShape& shape = options.step_shape;
  const bool sized = shape.max_batch > 0 || shape.max_tokens > 0;
  PAGEDKV_ASSIGN_OR_RETURN(
      cache->uploads_,
      runtime::UploadArena::create(be, cache->compute_,
                                   std::max(kInitialUploadBytes, step_upload_bytes(shape)),
                                   sized ? runtime::UploadArena::kMaxChunks : 1));
  cache->batch_uploads_.resize(static_cast<size_t>(num_groups));
  int64_t device_blocks = 0, host_blocks = 0;
  for (const GroupPool& g : cache->groups_) {
    device_blocks += g.config.num_device_blocks;
    host_blocks += g.config.num_host_blocks;
  }
  detail::logger().info(
      "KvCache: {} group(s); device pools {} blocks, {:.1f} MiB in {:.2f} ms; host pools {} "
      "blocks, {:.1f} MiB pinned in {:.2f} ms; transfers by {}",
      num_groups, device_blocks, cache->pool_info_.device_bytes / 1048576.0,
      cache->pool_info_.device_alloc_ms, host_blocks, cache->pool_info_.host_bytes / 1048576.0,
      cache->pool_info_.host_alloc_ms,
      cache->pool_info_.transfer_kernel ? "copy kernel" : "batched copy");
  return cache;
}

KvCache::~KvCache() {
  if (backend_ == nullptr) return;
  backend_->synchronize_stream(compute_).ignore_error();  // queued kernels may use the pools
  storage_.reset();  // waits for staging copies and the store's reads into the host pool
  for (GroupPool& g : groups_) g.slot_uploads.clear();  // leases go back before the arena goes
  batch_uploads_.clear();
  uploads_.reset();
  transfers_.reset();  // drains the copy stream
  for (GroupPool& g : groups_) {
    backend_->free_device(g.device);
    backend_->free_pinned(g.host);
  }
}

const CacheConfig& KvCache::group_config(int32_t g) const {
  return groups_[static_cast<size_t>(g)].config;
}

PoolRef KvCache::device_pool(int32_t g) const {
  const GroupPool& p = groups_[static_cast<size_t>(g)];
  return PoolRef{p.device, p.config.dtype, PoolLayout::from_config(p.config),
                 p.config.num_device_blocks};
}

Status KvCache::check_group(int32_t g) const {
  if (g < 0 || g >= num_groups()) {
    return out_of_range("group " + std::to_string(g) + " outside the cache's " +
                        std::to_string(num_groups()) + " groups");
  }
  return ok_status();
}

StatusOr<LayerGroup> KvCache::layer_group(int32_t layer) const {
  return find_layer_group(layers_, layer);
}

void KvCache::forget_slot_uploads(SequenceId id) {
  for (GroupPool& g : groups_) {
    if (!g.slot_uploads.empty()) g.slot_uploads.erase(id);
  }
}

Status KvCache::refuse_in_capture(const char* what) {
  PAGEDKV_ASSIGN_OR_RETURN(const bool capturing, backend_->is_capturing(compute_));
  if (!capturing) return ok_status();
  return failed_precondition(
      std::string(what) +
      ": the compute stream is capturing a CUDA graph; only write_kv_batch and "
      "write_kv_batch_all_layers over a batch whose slot mapping is caller-owned "
      "(build_vllm_batch_into, or build_batch_into given a slot-mapping buffer) and the ops over "
      "fixed buffers (ops.hpp) may be captured: call it before or after the capture");
}

StatusOr<int64_t> KvCache::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                        const SequenceOptions& options, int64_t max_cached) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::add_sequence");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("add_sequence"));
  poll_storage_quietly();
  PAGEDKV_ASSIGN_OR_RETURN(int64_t cached, control_->add_sequence(id, prompt, options, max_cached));
  ++generation_;
  return cached;
}

StatusOr<int64_t> KvCache::cached_prefix(const std::vector<TokenId>& prompt, NamespaceId ns,
                                         int64_t max_cached) const {
  PAGEDKV_RETURN_IF_ERROR(broken_);
  return control_->cached_prefix(prompt, ns, max_cached);
}

Status KvCache::run_transfers(const Transfers& t, Submitted* out) {
  // Dropped victims need no data and are not undone: record them before anything can fail.
  for (SequenceId id : t.evicted) {
    evicted_.push_back(id);
    forget_slot_uploads(id);
  }
  // Dropped host blocks are copied out for the write-back before the moves reuse their slots.
  if (storage_ != nullptr) {
    PAGEDKV_RETURN_IF_ERROR(storage_->stage(t.host_drops, transfers_->copy_stream(), compute_));
  }
  if (!t.moves.empty()) {
    StatusOr<runtime::TransferTicket> ticket =
        transfers_->submit(t.moves, compute_, &out->moves_done);
    PAGEDKV_RETURN_IF_ERROR(ticket.status());
    out->ticket = *ticket;
    // The engine notes which device blocks the job reads and writes: later work on the compute
    // stream waits for it only when it touches them (order_block_use, order_block_reuse), so
    // compute queued meanwhile overlaps the copies.
  }
  return run_copies(t.copies);
}

Status KvCache::run_copies(const std::vector<BlockCopy>& copies) {
  // One launch per group, each on its own pool.
  for (int32_t g = 0; g < num_groups() && !copies.empty(); ++g) {
    std::vector<int32_t> pairs;
    std::vector<int64_t> written;
    for (const BlockCopy& c : copies) {
      if (c.group != g) continue;
      pairs.push_back(c.src_block);
      pairs.push_back(c.dst_block);
      written.push_back(static_cast<int64_t>(c.dst_block) * config_.block_size);
    }
    if (pairs.empty()) continue;
    PAGEDKV_RETURN_IF_ERROR(order_block_reuse(g, written.data(), written.size()));
    std::vector<int32_t> sources;  // a source a restore is still writing
    for (size_t i = 0; i < pairs.size(); i += 2) sources.push_back(pairs[i]);
    PAGEDKV_RETURN_IF_ERROR(order_block_use(g, sources.data(), sources.size()));
    PAGEDKV_ASSIGN_OR_RETURN(runtime::UploadLease up, uploads_->upload({part(pairs)}));
    CopyBlocksArgs args;
    args.pairs = up.device<int32_t>(0);
    args.index_type = IndexType::kInt32;
    args.num_pairs = static_cast<int64_t>(written.size());
    PAGEDKV_RETURN_IF_ERROR(copy_blocks(*backend_, device_pool(g), args, compute_));
  }
  return ok_status();
}

void KvCache::note_transfers(const Transfers& t, runtime::TransferTicket ticket) {
  if (ticket == 0) return;
  for (const std::vector<SequenceId>* ids : {&t.offloaded, &t.restored}) {
    for (SequenceId id : *ids) last_job_[id] = ticket;
  }
}

Status KvCache::recover(const Status& failure, core::TierPlan& plan, int64_t moves_done) {
  // What was queued runs to completion first: the undo then copies bytes back over it. Each
  // step is tried twice: a transient error (or a second injected fault) gets one more chance
  // before the cache gives up on its blocks.
  auto twice = [](const auto& step) {
    Status st = step();
    return st.ok() ? st : step();
  };
  Status repair = twice([&] { return backend_->synchronize_stream(compute_); });
  if (repair.ok()) {
    repair = twice([&] { return transfers_->synchronize(); });
  }
  const std::vector<BlockMove> inverse = plan.undo(moves_done);
  size_t copied_back = 0;  // a failed attempt still runs the moves it queued: resume after them
  if (repair.ok() && !inverse.empty()) {
    repair = twice([&]() -> Status {
      const std::vector<BlockMove> rest(inverse.begin() + static_cast<std::ptrdiff_t>(copied_back),
                                        inverse.end());
      int64_t queued = 0;
      const Status st = transfers_->submit(rest, compute_, &queued).status();
      copied_back += static_cast<size_t>(queued);
      return st;
    });
    if (repair.ok()) {
      repair = twice([&] { return transfers_->synchronize(); });
    }
  }
  if (!repair.ok()) {
    broken_ = internal_error("the cache is unusable: after \"" + failure.message() +
                             "\" its blocks could not be put back: " + repair.message());
    detail::logger().error("KvCache: {}", broken_.message());
    return broken_;
  }
  return Status(failure.code(), failure.message() + " (nothing changed)");
}

Status KvCache::order_block_reuse(int32_t g, const int64_t* slots, size_t n) {
  return transfers_->order_block_reuse(g, slots, n, config_.block_size, compute_);
}

Status KvCache::order_block_use(int32_t g, const int32_t* blocks, size_t n) {
  return transfers_->order_block_use(g, blocks, n, compute_);
}

StatusOr<std::vector<int64_t>> KvCache::reserve(SequenceId id, int64_t n) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::reserve");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("reserve"));
  poll_storage_quietly();
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, control_->plan_reserve(id, n));
  std::vector<int64_t> slots = plan.slots();
  PAGEDKV_RETURN_IF_ERROR(carry_out(plan));
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
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::reserve_batch");
  if (slots != nullptr) slots->clear();  // what an error leaves
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("reserve_batch"));
  poll_storage_quietly();
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, control_->plan_reserve_batch(ids, n_each));
  if (slots != nullptr) slots->assign(plan.slots().begin(), plan.slots().end());
  const Status st = carry_out(plan);
  if (!st.ok() && slots != nullptr) slots->clear();
  return st;
}

Status KvCache::commit(SequenceId id, const std::vector<TokenId>& tokens) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::commit");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("commit"));
  return commit_tokens(id, tokens.data(), static_cast<int64_t>(tokens.size()));
}

Status KvCache::commit_tokens(SequenceId id, const TokenId* tokens, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(control_->commit(id, tokens, n));
  ++generation_;
  forget_slot_uploads(id);  // the reservation shrank: its upload no longer matches
  return ok_status();
}

Status KvCache::commit_batch(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                             int64_t n_each) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::commit_batch");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("commit_batch"));
  PAGEDKV_RETURN_IF_ERROR(check_commit_tokens(ids, tokens, n_each));
  // The control plane checks every member before it commits any.
  PAGEDKV_RETURN_IF_ERROR(control_->commit_batch(ids, tokens.data(), n_each));
  ++generation_;
  for (GroupPool& g : groups_) {
    if (g.slot_uploads.empty()) continue;
    for (SequenceId id : ids) g.slot_uploads.erase(id);
  }
  return ok_status();
}

Status KvCache::rollback(SequenceId id, int64_t length) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::rollback");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("rollback"));
  PAGEDKV_RETURN_IF_ERROR(control_->rollback(id, length));
  ++generation_;
  forget_slot_uploads(id);
  return ok_status();
}

Status KvCache::fork(SequenceId parent, SequenceId child) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::fork");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("fork"));
  PAGEDKV_RETURN_IF_ERROR(control_->fork(parent, child));
  ++generation_;
  return ok_status();
}

Status KvCache::finish(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::finish");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("finish"));
  PAGEDKV_RETURN_IF_ERROR(control_->finish(id));
  ++generation_;
  forget_slot_uploads(id);
  last_job_.erase(id);
  return ok_status();
}

Status KvCache::erase(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::erase");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("erase"));
  PAGEDKV_RETURN_IF_ERROR(control_->erase(id));
  ++generation_;
  forget_slot_uploads(id);
  last_job_.erase(id);
  return ok_status();
}

Status KvCache::set_active(const std::vector<SequenceId>& ids) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::set_active");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  return control_->set_active(ids);
}

Status KvCache::set_priority(SequenceId id, int32_t priority) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::set_priority");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  return control_->set_priority(id, priority);
}

Status KvCache::offload(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::offload");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("offload"));
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, control_->plan_offload(id));
  return carry_out(plan);
}

Status KvCache::carry_out(core::TierPlan& plan) {
  ++generation_;
  // The control plane has applied its plan; the data plane now carries it out, or the plan is
  // taken back.
  Submitted sub;
  Status s = run_transfers(plan.transfers(), &sub);
  // The full group's new slots are listed: their writes follow the jobs still using them from
  // here on. A window group's new pages are not: its writers order themselves (write_kv through
  // device_slots, a batch's writes when it is built: upload_batch).
  if (s.ok()) s = order_block_reuse(full_group_, plan.slots().data(), plan.slots().size());
  if (!s.ok()) return recover(s, plan, sub.moves_done);
  note_transfers(plan.transfers(), sub.ticket);
  plan.commit();
  return ok_status();
}

Status KvCache::restore(SequenceId id) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::restore");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("restore"));
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, control_->plan_restore(id));
  return carry_out(plan);
}

Status KvCache::prefetch(const std::vector<SequenceId>& ids) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::prefetch");
  PAGEDKV_RETURN_IF_ERROR(broken_);
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("prefetch"));
  PAGEDKV_ASSIGN_OR_RETURN(core::TierPlan plan, control_->plan_prefetch(ids));
  return carry_out(plan);
}

StatusOr<SequenceResidency> KvCache::residency(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("residency"));
  PAGEDKV_ASSIGN_OR_RETURN(Residency r, control_->residency(id));
  auto job = last_job_.find(id);
  if (job != last_job_.end()) {
    PAGEDKV_ASSIGN_OR_RETURN(bool done, transfers_->is_complete(job->second));
    if (!done) return SequenceResidency::kInFlight;
    last_job_.erase(job);
  }
  return r.offloaded ? SequenceResidency::kHost : SequenceResidency::kDevice;
}

std::vector<SequenceId> KvCache::drain_evicted_sequences() { return std::exchange(evicted_, {}); }

Status KvCache::synchronize() {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::synchronize");
  PAGEDKV_RETURN_IF_ERROR(refuse_in_capture("synchronize"));
  PAGEDKV_RETURN_IF_ERROR(transfers_->synchronize());
  return backend_->synchronize_stream(compute_);
}

}  // namespace pagedkv
