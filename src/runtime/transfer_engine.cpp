#include "runtime/transfer_engine.hpp"

#include <string>
#include <tuple>
#include <utility>

#include "common/nvtx.hpp"

namespace pagedkv::runtime {
namespace {

const char* tier_name(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

CopyKind copy_kind(Tier src, Tier dst) {
  if (src == Tier::kDevice)
    return dst == Tier::kDevice ? CopyKind::kDeviceToDevice : CopyKind::kDeviceToHost;
  return dst == Tier::kDevice ? CopyKind::kHostToDevice : CopyKind::kHostToHost;
}

}  // namespace

std::vector<CopyRun> merge_runs(const std::vector<BlockMove>& moves) {
  std::vector<CopyRun> runs;
  for (const BlockMove& m : moves) {
    if (!runs.empty()) {
      CopyRun& last = runs.back();
      if (last.src_tier == m.src_tier && last.dst_tier == m.dst_tier &&
          last.src_block + last.num_blocks == m.src_block &&
          last.dst_block + last.num_blocks == m.dst_block) {
        ++last.num_blocks;
        continue;
      }
    }
    runs.push_back(CopyRun{m.src_tier, m.src_block, m.dst_tier, m.dst_block, 1});
  }
  return runs;
}

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::create(Backend& backend,
                                                                 const TierPools& pools) {
  if (pools.block_bytes <= 0) return invalid_argument("block_bytes: must be positive");
  if (pools.device == nullptr || pools.device_blocks <= 0) {
    return invalid_argument("device pool: null or without blocks");
  }
  if ((pools.host == nullptr) != (pools.host_blocks <= 0)) {
    return invalid_argument("host pool: pointer and block count disagree");
  }
  PAGEDKV_ASSIGN_OR_RETURN(Stream stream, backend.create_stream());
  StatusOr<Event> ready = backend.create_event();
  if (!ready.ok()) {
    backend.destroy_stream(stream);
    return ready.status();
  }
  return std::unique_ptr<TransferEngine>(new TransferEngine(backend, pools, stream, *ready));
}

TransferEngine::TransferEngine(Backend& backend, const TierPools& pools, Stream copy_stream,
                               Event ready)
    : backend_(backend), pools_(pools), copy_stream_(copy_stream), ready_(ready) {}

TransferEngine::~TransferEngine() {
  backend_.synchronize_stream(copy_stream_).ignore_error();  // nothing to report it to
  backend_.destroy_stream(copy_stream_);
  for (const Job& job : in_flight_) backend_.destroy_event(job.done);
  for (Event e : spare_events_) backend_.destroy_event(e);
  backend_.destroy_event(ready_);
}

char* TransferEngine::block_address(Tier tier, int64_t block) const {
  char* base = static_cast<char*>(tier == Tier::kDevice ? pools_.device : pools_.host);
  return base + block * pools_.block_bytes;
}

Status TransferEngine::validate(const BlockMove& m) const {
  for (auto [tier, block, what] : {std::make_tuple(m.src_tier, m.src_block, "source"),
                                   std::make_tuple(m.dst_tier, m.dst_block, "destination")}) {
    if (tier != Tier::kDevice && tier != Tier::kHost) {
      return invalid_argument(std::string("block move ") + what + ": unknown tier");
    }
    const int64_t limit = tier == Tier::kDevice ? pools_.device_blocks : pools_.host_blocks;
    if (block < 0 || block >= limit) {
      return out_of_range(std::string("block move ") + what + ": " + tier_name(tier) + " block " +
                          std::to_string(block) + " outside [0, " + std::to_string(limit) + ")");
    }
  }
  if (m.src_tier == m.dst_tier && m.src_block == m.dst_block) {
    return invalid_argument("block move: source and destination are the same block");
  }
  return ok_status();
}

StatusOr<Event> TransferEngine::take_event() {
  if (!spare_events_.empty()) {
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return backend_.create_event();
}

void TransferEngine::recycle_completed() {
  while (!in_flight_.empty()) {
    StatusOr<bool> done = backend_.query_event(in_flight_.front().done);
    if (!done.ok() || !*done) return;
    completed_below_ = in_flight_.front().ticket + 1;
    spare_events_.push_back(in_flight_.front().done);
    in_flight_.pop_front();
  }
}

StatusOr<TransferTicket> TransferEngine::submit(const std::vector<BlockMove>& moves, Stream after,
                                                int64_t* moves_queued) {
  PAGEDKV_NVTX_RANGE("pagedkv::TransferEngine::submit");
  if (moves_queued != nullptr) *moves_queued = 0;
  for (const BlockMove& m : moves) PAGEDKV_RETURN_IF_ERROR(validate(m));
  recycle_completed();
  PAGEDKV_ASSIGN_OR_RETURN(Event done, take_event());

  // The copy stream starts after the caller's queued work (the last writes of these blocks).
  Status status = backend_.record_event(ready_, after);
  if (status.ok()) status = backend_.wait_event(copy_stream_, ready_);
  for (const CopyRun& run : merge_runs(moves)) {
    if (!status.ok()) break;
    const size_t bytes = static_cast<size_t>(run.num_blocks * pools_.block_bytes);
    status = backend_.copy_async(block_address(run.dst_tier, run.dst_block),
                                 block_address(run.src_tier, run.src_block), bytes,
                                 copy_kind(run.src_tier, run.dst_tier), copy_stream_);
    if (status.ok()) {
      ++copies_issued_;
      bytes_moved_ += static_cast<int64_t>(bytes);
      if (moves_queued != nullptr) *moves_queued += run.num_blocks;
    }
  }
  // Record even after a failure, so that ordering against what was queued stays intact.
  const Status recorded = backend_.record_event(done, copy_stream_);
  if (!recorded.ok()) {
    spare_events_.push_back(done);
    return status.ok() ? recorded : status;
  }
  const TransferTicket ticket = next_ticket_++;
  in_flight_.push_back(Job{ticket, done});
  if (!status.ok()) return status;
  return ticket;
}

const TransferEngine::Job* TransferEngine::find(TransferTicket ticket) const {
  if (in_flight_.empty() || ticket < in_flight_.front().ticket) return nullptr;
  const size_t index = static_cast<size_t>(ticket - in_flight_.front().ticket);
  return index < in_flight_.size() ? &in_flight_[index] : nullptr;
}

Status TransferEngine::order_after(TransferTicket ticket, Stream stream) {
  if (ticket == 0 || ticket >= next_ticket_) {
    return not_found("transfer ticket " + std::to_string(ticket) + " was never issued");
  }
  if (ticket < completed_below_) return ok_status();
  const Job* job = find(ticket);
  if (job == nullptr) return ok_status();  // recycled: complete
  return backend_.wait_event(stream, job->done);
}

StatusOr<bool> TransferEngine::is_complete(TransferTicket ticket) {
  if (ticket == 0 || ticket >= next_ticket_) {
    return not_found("transfer ticket " + std::to_string(ticket) + " was never issued");
  }
  recycle_completed();
  if (ticket < completed_below_) return true;
  const Job* job = find(ticket);
  if (job == nullptr) return true;
  return backend_.query_event(job->done);
}

Status TransferEngine::wait(TransferTicket ticket) {
  if (ticket == 0 || ticket >= next_ticket_) {
    return not_found("transfer ticket " + std::to_string(ticket) + " was never issued");
  }
  if (ticket < completed_below_) return ok_status();
  const Job* job = find(ticket);
  if (job == nullptr) return ok_status();
  return backend_.synchronize_event(job->done);
}

}  // namespace pagedkv::runtime
