// KvCache's private half (KvCache::Impl): the control plane, one data plane per tensor-parallel
// rank (its backend, each group's pools, transfer engine and upload arena), the storage link
// and what the facade keeps between calls, with the helpers its calls share. Only src/runtime's
// kv_cache*.cpp include it, so a change here recompiles the cache, not its clients; the
// installed cache.hpp holds one pointer.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/nvtx.hpp"
#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "runtime/storage_link.hpp"
#include "runtime/transfer_engine.hpp"
#include "runtime/upload_arena.hpp"

namespace pagedkv {

/// Opens the public call `name` of KvCache, in a KvCache member: the NVTX range
/// "pagedkv::KvCache::<name>" (Nsight shows every operation by that name), then Impl::enter:
/// the broken check and the refusal while the compute stream captures a CUDA graph, naming
/// `name`. Either error returns from the calling function.
#define PAGEDKV_KV_CACHE_CALL(name)               \
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::" #name); \
  PAGEDKV_RETURN_IF_ERROR(impl_->enter(#name))

struct KvCache::Impl {
  // Per sequence: the slots its last write_kv uploaded, and the region holding them. A cache of
  // an upload, not a copy of the reservation: the control plane's sequence table owns the slots,
  // write_kv asks it for them every time and uploads again when they differ (after a commit, a
  // new reservation, an offload or a restore).
  struct SlotUpload {
    std::vector<int64_t> slots;
    std::unique_ptr<runtime::UploadLease> lease;
  };
  // One KV group's pools on one rank, and what the data plane keeps for them.
  struct GroupPool {
    void* device = nullptr;  // of shard_config(g)'s blocks
    void* host = nullptr;
    std::unordered_map<SequenceId, SlotUpload> slot_uploads;
    DeviceBatch batch;  // the group's last built batch, as uploaded to this rank
  };
  // One tensor-parallel rank's data plane (the only one without tensor parallelism): its
  // backend and compute stream, each group's pools holding the rank's slice of the KV heads,
  // and the transfer engine and upload arena over them. Every rank has the same blocks, so the
  // control plane's block ids and the plans it makes hold on every rank.
  struct Rank {
    std::unique_ptr<Backend> owned_backend;
    Backend* backend = nullptr;
    Stream compute{};
    std::vector<GroupPool> groups;  // by CacheConfig::groups index
    std::unique_ptr<runtime::TransferEngine> transfers;
    std::unique_ptr<runtime::UploadArena> uploads;
    std::unordered_map<SequenceId, uint64_t> last_job;  // per sequence: its last transfer job
  };
  // What run_transfers() got onto the streams, per rank.
  struct Submitted {
    std::vector<uint64_t> tickets;    // the transfer job, 0 when there were no moves
    std::vector<int64_t> moves_done;  // moves queued (a prefix of the list when a rank failed)
  };

  Impl() = default;
  // Waits for the queued work, then frees the pools (after the parts that use them).
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  int32_t num_groups() const { return static_cast<int32_t>(group_configs.size()); }
  int32_t num_ranks() const { return static_cast<int32_t>(ranks.size()); }
  // The model's config of group `g` (all its heads).
  const CacheConfig& group_config(int32_t g) const { return group_configs[static_cast<size_t>(g)]; }
  // The bytes of one block of group `g` over every rank.
  int64_t group_block_bytes(int32_t g) const { return shard_config(g).block_bytes() * num_ranks(); }
  // What one rank's pools of group `g` hold (KvCache::shard_config): the same on every rank.
  const CacheConfig& shard_config(int32_t g) const { return shard_configs[static_cast<size_t>(g)]; }
  // Group `g`'s device pool on rank `r` as the data-plane ops see it.
  PoolRef device_pool(int32_t g, int32_t r = 0) const;

  // The checks every public call that may queue work makes first, in this order: the cache is
  // not broken (else that error), and the compute stream is not capturing (refuse_in_capture).
  Status enter(const char* what) {
    if (!broken.ok()) return broken;
    return refuse_in_capture(what);
  }
  // kOutOfRange naming `what` unless 0 <= r < num_ranks().
  Status check_rank(int32_t r, const char* what) const;
  // A control-plane change's result, passed through; on success the generation moves on (a
  // batch built before it is stale).
  template <typename Result>
  Result changed(Result result) {
    if (result.ok()) ++generation;
    return result;
  }

  // Creates rank `r`'s pools (its part of every group), transfer engine and upload arena, on its
  // backend and compute stream (set before).
  Status create_rank(int32_t r, const KvCacheOptions& options);
  // Queues a control-plane plan's transfers on every rank's streams, rank by rank; a failure
  // leaves the later ranks untouched.
  Status run_transfers(const Transfers& transfers, Submitted* out);
  // Carries a plan out: run_transfers(), then note_transfers() and commit, or recover().
  Status carry_out(core::TierPlan& plan);
  // Bookkeeping after a plan was queued: the last transfer job of each moved sequence.
  void note_transfers(const Transfers& transfers, const Submitted& sub);
  // Takes a failed plan back (control plane undone, the moves each rank queued copied back)
  // and returns `failure`; when that fails too, the cache is marked unusable and that error
  // returned.
  Status recover(const Status& failure, core::TierPlan& plan, const Submitted& sub);
  // Orders rank `r`'s compute stream after the offloads still reading, and the restores still
  // writing, the device blocks of group `g` that `slots` (of that group's pool; -1 entries
  // ignored) write.
  Status order_block_reuse(Rank& r, int32_t g, const int64_t* slots, size_t n);
  // Orders rank `r`'s compute stream after the restores still writing any of `blocks` of group
  // `g` (-1 entries ignored): work queued after this reads or writes them safely (the transfer
  // engine keeps each block's jobs: TransferEngine::order_block_use).
  Status order_block_use(Rank& r, int32_t g, const int32_t* blocks, size_t n);
  // Runs the block copies of a plan on rank `r`, group by group.
  Status run_copies(Rank& r, const std::vector<BlockCopy>& copies);
  // kOutOfRange unless 0 <= g < num_groups().
  Status check_group(int32_t g) const;
  // The group and in-group index of the model layer an op is asked for: layer_group(), except
  // that with one group the layer is passed through unchecked (the op checks it).
  StatusOr<LayerGroup> op_layer(int32_t layer) const;
  // Forgets the uploaded slots of `id`'s reservation in every group.
  void forget_slot_uploads(SequenceId id);
  // Forgets what the cache keeps of a sequence that is gone: its uploaded slots, its last job.
  void forget(SequenceId id);
  // Uploads group `g`'s metadata `m` of the batch being built to every rank; `*out` is rank
  // 0's batch (rank_batch gives the others).
  Status upload_batch(int32_t g, const BatchMetadata& m, const BatchOptions& options,
                      DeviceBatch* out);
  // Whether `batch` came from this cache's build_batch (KvCache::built_here).
  bool built_here(const DeviceBatch& batch) const;
  // kInvalidArgument for another cache's batch; kFailedPrecondition unless `batch` is the last
  // one built and nothing changed since.
  Status check_batch_current(const DeviceBatch& batch) const;
  // commit() without the NVTX range and the broken check.
  Status commit_tokens(SequenceId id, const TokenId* tokens, int64_t n);
  // kFailedPrecondition naming `what` when a compute stream is capturing a CUDA graph: the
  // call would allocate, upload, query or synchronize, or record work a replay must not repeat.
  Status refuse_in_capture(const char* what);
  // poll_storage() inside another call: a failure is logged, not returned (it is not that
  // call's; poll_storage() and flush_storage() report it).
  void poll_storage_quietly();
  // Rank `r`'s device copy of the slots of a sequence's reservation in group `g`, for write_kv.
  StatusOr<const int64_t*> device_slots(SequenceId id, int32_t g, Rank& r, int64_t* count);
  // With record_plans: appends a carried-out plan's moves and copies, or a built batch, to
  // `recorded` (take_step_plan).
  void record_transfers(const Transfers& t);
  void record_batch(int32_t g, const BatchMetadata& m, const BatchOptions& options,
                    bool same_build);
  // kInvalidArgument naming record `i` unless every block id, slot and length of `rec` fits this
  // cache's pools, and a batch of the same build follows one of an earlier group (`before`, the
  // record before it, or null). apply_step_plan checks a whole plan before it queues anything.
  Status check_step_record(const StepRecord& rec, const StepRecord* before, size_t i) const;
  // kFailedPrecondition naming `what` on a cache that applies another cache's plans.
  Status refuse_if_applying_plans(const char* what) const;

  CacheConfig config;
  std::vector<CacheConfig> group_configs;  // by CacheConfig::groups index: the model's
  std::vector<CacheConfig> shard_configs;  // the same, each rank's part of the heads
  std::vector<Rank> ranks;                 // one without tensor parallelism
  // With several ranks: the arena that packs each batch's metadata once and copies it to every
  // rank (null with one: rank 0's arena uploads it).
  std::unique_ptr<runtime::UploadArena> batch_arena;
  // The last build_batch's arrays, one region per group (on every rank).
  std::vector<std::unique_ptr<runtime::UploadLease>> batch_uploads;
  // Per group: the host metadata its batches point to (the control plane's); a batch pointing
  // elsewhere was built by another cache.
  std::vector<const BatchMetadata*> built;
  int32_t full_group = 0;
  std::vector<LayerGroup> layers;  // by model layer
  PoolInfo pool_info;
  std::unique_ptr<core::ControlPlane> control;
  std::unique_ptr<runtime::StorageLink> storage;  // null without a storage tier (rank 0's)
  std::vector<int64_t> slot_scratch;
  Submitted submitted;  // carry_out's, kept so that a decode step allocates nothing
  // Moves on with build_batch and every call that can change a reservation or a block;
  // write_kv_batch refuses a batch of another generation.
  uint64_t generation = 0;
  std::vector<SequenceId> evicted;
  Status broken;  // set when a failed call could not be taken back
  // Split processes (step_plan.hpp). The scheduler's side: what the calls since the last
  // take_step_plan() carried out. A worker's side: each group's last applied batch metadata
  // (its DeviceBatch's host copy), and whether a plan was applied (no decisions of its own).
  bool record_plans = false;
  StepPlan recorded;
  std::vector<BatchMetadata> applied;
  bool applies_plans = false;
};

}  // namespace pagedkv
