// BlockHazards: per device block of each KV group, the transfer job that last read it (an
// offload's source) and the one that last wrote it (a restore's, a prefetch's or an onboarded
// host hit's destination), so that work queued on another stream waits for a job only when it
// touches one of that job's blocks, and only when it is queued: compute queued meanwhile runs
// beside the copies. The transfer engine notes every job it submits (TransferEngine::submit)
// and orders a stream before a block's use or reuse on request (order_block_use,
// order_block_reuse), so a cache keeps no job bookkeeping of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::runtime {

class TransferEngine;

class BlockHazards {
 public:
  /// `device_blocks[g]`: the blocks of group g's device pool.
  explicit BlockHazards(const std::vector<int64_t>& device_blocks);

  /// Notes what job `ticket` (queued) does to device blocks: reads the sources of its
  /// device-to-host moves, writes the destinations of its host-to-device ones.
  void note(uint64_t ticket, const std::vector<BlockMove>& moves);

  /// Orders `stream` (through `engine`) after the jobs still reading, and the jobs still writing,
  /// the device blocks of group `g` that `slots` (token slots of `block_size`-token blocks; -1
  /// entries ignored) write. Work queued on `stream` afterwards may write them.
  Status order_reuse(TransferEngine& engine, Stream stream, int32_t g, const int64_t* slots,
                     size_t n, int64_t block_size);
  /// Orders `stream` after the jobs still writing any of `blocks` (of group `g`; -1 entries
  /// ignored). Work queued on `stream` afterwards may read or write them.
  Status order_use(TransferEngine& engine, Stream stream, int32_t g, const int32_t* blocks,
                   size_t n);

  /// Blocks of group `g` with a job still noted as reading (`read`) or writing them.
  int64_t pending(int32_t g, bool read) const;

 private:
  struct Group {
    std::vector<uint64_t> read_by_job;     // 0: no job pending
    std::vector<uint64_t> written_by_job;  // 0: no job pending
    int64_t reads_pending = 0;             // entries of read_by_job that are not 0
    int64_t writes_pending = 0;            // entries of written_by_job that are not 0
  };
  // A job's blocks of one group and one kind of access: once the job has completed, the entries
  // it still holds are cleared (retire_completed()).
  struct JobBlocks {
    uint64_t job = 0;
    int32_t group = 0;
    std::vector<int32_t> blocks;
  };

  // Clears the entries of the jobs that have completed (asked of `engine` job by job: the two
  // copy streams may finish jobs out of order).
  void retire_completed(TransferEngine& engine);
  // Records one access, in its job's record among those from `first` on.
  void note_block(uint64_t ticket, int32_t g, int32_t block, bool read, size_t first);

  std::vector<Group> groups_;
  std::vector<JobBlocks> pending_reads_;
  std::vector<JobBlocks> pending_writes_;
};

}  // namespace pagedkv::runtime
