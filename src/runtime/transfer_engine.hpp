// Moves whole blocks between the device pool and the pinned host pool on a dedicated copy
// stream, ordered against the compute stream by events and never by host blocking.
//
// A job is one batch of BlockMoves (a step's offloads, restores and prefetches). Block-major
// pools make every block one contiguous range, and consecutive moves whose source and
// destination blocks are both consecutive are merged into one copy (vLLM measured per-block
// copies of small pages at a quarter of the bandwidth of merged runs).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

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
};

/// Runs jobs of block moves on its own copy stream.
class TransferEngine {
 public:
  /// Creates the copy stream. kInvalidArgument for pools without blocks or bytes.
  static StatusOr<std::unique_ptr<TransferEngine>> create(Backend& backend, const TierPools& pools);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  /// Queues `moves` as one job on the copy stream, after the work queued on `after` so far (the
  /// last writes of the blocks being read). Validates every move first: on error nothing is
  /// queued. An empty job completes at once. `moves_queued` (optional) receives how many moves,
  /// from the front of the list, were queued: all of them on success, a prefix when the
  /// backend failed part way (those still run).
  StatusOr<TransferTicket> submit(const std::vector<BlockMove>& moves, Stream after,
                                  int64_t* moves_queued = nullptr);

  /// Work queued on `stream` after this call starts only after job `ticket` (and every earlier
  /// job) finished copying: writes into blocks the job read, reads of blocks it wrote.
  Status order_after(TransferTicket ticket, Stream stream);

  /// True when job `ticket` is done. kNotFound for a ticket never handed out.
  StatusOr<bool> is_complete(TransferTicket ticket);

  /// Blocks the host until job `ticket` is done.
  Status wait(TransferTicket ticket);

  /// The copy stream (for tests and for callers that chain their own copies).
  Stream copy_stream() const { return copy_stream_; }

  /// Copies queued and bytes moved since creation.
  int64_t copies_issued() const { return copies_issued_; }
  int64_t bytes_moved() const { return bytes_moved_; }

 private:
  struct Job {
    TransferTicket ticket;
    Event done;
  };
  TransferEngine(Backend& backend, const TierPools& pools, Stream copy_stream, Event ready);
  Status validate(const BlockMove& move) const;
  StatusOr<Event> take_event();
  void recycle_completed();
  const Job* find(TransferTicket ticket) const;
  char* block_address(Tier tier, int64_t block) const;

  Backend& backend_;
  TierPools pools_;
  Stream copy_stream_;
  Event ready_;                // recorded on the caller's stream before each job
  std::deque<Job> in_flight_;  // oldest first
  std::vector<Event> spare_events_;
  TransferTicket next_ticket_ = 1;
  TransferTicket completed_below_ = 1;  // every ticket < this one is known to be complete
  int64_t copies_issued_ = 0;
  int64_t bytes_moved_ = 0;
};

}  // namespace pagedkv::runtime
