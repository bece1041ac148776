// Moves whole blocks between the device pool and the pinned host pool on two copy streams, one
// per direction, ordered against the compute stream by events and never by host blocking.
//
// A job is one batch of BlockMoves (a step's offloads, restores and prefetches). Block-major
// pools make every block one contiguous range; consecutive moves whose source and destination
// blocks are both consecutive are merged into one region (vLLM measured per-block copies of
// small pages at a quarter of the bandwidth of merged runs), and the regions of a direction go
// to the backend as one Backend::copy_batch (cudaMemcpyBatchAsync), not one copy each.
//
// Jobs of small blocks take the copy kernel instead, when the host pool is mapped into the
// device's address space (Backend::mapped_device_pointer): each batch is one launch of the
// block-copy body (kernels/paged_copy.hpp) over the batch's (source, destination) block pairs,
// which a small copy on the same stream first uploads from pinned memory into device memory
// (both kept by the job until it completes). The launch takes at most a few CTAs (the transfer
// is PCIe-bound; a full grid would take the SMs from compute), and the copy streams have a low
// priority (StreamPriority::kLow), so compute kernels are scheduled first. Below
// TransferOptions::kernel_block_bytes per block the kernel's one launch beats the DMA's setup
// per region; which side of the threshold wins, and how few CTAs suffice, is for a GPU to
// measure (bench_transfer).
//
// Offloads (device -> host) run on the device-to-host stream, restores (host -> device) on the
// host-to-device stream, so a job's two directions overlap. A move that touches a block an
// earlier move of the other direction touches (a restore into a device block an offload reads,
// an offload into a host slot a restore reads) is ordered after it by an event; the batches are
// cut only where such a dependency would otherwise form a cycle. Jobs stay in order: each job
// starts after everything on the device-to-host stream (earlier jobs, staging copies queued on
// copy_stream()) and ends there.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"
#include "runtime/block_hazards.hpp"

namespace pagedkv::runtime {

/// One contiguous copy derived from a run of moves.
struct CopyRun {
  Tier src_tier = Tier::kDevice;
  int64_t src_block = 0;
  Tier dst_tier = Tier::kHost;
  int64_t dst_block = 0;
  int64_t num_blocks = 0;
};

/// Merges moves into runs, keeping list order (a later move may reuse a block an earlier one
/// freed, so moves are never reordered).
std::vector<CopyRun> merge_runs(const std::vector<BlockMove>& moves);

/// Identifies a submitted job; increasing.
using TransferTicket = uint64_t;

/// The pools a transfer engine moves blocks between.
struct TierPools {
  void* device = nullptr;
  int64_t device_blocks = 0;
  void* host = nullptr;  // pinned
  int64_t host_blocks = 0;
  int64_t block_bytes = 0;
  /// The host pool as kernels address it (Backend::mapped_device_pointer of `host`); null when
  /// it is not mapped, and then every job goes through Backend::copy_batch.
  void* host_mapped = nullptr;
};

/// How a transfer engine moves blocks.
struct TransferOptions {
  /// Jobs whose blocks are smaller than this many bytes run as one copy kernel per direction
  /// and batch over the mapped host pool; larger ones, or any when the host pool is not mapped,
  /// as Backend::copy_batch. 0 (the engine's default) never uses the kernel.
  int64_t kernel_block_bytes = 0;
};

/// Runs jobs of block moves on its own two copy streams.
class TransferEngine {
 public:
  /// The most CTAs one copy-kernel launch occupies (KernelLaunch::max_blocks). The kernel moves
  /// bytes over PCIe (one side is mapped host memory), so the link sets its speed, not the SMs:
  /// a few CTAs of 16-byte accesses keep enough requests in flight, while a full grid (SMs x
  /// resident blocks) would hold every SM's warp slots for the whole transfer and stall the
  /// compute kernels the copy is meant to overlap. 16 is a guess, not a measurement: the knee
  /// (the smallest cap that still reaches full link speed) is for a GPU to find
  /// (docs/gpu-check.md).
  static constexpr int32_t kCopyKernelMaxBlocks = 16;

  /// Creates the copy streams (StreamPriority::kLow). kInvalidArgument for pools without blocks or
  /// bytes, a mapped host pool without a host pool, or a negative kernel_block_bytes.
  static StatusOr<std::unique_ptr<TransferEngine>> create(Backend& backend, const TierPools& pools,
                                                          const TransferOptions& options = {});
  /// One engine for the pools of several KV groups (a cache whose groups share the blocks):
  /// `pools[g]` are group g's, and BlockMove::group names the pools of each move. One job may
  /// move blocks of every group; its moves of one group are ordered as one pool's are, and moves
  /// of different groups never depend on each other. The copy kernel serves the groups whose
  /// blocks are below the threshold, one launch per group and batch.
  static StatusOr<std::unique_ptr<TransferEngine>> create(Backend& backend,
                                                          const std::vector<TierPools>& pools,
                                                          const TransferOptions& options = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  /// Queues `moves` as one job on the copy streams, after the work queued on `after` so far (the
  /// last writes of the blocks being read); a later move that reuses a block an earlier one
  /// freed runs after it. Validates every move first: on error nothing is queued. An empty job
  /// completes at once. `moves_queued` (optional) receives how many moves, from the front of the
  /// list, were queued: all of them on success, a prefix when the backend failed part way (those
  /// still run). Moves after that prefix may have been queued too, but only ones of the other
  /// direction that depend on no move left out, so undoing the prefix restores every block that
  /// holds data (for moves between tiers, the only kind the control plane makes).
  StatusOr<TransferTicket> submit(const std::vector<BlockMove>& moves, Stream after,
                                  int64_t* moves_queued = nullptr);

  /// Work queued on `stream` after this call starts only after job `ticket` (and every earlier
  /// job) finished copying: writes into blocks the job read, reads of blocks it wrote.
  Status order_after(TransferTicket ticket, Stream stream);

  /// Per block, as work on `stream` needs it (BlockHazards, block_hazards.hpp): orders `stream`
  /// after the jobs still reading or writing the device blocks of `group` that `slots` (token
  /// slots of `block_size`-token blocks; -1 ignored) write; nothing when no job touches them.
  Status order_block_reuse(int32_t group, const int64_t* slots, size_t n, int64_t block_size,
                           Stream stream);
  /// Orders `stream` after the jobs still writing any of `blocks` of `group` (-1 ignored), so
  /// that work queued on it afterwards reads or writes them safely.
  Status order_block_use(int32_t group, const int32_t* blocks, size_t n, Stream stream);
  /// Device blocks of `group` that a job still in flight (as far as noted) reads (`read`) or
  /// writes; 0 means a use or reuse of the group orders nothing.
  int64_t blocks_pending(int32_t group, bool read) const { return hazards_.pending(group, read); }

  /// True when job `ticket` is done. kNotFound for a ticket never handed out.
  StatusOr<bool> is_complete(TransferTicket ticket);

  /// Blocks the host until job `ticket` is done.
  Status wait(TransferTicket ticket);

  /// The device-to-host stream, where every job starts and ends: work queued on it before a job
  /// runs before the job's copies, work queued after it runs after them.
  Stream copy_stream() const { return streams_[kToHost]; }
  /// The stream of offloads (and device-to-device moves) and that of restores (and host-to-host
  /// moves).
  Stream device_to_host_stream() const { return streams_[kToHost]; }
  Stream host_to_device_stream() const { return streams_[kToDevice]; }

  /// Blocks the host until both copy streams are idle.
  Status synchronize();

  /// True when jobs of some group go through the copy kernel (a mapped host pool, blocks below
  /// the threshold).
  bool uses_kernel() const;

  /// Backend copy calls (copy_batch, one per direction and batch), the regions they held (runs
  /// of consecutive blocks), copy kernel launches (one per direction and batch) and the bytes
  /// moved by either since creation.
  int64_t copies_issued() const { return copies_issued_; }
  int64_t regions_issued() const { return regions_issued_; }
  int64_t kernels_issued() const { return kernels_issued_; }
  int64_t bytes_moved() const { return bytes_moved_; }

 private:
  class Issuer;  // queues one job's moves (transfer_engine.cpp)
  friend class Issuer;
  static constexpr int kToHost = 0;    // offloads, device-to-device moves
  static constexpr int kToDevice = 1;  // restores, host-to-host moves
  // A copy kernel's (source, destination) block pairs: written into pinned memory, uploaded on
  // the copy stream into device memory, which the kernel reads.
  struct PairBuffer {
    void* host = nullptr;    // pinned
    void* device = nullptr;  // device memory of the same size
    size_t bytes = 0;
  };
  struct Job {
    TransferTicket ticket;
    Event done;
    std::vector<PairBuffer> pairs;  // read by the job's kernels: reused once `done` completed
  };
  TransferEngine(Backend& backend, std::vector<TierPools> pools, std::vector<bool> use_kernel,
                 Stream to_host, Stream to_device, Event ready, Event link);
  Status validate(const BlockMove& move) const;
  StatusOr<Event> take_event();
  // A pair buffer of at least `bytes` bytes for the job being issued (kept in issuing_pairs_).
  StatusOr<PairBuffer> take_pairs(size_t bytes);
  void recycle_pairs(std::vector<PairBuffer>& buffers);
  void free_pairs(const PairBuffer& buffer);
  void recycle_completed();
  const Job* find(TransferTicket ticket) const;
  char* block_address(int32_t group, Tier tier, int64_t block) const;
  // A pool's base as the copy kernel addresses it, and its block count.
  char* kernel_address(int32_t group, Tier tier) const;
  int64_t pool_blocks(int32_t group, Tier tier) const;

  Backend& backend_;
  std::vector<TierPools> pools_;  // by group
  std::vector<bool> use_kernel_;  // by group
  Stream streams_[2];             // by kToHost, kToDevice
  Event ready_;                   // recorded on the caller's stream before each job
  Event link_;                    // recorded on one copy stream and at once waited on by the other
  std::deque<Job> in_flight_;     // oldest first
  std::vector<Event> spare_events_;
  std::vector<PairBuffer> issuing_pairs_;  // taken by the job being issued
  std::vector<PairBuffer> spare_pairs_;
  std::vector<PairBuffer> orphaned_pairs_;  // not covered by a done event: reused after a sync
  TransferTicket next_ticket_ = 1;
  TransferTicket completed_below_ = 1;  // every ticket < this one is known to be complete
  int64_t copies_issued_ = 0;
  int64_t regions_issued_ = 0;
  int64_t kernels_issued_ = 0;
  int64_t bytes_moved_ = 0;
  BlockHazards hazards_;  // each device block's last reading and writing job
};

}  // namespace pagedkv::runtime
