// StorageLink: what joins a KvCache to a StorageTier (include/pagedkv/storage_tier.hpp).
//
// Write-back: the control plane reports the cached host blocks its host LRU drops
// (Transfers::host_drops), each with where its bytes are until the same call's moves run
// (DroppedBlock::source): its host slot, or the device block it was demoted from earlier in the
// call. Those moves may overwrite the source, so stage() queues copies of the blocks into a
// pinned staging area on the copy stream, before the call's moves (a device source also after
// the compute stream's queued writes); once those copies ran, poll() hands the bytes to the
// store (which copies them) and frees the staging slots. With every staging slot taken, a
// dropped block is simply not written back.
//
// Read-back: fetch() asks the store which blocks after a prompt's cached prefix it holds and
// takes host slots for them (ControlPlane::begin_arrival: free ones, then those of the least
// recently used cached host blocks, staged for write-back like any drop). The store may write those
// slots only after every copy already queued on the copy stream ran (a restore may still be reading
// a slot's previous occupant), so the read is submitted by a later poll() once an event recorded
// then has completed. When the read finishes, poll() reports it (finish_arrival): the blocks
// become cached host blocks, and prompts hit them like any host block.
//
// A finished put is announced on the storage tier once, parent first (StorageAnnouncer).
//
// Several KV groups: each group may have a store of its own layout (a lane: its store, pools,
// staging area and announcer). A dropped block comes once per group that kept a page of it
// (DroppedBlock::group), and goes to that group's store. A fetch asks the owner's store which
// blocks it holds and every other group's store which of those it holds, and reads them all into
// one arrival (ControlPlane::begin_arrival's group pages); the arrival is finished once every
// lane's read has.
//
// Tensor parallelism: each rank's share of a group's pages goes to a store of its own (a lane per
// group and rank, on that rank's backend and streams, the store's layout naming the TP size and
// the rank). A fetch brings back the blocks every rank's store holds; a dropped block goes to
// every rank's store. Rank 0's lanes announce puts and count blocks; bytes count on every rank.
//
// Nothing here waits for the store; only flush() (tests, shutdown) does.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/control_plane.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/storage_announcer.hpp"

namespace pagedkv {
namespace runtime {

class StorageLink {
 public:
  /// One group's store on one rank (not owned; null: the group's pages are not stored), which
  /// must have the layout of `config` (the rank's part of the group; with tp_size > 1 naming the
  /// TP size and the rank: StorageLayout::for_rank), and that rank's pools of the group, its
  /// backend and the streams its copies go on (the transfer engine's copy stream, the compute
  /// stream).
  struct GroupStore {
    StorageTier* store = nullptr;
    CacheConfig config;
    int32_t group = 0;  // config index
    int32_t rank = 0;
    int32_t tp_size = 1;
    void* device_pool = nullptr;
    void* host_pool = nullptr;
    Backend* backend = nullptr;
    Stream copy_stream{};
    Stream compute{};
  };
  /// A lane per entry of `stores` with a store (every group on every rank, in any order);
  /// `owner` is the group that owns the blocks (ControlPlane::full_group()), whose store must be
  /// given on every rank. kInvalidArgument for a layout that differs, a missing owner store, a
  /// group stored on some ranks only, two lanes given one store (or stores of one layout), or a
  /// cache without a host tier; kResourceExhausted when a staging area cannot be had. Each lane
  /// gets `staging_blocks` staging slots of its block.
  static StatusOr<std::unique_ptr<StorageLink>> create(const std::vector<GroupStore>& stores,
                                                       int32_t num_groups, int32_t owner,
                                                       int64_t staging_blocks);
  /// Waits for the staging copies and every job of the store (they read or write the pools).
  ~StorageLink();
  StorageLink(const StorageLink&) = delete;
  StorageLink& operator=(const StorageLink&) = delete;

  /// Queues, on each lane's copy stream, the copies of dropped blocks out of their sources;
  /// those on the device after the work queued on the lane's compute stream so far (their last
  /// writes). Call it before the moves of the same plan are queued: the plan's later writes into
  /// a device source wait for that plan's transfer job, which starts after these copies.
  Status stage(const std::vector<DroppedBlock>& drops);
  /// Hands staged blocks whose copies ran to the store, submits reads whose slots are free of
  /// queued copies, and lands finished reads in the control plane. Never waits.
  Status poll(core::ControlPlane& control);
  /// Starts reading the blocks the store holds for a hit of at most `max_cached` tokens of
  /// `prompt` (-1: no bound; see ControlPlane::storage_lookup) into host slots (free ones, then
  /// those of the least recently used cached host blocks, which are written back first: see
  /// ControlPlane::begin_arrival); says how many are on their way and how far a hit reaches once
  /// they land. A window's blocks are fetched all or none. Once the read is queued the fetch has
  /// succeeded: the poll that follows it only starts the read sooner, and its error is left to
  /// the next poll.
  StatusOr<StorageFetch> fetch(core::ControlPlane& control, const std::vector<TokenId>& prompt,
                               NamespaceId ns, int64_t max_cached);
  /// poll() until nothing is staged, waiting or in flight.
  Status flush(core::ControlPlane& control);
  /// Sets the storage counters of `stats`: every lane's, or group `group`'s lane's (0 without one).
  void add_stats(ControlStats* stats, int32_t group = -1) const;

 private:
  StorageLink() = default;

  // One group's store on one rank and what writing back to it takes.
  struct Lane {
    int32_t group = 0;  // config index
    int32_t rank = 0;
    Backend* backend = nullptr;
    Stream copy_stream{};
    Stream compute{};
    StorageTier* store = nullptr;
    int64_t block_bytes = 0;
    void* device_pool = nullptr;
    void* host_pool = nullptr;
    void* staging = nullptr;
    std::vector<int64_t> free_staging;
    // Puts in flight: the blocks they write, for events.
    std::unordered_map<uint64_t, std::vector<DroppedBlock>> puts;
    // Which finished puts are announced on the storage tier, and when (rank 0's lanes only).
    StorageAnnouncer announcer;
    std::vector<Event> spare_events;  // of `backend`
    std::vector<Event> all_events;
    // This lane's counts (ControlStats::storage_*; storage_hit_blocks is the control plane's).
    int64_t blocks_written = 0;
    int64_t bytes_written = 0;
    int64_t bytes_read = 0;
    int64_t failed_blocks = 0;
    int64_t writes_dropped = 0;

    void* staging_slot(int64_t i) const { return static_cast<char*>(staging) + i * block_bytes; }
    const char* source_bytes(const BlockLocation& at) const {
      const void* pool = at.tier == Tier::kDevice ? device_pool : host_pool;
      return static_cast<const char*>(pool) + at.block * block_bytes;
    }
  };
  // Blocks of one lane copied into staging slots by copies that complete with `ready` (or that
  // ran already, when no event could be recorded and the stream was waited for instead).
  struct StagedBatch {
    size_t lane = 0;
    Event ready{};
    bool ran = false;
    std::vector<DroppedBlock> blocks;
    std::vector<int64_t> slots;
  };
  // One lane's read of an arrival: its keys into its pool, once its copy stream has passed
  // `ready` (the copies still reading the slots' previous blocks).
  struct ReadPart {
    size_t lane = 0;
    Event ready{};
    std::vector<StorageKey> keys;
    std::vector<void*> dst;
    bool done = false;
    int64_t intact = 0;  // blocks read and verified, from the first
  };
  // An arrival's reads, waiting for every part's copy stream, then in flight.
  struct PendingRead {
    uint64_t arrival = 0;
    std::vector<ReadPart> parts;
  };
  // Whether the work before lane `l`'s event `e` ran; a failed query answers false and is kept
  // in `first_error` (when it holds none yet).
  bool ran(size_t l, Event e, Status* first_error);
  Status stage_lane(size_t lane, std::vector<DroppedBlock> drops);
  Status send_staged();
  Status submit_reads(core::ControlPlane& control);
  Status collect(core::ControlPlane& control);
  // A read part ended: the arrival is finished once all its parts have.
  Status part_done(core::ControlPlane& control, uint64_t arrival, size_t lane, int64_t intact);
  // Announces the finished puts that can be (StorageAnnouncer).
  void announce(core::ControlPlane& control);
  StatusOr<Event> take_event(size_t l);
  void give_event(size_t l, Event e) { lanes_[l].spare_events.push_back(e); }
  bool idle() const;

  std::vector<Lane> lanes_;  // the owner's first, rank 0's first among them
  int32_t owner_ = 0;
  std::vector<std::vector<size_t>> lanes_of_group_;  // by config index; none: no store
  std::vector<StagedBatch> staged_;
  std::vector<PendingRead> waiting_reads_;
  // Reads in flight: by arrival, and each lane's job to its arrival.
  std::unordered_map<uint64_t, PendingRead> reads_;
  std::vector<std::unordered_map<uint64_t, uint64_t>> read_jobs_;  // by lane: job -> arrival
};

}  // namespace runtime
}  // namespace pagedkv
