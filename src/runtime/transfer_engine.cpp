#include "runtime/transfer_engine.hpp"

#include <algorithm>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "common/nvtx.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv::runtime {
namespace {

const char* tier_name(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

// Pair buffers: the smallest one allocated, and how many idle ones are kept for reuse.
constexpr size_t kMinPairBytes = 4096;
constexpr size_t kMaxSparePairBuffers = 8;

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
                                                                 const TierPools& pools,
                                                                 const TransferOptions& options) {
  return create(backend, std::vector<TierPools>{pools}, options);
}

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::create(
    Backend& backend, const std::vector<TierPools>& all_pools, const TransferOptions& options) {
  // A block's dependency key holds its group in 8 bits.
  if (all_pools.empty() || all_pools.size() > 256) {
    return invalid_argument("pools: " + std::to_string(all_pools.size()) +
                            " groups, the engine moves 1 to 256");
  }
  if (options.kernel_block_bytes < 0) {
    return invalid_argument("kernel_block_bytes: negative (" +
                            std::to_string(options.kernel_block_bytes) + ")");
  }
  std::vector<bool> use_kernel;
  for (size_t g = 0; g < all_pools.size(); ++g) {
    const TierPools& pools = all_pools[g];
    const std::string where = all_pools.size() == 1 ? "" : "group " + std::to_string(g) + ": ";
    if (pools.block_bytes <= 0) return invalid_argument(where + "block_bytes: must be positive");
    if (pools.host_mapped != nullptr && pools.host == nullptr) {
      return invalid_argument(where + "host pool: mapped address without a host pool");
    }
    if (pools.device == nullptr || pools.device_blocks <= 0) {
      return invalid_argument(where + "device pool: null or without blocks");
    }
    if ((pools.host == nullptr) != (pools.host_blocks <= 0)) {
      return invalid_argument(where + "host pool: pointer and block count disagree");
    }
    use_kernel.push_back(pools.host_mapped != nullptr &&
                         pools.block_bytes < options.kernel_block_bytes);
  }
  std::vector<Stream> streams;
  std::vector<Event> events;
  auto release = [&] {
    for (Stream s : streams) backend.destroy_stream(s);
    for (Event e : events) backend.destroy_event(e);
  };
  // Low priority: where copy-kernel blocks and compute blocks wait for the same SMs, the
  // compute stream's go first (copies through the copy engines are not affected).
  for (int i = 0; i < 2; ++i) {
    StatusOr<Stream> stream = backend.create_stream(StreamPriority::kLow);
    if (!stream.ok()) {
      release();
      return stream.status();
    }
    streams.push_back(*stream);
  }
  for (int i = 0; i < 2; ++i) {
    StatusOr<Event> event = backend.create_event();
    if (!event.ok()) {
      release();
      return event.status();
    }
    events.push_back(*event);
  }
  return std::unique_ptr<TransferEngine>(new TransferEngine(
      backend, all_pools, std::move(use_kernel), streams[0], streams[1], events[0], events[1]));
}

TransferEngine::TransferEngine(Backend& backend, std::vector<TierPools> pools,
                               std::vector<bool> use_kernel, Stream to_host, Stream to_device,
                               Event ready, Event link)
    : backend_(backend),
      pools_(std::move(pools)),
      use_kernel_(std::move(use_kernel)),
      streams_{to_host, to_device},
      ready_(ready),
      link_(link),
      hazards_([this] {
        std::vector<int64_t> blocks;
        for (const TierPools& p : pools_) blocks.push_back(p.device_blocks);
        return blocks;
      }()) {}

TransferEngine::~TransferEngine() {
  for (Stream s : streams_) {
    backend_.synchronize_stream(s).ignore_error();  // nothing to report it to
    backend_.destroy_stream(s);
  }
  for (const Job& job : in_flight_) {
    backend_.destroy_event(job.done);
    for (const PairBuffer& b : job.pairs) free_pairs(b);
  }
  for (const std::vector<PairBuffer>* list : {&spare_pairs_, &orphaned_pairs_}) {
    for (const PairBuffer& b : *list) free_pairs(b);
  }
  for (Event e : spare_events_) backend_.destroy_event(e);
  backend_.destroy_event(ready_);
  backend_.destroy_event(link_);
}

Status TransferEngine::synchronize() {
  PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_stream(streams_[kToDevice]));
  PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_stream(streams_[kToHost]));
  recycle_pairs(orphaned_pairs_);  // nothing queued can read them any more
  return ok_status();
}

bool TransferEngine::uses_kernel() const {
  return std::find(use_kernel_.begin(), use_kernel_.end(), true) != use_kernel_.end();
}

char* TransferEngine::kernel_address(int32_t group, Tier tier) const {
  const TierPools& p = pools_[static_cast<size_t>(group)];
  return static_cast<char*>(tier == Tier::kDevice ? p.device : p.host_mapped);
}

int64_t TransferEngine::pool_blocks(int32_t group, Tier tier) const {
  const TierPools& p = pools_[static_cast<size_t>(group)];
  return tier == Tier::kDevice ? p.device_blocks : p.host_blocks;
}

char* TransferEngine::block_address(int32_t group, Tier tier, int64_t block) const {
  const TierPools& p = pools_[static_cast<size_t>(group)];
  char* base = static_cast<char*>(tier == Tier::kDevice ? p.device : p.host);
  return base + block * p.block_bytes;
}

Status TransferEngine::validate(const BlockMove& m) const {
  if (m.group < 0 || m.group >= static_cast<int32_t>(pools_.size())) {
    return out_of_range("block move: group " + std::to_string(m.group) + " outside the " +
                        std::to_string(pools_.size()) + " the engine moves");
  }
  for (auto [tier, block, what] : {std::make_tuple(m.src_tier, m.src_block, "source"),
                                   std::make_tuple(m.dst_tier, m.dst_block, "destination")}) {
    if (tier != Tier::kDevice && tier != Tier::kHost) {
      return invalid_argument(std::string("block move ") + what + ": unknown tier");
    }
    const int64_t limit = pool_blocks(m.group, tier);
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

StatusOr<TransferEngine::PairBuffer> TransferEngine::take_pairs(size_t bytes) {
  auto best = spare_pairs_.end();
  for (auto it = spare_pairs_.begin(); it != spare_pairs_.end(); ++it) {
    if (it->bytes >= bytes && (best == spare_pairs_.end() || it->bytes < best->bytes)) best = it;
  }
  if (best != spare_pairs_.end()) {
    const PairBuffer b = *best;
    spare_pairs_.erase(best);
    return b;
  }
  size_t capacity = kMinPairBytes;
  while (capacity < bytes) capacity *= 2;
  PAGEDKV_ASSIGN_OR_RETURN(void* host, backend_.allocate_pinned(capacity));
  StatusOr<void*> device = backend_.allocate_device(capacity);
  if (!device.ok()) {
    backend_.free_pinned(host);
    return device.status();
  }
  return PairBuffer{host, *device, capacity};
}

void TransferEngine::free_pairs(const PairBuffer& b) {
  backend_.free_pinned(b.host);
  backend_.free_device(b.device);
}

void TransferEngine::recycle_pairs(std::vector<PairBuffer>& buffers) {
  for (const PairBuffer& b : buffers) spare_pairs_.push_back(b);
  buffers.clear();
  // Keep the largest few: a long job's buffer serves the short ones after it.
  while (spare_pairs_.size() > kMaxSparePairBuffers) {
    auto smallest = std::min_element(
        spare_pairs_.begin(), spare_pairs_.end(),
        [](const PairBuffer& a, const PairBuffer& b) { return a.bytes < b.bytes; });
    free_pairs(*smallest);
    spare_pairs_.erase(smallest);
  }
}

void TransferEngine::recycle_completed() {
  while (!in_flight_.empty()) {
    StatusOr<bool> done = backend_.query_event(in_flight_.front().done);
    if (!done.ok() || !*done) return;
    completed_below_ = in_flight_.front().ticket + 1;
    spare_events_.push_back(in_flight_.front().done);
    recycle_pairs(in_flight_.front().pairs);
    in_flight_.pop_front();
  }
}

// Queues one job: each move goes into the open batch of its direction (lane); a move that
// depends on a move of the other lane makes its lane's batch wait for that lane's batch, and
// batches are issued only when a cycle, a conflict inside a lane or the end of the job forces
// it. Issue order always follows the dependencies, and the first failure stops all issuing, so
// a queued move never depends on one that was not queued.
class TransferEngine::Issuer {
 public:
  Issuer(TransferEngine& engine, const std::vector<BlockMove>& moves)
      : e_(engine), moves_(moves), queued_(moves.size(), false) {}

  Status run(Stream after) {
    bool lane_used[2] = {false, false};
    for (const BlockMove& m : moves_) lane_used[lane_of(m)] = true;
    // Fork: the to-host lane follows the caller's stream; the to-device lane follows the
    // to-host lane (earlier jobs, staging copies), so jobs and their copies stay in order.
    step(e_.backend_.record_event(e_.ready_, after));
    step(e_.backend_.wait_event(e_.streams_[kToHost], e_.ready_));
    if (lane_used[kToDevice]) link(kToHost, kToDevice);
    for (size_t i = 0; i < moves_.size() && status_.ok(); ++i) place(i);
    flush(kToHost);
    flush(kToDevice);
    const Status result = status_;
    // Join, even after a failure: the job's done event (on the to-host lane) then covers all
    // that was queued on the to-device lane.
    if (lane_used[kToDevice]) {
      status_ = ok_status();
      link(kToDevice, kToHost);
      joined_ = status_.ok();
      if (result.ok()) return status_;
    }
    return result;
  }

  // False when the to-device lane could not be joined: the job's done event then does not
  // cover that lane's work.
  bool joined() const { return joined_; }

  // How many moves, from the front, were queued.
  int64_t queued_prefix() const {
    int64_t n = 0;
    while (n < static_cast<int64_t>(queued_.size()) && queued_[static_cast<size_t>(n)]) ++n;
    return n;
  }

 private:
  // Accesses of blocks by queued or open moves: key (block, tier), bits kRead and kWrite.
  using Accesses = std::unordered_map<uint64_t, uint8_t>;
  static constexpr uint8_t kRead = 1;
  static constexpr uint8_t kWrite = 2;

  static int lane_of(const BlockMove& m) {
    return m.src_tier == Tier::kDevice ? kToHost : kToDevice;
  }
  // Blocks of different groups are in different pools: the group is part of the key.
  static uint64_t key(int32_t group, Tier tier, int64_t block) {
    return (((static_cast<uint64_t>(block) << 8) | static_cast<uint64_t>(group)) << 1) |
           (tier == Tier::kDevice ? 1u : 0u);
  }
  static bool conflicts(const Accesses& a, const BlockMove& m) {
    auto src = a.find(key(m.group, m.src_tier, m.src_block));
    if (src != a.end() && (src->second & kWrite) != 0) return true;  // read after write
    return a.count(key(m.group, m.dst_tier, m.dst_block)) != 0;      // write after read/write
  }
  static void add(Accesses& a, const BlockMove& m) {
    a[key(m.group, m.src_tier, m.src_block)] |= kRead;
    a[key(m.group, m.dst_tier, m.dst_block)] |= kWrite;
  }

  void step(const Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }
  // Work queued on lane `to` from now on runs after the work queued on lane `from` so far.
  void link(int from, int to) {
    if (!status_.ok()) return;
    step(e_.backend_.record_event(e_.link_, e_.streams_[from]));
    if (status_.ok()) step(e_.backend_.wait_event(e_.streams_[to], e_.link_));
  }

  void place(size_t i) {
    const BlockMove& m = moves_[i];
    const int d = lane_of(m);
    const int o = 1 - d;
    if (conflicts(unordered_[o], m)) {
      // The other lane's batch already waits for this one: issue both, this lane's first.
      if (waits_[o]) flush(o);
      waits_[d] = true;
    }
    if (!open_[d].empty() &&
        (conflicts(open_access_[d], m) ||
         copy_kind(m.src_tier, m.dst_tier) !=
             copy_kind(moves_[open_[d][0]].src_tier, moves_[open_[d][0]].dst_tier))) {
      flush(d);  // copies within one batch are unordered; stream order separates two batches
    }
    open_[d].push_back(i);
    add(open_access_[d], m);
    add(unordered_[d], m);
  }

  // Issues lane d's open batch, after the other lane's when it waits for it.
  void flush(int d) {
    const int o = 1 - d;
    if (waits_[d]) {
      waits_[d] = false;
      flush(o);
      link(o, d);
      unordered_[o].clear();  // all of the other lane so far now precedes this lane's work
    }
    if (!open_[d].empty() && status_.ok()) issue(d);
    open_[d].clear();
    open_access_[d].clear();
  }

  // Issues lane d's open batch: the moves of each group that takes the copy kernel as one
  // launch, all the others as one copy_batch. The copies of a batch are unordered, so each
  // group's moves go together, in list order, and merge into runs among themselves.
  void issue(int d) {
    std::vector<size_t> order = open_[d];
    std::stable_sort(order.begin(), order.end(),
                     [this](size_t a, size_t b) { return moves_[a].group < moves_[b].group; });
    std::vector<CopyRegion> regions;
    std::vector<size_t> copied;  // the moves `regions` holds
    size_t bytes = 0;
    for (size_t begin = 0, end = 0; begin < order.size(); begin = end) {
      const int32_t group = moves_[order[begin]].group;
      end = begin;
      while (end < order.size() && moves_[order[end]].group == group) ++end;
      const std::vector<size_t> part(order.begin() + static_cast<std::ptrdiff_t>(begin),
                                     order.begin() + static_cast<std::ptrdiff_t>(end));
      if (e_.use_kernel_[static_cast<size_t>(group)]) {
        issue_kernel(d, group, part);
        if (!status_.ok()) return;
        continue;
      }
      std::vector<BlockMove> batch;
      batch.reserve(part.size());
      for (size_t i : part) batch.push_back(moves_[i]);
      const int64_t block_bytes = e_.pools_[static_cast<size_t>(group)].block_bytes;
      for (const CopyRun& run : merge_runs(batch)) {
        const size_t n = static_cast<size_t>(run.num_blocks * block_bytes);
        regions.push_back(CopyRegion{e_.block_address(group, run.dst_tier, run.dst_block),
                                     e_.block_address(group, run.src_tier, run.src_block), n});
        bytes += n;
      }
      copied.insert(copied.end(), part.begin(), part.end());
    }
    if (regions.empty()) return;
    const BlockMove& first = moves_[copied[0]];
    const CopyKind kind = copy_kind(first.src_tier, first.dst_tier);
    step(e_.backend_.copy_batch(regions.data(), regions.size(), kind, e_.streams_[d]));
    if (!status_.ok()) return;
    for (size_t i : copied) queued_[i] = true;
    ++e_.copies_issued_;
    e_.regions_issued_ += static_cast<int64_t>(regions.size());
    e_.bytes_moved_ += static_cast<int64_t>(bytes);
  }

  // Group `group`'s moves `part` of a batch as one launch of the block-copy body over their
  // (source, destination) pairs, on at most kCopyKernelMaxBlocks CTAs. The pairs are uploaded
  // to device memory on the lane's stream first: read from mapped host memory, every thread's
  // pair would cost a PCIe round trip before its data's own. The job keeps both buffers until it
  // completes. No runs are merged: the kernel costs the same per block either way.
  void issue_kernel(int d, int32_t group, const std::vector<size_t>& part) {
    const BlockMove& first = moves_[part[0]];
    const size_t n = part.size();
    const size_t pair_bytes = n * 2 * sizeof(int32_t);
    StatusOr<PairBuffer> buffer = e_.take_pairs(pair_bytes);
    step(buffer.status());
    if (!status_.ok()) return;
    e_.issuing_pairs_.push_back(*buffer);
    auto* pairs = static_cast<int32_t*>(buffer->host);
    for (size_t k = 0; k < n; ++k) {
      pairs[2 * k] = moves_[part[k]].src_block;
      pairs[2 * k + 1] = moves_[part[k]].dst_block;
    }
    step(e_.backend_.copy_async(buffer->device, buffer->host, pair_bytes, CopyKind::kHostToDevice,
                                e_.streams_[d]));
    if (!status_.ok()) return;
    const int64_t block_bytes = e_.pools_[static_cast<size_t>(group)].block_bytes;
    ops_detail::BlockCopyPools pools;
    pools.dst = e_.kernel_address(group, first.dst_tier);
    pools.dst_blocks = e_.pool_blocks(group, first.dst_tier);
    pools.src = e_.kernel_address(group, first.src_tier);
    pools.src_blocks = e_.pool_blocks(group, first.src_tier);
    pools.block_bytes = block_bytes;
    step(ops_detail::launch_copy_blocks(e_.backend_, pools, buffer->device, IndexType::kInt32,
                                        static_cast<int64_t>(n), e_.streams_[d],
                                        kCopyKernelMaxBlocks));
    if (!status_.ok()) return;
    for (size_t i : part) queued_[i] = true;
    ++e_.kernels_issued_;
    e_.bytes_moved_ += static_cast<int64_t>(n) * block_bytes;
  }

  TransferEngine& e_;
  const std::vector<BlockMove>& moves_;
  std::vector<bool> queued_;
  Status status_;
  std::vector<size_t> open_[2];     // the moves of each lane's open batch, in list order
  Accesses open_access_[2];         // what the open batch touches
  Accesses unordered_[2];           // what the lane touches that the other lane does not yet follow
  bool waits_[2] = {false, false};  // the lane's open batch must follow the other lane's
  bool joined_ = true;
};

StatusOr<TransferTicket> TransferEngine::submit(const std::vector<BlockMove>& moves, Stream after,
                                                int64_t* moves_queued) {
  PAGEDKV_NVTX_RANGE("pagedkv::TransferEngine::submit");
  if (moves_queued != nullptr) *moves_queued = 0;
  for (const BlockMove& m : moves) PAGEDKV_RETURN_IF_ERROR(validate(m));
  recycle_completed();
  PAGEDKV_ASSIGN_OR_RETURN(Event done, take_event());
  if (backend_.kind() == BackendKind::kNull) {
    // No bytes move (null_backend.hpp): the job is done once recorded, so neither copy runs
    // nor the blocks it touches need working out; that work was a fifth of a sizing run.
    const Status recorded = backend_.record_event(done, streams_[kToHost]);
    if (!recorded.ok()) {
      spare_events_.push_back(done);
      return recorded;
    }
    if (moves_queued != nullptr) *moves_queued = static_cast<int64_t>(moves.size());
    const TransferTicket ticket = next_ticket_++;
    in_flight_.push_back(Job{ticket, done, {}});
    return ticket;
  }

  Issuer issuer(*this, moves);
  const Status status = issuer.run(after);
  if (moves_queued != nullptr) *moves_queued = issuer.queued_prefix();
  // Record even after a failure, so that ordering against what was queued stays intact.
  const Status recorded = backend_.record_event(done, streams_[kToHost]);
  if (!recorded.ok() || !issuer.joined()) {
    // No event tells when the job's kernels stop reading their pairs: keep the buffers until
    // both streams are drained (synchronize() or the end).
    for (const PairBuffer& b : issuing_pairs_) orphaned_pairs_.push_back(b);
    issuing_pairs_.clear();
  }
  if (!recorded.ok()) {
    spare_events_.push_back(done);
    return status.ok() ? recorded : status;
  }
  const TransferTicket ticket = next_ticket_++;
  in_flight_.push_back(Job{ticket, done, std::move(issuing_pairs_)});
  issuing_pairs_.clear();
  if (!status.ok()) return status;
  hazards_.note(ticket, moves);
  return ticket;
}

Status TransferEngine::order_block_reuse(int32_t group, const int64_t* slots, size_t n,
                                         int64_t block_size, Stream stream) {
  return hazards_.order_reuse(*this, stream, group, slots, n, block_size);
}

Status TransferEngine::order_block_use(int32_t group, const int32_t* blocks, size_t n,
                                       Stream stream) {
  return hazards_.order_use(*this, stream, group, blocks, n);
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
