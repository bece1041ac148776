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
  /// One group's store (not owned; null: the group's pages are not stored), which must have the
  /// layout of `config` (the group's), and the group's pools of the device and host tiers.
  struct GroupStore {
    StorageTier* store = nullptr;
    CacheConfig config;
    void* device_pool = nullptr;
    void* host_pool = nullptr;
  };
  /// `groups` by config index (one entry with one group); `owner` is the group that owns the
  /// blocks (ControlPlane::full_group()), whose store must be given. kInvalidArgument for a
  /// layout that differs, a missing owner store, two groups given one store, or a cache without
  /// a host tier; kResourceExhausted when a staging area cannot be had. Each store gets
  /// `staging_blocks` staging slots of its group's block.
  static StatusOr<std::unique_ptr<StorageLink>> create(Backend& backend,
                                                       const std::vector<GroupStore>& groups,
                                                       int32_t owner, int64_t staging_blocks);
  /// Waits for the staging copies and every job of the store (they read or write the pools).
  ~StorageLink();
  StorageLink(const StorageLink&) = delete;
  StorageLink& operator=(const StorageLink&) = delete;

  /// Queues, on `copy_stream`, the copies of dropped blocks out of their sources; those on the
  /// device after the work queued on `compute` so far (their last writes). Call it before the
  /// moves of the same plan are queued: the plan's later writes into a device source wait for
  /// that plan's transfer job, which starts after these copies.
  Status stage(const std::vector<DroppedBlock>& drops, Stream copy_stream, Stream compute);
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
                               NamespaceId ns, int64_t max_cached, Stream copy_stream,
                               Stream compute);
  /// poll() until nothing is staged, waiting or in flight.
  Status flush(core::ControlPlane& control);
  /// Sets the storage counters of `stats`: every lane's, or group `group`'s lane's (0 without one).
  void add_stats(ControlStats* stats, int32_t group = -1) const;

 private:
  explicit StorageLink(Backend& backend) : backend_(backend) {}

  // One group's store and what writing back to it takes.
  struct Lane {
    int32_t group = 0;  // config index
    StorageTier* store = nullptr;
    int64_t block_bytes = 0;
    void* device_pool = nullptr;
    void* host_pool = nullptr;
    void* staging = nullptr;
    std::vector<int64_t> free_staging;
    // Puts in flight: the blocks they write, for events.
    std::unordered_map<uint64_t, std::vector<DroppedBlock>> puts;
    // Which finished puts are announced on the storage tier, and when.
    StorageAnnouncer announcer;
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
  // One lane's read of an arrival: its keys into its pool (the owner's is lanes_[0]'s).
  struct ReadPart {
    size_t lane = 0;
    std::vector<StorageKey> keys;
    std::vector<void*> dst;
    bool done = false;
    int64_t intact = 0;  // blocks read and verified, from the first
  };
  // An arrival's reads, waiting for the copy stream (`ready`), then in flight.
  struct PendingRead {
    Event ready{};
    uint64_t arrival = 0;
    std::vector<ReadPart> parts;
  };
  // Whether the work before `e` ran; a failed query answers false and is kept in `first_error`
  // (when it holds none yet).
  bool ran(Event e, Status* first_error);
  Status stage_lane(size_t lane, std::vector<DroppedBlock> drops, Stream copy_stream);
  Status send_staged();
  Status submit_reads(core::ControlPlane& control);
  Status collect(core::ControlPlane& control);
  // A read part ended: the arrival is finished once all its parts have.
  Status part_done(core::ControlPlane& control, uint64_t arrival, size_t lane, int64_t intact);
  // Announces the finished puts that can be (StorageAnnouncer).
  void announce(core::ControlPlane& control);
  StatusOr<Event> take_event();
  void give_event(Event e) { spare_events_.push_back(e); }
  bool idle() const;

  Backend& backend_;
  std::vector<Lane> lanes_;         // the owner's first
  std::vector<int> lane_of_group_;  // by config index; -1: the group has no store
  std::vector<StagedBatch> staged_;
  std::vector<PendingRead> waiting_reads_;
  std::vector<Event> spare_events_;
  std::vector<Event> all_events_;
  // Reads in flight: by arrival, and each lane's job to its arrival.
  std::unordered_map<uint64_t, PendingRead> reads_;
  std::vector<std::unordered_map<uint64_t, uint64_t>> read_jobs_;  // by lane: job -> arrival
};

}  // namespace runtime
}  // namespace pagedkv
