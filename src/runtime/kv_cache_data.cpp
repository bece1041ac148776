// KvCache's data-plane calls on the compute stream: writes (write_kv, write_kv_batch and the
// all-layers form), batches (build_batch, build_batches and their upload), device views,
// gathers and uploads into caller buffers. Each orders the compute stream after the transfer
// jobs still using the blocks it touches (TransferEngine::order_block_use and
// order_block_reuse) before it queues its work. The control calls and tier moves are in
// kv_cache.cpp.
#include <algorithm>
#include <array>
#include <string>

#include "pagedkv/ops.hpp"
#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {

using runtime::part;

StatusOr<LayerGroup> KvCache::Impl::op_layer(int32_t layer) const {
  // With one group the op checks the layer itself, with its own message, as it always has.
  if (num_groups() == 1) return LayerGroup{0, layer};
  return find_layer_group(layers, layer);
}

StatusOr<const int64_t*> KvCache::Impl::device_slots(SequenceId id, int32_t g, Rank& r,
                                                     int64_t* count) {
  slot_scratch.clear();
  PAGEDKV_RETURN_IF_ERROR(control->group_reserved_slots(id, g, &slot_scratch));
  if (slot_scratch.empty()) {
    return failed_precondition("sequence " + std::to_string(id) + ": nothing reserved to write");
  }
  // A block of the reservation may have been read by an offload that is still running.
  PAGEDKV_RETURN_IF_ERROR(order_block_reuse(r, g, slot_scratch.data(), slot_scratch.size()));
  SlotUpload& up = r.groups[static_cast<size_t>(g)].slot_uploads[id];
  // Uploaded once per reservation, kept (leased) while the slots stay the same. An upload that
  // a failing op then ignores changes nothing observable.
  if (up.lease == nullptr || up.slots != slot_scratch) {
    up.lease.reset();
    PAGEDKV_ASSIGN_OR_RETURN(runtime::UploadLease lease, r.uploads->upload({part(slot_scratch)}));
    up.lease = std::make_unique<runtime::UploadLease>(std::move(lease));
    up.slots = slot_scratch;
  }
  *count = static_cast<int64_t>(up.slots.size());
  return up.lease->device<int64_t>(0);
}

Status KvCache::write_kv(SequenceId id, int32_t layer, const void* key, const void* value,
                         DType input_dtype, int64_t row_stride, int32_t rank) {
  PAGEDKV_KV_CACHE_CALL(write_kv);
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.check_rank(rank, "write_kv"));
  Impl::Rank& r = c.ranks[static_cast<size_t>(rank)];
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, c.op_layer(layer));
  WriteKvArgs args;
  PAGEDKV_ASSIGN_OR_RETURN(args.slot_mapping, c.device_slots(id, lg.group, r, &args.num_tokens));
  args.key = key;
  args.value = value;
  args.input_dtype = input_dtype;
  args.row_stride = row_stride;
  args.layer = lg.layer;
  return pagedkv::write_kv(*r.backend, c.device_pool(lg.group, rank), args, r.compute);
}

bool KvCache::built_here(const DeviceBatch& batch) const { return impl_->built_here(batch); }

bool KvCache::Impl::built_here(const DeviceBatch& batch) const {
  return batch.host != nullptr && batch.group >= 0 && batch.group < num_groups() &&
         batch.rank >= 0 && batch.rank < num_ranks() &&
         batch.host == built[static_cast<size_t>(batch.group)];
}

Status KvCache::Impl::check_batch_current(const DeviceBatch& batch) const {
  if (batch.host != nullptr && !built_here(batch)) {
    return invalid_argument("the DeviceBatch was built by another cache");
  }
  if (batch.host == nullptr || batch.generation != generation) {
    return failed_precondition(
        "the DeviceBatch is stale: build_batch again after reserving, committing or moving "
        "sequences");
  }
  // Under tensor parallelism each rank reads its own upload: a batch whose rank was changed by
  // hand would point one device's kernels at another's memory.
  const DeviceBatch& uploaded =
      ranks[static_cast<size_t>(batch.rank)].groups[static_cast<size_t>(batch.group)].batch;
  if (batch.block_tables != uploaded.block_tables ||
      (!batch.caller_owned_slots && batch.slot_mapping != uploaded.slot_mapping)) {
    return invalid_argument("the DeviceBatch's arrays are not rank " + std::to_string(batch.rank) +
                            "'s: rank_batch gives each rank's batch");
  }
  return ok_status();
}

Status KvCache::write_kv_batch(const DeviceBatch& batch, int32_t layer, const void* key,
                               const void* value, DType input_dtype, int64_t row_stride) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::write_kv_batch");
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.broken);
  PAGEDKV_RETURN_IF_ERROR(c.check_batch_current(batch));
  // A slot mapping in the upload arena is reused after the next build: a replay would read it.
  if (!batch.caller_owned_slots) PAGEDKV_RETURN_IF_ERROR(c.refuse_in_capture("write_kv_batch"));
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, c.op_layer(layer));
  if (lg.group != batch.group) {
    return invalid_argument("layer " + std::to_string(layer) + " is group " +
                            std::to_string(lg.group) + "'s; the batch is group " +
                            std::to_string(batch.group) + "'s");
  }
  WriteKvArgs args;
  args.key = key;
  args.value = value;
  args.input_dtype = input_dtype;
  args.row_stride = row_stride;
  args.num_tokens = static_cast<int64_t>(batch.host->slot_mapping.size());
  args.slot_mapping = batch.slot_mapping;
  args.layer = lg.layer;
  const Impl::Rank& r = c.ranks[static_cast<size_t>(batch.rank)];
  return pagedkv::write_kv(*r.backend, c.device_pool(batch.group, batch.rank), args, r.compute);
}

Status KvCache::write_kv_batch_all_layers(const DeviceBatch& batch, const void* key,
                                          const void* value, DType input_dtype, int64_t row_stride,
                                          int64_t layer_stride) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::write_kv_batch_all_layers");
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.broken);
  PAGEDKV_RETURN_IF_ERROR(c.check_batch_current(batch));
  if (!batch.caller_owned_slots) {
    PAGEDKV_RETURN_IF_ERROR(c.refuse_in_capture("write_kv_batch_all_layers"));
  }
  WriteKvAllLayersArgs args;
  args.key = key;
  args.value = value;
  args.input_dtype = input_dtype;
  args.row_stride = row_stride;
  args.layer_stride = layer_stride;
  args.num_tokens = static_cast<int64_t>(batch.host->slot_mapping.size());
  args.slot_mapping = batch.slot_mapping;
  const Impl::Rank& r = c.ranks[static_cast<size_t>(batch.rank)];
  return pagedkv::write_kv_all_layers(*r.backend, c.device_pool(batch.group, batch.rank), args,
                                      r.compute);
}

StatusOr<DeviceBatch> KvCache::build_batch(const std::vector<SequenceId>& ids,
                                           const BatchOptions& options) {
  PAGEDKV_KV_CACHE_CALL(build_batch);
  if (impl_->num_groups() > 1) {
    return invalid_argument("build_batch: the cache holds " + std::to_string(impl_->num_groups()) +
                            " KV groups: build_batches gives each group's batch");
  }
  // The host metadata every DeviceBatch points to is rewritten: an earlier batch is stale from
  // here on, even if the upload below fails (found by tests/fuzz).
  PAGEDKV_ASSIGN_OR_RETURN(const BatchMetadata* m,
                           impl_->changed(impl_->control->build_batch(ids, options)));
  DeviceBatch out;
  PAGEDKV_RETURN_IF_ERROR(impl_->upload_batch(0, *m, options, &out));
  if (impl_->record_plans) impl_->record_batch(0, *m, options, false);
  return out;
}

StatusOr<std::vector<DeviceBatch>> KvCache::build_batches(const std::vector<SequenceId>& ids,
                                                          const BatchOptions& options) {
  PAGEDKV_KV_CACHE_CALL(build_batches);
  PAGEDKV_ASSIGN_OR_RETURN(const BatchMetadata* m,  // stale batches as in build_batch
                           impl_->changed(impl_->control->build_batch(ids, options)));
  std::vector<DeviceBatch> out(static_cast<size_t>(impl_->num_groups()));
  for (int32_t g = 0; g < impl_->num_groups(); ++g) {
    const BatchMetadata& meta = g == impl_->full_group ? *m : impl_->control->group_batch(g);
    PAGEDKV_RETURN_IF_ERROR(impl_->upload_batch(g, meta, options, &out[static_cast<size_t>(g)]));
  }
  if (impl_->record_plans) {  // after every group's upload: a failed build records nothing
    for (int32_t g = 0; g < impl_->num_groups(); ++g) {
      const BatchMetadata& meta = g == impl_->full_group ? *m : impl_->control->group_batch(g);
      impl_->record_batch(g, meta, options, g > 0);
    }
  }
  return out;
}

Status KvCache::Impl::upload_batch(int32_t g, const BatchMetadata& m, const BatchOptions& options,
                                   DeviceBatch* out) {
  built[static_cast<size_t>(g)] = &m;
  for (Rank& r : ranks) {
    r.groups[static_cast<size_t>(g)].batch = DeviceBatch{};  // a failed upload leaves none behind
  }
  for (Rank& r : ranks) {
    // The batch's readers come after the restores still writing its blocks, and its writes
    // after the offloads still reading the blocks its slots reuse (build_batch and
    // build_batches alike; for the full group the reservation has ordered those already).
    PAGEDKV_RETURN_IF_ERROR(order_block_use(r, g, m.block_tables.data(), m.block_tables.size()));
    PAGEDKV_RETURN_IF_ERROR(order_block_reuse(r, g, m.slot_mapping.data(), m.slot_mapping.size()));
  }
  // One packed upload, copied to every rank's device: every array lives until the next
  // build_batch (DeviceBatch's contract).
  runtime::UploadArena& arena = batch_arena != nullptr ? *batch_arena : *ranks[0].uploads;
  PAGEDKV_ASSIGN_OR_RETURN(
      runtime::UploadLease up,
      arena.upload({part(m.slot_mapping), part(m.block_tables), part(m.seq_lens), part(m.indptr),
                    part(m.indices), part(m.last_page_len)}));
  for (size_t i = 0; i < ranks.size(); ++i) {
    DeviceBatch& b = ranks[i].groups[static_cast<size_t>(g)].batch;
    b.host = &m;
    b.generation = generation;
    b.group = g;
    b.rank = static_cast<int32_t>(i);
    b.slot_mapping = up.device<int64_t>(0, i);
    b.block_tables = up.device<int32_t>(1, i);
    b.seq_lens = up.device<int32_t>(2, i);
    if (options.build_csr) {
      b.indptr = up.device<int32_t>(3, i);
      b.indices = up.device<int32_t>(4, i);
      b.last_page_len = up.device<int32_t>(5, i);
    }
  }
  std::unique_ptr<runtime::UploadLease>& lease = batch_uploads[static_cast<size_t>(g)];
  if (lease == nullptr) {
    lease = std::make_unique<runtime::UploadLease>(std::move(up));
  } else {
    *lease = std::move(up);
  }
  *out = ranks[0].groups[static_cast<size_t>(g)].batch;
  return ok_status();
}

StatusOr<DeviceBatch> KvCache::rank_batch(const DeviceBatch& batch, int32_t rank) const {
  const Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.check_rank(rank, "rank_batch"));
  PAGEDKV_RETURN_IF_ERROR(c.check_batch_current(batch));
  return c.ranks[static_cast<size_t>(rank)].groups[static_cast<size_t>(batch.group)].batch;
}

Status KvCache::upload_to_device(const HostUpload* arrays, size_t count, int32_t rank) {
  PAGEDKV_NVTX_RANGE("pagedkv::KvCache::upload_to_device");
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.broken);
  PAGEDKV_RETURN_IF_ERROR(c.check_rank(rank, "upload_to_device"));
  Impl::Rank& r = c.ranks[static_cast<size_t>(rank)];
  if (arrays == nullptr && count > 0) {
    return invalid_argument("upload_to_device: null arrays for " + std::to_string(count));
  }
  if (count > kMaxHostUploads) {
    return invalid_argument("upload_to_device: " + std::to_string(count) + " arrays, at most " +
                            std::to_string(kMaxHostUploads));
  }
  std::array<runtime::UploadPart, kMaxHostUploads> parts{};
  for (size_t i = 0; i < count; ++i) {
    const HostUpload& a = arrays[i];
    if (a.bytes > 0 && (a.dst == nullptr || a.src == nullptr)) {
      return invalid_argument("upload_to_device: array " + std::to_string(i) + " has a null " +
                              (a.dst == nullptr ? "destination" : "source"));
    }
    parts[i] = {a.src, a.bytes};
  }
  PAGEDKV_RETURN_IF_ERROR(c.refuse_in_capture("upload_to_device"));
  // One packed upload; the lease is released when this returns, after the copies out of it are
  // queued on the compute stream (the arena's stream), as the arena requires.
  PAGEDKV_ASSIGN_OR_RETURN(runtime::UploadLease up, r.uploads->upload(parts.data(), count));
  for (size_t i = 0; i < count; ++i) {
    if (arrays[i].bytes == 0) continue;
    PAGEDKV_RETURN_IF_ERROR(r.backend->copy_async(arrays[i].dst, up.device(i), arrays[i].bytes,
                                                  CopyKind::kDeviceToDevice, r.compute));
  }
  return ok_status();
}

device::PagedKvView KvCache::device_view(const DeviceBatch& batch, KvScales scales) const {
  // A batch of no group or rank of this cache (not built here) gets rank 0's pool of the full
  // group.
  const bool ours = batch.group >= 0 && batch.group < impl_->num_groups() && batch.rank >= 0 &&
                    batch.rank < impl_->num_ranks();
  const int32_t g = ours ? batch.group : impl_->full_group;
  const PoolRef pool = impl_->device_pool(g, ours ? batch.rank : 0);
  const int32_t batch_size = batch.host != nullptr ? batch.host->batch_size : 0;
  device::PagedKvView view =
      batch.indptr != nullptr
          ? device::make_csr_view(pool.data, pool.layout, pool.dtype, pool.num_blocks, batch.indptr,
                                  batch.indices, batch.last_page_len, batch_size, scales)
          : device::make_block_table_view(pool.data, pool.layout, pool.dtype, pool.num_blocks,
                                          batch.block_tables,
                                          batch.host != nullptr ? batch.host->max_blocks : 0,
                                          batch.seq_lens, batch_size, scales);
  view.sliding_window = impl_->group_config(g).sliding_window;
  view.ring_table = batch.indptr == nullptr && batch.host != nullptr && batch.host->ring_table;
  return view;
}

Status KvCache::gather_layer(SequenceId id, int32_t layer, void* key_out, void* value_out,
                             DType packed_dtype, PackedLayout packed_layout, int64_t position_begin,
                             int64_t num_tokens, int32_t rank) {
  PAGEDKV_KV_CACHE_CALL(gather_layer);
  Impl& c = *impl_;
  PAGEDKV_RETURN_IF_ERROR(c.check_rank(rank, "gather_layer"));
  Impl::Rank& r = c.ranks[static_cast<size_t>(rank)];
  PAGEDKV_ASSIGN_OR_RETURN(LayerGroup lg, c.op_layer(layer));
  PAGEDKV_ASSIGN_OR_RETURN(int64_t length, c.control->length(id));
  // Compared as differences from `length`: position_begin + num_tokens can overflow int64 for
  // caller-supplied values (found by tests/fuzz).
  if (position_begin < 0 || position_begin > length) {
    return out_of_range("sequence " + std::to_string(id) + ": position_begin " +
                        std::to_string(position_begin) + " outside its " + std::to_string(length) +
                        " committed tokens");
  }
  if (num_tokens < 0) num_tokens = length - position_begin;
  if (num_tokens > length - position_begin) {
    return out_of_range("sequence " + std::to_string(id) + ": " + std::to_string(num_tokens) +
                        " tokens from position " + std::to_string(position_begin) +
                        " run past its " + std::to_string(length) + " committed tokens");
  }
  PackedLayerArgs args;
  args.key = key_out;
  args.value = value_out;
  args.packed_dtype = packed_dtype;
  args.packed_layout = packed_layout;
  args.layer = lg.layer;
  args.position_begin = position_begin;
  args.num_tokens = num_tokens;
  // An offloaded sequence is read only after a restore, as build_batch does, also when every
  // block it holds happens to be on the device (a fork that shares them all, say).
  PAGEDKV_ASSIGN_OR_RETURN(Residency residency, c.control->residency(id));
  PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks,
                           c.control->group_block_locations(id, lg.group));
  if (num_tokens > 0 &&
      blocks[static_cast<size_t>(position_begin / c.config.block_size)].block < 0) {
    return out_of_range("sequence " + std::to_string(id) + ": position " +
                        std::to_string(position_begin) + " fell out of the sliding window (" +
                        std::to_string(c.group_config(lg.group).sliding_window) + " tokens)");
  }
  const bool on_device = std::all_of(
      blocks.begin(), blocks.end(), [](const BlockLocation& b) { return b.tier == Tier::kDevice; });
  if (residency.offloaded || !on_device) {
    return failed_precondition("sequence " + std::to_string(id) +
                               " is offloaded: restore it before reading");
  }
  std::vector<int32_t> table;
  table.reserve(blocks.size());
  for (const BlockLocation& b : blocks) table.push_back(b.block);
  PAGEDKV_RETURN_IF_ERROR(c.order_block_use(r, lg.group, table.data(), table.size()));
  PAGEDKV_ASSIGN_OR_RETURN(runtime::UploadLease up, r.uploads->upload({part(table)}));
  args.block_table = up.device<int32_t>(0);
  args.block_table_len = static_cast<int32_t>(table.size());
  return pagedkv::gather_layer(*r.backend, c.device_pool(lg.group, rank), args, r.compute);
}

}  // namespace pagedkv
