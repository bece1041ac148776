#include "runtime/storage_link.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "common/logging.hpp"

namespace pagedkv {
namespace runtime {

StatusOr<std::unique_ptr<StorageLink>> StorageLink::create(Backend& backend,
                                                           const std::vector<GroupStore>& groups,
                                                           int32_t owner, int64_t staging_blocks) {
  if (owner < 0 || static_cast<size_t>(owner) >= groups.size() ||
      groups[static_cast<size_t>(owner)].store == nullptr) {
    return invalid_argument(
        "storage: the group that owns the blocks (KvCache::full_group(), the one that attends "
        "furthest back) needs a store: it decides which blocks a fetch brings back");
  }
  if (staging_blocks < 1) {
    return invalid_argument("storage_staging_blocks must be >= 1, got " +
                            std::to_string(staging_blocks));
  }
  std::unique_ptr<StorageLink> link(new StorageLink(backend));
  link->lane_of_group_.assign(groups.size(), -1);
  // The owner's lane first: fetches start from its store.
  std::vector<size_t> order{static_cast<size_t>(owner)};
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g != static_cast<size_t>(owner) && groups[g].store != nullptr) order.push_back(g);
  }
  for (const size_t g : order) {
    const GroupStore& gs = groups[g];
    const std::string where = groups.size() > 1 ? "storage (group " + std::to_string(g) + "): "
                                                : std::string("storage: ");
    if (gs.config.num_host_blocks == 0 || gs.host_pool == nullptr) {
      return invalid_argument(where +
                              "a storage tier sits behind the host tier: num_host_blocks must be "
                              "> 0");
    }
    const StorageLayout want = StorageLayout::from_config(gs.config, gs.store->layout().model_id);
    if (want.fingerprint() != gs.store->layout().fingerprint() ||
        gs.store->layout().block_bytes != gs.config.block_bytes()) {
      return invalid_argument(
          where +
          "the store's layout (layers, heads, head_dim, dtype, block size, page layout) differs "
          "from the cache's");
    }
    for (const Lane& other : link->lanes_) {
      // The same key names a block of every group: each group's pages need a store of their own.
      if (other.store == gs.store ||
          other.store->layout().fingerprint() == gs.store->layout().fingerprint()) {
        return invalid_argument(
            where + "group " + std::to_string(other.group) +
            (other.store == gs.store ? " has the same store" : " has a store of the same layout") +
            ": give each group's store its own model id");
      }
    }
    Lane lane;
    lane.group = static_cast<int32_t>(g);
    lane.store = gs.store;
    lane.block_bytes = gs.config.block_bytes();
    lane.device_pool = gs.device_pool;
    lane.host_pool = gs.host_pool;
    link->lanes_.push_back(std::move(lane));
    Lane& added = link->lanes_.back();
    link->lane_of_group_[g] = static_cast<int>(link->lanes_.size() - 1);
    PAGEDKV_ASSIGN_OR_RETURN(
        added.staging,
        backend.allocate_pinned(static_cast<size_t>(staging_blocks * added.block_bytes)));
    for (int64_t i = staging_blocks; i > 0; --i) added.free_staging.push_back(i - 1);
  }
  link->read_jobs_.resize(link->lanes_.size());
  return link;
}

StorageLink::~StorageLink() {
  for (const StagedBatch& b : staged_) {
    if (!b.ran) backend_.synchronize_event(b.ready).ignore_error();
  }
  for (const PendingRead& r : waiting_reads_) backend_.synchronize_event(r.ready).ignore_error();
  // Their reads write into the host pools; their puts were copied already.
  for (Lane& lane : lanes_) lane.store->drain();
  for (Event e : all_events_) backend_.destroy_event(e);
  for (Lane& lane : lanes_) {
    if (lane.staging != nullptr) backend_.free_pinned(lane.staging);
  }
}

bool StorageLink::idle() const {
  if (!staged_.empty() || !waiting_reads_.empty() || !reads_.empty()) return false;
  for (const Lane& lane : lanes_) {
    if (!lane.puts.empty()) return false;
  }
  return true;
}

StatusOr<Event> StorageLink::take_event() {
  if (!spare_events_.empty()) {
    const Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  PAGEDKV_ASSIGN_OR_RETURN(Event e, backend_.create_event());
  all_events_.push_back(e);
  return e;
}

Status StorageLink::stage(const std::vector<DroppedBlock>& drops, Stream copy_stream,
                          Stream compute) {
  if (drops.empty()) return ok_status();
  // Each group's drops go to its store; a group without one keeps none.
  std::vector<std::vector<DroppedBlock>> by_lane(lanes_.size());
  bool from_device = false;
  for (const DroppedBlock& d : drops) {
    const int lane = d.group >= 0 && static_cast<size_t>(d.group) < lane_of_group_.size()
                         ? lane_of_group_[static_cast<size_t>(d.group)]
                         : -1;
    if (lane < 0) continue;
    by_lane[static_cast<size_t>(lane)].push_back(d);
    from_device = from_device || d.source.tier == Tier::kDevice;
  }
  if (from_device) {
    // A block demoted and dropped within one call is read from its device block, which the
    // compute stream may still be writing.
    PAGEDKV_ASSIGN_OR_RETURN(Event written, take_event());
    Status st = backend_.record_event(written, compute);
    if (st.ok()) st = backend_.wait_event(copy_stream, written);
    give_event(written);  // reusable at once: a wait captures the event's state when queued
    if (!st.ok()) {
      for (size_t l = 0; l < lanes_.size(); ++l) {
        lanes_[l].writes_dropped += static_cast<int64_t>(by_lane[l].size());  // nothing staged
      }
      return st;
    }
  }
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (by_lane[l].empty()) continue;
    PAGEDKV_RETURN_IF_ERROR(stage_lane(l, std::move(by_lane[l]), copy_stream));
  }
  return ok_status();
}

Status StorageLink::stage_lane(size_t l, std::vector<DroppedBlock> drops, Stream copy_stream) {
  Lane& lane = lanes_[l];
  StagedBatch batch;
  batch.lane = l;
  for (DroppedBlock& d : drops) {
    if (lane.free_staging.empty()) {
      ++lane.writes_dropped;  // a bounded write-back: the block is simply not kept
      continue;
    }
    const int64_t slot = lane.free_staging.back();
    const CopyKind kind =
        d.source.tier == Tier::kDevice ? CopyKind::kDeviceToHost : CopyKind::kHostToHost;
    const Status st = backend_.copy_async(lane.staging_slot(slot), lane.source_bytes(d.source),
                                          static_cast<size_t>(lane.block_bytes), kind, copy_stream);
    if (!st.ok()) {
      // What was queued still runs; keep those slots until it has.
      ++lane.writes_dropped;
      break;
    }
    lane.free_staging.pop_back();
    batch.slots.push_back(slot);
    lane.announcer.put_started(d);
    batch.blocks.push_back(std::move(d));
  }
  if (batch.slots.empty()) return ok_status();
  StatusOr<Event> ready = take_event();
  Status st = ready.status();
  if (st.ok()) st = backend_.record_event(*ready, copy_stream);
  if (st.ok()) {
    batch.ready = *ready;
  } else {
    if (ready.ok()) give_event(*ready);
    // Without the event nothing says when the copies ran: wait for the stream instead.
    const Status synced = backend_.synchronize_stream(copy_stream);
    if (!synced.ok()) {
      // The copies may still run into their slots, which stay taken; the blocks are given up.
      lane.writes_dropped += static_cast<int64_t>(batch.blocks.size());
      for (DroppedBlock& d : batch.blocks) lane.announcer.put_ended(std::move(d), false);
      return synced;
    }
    batch.ran = true;
  }
  staged_.push_back(std::move(batch));
  return ok_status();
}

bool StorageLink::ran(Event e, Status* first_error) {
  StatusOr<bool> done = backend_.query_event(e);
  if (done.ok()) return *done;
  if (first_error->ok()) *first_error = done.status();
  return false;
}

Status StorageLink::send_staged() {
  // The batches are compacted in place: an error (a failed query) keeps its batch for a later
  // poll and is returned after the loop, never in the middle of the compaction.
  Status error = ok_status();
  size_t kept = 0;
  for (size_t i = 0; i < staged_.size(); ++i) {
    StagedBatch& b = staged_[i];
    if (!b.ran && !ran(b.ready, &error)) {
      if (kept != i) staged_[kept] = std::move(b);
      ++kept;
      continue;
    }
    Lane& lane = lanes_[b.lane];
    std::vector<StorageKey> keys;
    std::vector<const void*> bytes;
    for (size_t j = 0; j < b.blocks.size(); ++j) {
      keys.push_back(StorageKey{b.blocks[j].block_hash, b.blocks[j].ns});
      bytes.push_back(lane.staging_slot(b.slots[j]));
    }
    StatusOr<uint64_t> job = lane.store->submit_put(keys, bytes);  // copies the bytes
    for (int64_t s : b.slots) lane.free_staging.push_back(s);
    if (!b.ran) give_event(b.ready);
    if (job.ok()) {
      lane.puts.emplace(*job, std::move(b.blocks));
    } else {
      for (DroppedBlock& d : b.blocks) lane.announcer.put_ended(std::move(d), false);
      lane.writes_dropped += static_cast<int64_t>(keys.size());
      if (job.status().code() != StatusCode::kResourceExhausted) {
        detail::logger().warn("storage: write-back of {} blocks failed: {}", keys.size(),
                              job.status().message());
      }
    }
  }
  staged_.resize(kept);
  return error;
}

Status StorageLink::submit_reads(core::ControlPlane& control) {
  Status error = ok_status();  // as in send_staged(): returned after the compaction
  size_t kept = 0;
  std::vector<PendingRead> ready;
  for (size_t i = 0; i < waiting_reads_.size(); ++i) {
    PendingRead& r = waiting_reads_[i];
    if (!ran(r.ready, &error)) {
      if (kept != i) waiting_reads_[kept] = std::move(r);
      ++kept;
      continue;
    }
    give_event(r.ready);
    ready.push_back(std::move(r));
  }
  waiting_reads_.resize(kept);
  for (PendingRead& r : ready) {
    const uint64_t arrival = r.arrival;
    std::vector<size_t> failed;  // lanes whose get could not be submitted: nothing read
    for (ReadPart& part : r.parts) {
      StatusOr<uint64_t> job = lanes_[part.lane].store->submit_get(part.keys, part.dst);
      if (job.ok()) {
        read_jobs_[part.lane].emplace(*job, arrival);
      } else {
        failed.push_back(part.lane);
      }
    }
    reads_.emplace(arrival, std::move(r));
    for (const size_t lane : failed) {
      const Status st = part_done(control, arrival, lane, /*intact=*/0);
      if (!st.ok() && error.ok()) error = st;
    }
  }
  return error;
}

Status StorageLink::part_done(core::ControlPlane& control, uint64_t arrival, size_t lane,
                              int64_t intact) {
  auto it = reads_.find(arrival);
  if (it == reads_.end()) return ok_status();
  PendingRead& r = it->second;
  bool all = true;
  for (ReadPart& part : r.parts) {
    if (part.lane == lane && !part.done) {
      part.done = true;
      part.intact = intact;
      const int64_t n = static_cast<int64_t>(part.keys.size());
      lanes_[lane].bytes_read += intact * lanes_[lane].block_bytes;
      lanes_[lane].failed_blocks += n - intact;
    }
    all = all && part.done;
  }
  // The arrival's blocks and pages are written until every lane's read has ended.
  if (!all) return ok_status();
  const PendingRead done = std::move(r);
  reads_.erase(it);
  // The owner's blocks before the first failed or corrupt one are good; the rest are a miss,
  // never garbage. So are each group's pages.
  const int64_t owner_intact = done.parts.front().intact;
  if (done.parts.size() == 1) {
    return control.finish_arrival_partly(arrival, owner_intact).status();
  }
  std::vector<std::vector<bool>> group_ok(lane_of_group_.size());
  for (size_t p = 1; p < done.parts.size(); ++p) {
    const ReadPart& part = done.parts[p];
    std::vector<bool>& ok = group_ok[static_cast<size_t>(lanes_[part.lane].group)];
    ok.assign(part.keys.size(), false);
    for (int64_t k = 0; k < part.intact; ++k) ok[static_cast<size_t>(k)] = true;
  }
  return control.finish_arrival_partly(arrival, owner_intact, &group_ok).status();
}

Status StorageLink::collect(core::ControlPlane& control) {
  Status error = ok_status();
  for (size_t l = 0; l < lanes_.size(); ++l) {
    Lane& lane = lanes_[l];
    for (const StorageCompletion& c : lane.store->poll()) {
      auto put = lane.puts.find(c.job);
      if (put != lane.puts.end()) {
        const int64_t n = static_cast<int64_t>(put->second.size());
        if (c.ok) {
          lane.blocks_written += n;
          lane.bytes_written += n * lane.block_bytes;
        } else {
          lane.failed_blocks += n;
          detail::logger().warn("storage: write-back of {} blocks failed: {}", n, c.error);
        }
        for (DroppedBlock& b : put->second) lane.announcer.put_ended(std::move(b), c.ok);
        lane.puts.erase(put);
        continue;
      }
      auto read = read_jobs_[l].find(c.job);
      if (read == read_jobs_[l].end()) continue;  // not this link's job (a store serves one cache)
      const uint64_t arrival = read->second;
      read_jobs_[l].erase(read);
      auto pending = reads_.find(arrival);
      if (pending == reads_.end()) continue;
      int64_t n = 0;
      for (const ReadPart& part : pending->second.parts) {
        if (part.lane == l) n = static_cast<int64_t>(part.keys.size());
      }
      const int64_t intact = c.ok ? n : std::min<int64_t>(static_cast<int64_t>(c.blocks_ok), n);
      const Status st = part_done(control, arrival, l, intact);
      if (!st.ok() && error.ok()) error = st;
    }
  }
  announce(control);
  return error;
}

void StorageLink::announce(core::ControlPlane& control) {
  for (Lane& lane : lanes_) {
    lane.announcer.announce([&](uint64_t hash) { return control.indexes_hash(hash); },
                            [](NamespaceId ns) { return core::PrefixIndex::root_hash(ns); },
                            [&](const DroppedBlock& b) { control.record_stored_in_storage(b); });
  }
}

Status StorageLink::poll(core::ControlPlane& control) {
  if (idle()) return ok_status();
  PAGEDKV_RETURN_IF_ERROR(send_staged());
  PAGEDKV_RETURN_IF_ERROR(submit_reads(control));
  return collect(control);
}

StatusOr<StorageFetch> StorageLink::fetch(core::ControlPlane& control,
                                          const std::vector<TokenId>& prompt, NamespaceId ns,
                                          int64_t max_cached, Stream copy_stream, Stream compute) {
  PAGEDKV_ASSIGN_OR_RETURN(core::StorageLookup lookup,
                           control.storage_lookup(prompt, ns, control.arrival_room(), max_cached));
  StorageFetch out;
  out.reach = control.storage_reach(lookup, 0);
  if (lookup.hashes.empty()) return out;
  std::vector<StorageKey> keys;
  keys.reserve(lookup.hashes.size());
  for (uint64_t h : lookup.hashes) keys.push_back(StorageKey{h, ns});
  Lane& owner = lanes_.front();
  StatusOr<size_t> held = owner.store->batch_exists(keys);
  if (!held.ok() || *held == 0) return out;  // a store that is away is a miss
  // A window with a hole is no hit: its blocks come all or none.
  if (!lookup.prefix_hashes.empty() && *held < keys.size()) return out;
  keys.resize(*held);
  // Several groups: which of those blocks each other group's store holds (one that is away
  // holds none).
  std::vector<std::vector<bool>> group_held;
  if (lanes_.size() > 1) {
    group_held.resize(lane_of_group_.size());
    for (size_t l = 1; l < lanes_.size(); ++l) {
      StatusOr<std::vector<bool>> each = lanes_[l].store->exists_each(keys);
      group_held[static_cast<size_t>(lanes_[l].group)] =
          each.ok() && each->size() == keys.size() ? std::move(*each)
                                                   : std::vector<bool>(keys.size(), false);
    }
  }
  PAGEDKV_ASSIGN_OR_RETURN(core::Arrival arrival,
                           control.begin_arrival(lookup, static_cast<int64_t>(keys.size()),
                                                 group_held.empty() ? nullptr : &group_held));
  // Cached host blocks dropped for the arrival's slots: copied out before the read is let in
  // (the event below is recorded after these copies).
  Status staged = stage(arrival.host_drops, copy_stream, compute);
  if (arrival.host_blocks.empty()) {
    PAGEDKV_RETURN_IF_ERROR(staged);
    return out;
  }
  PendingRead r;
  r.arrival = arrival.id;
  ReadPart blocks;
  for (size_t i = 0; i < arrival.host_blocks.size(); ++i) {
    blocks.keys.push_back(keys[i]);
    blocks.dst.push_back(static_cast<char*>(owner.host_pool) +
                         arrival.host_blocks[i] * owner.block_bytes);
  }
  r.parts.push_back(std::move(blocks));
  for (const core::GroupArrival& ga : arrival.groups) {
    ReadPart pages;
    pages.lane = static_cast<size_t>(lane_of_group_[static_cast<size_t>(ga.group)]);
    const Lane& lane = lanes_[pages.lane];
    for (size_t k = 0; k < ga.index.size(); ++k) {
      pages.keys.push_back(keys[static_cast<size_t>(ga.index[k])]);
      pages.dst.push_back(static_cast<char*>(lane.host_pool) + ga.pages[k] * lane.block_bytes);
    }
    r.parts.push_back(std::move(pages));
  }
  StatusOr<Event> ready = take_event();
  Status st = staged.ok() ? ready.status() : staged;
  if (st.ok()) st = backend_.record_event(*ready, copy_stream);
  if (!st.ok()) {
    if (ready.ok()) give_event(*ready);
    PAGEDKV_RETURN_IF_ERROR(control.finish_arrival(arrival.id, false).status());
    return st;
  }
  r.ready = *ready;
  out.blocks = static_cast<int64_t>(arrival.host_blocks.size());
  out.reach = arrival.reach;
  waiting_reads_.push_back(std::move(r));
  // The fetch is done: its arrival is registered and its read queued. Moving the queues on
  // here only starts the read sooner; a failed step (an event query) keeps its work for the
  // next poll, which reports it, so it must not turn this success into a failure that changed
  // the cache.
  const Status progressed = poll(control);
  if (!progressed.ok()) {
    detail::logger().warn("storage: poll after a fetch: {}", progressed.message());
  }
  return out;
}

Status StorageLink::flush(core::ControlPlane& control) {
  while (!idle()) {
    for (const StagedBatch& b : staged_) {
      if (!b.ran) PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_event(b.ready));
    }
    for (const PendingRead& r : waiting_reads_) {
      PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_event(r.ready));
    }
    PAGEDKV_RETURN_IF_ERROR(send_staged());
    PAGEDKV_RETURN_IF_ERROR(submit_reads(control));
    for (Lane& lane : lanes_) lane.store->drain();
    PAGEDKV_RETURN_IF_ERROR(collect(control));
  }
  return ok_status();
}

void StorageLink::add_stats(ControlStats* stats, int32_t group) const {
  stats->storage_blocks_written = 0;
  stats->storage_bytes_written = 0;
  stats->storage_bytes_read = 0;
  stats->storage_failed_blocks = 0;
  stats->storage_writes_dropped = 0;
  for (const Lane& lane : lanes_) {
    if (group >= 0 && lane.group != group) continue;
    stats->storage_blocks_written += lane.blocks_written;
    stats->storage_bytes_written += lane.bytes_written;
    stats->storage_bytes_read += lane.bytes_read;
    stats->storage_failed_blocks += lane.failed_blocks;
    stats->storage_writes_dropped += lane.writes_dropped;
  }
}

}  // namespace runtime
}  // namespace pagedkv
