// The two forms of the tier-moving calls (plain: kept at once; plan_*: an open TierPlan), the
// guard that refuses every mutating call while a plan is open, and the slot queries through
// which the runtime reads a reservation from its only owner, the sequence table.
#include <string>

#include "core/control_plane.hpp"
#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

namespace {

void clear_transfers(Transfers* t) {
  t->moves.clear();
  t->copies.clear();
  t->offloaded.clear();
  t->restored.clear();
  t->evicted.clear();
  t->host_drops.clear();
}

}  // namespace

Status ControlPlane::check_no_open_plan(const char* what) const {
  if (!journal_.open) return ok_status();
  return failed_precondition(std::string(what) +
                             ": a tier plan is open; commit or undo it before any other call");
}

// ---------------------------------------------------------------- plain form: kept at once

Status ControlPlane::reserve_into(SequenceId id, int64_t n, ReserveResult* out) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("reserve"));
  const Status st = run_reserve(id, n, out);
  close_journal();
  return st;
}

Status ControlPlane::reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each,
                                   ReserveResult* out) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("reserve_batch"));
  const Status st = run_reserve_batch(ids, n_each, out);
  close_journal();
  return st;
}

// The plain form of a call that returns only transfers: run it, keep it.
template <typename Run>
StatusOr<Transfers> ControlPlane::keep_at_once(const char* what, Run run) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan(what));
  Transfers out;
  const Status st = run(&out);
  close_journal();
  PAGEDKV_RETURN_IF_ERROR(st);
  return out;
}

StatusOr<Transfers> ControlPlane::offload(SequenceId id) {
  return keep_at_once("offload", [&](Transfers* out) { return run_offload(id, out); });
}

StatusOr<Transfers> ControlPlane::restore(SequenceId id) {
  return keep_at_once("restore", [&](Transfers* out) { return run_restore(id, out); });
}

StatusOr<Transfers> ControlPlane::prefetch(const std::vector<SequenceId>& ids) {
  return keep_at_once("prefetch", [&](Transfers* out) { return run_prefetch(ids, out); });
}

// ---------------------------------------------------------------- plan form

void ControlPlane::reset_plan_result() {
  clear_transfers(&plan_result_.transfers);
  plan_result_.slots.clear();
}

StatusOr<TierPlan> ControlPlane::open_plan(const Status& st) {
  if (!st.ok()) {
    close_journal();  // nothing changed: the call failed before applying anything
    return st;
  }
  return TierPlan(this);
}

StatusOr<TierPlan> ControlPlane::plan_reserve(SequenceId id, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("reserve"));
  reset_plan_result();
  return open_plan(run_reserve(id, n, &plan_result_));
}

StatusOr<TierPlan> ControlPlane::plan_reserve_batch(const std::vector<SequenceId>& ids,
                                                    int64_t n_each) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("reserve_batch"));
  reset_plan_result();
  return open_plan(run_reserve_batch(ids, n_each, &plan_result_));
}

StatusOr<TierPlan> ControlPlane::plan_offload(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("offload"));
  reset_plan_result();
  return open_plan(run_offload(id, &plan_result_.transfers));
}

StatusOr<TierPlan> ControlPlane::plan_restore(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("restore"));
  reset_plan_result();
  return open_plan(run_restore(id, &plan_result_.transfers));
}

StatusOr<TierPlan> ControlPlane::plan_prefetch(const std::vector<SequenceId>& ids) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("prefetch"));
  reset_plan_result();
  return open_plan(run_prefetch(ids, &plan_result_.transfers));
}

// ---------------------------------------------------------------- slots

StatusOr<int64_t> ControlPlane::slot(SequenceId id, int64_t position) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  const int64_t end = s->length() + s->pending;
  if (position < 0 || position >= end) {
    return out_of_range("slot: position " + std::to_string(position) + " of sequence " +
                        std::to_string(id) + " is outside its " + std::to_string(end) +
                        " committed and reserved positions");
  }
  const LogicalId id_at = s->blocks[static_cast<size_t>(bdiv_.div(position))];
  if (id_at == kNoBlock) {
    return out_of_range("slot: position " + std::to_string(position) + " of sequence " +
                        std::to_string(id) + " fell out of the sliding window (" +
                        std::to_string(window_) + " tokens)");
  }
  const BlockInfo& b = blocks_[id_at];
  if (s->offloaded || b.tier != Tier::kDevice) {
    return failed_precondition("slot: sequence " + std::to_string(id) +
                               " is offloaded: restore it (or reserve again) first");
  }
  return static_cast<int64_t>(b.phys) * block_size_ + bdiv_.mod(position);
}

Status ControlPlane::reserved_slots(SequenceId id, std::vector<int64_t>* out) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (s->pending > 0 && s->offloaded) {
    return failed_precondition("sequence " + std::to_string(id) +
                               " is offloaded: restore it (or reserve again) before writing");
  }
  const int64_t len = s->length();
  for (int64_t p = len; p < len + s->pending; ++p) {
    const BlockInfo& b = blocks_[s->blocks[static_cast<size_t>(bdiv_.div(p))]];
    out->push_back(static_cast<int64_t>(b.phys) * block_size_ + bdiv_.mod(p));
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
