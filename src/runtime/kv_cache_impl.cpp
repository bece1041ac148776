// KvCache::Impl's shared helpers: teardown, group checks, the capture refusal, and carrying a
// control-plane plan out on the streams (transfers, block copies) or taking it back when the
// backend fails part way (recover). The public calls are in kv_cache.cpp (control and tier
// moves), kv_cache_data.cpp, kv_cache_queries.cpp and kv_cache_storage.cpp.
#include "runtime/kv_cache_impl.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "common/logging.hpp"

namespace pagedkv {

using runtime::part;

KvCache::Impl::~Impl() {
  // Queued kernels may use the pools; the storage link waits for its staging copies and the
  // store's reads into rank 0's host pool.
  for (Rank& r : ranks) {
    if (r.backend != nullptr) r.backend->synchronize_stream(r.compute).ignore_error();
  }
  storage.reset();
  batch_uploads.clear();  // leases go back before their arena
  batch_arena.reset();
  for (Rank& r : ranks) {
    if (r.backend == nullptr) continue;
    for (GroupPool& g : r.groups) g.slot_uploads.clear();
    r.uploads.reset();
    r.transfers.reset();  // drains the copy stream
    for (GroupPool& g : r.groups) {
      r.backend->free_device(g.device);
      r.backend->free_pinned(g.host);
    }
  }
}

PoolRef KvCache::Impl::device_pool(int32_t g, int32_t r) const {
  const CacheConfig& c = shard_config(g);
  return PoolRef{ranks[static_cast<size_t>(r)].groups[static_cast<size_t>(g)].device, c.dtype,
                 PoolLayout::from_config(c), c.num_device_blocks};
}

Status KvCache::Impl::check_group(int32_t g) const {
  if (g < 0 || g >= num_groups()) {
    return out_of_range("group " + std::to_string(g) + " outside the cache's " +
                        std::to_string(num_groups()) + " groups");
  }
  return ok_status();
}

Status KvCache::Impl::check_rank(int32_t r, const char* what) const {
  if (r < 0 || r >= num_ranks()) {
    return out_of_range(std::string(what) + ": rank " + std::to_string(r) +
                        " outside the cache's " + std::to_string(num_ranks()) +
                        " tensor-parallel ranks");
  }
  return ok_status();
}

void KvCache::Impl::forget_slot_uploads(SequenceId id) {
  for (Rank& r : ranks) {
    for (GroupPool& g : r.groups) {
      if (!g.slot_uploads.empty()) g.slot_uploads.erase(id);
    }
  }
}

Status KvCache::Impl::refuse_in_capture(const char* what) {
  for (Rank& r : ranks) {
    PAGEDKV_ASSIGN_OR_RETURN(const bool capturing, r.backend->is_capturing(r.compute));
    if (!capturing) continue;
    return failed_precondition(
        std::string(what) +
        ": the compute stream is capturing a CUDA graph; only write_kv_batch and "
        "write_kv_batch_all_layers over a batch whose slot mapping is caller-owned "
        "(build_vllm_batch_into, or build_batch_into given a slot-mapping buffer) and the ops "
        "over fixed buffers (ops.hpp) may be captured: call it before or after the capture");
  }
  return ok_status();
}

void KvCache::Impl::forget(SequenceId id) {
  forget_slot_uploads(id);
  for (Rank& r : ranks) r.last_job.erase(id);
}

Status KvCache::Impl::commit_tokens(SequenceId id, const TokenId* tokens, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(changed(control->commit(id, tokens, n)));
  forget_slot_uploads(id);  // the reservation shrank: its upload no longer matches
  return ok_status();
}

Status KvCache::Impl::carry_out(core::TierPlan& plan) {
  ++generation;
  // The control plane has applied its plan; the data plane now carries it out on every rank,
  // or the plan is taken back on every rank.
  Submitted& sub = submitted;
  Status s = run_transfers(plan.transfers(), &sub);
  // The full group's new slots are listed: their writes follow the jobs still using them from
  // here on. A window group's new pages are not: its writers order themselves (write_kv through
  // device_slots, a batch's writes when it is built: upload_batch).
  for (Rank& r : ranks) {
    if (!s.ok()) break;
    s = order_block_reuse(r, full_group, plan.slots().data(), plan.slots().size());
  }
  if (!s.ok()) return recover(s, plan, sub);
  note_transfers(plan.transfers(), sub);
  if (record_plans) record_transfers(plan.transfers());  // before commit() releases them
  plan.commit();
  return ok_status();
}

Status KvCache::Impl::run_transfers(const Transfers& t, Submitted* out) {
  out->tickets.assign(ranks.size(), 0);
  out->moves_done.assign(ranks.size(), 0);
  // Dropped victims need no data and are not undone: record them before anything can fail.
  for (SequenceId id : t.evicted) {
    evicted.push_back(id);
    forget_slot_uploads(id);
  }
  // Dropped host blocks are copied out for the write-back (on every rank) before the moves
  // reuse their slots.
  if (storage != nullptr) PAGEDKV_RETURN_IF_ERROR(storage->stage(t.host_drops));
  for (size_t i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks[i];
    if (!t.moves.empty()) {
      StatusOr<runtime::TransferTicket> ticket =
          r.transfers->submit(t.moves, r.compute, &out->moves_done[i]);
      PAGEDKV_RETURN_IF_ERROR(ticket.status());
      out->tickets[i] = *ticket;
      // The engine notes which device blocks the job reads and writes: later work on the
      // compute stream waits for it only when it touches them (order_block_use,
      // order_block_reuse), so compute queued meanwhile overlaps the copies.
    }
    PAGEDKV_RETURN_IF_ERROR(run_copies(r, t.copies));
  }
  return ok_status();
}

Status KvCache::Impl::run_copies(Rank& r, const std::vector<BlockCopy>& copies) {
  // One launch per group, each on its own pool.
  for (int32_t g = 0; g < num_groups() && !copies.empty(); ++g) {
    std::vector<int32_t> pairs;
    std::vector<int64_t> written;
    for (const BlockCopy& c : copies) {
      if (c.group != g) continue;
      pairs.push_back(c.src_block);
      pairs.push_back(c.dst_block);
      written.push_back(static_cast<int64_t>(c.dst_block) * config.block_size);
    }
    if (pairs.empty()) continue;
    PAGEDKV_RETURN_IF_ERROR(order_block_reuse(r, g, written.data(), written.size()));
    std::vector<int32_t> sources;  // a source a restore is still writing
    for (size_t i = 0; i < pairs.size(); i += 2) sources.push_back(pairs[i]);
    PAGEDKV_RETURN_IF_ERROR(order_block_use(r, g, sources.data(), sources.size()));
    PAGEDKV_ASSIGN_OR_RETURN(runtime::UploadLease up, r.uploads->upload({part(pairs)}));
    CopyBlocksArgs args;
    args.pairs = up.device<int32_t>(0);
    args.index_type = IndexType::kInt32;
    args.num_pairs = static_cast<int64_t>(written.size());
    const int32_t rank = static_cast<int32_t>(&r - ranks.data());
    PAGEDKV_RETURN_IF_ERROR(copy_blocks(*r.backend, device_pool(g, rank), args, r.compute));
  }
  return ok_status();
}

void KvCache::Impl::note_transfers(const Transfers& t, const Submitted& sub) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (sub.tickets[i] == 0) continue;
    for (const std::vector<SequenceId>* ids : {&t.offloaded, &t.restored}) {
      for (SequenceId id : *ids) ranks[i].last_job[id] = sub.tickets[i];
    }
  }
}

Status KvCache::Impl::recover(const Status& failure, core::TierPlan& plan, const Submitted& sub) {
  // What was queued runs to completion first: the undo then copies bytes back over it. Each
  // step is tried twice: a transient error (or a second injected fault) gets one more chance
  // before the cache gives up on its blocks.
  auto twice = [](const auto& step) {
    Status st = step();
    return st.ok() ? st : step();
  };
  Status repair = ok_status();
  for (Rank& r : ranks) {
    if (repair.ok()) repair = twice([&] { return r.backend->synchronize_stream(r.compute); });
    if (repair.ok()) repair = twice([&] { return r.transfers->synchronize(); });
  }
  // Ranks are run in order, so the first queued the most moves; each copies back its own.
  const int64_t most_done =
      sub.moves_done.empty() ? 0 : *std::max_element(sub.moves_done.begin(), sub.moves_done.end());
  std::vector<int32_t> inverts;
  const std::vector<BlockMove> inverse = plan.undo(most_done, &inverts);
  for (size_t i = 0; i < ranks.size() && repair.ok(); ++i) {
    Rank& r = ranks[i];
    std::vector<BlockMove> mine;
    for (size_t m = 0; m < inverse.size(); ++m) {
      if (inverts[m] < sub.moves_done[i]) mine.push_back(inverse[m]);
    }
    if (mine.empty()) continue;
    size_t copied_back = 0;  // a failed attempt still runs the moves it queued: resume after them
    repair = twice([&]() -> Status {
      const std::vector<BlockMove> rest(mine.begin() + static_cast<std::ptrdiff_t>(copied_back),
                                        mine.end());
      int64_t queued = 0;
      const Status st = r.transfers->submit(rest, r.compute, &queued).status();
      copied_back += static_cast<size_t>(queued);
      return st;
    });
    if (repair.ok()) repair = twice([&] { return r.transfers->synchronize(); });
  }
  if (!repair.ok()) {
    broken = internal_error("the cache is unusable: after \"" + failure.message() +
                            "\" its blocks could not be put back: " + repair.message());
    detail::logger().error("KvCache: {}", broken.message());
    return broken;
  }
  return Status(failure.code(), failure.message() + " (nothing changed)");
}

Status KvCache::Impl::order_block_reuse(Rank& r, int32_t g, const int64_t* slots, size_t n) {
  return r.transfers->order_block_reuse(g, slots, n, config.block_size, r.compute);
}

Status KvCache::Impl::order_block_use(Rank& r, int32_t g, const int32_t* blocks, size_t n) {
  return r.transfers->order_block_use(g, blocks, n, r.compute);
}

}  // namespace pagedkv
