#include "runtime/block_hazards.hpp"

#include <algorithm>

#include "runtime/transfer_engine.hpp"

namespace pagedkv::runtime {

BlockHazards::BlockHazards(const std::vector<int64_t>& device_blocks) {
  groups_.resize(device_blocks.size());
  for (size_t g = 0; g < device_blocks.size(); ++g) {
    groups_[g].read_by_job.assign(static_cast<size_t>(device_blocks[g]), 0);
    groups_[g].written_by_job.assign(static_cast<size_t>(device_blocks[g]), 0);
  }
}

void BlockHazards::note(uint64_t ticket, const std::vector<BlockMove>& moves) {
  const size_t first_read = pending_reads_.size();
  const size_t first_write = pending_writes_.size();
  for (const BlockMove& m : moves) {
    if (m.src_tier == Tier::kDevice) {
      note_block(ticket, m.group, m.src_block, /*read=*/true, first_read);
    } else if (m.dst_tier == Tier::kDevice) {
      note_block(ticket, m.group, m.dst_block, /*read=*/false, first_write);
    }
  }
}

void BlockHazards::note_block(uint64_t ticket, int32_t g, int32_t block, bool read, size_t first) {
  Group& group = groups_[static_cast<size_t>(g)];
  uint64_t& job = (read ? group.read_by_job : group.written_by_job)[static_cast<size_t>(block)];
  (read ? group.reads_pending : group.writes_pending) += job == 0 ? 1 : 0;
  job = ticket;
  // One record per group and kind of access the job makes.
  std::vector<JobBlocks>& records = read ? pending_reads_ : pending_writes_;
  auto rec = std::find_if(records.begin() + static_cast<std::ptrdiff_t>(first), records.end(),
                          [g](const JobBlocks& r) { return r.group == g; });
  if (rec == records.end()) {
    records.push_back(JobBlocks{ticket, g, {}});
    rec = records.end() - 1;
  }
  rec->blocks.push_back(block);
}

void BlockHazards::retire_completed(TransferEngine& engine) {
  // An entry a later job took over, or an ordered access cleared, is left alone.
  auto retire = [this, &engine](std::vector<JobBlocks>& records, bool read) {
    auto done = [this, &engine, read](const JobBlocks& r) {
      const StatusOr<bool> complete = engine.is_complete(r.job);
      if (!complete.ok() || !*complete) return false;
      Group& g = groups_[static_cast<size_t>(r.group)];
      std::vector<uint64_t>& by_job = read ? g.read_by_job : g.written_by_job;
      for (int32_t b : r.blocks) {
        uint64_t& job = by_job[static_cast<size_t>(b)];
        if (job != r.job) continue;
        job = 0;
        --(read ? g.reads_pending : g.writes_pending);
      }
      return true;
    };
    records.erase(std::remove_if(records.begin(), records.end(), done), records.end());
  };
  retire(pending_reads_, true);
  retire(pending_writes_, false);
}

Status BlockHazards::order_reuse(TransferEngine& engine, Stream stream, int32_t g,
                                 const int64_t* slots, size_t n, int64_t block_size) {
  // A write into a block waits for the offload still reading it and the restore still writing
  // it.
  Group& group = groups_[static_cast<size_t>(g)];
  if (group.reads_pending == 0 && group.writes_pending == 0) return ok_status();
  retire_completed(engine);
  if (group.reads_pending == 0 && group.writes_pending == 0) return ok_status();
  uint64_t latest = 0;
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    const size_t b = static_cast<size_t>(slots[i] / block_size);
    latest = std::max({latest, group.read_by_job[b], group.written_by_job[b]});
  }
  if (latest == 0) return ok_status();
  PAGEDKV_RETURN_IF_ERROR(engine.order_after(latest, stream));
  // Once ordered, later work on the stream follows the job too.
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    const size_t b = static_cast<size_t>(slots[i] / block_size);
    group.reads_pending -= group.read_by_job[b] != 0 ? 1 : 0;
    group.writes_pending -= group.written_by_job[b] != 0 ? 1 : 0;
    group.read_by_job[b] = 0;
    group.written_by_job[b] = 0;
  }
  return ok_status();
}

Status BlockHazards::order_use(TransferEngine& engine, Stream stream, int32_t g,
                               const int32_t* blocks, size_t n) {
  Group& group = groups_[static_cast<size_t>(g)];
  if (group.writes_pending == 0) return ok_status();
  retire_completed(engine);
  if (group.writes_pending == 0) return ok_status();
  uint64_t latest = 0;
  for (size_t i = 0; i < n; ++i) {
    if (blocks[i] >= 0) {
      latest = std::max(latest, group.written_by_job[static_cast<size_t>(blocks[i])]);
    }
  }
  if (latest == 0) return ok_status();
  PAGEDKV_RETURN_IF_ERROR(engine.order_after(latest, stream));
  for (size_t i = 0; i < n; ++i) {
    if (blocks[i] < 0) continue;
    uint64_t& job = group.written_by_job[static_cast<size_t>(blocks[i])];
    group.writes_pending -= job != 0 ? 1 : 0;
    job = 0;
  }
  return ok_status();
}

int64_t BlockHazards::pending(int32_t g, bool read) const {
  const Group& group = groups_[static_cast<size_t>(g)];
  return read ? group.reads_pending : group.writes_pending;
}

}  // namespace pagedkv::runtime
