// Reserving slots: what a reserve needs (new blocks, a copy-on-write, a restore), checked and
// planned before anything changes, then applied. reserve_batch is the decode step's form: one
// bound for the whole batch, and the planner frees room for all members at once.
#include <algorithm>
#include <string>

#include "core/control_plane.hpp"
#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

Status ControlPlane::check_reserve_length(const Sequence& s, int64_t n) const {
  const int64_t len = s.length();
  // Written as a difference: len + n overflows int64 for a huge caller-supplied n (tests/fuzz).
  if (n > config_.max_sequence_length - len) {
    return out_of_range("reserve: " + seq_name(s.id) + " has " + std::to_string(len) + " tokens; " +
                        std::to_string(n) + " more would pass max_sequence_length " +
                        std::to_string(config_.max_sequence_length));
  }
  return ok_status();
}

ControlPlane::ReserveNeed ControlPlane::reserve_need(const Sequence& s, int64_t n) const {
  ReserveNeed need;
  const int64_t len = s.length();
  need.need_total = static_cast<size_t>(bdiv_.ceil_div(len + n));
  const size_t cur = s.blocks.size();
  need.write_block = static_cast<size_t>(bdiv_.div(len));
  if (n > 0 && need.write_block < cur) {
    const BlockInfo& b = blocks_[s.blocks[need.write_block]];
    need.cow = b.ref > 1 || b.node >= 0;
  }
  need.new_blocks = need.need_total > cur ? static_cast<int64_t>(need.need_total - cur) : 0;
  if (s.offloaded) {
    for (LogicalId b : s.live_blocks()) need.host_blocks += blocks_[b].tier == Tier::kHost ? 1 : 0;
  }
  return need;
}

void ControlPlane::apply_reserve(Sequence* s, int64_t n, const ReserveNeed& need,
                                 ReserveResult* result) {
  // Nothing here can fail: the caller made room for need.device_blocks().
  Transfers& out = result->transfers;
  if (s->offloaded) do_restore(s, &out);
  Journal::SavedSequence& saved = journal_.sequence(*s);
  // A copy-on-write source that only this sequence holds loses the reference at the end of the
  // call (flush_deferred_releases), so that no later allocation of the call evicts and reuses
  // it while the copy is pending.
  // The blocks of an earlier, longer reservation hold no committed token: free them now.
  while (s->blocks.size() > need.need_total) {
    const LogicalId tail = s->blocks.back();
    if (saved.tail_size++ == 0) saved.tail_begin = static_cast<uint32_t>(journal_.tails.size());
    journal_.tails.push_back(tail);
    s->blocks.pop_back();
    s->mark_changed(s->blocks.size());
    BlockInfo& info = blocks_[tail];
    if (info.ref == 1 && info.node < 0) {
      if (!groups_.empty()) groups_.drop(*s, s->blocks.size(), tail, /*undoable=*/true);
      info.ref = 0;
      journal_.release(tail, blocks_[tail]);
      release_logical(tail);
    } else {
      deferred_release_.push_back(DeferredRelease{s, tail, s->blocks.size(), false});
    }
  }
  if (need.cow) {
    const LogicalId src = s->blocks[need.write_block];
    saved.cow_index = static_cast<int32_t>(need.write_block);
    saved.cow_source = src;
    const LogicalId dst = take_device_block(&out);
    out.copies.push_back(BlockCopy{blocks_[src].phys, blocks_[dst].phys, full_group_});
    if (!groups_.empty()) groups_.copy(src, dst, &out);
    s->blocks[need.write_block] = dst;
    s->mark_changed(need.write_block);
    if (blocks_[src].ref > 1) {
      --blocks_[src].ref;  // still held by others: nothing can evict it
      journal_.unref(src);
      // Its window groups' pages may have no other holder: they go at the end of the call.
      if (!groups_.empty()) {
        deferred_release_.push_back(DeferredRelease{s, src, need.write_block, true});
      }
    } else {
      deferred_release_.push_back(DeferredRelease{s, src, need.write_block, false});
    }
    ++counters_.copy_on_write;
  }
  for (int64_t i = 0; i < need.new_blocks; ++i) s->blocks.push_back(take_device_block(&out));
  widest_ = std::max(widest_, s->blocks.size());
  s->pending = n;
  touch(s);
  const int64_t len = s->length();
  for (int64_t p = len; p < len + n; ++p) {
    const int64_t phys = blocks_[s->blocks[static_cast<size_t>(bdiv_.div(p))]].phys;
    result->slots.push_back(phys * block_size_ + bdiv_.mod(p));
  }
}

bool ControlPlane::apply_reserve_plain(Sequence* s, int64_t n, ReserveResult* result) {
  const int64_t len = s->length();
  const size_t cur = s->blocks.size();
  const size_t need_total = static_cast<size_t>(bdiv_.ceil_div(len + n));
  const size_t write_block = static_cast<size_t>(bdiv_.div(len));
  if (s->offloaded || cur > need_total) return false;
  if (n > 0 && write_block < cur) {
    const BlockInfo& b = blocks_[s->blocks[write_block]];
    if (b.ref > 1 || b.node >= 0) return false;
  }
  // From here on as apply_reserve() with nothing to restore, drop or copy.
  journal_.sequence(*s);
  if (need_total > cur) {
    for (size_t i = cur; i < need_total; ++i) {
      s->blocks.push_back(take_device_block(&result->transfers));
    }
    widest_ = std::max(widest_, need_total);
  }
  s->pending = n;
  touch(s);
  for (int64_t p = len; p < len + n; ++p) {
    const int64_t phys = blocks_[s->blocks[static_cast<size_t>(bdiv_.div(p))]].phys;
    result->slots.push_back(phys * block_size_ + bdiv_.mod(p));
  }
  return true;
}

bool ControlPlane::batch_surely_fits(size_t rows, int64_t n_each) const {
  if (counters_.offloaded_sequences != 0) return false;
  if (longest_ > config_.max_sequence_length - n_each) return false;
  // A member takes at most one block per block_size tokens it begins (its table covers its
  // committed tokens already) and one copy-on-write; with windows as many pages in each.
  const int64_t worst = bdiv_.ceil_div(n_each) + 1;
  const int64_t n = static_cast<int64_t>(rows);
  if (n == 0) return true;
  if (worst > device_available() / n) return false;
  for (const GroupPages& g : groups_) {
    if (worst > g.room() / n) return false;
  }
  return true;
}

Status ControlPlane::run_reserve(SequenceId id, int64_t n, ReserveResult* result) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (n < 0) return invalid_argument("reserve: n must be >= 0, got " + std::to_string(n));
  PAGEDKV_RETURN_IF_ERROR(check_reserve_length(*s, n));
  const ReserveNeed need = reserve_need(*s, n);
  VictimPlan plan;
  PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(need.device_blocks(), s, &plan));
  if (!groups_.empty()) {
    std::vector<int64_t> pages(groups_.size(), 0);
    groups_.add_need(*s, need.new_blocks + (need.cow ? 1 : 0), &pages);
    PAGEDKV_RETURN_IF_ERROR(plan_group_pages(pages, s, &plan));
  }
  begin_journal();
  apply_plan(plan, &result->transfers);
  apply_reserve(s, n, need, result);
  flush_deferred_releases();
  return ok_status();
}

Status ControlPlane::run_reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each,
                                       ReserveResult* result) {
  PAGEDKV_RETURN_IF_ERROR(resolve(ids, /*check_offloaded=*/false, "reserve_batch"));
  if (n_each < 0) {
    return invalid_argument("reserve_batch: n_each must be >= 0, got " + std::to_string(n_each));
  }
  const size_t rows = resolved_.size();
  if (batch_surely_fits(rows, n_each)) {
    // The decode step's usual case: no member needs checking, so no pass before the one that
    // applies (same outcome: no plan would take anything).
    begin_journal();
    apply_reserve_rows(n_each, result);
    return ok_status();
  }
  // Pass 1 reads only the sequence records: lengths, and an upper bound of the blocks needed
  // (a copy-on-write is possible whenever the write lands in an existing block). The exact need,
  // which reads every written block's record, is computed only when the bound does not fit.
  int64_t upper = 0;
  const int64_t max_len = config_.max_sequence_length - n_each;
  for (size_t i = 0; i < rows; ++i) {
    if (i + 8 < rows) __builtin_prefetch(resolved_[i + 8]);
    const Sequence& s = *resolved_[i];
    const int64_t len = s.length();
    if (len > max_len) PAGEDKV_RETURN_IF_ERROR(check_reserve_length(s, n_each));
    if (s.offloaded) {
      upper += reserve_need(s, n_each).device_blocks();
      continue;
    }
    const int64_t cur = static_cast<int64_t>(s.blocks.size());
    upper += std::max<int64_t>(bdiv_.ceil_div(len + n_each) - cur, 0) +
             (n_each > 0 && bdiv_.div(len) < cur ? 1 : 0);
  }
  // The need can only overestimate: an earlier member's copy-on-write may unshare a later one's
  // block. With room for it no member's own plan would take anything (the sum of the needs never
  // exceeds what is available), so applying in order equals reserve_into() per id.
  begin_journal();
  const int64_t avail = device_available();
  int64_t need = -1;  // computed when the bound does not fit
  const auto exact_need = [&] {
    if (need < 0) {
      need = 0;
      for (const Sequence* s : resolved_) need += reserve_need(*s, n_each).device_blocks();
    }
    return need;
  };
  VictimPlan plan;
  if (upper > avail && exact_need() > avail) {
    PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(need, nullptr, &plan, resolved_epoch_));
  }
  if (!groups_.empty()) {
    // Every block a member takes (and every held page it restores) is a page in each window
    // group too: `upper` bounds them.
    bool fits = true;
    for (const GroupPages& g : groups_) fits = fits && g.room() >= upper;
    if (!fits) {
      std::vector<int64_t> pages(groups_.size(), 0);
      for (const Sequence* s : resolved_) {
        const ReserveNeed n = reserve_need(*s, n_each);
        groups_.add_need(*s, n.new_blocks + (n.cow ? 1 : 0), &pages);
      }
      PAGEDKV_RETURN_IF_ERROR(plan_group_pages(pages, nullptr, &plan, resolved_epoch_));
    }
  }
  if (!plan.order.empty()) apply_plan(plan, &result->transfers);
  apply_reserve_rows(n_each, result);
  return ok_status();
}

void ControlPlane::apply_reserve_rows(int64_t n_each, ReserveResult* result) {
  const size_t rows = resolved_.size();
  for (size_t i = 0; i < rows; ++i) {
    // The tables and the blocks they write are scattered: fetch a few rows ahead, the table
    // entry first, then (once it has arrived) the block record.
    if (i + 8 < rows) {
      const Sequence& a = *resolved_[i + 8];
      const size_t wb = static_cast<size_t>(bdiv_.div(a.length()));
      if (wb < a.blocks.size()) __builtin_prefetch(&a.blocks[wb]);
    }
    if (i + 4 < rows) {
      const Sequence& a = *resolved_[i + 4];
      const size_t wb = static_cast<size_t>(bdiv_.div(a.length()));
      if (wb < a.blocks.size()) __builtin_prefetch(&blocks_[a.blocks[wb]]);
    }
    Sequence* s = resolved_[i];
    if (!apply_reserve_plain(s, n_each, result)) {
      apply_reserve(s, n_each, reserve_need(*s, n_each), result);
    }
  }
  flush_deferred_releases();
}

StatusOr<ReserveResult> ControlPlane::reserve(SequenceId id, int64_t n) {
  ReserveResult result;
  PAGEDKV_RETURN_IF_ERROR(reserve_into(id, n, &result));
  return result;
}

}  // namespace core
}  // namespace pagedkv
