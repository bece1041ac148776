// KvCache's private half (KvCache::Impl): the pools of each group, the control plane, the data
// plane's parts (transfer engine, storage link, upload arena) and what the facade keeps between
// calls, with the helpers its calls share. Only src/runtime's kv_cache*.cpp include it, so a
// change here recompiles the cache, not its clients; the installed cache.hpp holds one pointer.
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
  // One KV group's pools and what the data plane keeps for them.
  struct GroupPool {
    CacheConfig config;  // CacheConfig::group_config of the group
    void* device = nullptr;
    void* host = nullptr;
    std::unordered_map<SequenceId, SlotUpload> slot_uploads;
    // The host metadata this group's batches point to (the control plane's): a batch pointing
    // elsewhere was built by another cache.
    const BatchMetadata* built = nullptr;
  };
  // What run_transfers() got onto the streams.
  struct Submitted {
    uint64_t ticket = 0;     // the transfer job, 0 when there were no moves
    int64_t moves_done = 0;  // moves queued (a prefix of the list when the backend failed)
  };

  Impl() = default;
  // Waits for the queued work, then frees the pools (after the parts that use them).
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  int32_t num_groups() const { return static_cast<int32_t>(groups.size()); }
  const CacheConfig& group_config(int32_t g) const { return groups[static_cast<size_t>(g)].config; }
  // Group `g`'s device pool as the data-plane ops see it.
  PoolRef device_pool(int32_t g) const;

  // The checks every public call that may queue work makes first, in this order: the cache is
  // not broken (else that error), and the compute stream is not capturing (refuse_in_capture).
  Status enter(const char* what) {
    if (!broken.ok()) return broken;
    return refuse_in_capture(what);
  }
  // A control-plane change's result, passed through; on success the generation moves on (a
  // batch built before it is stale).
  template <typename Result>
  Result changed(Result result) {
    if (result.ok()) ++generation;
    return result;
  }

  // Queues a control-plane plan's transfers on the streams.
  Status run_transfers(const Transfers& transfers, Submitted* out);
  // Carries a plan out: run_transfers(), then note_transfers() and commit, or recover().
  Status carry_out(core::TierPlan& plan);
  // Bookkeeping after a plan was queued: the last transfer job of each moved sequence.
  void note_transfers(const Transfers& transfers, runtime::TransferTicket ticket);
  // Takes a failed plan back (control plane undone, queued moves copied back) and returns
  // `failure`; when that fails too, the cache is marked unusable and that error returned.
  Status recover(const Status& failure, core::TierPlan& plan, int64_t moves_done);
  // Orders the compute stream after the offloads still reading, and the restores still
  // writing, the device blocks of group `g` that `slots` (of that group's pool; -1 entries
  // ignored) write.
  Status order_block_reuse(int32_t g, const int64_t* slots, size_t n);
  // Orders the compute stream after the restores still writing any of `blocks` of group `g`
  // (-1 entries ignored): work queued after this reads or writes them safely (the transfer
  // engine keeps each block's jobs: TransferEngine::order_block_use).
  Status order_block_use(int32_t g, const int32_t* blocks, size_t n);
  // Runs the block copies of a plan, group by group.
  Status run_copies(const std::vector<BlockCopy>& copies);
  // kOutOfRange unless 0 <= g < num_groups().
  Status check_group(int32_t g) const;
  // The group and in-group index of the model layer an op is asked for: layer_group(), except
  // that with one group the layer is passed through unchecked (the op checks it).
  StatusOr<LayerGroup> op_layer(int32_t layer) const;
  // Forgets the uploaded slots of `id`'s reservation in every group.
  void forget_slot_uploads(SequenceId id);
  // Forgets what the cache keeps of a sequence that is gone: its uploaded slots, its last job.
  void forget(SequenceId id);
  // Uploads group `g`'s metadata `m` of the batch being built into `*out`.
  Status upload_batch(int32_t g, const BatchMetadata& m, const BatchOptions& options,
                      DeviceBatch* out);
  // Whether `batch` came from this cache's build_batch (KvCache::built_here).
  bool built_here(const DeviceBatch& batch) const;
  // kInvalidArgument for another cache's batch; kFailedPrecondition unless `batch` is the last
  // one built and nothing changed since.
  Status check_batch_current(const DeviceBatch& batch) const;
  // commit() without the NVTX range and the broken check.
  Status commit_tokens(SequenceId id, const TokenId* tokens, int64_t n);
  // kFailedPrecondition naming `what` when the compute stream is capturing a CUDA graph: the
  // call would allocate, upload, query or synchronize, or record work a replay must not repeat.
  Status refuse_in_capture(const char* what);
  // poll_storage() inside another call: a failure is logged, not returned (it is not that
  // call's; poll_storage() and flush_storage() report it).
  void poll_storage_quietly();
  // The device copy of the slots of a sequence's reservation in group `g`, for write_kv.
  StatusOr<const int64_t*> device_slots(SequenceId id, int32_t g, int64_t* count);

  CacheConfig config;
  std::unique_ptr<Backend> owned_backend;
  Backend* backend = nullptr;
  Stream compute{};
  std::vector<GroupPool> groups;  // by CacheConfig::groups index
  int32_t full_group = 0;
  std::vector<LayerGroup> layers;  // by model layer
  PoolInfo pool_info;
  std::unique_ptr<core::ControlPlane> control;
  std::unique_ptr<runtime::TransferEngine> transfers;
  std::unique_ptr<runtime::StorageLink> storage;  // null without a storage tier
  std::unique_ptr<runtime::UploadArena> uploads;
  std::vector<int64_t> slot_scratch;
  // The last build_batch's arrays, one region per group. `generation` moves on with
  // build_batch and every call that can change a reservation or a block; write_kv_batch
  // refuses a batch of another generation.
  std::vector<std::unique_ptr<runtime::UploadLease>> batch_uploads;
  uint64_t generation = 0;
  std::unordered_map<SequenceId, uint64_t> last_job;  // per sequence: its last transfer job
  std::vector<SequenceId> evicted;
  Status broken;  // set when a failed call could not be taken back
};

}  // namespace pagedkv
