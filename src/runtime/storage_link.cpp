#include "runtime/storage_link.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "common/logging.hpp"

namespace pagedkv {
namespace runtime {

StatusOr<std::unique_ptr<StorageLink>> StorageLink::create(Backend& backend, StorageTier* store,
                                                           const CacheConfig& config,
                                                           void* device_pool, void* host_pool,
                                                           int64_t staging_blocks) {
  if (config.num_host_blocks == 0 || host_pool == nullptr) {
    return invalid_argument(
        "storage: a storage tier sits behind the host tier: num_host_blocks must be > 0");
  }
  if (staging_blocks < 1) {
    return invalid_argument("storage_staging_blocks must be >= 1, got " +
                            std::to_string(staging_blocks));
  }
  const StorageLayout want = StorageLayout::from_config(config, store->layout().model_id);
  if (want.fingerprint() != store->layout().fingerprint() ||
      store->layout().block_bytes != config.block_bytes()) {
    return invalid_argument(
        "storage: the store's layout (layers, heads, head_dim, dtype, block size, page layout) "
        "differs from the cache's");
  }
  std::unique_ptr<StorageLink> link(
      new StorageLink(backend, store, config.block_bytes(), device_pool, host_pool));
  PAGEDKV_ASSIGN_OR_RETURN(
      link->staging_,
      backend.allocate_pinned(static_cast<size_t>(staging_blocks * config.block_bytes())));
  for (int64_t i = staging_blocks; i > 0; --i) link->free_staging_.push_back(i - 1);
  return link;
}

StorageLink::StorageLink(Backend& backend, StorageTier* store, int64_t block_bytes,
                         void* device_pool, void* host_pool)
    : backend_(backend),
      store_(store),
      block_bytes_(block_bytes),
      device_pool_(device_pool),
      host_pool_(host_pool) {}

StorageLink::~StorageLink() {
  for (const StagedBatch& b : staged_) {
    if (!b.ran) backend_.synchronize_event(b.ready).ignore_error();
  }
  for (const PendingRead& r : waiting_reads_) backend_.synchronize_event(r.ready).ignore_error();
  store_->drain();  // its reads write into the host pool, its puts were copied already
  for (Event e : all_events_) backend_.destroy_event(e);
  if (staging_ != nullptr) backend_.free_pinned(staging_);
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
  const bool from_device = std::any_of(drops.begin(), drops.end(), [](const DroppedBlock& d) {
    return d.source.tier == Tier::kDevice;
  });
  if (from_device) {
    // A block demoted and dropped within one call is read from its device block, which the
    // compute stream may still be writing.
    PAGEDKV_ASSIGN_OR_RETURN(Event written, take_event());
    Status st = backend_.record_event(written, compute);
    if (st.ok()) st = backend_.wait_event(copy_stream, written);
    give_event(written);  // reusable at once: a wait captures the event's state when queued
    if (!st.ok()) {
      writes_dropped_ += static_cast<int64_t>(drops.size());  // nothing was staged
      return st;
    }
  }
  StagedBatch batch;
  for (const DroppedBlock& d : drops) {
    if (free_staging_.empty()) {
      ++writes_dropped_;  // a bounded write-back: the block is simply not kept
      continue;
    }
    const int64_t slot = free_staging_.back();
    const CopyKind kind =
        d.source.tier == Tier::kDevice ? CopyKind::kDeviceToHost : CopyKind::kHostToHost;
    const Status st = backend_.copy_async(staging_slot(slot), source_bytes(d.source),
                                          static_cast<size_t>(block_bytes_), kind, copy_stream);
    if (!st.ok()) {
      // What was queued still runs; keep those slots until it has.
      ++writes_dropped_;
      break;
    }
    free_staging_.pop_back();
    batch.slots.push_back(slot);
    batch.blocks.push_back(d);
    announcer_.put_started(d);
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
      writes_dropped_ += static_cast<int64_t>(batch.blocks.size());
      for (DroppedBlock& d : batch.blocks) announcer_.put_ended(std::move(d), false);
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
    std::vector<StorageKey> keys;
    std::vector<const void*> bytes;
    for (size_t j = 0; j < b.blocks.size(); ++j) {
      keys.push_back(StorageKey{b.blocks[j].block_hash, b.blocks[j].ns});
      bytes.push_back(staging_slot(b.slots[j]));
    }
    StatusOr<uint64_t> job = store_->submit_put(keys, bytes);  // copies the bytes
    for (int64_t s : b.slots) free_staging_.push_back(s);
    if (!b.ran) give_event(b.ready);
    if (job.ok()) {
      puts_.emplace(*job, std::move(b.blocks));
    } else {
      for (DroppedBlock& d : b.blocks) announcer_.put_ended(std::move(d), false);
      writes_dropped_ += static_cast<int64_t>(keys.size());
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
  for (size_t i = 0; i < waiting_reads_.size(); ++i) {
    PendingRead& r = waiting_reads_[i];
    if (!ran(r.ready, &error)) {
      if (kept != i) waiting_reads_[kept] = std::move(r);
      ++kept;
      continue;
    }
    give_event(r.ready);
    StatusOr<uint64_t> job = store_->submit_get(r.keys, r.dst);
    if (job.ok()) {
      reads_.emplace(*job, std::move(r));
      continue;
    }
    failed_blocks_ += static_cast<int64_t>(r.keys.size());
    const Status st = control.finish_arrival(r.arrival, false).status();
    if (!st.ok() && error.ok()) error = st;
  }
  waiting_reads_.resize(kept);
  return error;
}

Status StorageLink::collect(core::ControlPlane& control) {
  for (const StorageCompletion& c : store_->poll()) {
    auto put = puts_.find(c.job);
    if (put != puts_.end()) {
      const int64_t n = static_cast<int64_t>(put->second.size());
      if (c.ok) {
        blocks_written_ += n;
        bytes_written_ += n * block_bytes_;
      } else {
        failed_blocks_ += n;
        detail::logger().warn("storage: write-back of {} blocks failed: {}", n, c.error);
      }
      for (DroppedBlock& b : put->second) announcer_.put_ended(std::move(b), c.ok);
      puts_.erase(put);
      continue;
    }
    auto read = reads_.find(c.job);
    if (read == reads_.end()) continue;  // not this link's job (a store serves one cache)
    const int64_t n = static_cast<int64_t>(read->second.keys.size());
    // The blocks before the first failed or corrupt one are good; the rest are a miss, never
    // garbage.
    const int64_t intact = c.ok ? n : std::min<int64_t>(static_cast<int64_t>(c.blocks_ok), n);
    bytes_read_ += intact * block_bytes_;
    failed_blocks_ += n - intact;
    const uint64_t arrival = read->second.arrival;
    reads_.erase(read);
    PAGEDKV_RETURN_IF_ERROR(control.finish_arrival_partly(arrival, intact).status());
  }
  announce(control);
  return ok_status();
}

void StorageLink::announce(core::ControlPlane& control) {
  announcer_.announce([&](uint64_t hash) { return control.indexes_hash(hash); },
                      [](NamespaceId ns) { return core::PrefixIndex::root_hash(ns); },
                      [&](const DroppedBlock& b) { control.record_stored_in_storage(b); });
}

Status StorageLink::poll(core::ControlPlane& control) {
  if (staged_.empty() && waiting_reads_.empty() && puts_.empty() && reads_.empty()) {
    return ok_status();
  }
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
  StatusOr<size_t> held = store_->batch_exists(keys);
  if (!held.ok() || *held == 0) return out;  // a store that is away is a miss
  // A window with a hole is no hit: its blocks come all or none.
  if (!lookup.prefix_hashes.empty() && *held < keys.size()) return out;
  PAGEDKV_ASSIGN_OR_RETURN(core::Arrival arrival,
                           control.begin_arrival(lookup, static_cast<int64_t>(*held)));
  // Cached host blocks dropped for the arrival's slots: copied out before the read is let in
  // (the event below is recorded after these copies).
  Status staged = stage(arrival.host_drops, copy_stream, compute);
  if (arrival.host_blocks.empty()) {
    PAGEDKV_RETURN_IF_ERROR(staged);
    return out;
  }
  PendingRead r;
  r.arrival = arrival.id;
  for (size_t i = 0; i < arrival.host_blocks.size(); ++i) {
    r.keys.push_back(keys[i]);
    r.dst.push_back(static_cast<char*>(host_pool_) + arrival.host_blocks[i] * block_bytes_);
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
  out.blocks = static_cast<int64_t>(r.keys.size());
  out.reach = control.storage_reach(lookup, out.blocks);
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
  while (!staged_.empty() || !waiting_reads_.empty() || !puts_.empty() || !reads_.empty()) {
    for (const StagedBatch& b : staged_) {
      if (!b.ran) PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_event(b.ready));
    }
    for (const PendingRead& r : waiting_reads_) {
      PAGEDKV_RETURN_IF_ERROR(backend_.synchronize_event(r.ready));
    }
    PAGEDKV_RETURN_IF_ERROR(send_staged());
    PAGEDKV_RETURN_IF_ERROR(submit_reads(control));
    store_->drain();
    PAGEDKV_RETURN_IF_ERROR(collect(control));
  }
  return ok_status();
}

void StorageLink::add_stats(ControlStats* stats) const {
  stats->storage_blocks_written = blocks_written_;
  stats->storage_bytes_written = bytes_written_;
  stats->storage_bytes_read = bytes_read_;
  stats->storage_failed_blocks = failed_blocks_;
  stats->storage_writes_dropped = writes_dropped_;
}

}  // namespace runtime
}  // namespace pagedkv
