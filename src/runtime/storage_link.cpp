#include "runtime/storage_link.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "common/logging.hpp"

namespace pagedkv {
namespace runtime {

StatusOr<std::unique_ptr<StorageLink>> StorageLink::create(const std::vector<GroupStore>& stores,
                                                           int32_t num_groups, int32_t owner,
                                                           int64_t staging_blocks) {
  // Which ranks store each group: the owner's on every rank, any other group's on all or none.
  std::vector<std::vector<const GroupStore*>> by_group(static_cast<size_t>(num_groups));
  int32_t tp_size = 1;
  for (const GroupStore& gs : stores) {
    tp_size = gs.tp_size;
    if (gs.group < 0 || gs.group >= num_groups) return invalid_argument("storage: no such group");
    if (gs.store != nullptr) by_group[static_cast<size_t>(gs.group)].push_back(&gs);
  }
  if (owner < 0 || owner >= num_groups ||
      by_group[static_cast<size_t>(owner)].size() != static_cast<size_t>(tp_size)) {
    return invalid_argument(
        "storage: the group that owns the blocks (KvCache::full_group(), the one that attends "
        "furthest back) needs a store" +
        std::string(tp_size > 1 ? " on every rank" : "") +
        ": it decides which blocks a fetch brings back");
  }
  if (staging_blocks < 1) {
    return invalid_argument("storage_staging_blocks must be >= 1, got " +
                            std::to_string(staging_blocks));
  }
  std::unique_ptr<StorageLink> link(new StorageLink());
  link->owner_ = owner;
  link->lanes_of_group_.resize(static_cast<size_t>(num_groups));
  // The owner's lanes first (fetches start from its stores), each group's by rank.
  std::vector<size_t> order{static_cast<size_t>(owner)};
  for (size_t g = 0; g < by_group.size(); ++g) {
    if (g != static_cast<size_t>(owner) && !by_group[g].empty()) order.push_back(g);
  }
  for (const size_t g : order) {
    std::vector<const GroupStore*>& group = by_group[g];
    std::sort(group.begin(), group.end(),
              [](const GroupStore* a, const GroupStore* b) { return a->rank < b->rank; });
    for (const GroupStore* gs : group) {
      std::string at;  // "group g", "rank r", both or neither
      if (num_groups > 1) at = "group " + std::to_string(g);
      if (tp_size > 1) at += (at.empty() ? "rank " : ", rank ") + std::to_string(gs->rank);
      const std::string where = at.empty() ? "storage: " : "storage (" + at + "): ";
      if (group.size() != static_cast<size_t>(tp_size)) {
        return invalid_argument(where + "a group's pages are stored on every rank or on none");
      }
      if (gs->config.num_host_blocks == 0 || gs->host_pool == nullptr) {
        return invalid_argument(where +
                                "a storage tier sits behind the host tier: num_host_blocks must "
                                "be > 0");
      }
      const std::string& model_id = gs->store->layout().model_id;
      const StorageLayout want =
          tp_size > 1 ? StorageLayout::for_rank(gs->config, model_id, tp_size, gs->rank)
                      : StorageLayout::from_config(gs->config, model_id);
      if (want.fingerprint() != gs->store->layout().fingerprint() ||
          gs->store->layout().block_bytes != gs->config.block_bytes()) {
        return invalid_argument(
            where + "the store's layout (layers, heads, head_dim, dtype, block size, page layout" +
            std::string(tp_size > 1 ? ", TP size and rank: StorageLayout::for_rank" : "") +
            ") differs from the cache's");
      }
      for (const Lane& other : link->lanes_) {
        // The same key names a block of every group and rank: each needs a store of its own.
        if (other.store == gs->store ||
            other.store->layout().fingerprint() == gs->store->layout().fingerprint()) {
          return invalid_argument(where + "group " + std::to_string(other.group) +
                                  (other.store == gs->store ? " has the same store"
                                                            : " has a store of the same layout") +
                                  ": give each group's store its own model id");
        }
      }
      Lane lane;
      lane.group = static_cast<int32_t>(g);
      lane.rank = gs->rank;
      lane.backend = gs->backend;
      lane.copy_stream = gs->copy_stream;
      lane.compute = gs->compute;
      lane.store = gs->store;
      lane.block_bytes = gs->config.block_bytes();
      lane.device_pool = gs->device_pool;
      lane.host_pool = gs->host_pool;
      link->lanes_.push_back(std::move(lane));
      Lane& added = link->lanes_.back();
      link->lanes_of_group_[g].push_back(link->lanes_.size() - 1);
      PAGEDKV_ASSIGN_OR_RETURN(
          added.staging,
          added.backend->allocate_pinned(static_cast<size_t>(staging_blocks * added.block_bytes)));
      for (int64_t i = staging_blocks; i > 0; --i) added.free_staging.push_back(i - 1);
    }
  }
  link->read_jobs_.resize(link->lanes_.size());
  return link;
}

StorageLink::~StorageLink() {
  for (const StagedBatch& b : staged_) {
    if (!b.ran) lanes_[b.lane].backend->synchronize_event(b.ready).ignore_error();
  }
  for (const PendingRead& r : waiting_reads_) {
    for (const ReadPart& part : r.parts) {
      lanes_[part.lane].backend->synchronize_event(part.ready).ignore_error();
    }
  }
  // Their reads write into the host pools; their puts were copied already.
  for (Lane& lane : lanes_) lane.store->drain();
  for (Lane& lane : lanes_) {
    for (Event e : lane.all_events) lane.backend->destroy_event(e);
    if (lane.staging != nullptr) lane.backend->free_pinned(lane.staging);
  }
}

bool StorageLink::idle() const {
  if (!staged_.empty() || !waiting_reads_.empty() || !reads_.empty()) return false;
  for (const Lane& lane : lanes_) {
    if (!lane.puts.empty()) return false;
  }
  return true;
}

StatusOr<Event> StorageLink::take_event(size_t l) {
  Lane& lane = lanes_[l];
  if (!lane.spare_events.empty()) {
    const Event e = lane.spare_events.back();
    lane.spare_events.pop_back();
    return e;
  }
  PAGEDKV_ASSIGN_OR_RETURN(Event e, lane.backend->create_event());
  lane.all_events.push_back(e);
  return e;
}

Status StorageLink::stage(const std::vector<DroppedBlock>& drops) {
  if (drops.empty()) return ok_status();
  // Each group's drops go to its stores (one a rank); a group without one keeps none.
  std::vector<std::vector<DroppedBlock>> by_lane(lanes_.size());
  std::vector<bool> from_device(lanes_.size(), false);
  for (const DroppedBlock& d : drops) {
    if (d.group < 0 || static_cast<size_t>(d.group) >= lanes_of_group_.size()) continue;
    for (const size_t l : lanes_of_group_[static_cast<size_t>(d.group)]) {
      by_lane[l].push_back(d);
      from_device[l] = from_device[l] || d.source.tier == Tier::kDevice;
    }
  }
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (!from_device[l]) continue;
    // A block demoted and dropped within one call is read from its device block, which the
    // compute stream may still be writing.
    Lane& lane = lanes_[l];
    StatusOr<Event> written = take_event(l);
    Status st = written.status();
    if (st.ok()) st = lane.backend->record_event(*written, lane.compute);
    if (st.ok()) st = lane.backend->wait_event(lane.copy_stream, *written);
    if (written.ok()) give_event(l, *written);  // reusable at once: a wait captures its state
    if (!st.ok()) {
      for (size_t k = 0; k < lanes_.size(); ++k) {
        lanes_[k].writes_dropped += static_cast<int64_t>(by_lane[k].size());  // nothing staged
      }
      return st;
    }
  }
  for (size_t l = 0; l < lanes_.size(); ++l) {
    if (by_lane[l].empty()) continue;
    PAGEDKV_RETURN_IF_ERROR(stage_lane(l, std::move(by_lane[l])));
  }
  return ok_status();
}

Status StorageLink::stage_lane(size_t l, std::vector<DroppedBlock> drops) {
  Lane& lane = lanes_[l];
  const bool announces = lane.rank == 0;
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
    const Status st =
        lane.backend->copy_async(lane.staging_slot(slot), lane.source_bytes(d.source),
                                 static_cast<size_t>(lane.block_bytes), kind, lane.copy_stream);
    if (!st.ok()) {
      // What was queued still runs; keep those slots until it has.
      ++lane.writes_dropped;
      break;
    }
    lane.free_staging.pop_back();
    batch.slots.push_back(slot);
    if (announces) lane.announcer.put_started(d);
    batch.blocks.push_back(std::move(d));
  }
  if (batch.slots.empty()) return ok_status();
  StatusOr<Event> ready = take_event(l);
  Status st = ready.status();
  if (st.ok()) st = lane.backend->record_event(*ready, lane.copy_stream);
  if (st.ok()) {
    batch.ready = *ready;
  } else {
    if (ready.ok()) give_event(l, *ready);
    // Without the event nothing says when the copies ran: wait for the stream instead.
    const Status synced = lane.backend->synchronize_stream(lane.copy_stream);
    if (!synced.ok()) {
      // The copies may still run into their slots, which stay taken; the blocks are given up.
      lane.writes_dropped += static_cast<int64_t>(batch.blocks.size());
      for (DroppedBlock& d : batch.blocks) {
        if (announces) lane.announcer.put_ended(std::move(d), false);
      }
      return synced;
    }
    batch.ran = true;
  }
  staged_.push_back(std::move(batch));
  return ok_status();
}

bool StorageLink::ran(size_t l, Event e, Status* first_error) {
  StatusOr<bool> done = lanes_[l].backend->query_event(e);
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
    if (!b.ran && !ran(b.lane, b.ready, &error)) {
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
    if (!b.ran) give_event(b.lane, b.ready);
    if (job.ok()) {
      lane.puts.emplace(*job, std::move(b.blocks));
    } else {
      for (DroppedBlock& d : b.blocks) {
        if (lane.rank == 0) lane.announcer.put_ended(std::move(d), false);
      }
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
    bool all_ran = true;
    for (const ReadPart& part : r.parts) all_ran = ran(part.lane, part.ready, &error) && all_ran;
    if (!all_ran) {
      if (kept != i) waiting_reads_[kept] = std::move(r);
      ++kept;
      continue;
    }
    for (const ReadPart& part : r.parts) give_event(part.lane, part.ready);
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
  // The owner's blocks before the first failed or corrupt one on any rank are good; the rest are
  // a miss, never garbage. So are each group's pages (a page is good when every rank read it).
  int64_t owner_intact = static_cast<int64_t>(done.parts.front().keys.size());
  std::vector<std::vector<bool>> group_ok(lanes_of_group_.size());
  bool other_groups = false;
  for (const ReadPart& part : done.parts) {
    const int32_t g = lanes_[part.lane].group;
    if (g == owner_) {
      owner_intact = std::min(owner_intact, part.intact);
      continue;
    }
    std::vector<bool>& ok = group_ok[static_cast<size_t>(g)];
    if (ok.empty()) ok.assign(part.keys.size(), true);
    for (size_t k = static_cast<size_t>(part.intact); k < ok.size(); ++k) ok[k] = false;
    other_groups = true;
  }
  if (!other_groups) return control.finish_arrival_partly(arrival, owner_intact).status();
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
        for (DroppedBlock& b : put->second) {
          if (lane.rank == 0) lane.announcer.put_ended(std::move(b), c.ok);
        }
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
                                          int64_t max_cached) {
  PAGEDKV_ASSIGN_OR_RETURN(core::StorageLookup lookup,
                           control.storage_lookup(prompt, ns, control.arrival_room(), max_cached));
  StorageFetch out;
  out.reach = control.storage_reach(lookup, 0);
  if (lookup.hashes.empty()) return out;
  std::vector<StorageKey> keys;
  keys.reserve(lookup.hashes.size());
  for (uint64_t h : lookup.hashes) keys.push_back(StorageKey{h, ns});
  // The prefix every rank's store of the owner holds (a store that is away holds none).
  size_t held = keys.size();
  for (const size_t l : lanes_of_group_[static_cast<size_t>(owner_)]) {
    StatusOr<size_t> each = lanes_[l].store->batch_exists(keys);
    held = each.ok() ? std::min(held, *each) : 0;
  }
  if (held == 0) return out;
  // A window with a hole is no hit: its blocks come all or none.
  if (!lookup.prefix_hashes.empty() && held < keys.size()) return out;
  keys.resize(held);
  // Several groups: which of those blocks every rank's store of each other group holds.
  std::vector<std::vector<bool>> group_held;
  for (size_t g = 0; g < lanes_of_group_.size(); ++g) {
    if (static_cast<int32_t>(g) == owner_ || lanes_of_group_[g].empty()) continue;
    group_held.resize(lanes_of_group_.size());
    std::vector<bool>& all = group_held[g];
    all.assign(keys.size(), true);
    for (const size_t l : lanes_of_group_[g]) {
      StatusOr<std::vector<bool>> each = lanes_[l].store->exists_each(keys);
      const bool answered = each.ok() && each->size() == keys.size();
      for (size_t k = 0; k < keys.size(); ++k) all[k] = all[k] && answered && (*each)[k];
    }
  }
  PAGEDKV_ASSIGN_OR_RETURN(core::Arrival arrival,
                           control.begin_arrival(lookup, static_cast<int64_t>(keys.size()),
                                                 group_held.empty() ? nullptr : &group_held));
  // Cached host blocks dropped for the arrival's slots: copied out before the read is let in
  // (each lane's event below is recorded after these copies).
  Status st = stage(arrival.host_drops);
  if (arrival.host_blocks.empty()) {
    PAGEDKV_RETURN_IF_ERROR(st);
    return out;
  }
  PendingRead r;
  r.arrival = arrival.id;
  for (const size_t l : lanes_of_group_[static_cast<size_t>(owner_)]) {
    ReadPart blocks;  // each rank's share of the blocks into its host pool
    blocks.lane = l;
    const Lane& lane = lanes_[l];
    for (size_t i = 0; i < arrival.host_blocks.size(); ++i) {
      blocks.keys.push_back(keys[i]);
      blocks.dst.push_back(static_cast<char*>(lane.host_pool) +
                           arrival.host_blocks[i] * lane.block_bytes);
    }
    r.parts.push_back(std::move(blocks));
  }
  for (const core::GroupArrival& ga : arrival.groups) {
    for (const size_t l : lanes_of_group_[static_cast<size_t>(ga.group)]) {
      ReadPart pages;
      pages.lane = l;
      const Lane& lane = lanes_[l];
      for (size_t k = 0; k < ga.index.size(); ++k) {
        pages.keys.push_back(keys[static_cast<size_t>(ga.index[k])]);
        pages.dst.push_back(static_cast<char*>(lane.host_pool) + ga.pages[k] * lane.block_bytes);
      }
      r.parts.push_back(std::move(pages));
    }
  }
  size_t with_event = 0;  // the parts whose `ready` is taken
  for (ReadPart& part : r.parts) {
    if (!st.ok()) break;
    StatusOr<Event> ready = take_event(part.lane);
    st = ready.status();
    if (!st.ok()) break;
    part.ready = *ready;
    ++with_event;
    st = lanes_[part.lane].backend->record_event(part.ready, lanes_[part.lane].copy_stream);
  }
  if (!st.ok()) {
    for (size_t p = 0; p < with_event; ++p) give_event(r.parts[p].lane, r.parts[p].ready);
    PAGEDKV_RETURN_IF_ERROR(control.finish_arrival(arrival.id, false).status());
    return st;
  }
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
      if (!b.ran) PAGEDKV_RETURN_IF_ERROR(lanes_[b.lane].backend->synchronize_event(b.ready));
    }
    for (const PendingRead& r : waiting_reads_) {
      for (const ReadPart& part : r.parts) {
        PAGEDKV_RETURN_IF_ERROR(lanes_[part.lane].backend->synchronize_event(part.ready));
      }
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
    // A block counts once (rank 0's lane); its bytes, failures and drops on every rank.
    if (lane.rank == 0) stats->storage_blocks_written += lane.blocks_written;
    stats->storage_bytes_written += lane.bytes_written;
    stats->storage_bytes_read += lane.bytes_read;
    stats->storage_failed_blocks += lane.failed_blocks;
    stats->storage_writes_dropped += lane.writes_dropped;
  }
}

}  // namespace runtime
}  // namespace pagedkv
