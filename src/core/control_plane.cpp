#include "core/control_plane.hpp"

#include <algorithm>
#include <chrono>
#include <string>

namespace pagedkv {
namespace core {

namespace {

std::string seq_name(SequenceId id) { return "sequence " + std::to_string(id); }

Status unknown(SequenceId id) { return not_found(seq_name(id) + " does not exist"); }

int64_t default_clock() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::create(const CacheConfig& config,
                                                             ControlOptions options) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (config.mode != CacheMode::kPaged) {
    return invalid_argument("mode: ControlPlane is the paged control plane; use DenseAllocator");
  }
  if (options.event_capacity == 0) {
    return invalid_argument("event_capacity must be >= 1 (set enable_events = false for none)");
  }
  return std::unique_ptr<ControlPlane>(new ControlPlane(config, std::move(options)));
}

ControlPlane::ControlPlane(const CacheConfig& config, ControlOptions options)
    : config_(config),
      clock_(options.clock ? std::move(options.clock) : Clock(default_clock)),
      events_enabled_(options.enable_events),
      block_size_(config.block_size),
      bdiv_(config.block_size),
      blocks_(config.num_device_blocks, config.num_host_blocks),
      index_(config.block_size, config.num_device_blocks + config.num_host_blocks),
      evictq_(&blocks_, Tier::kDevice),
      host_lru_(&blocks_, Tier::kHost),
      batch_(config.block_size),
      events_(options.event_capacity) {}

Status ControlPlane::validate_options(const SequenceOptions& o) const {
  if (o.retention_priority < kMinRetentionPriority ||
      o.retention_priority > kMaxRetentionPriority) {
    return invalid_argument("retention_priority must be in [0, 100], got " +
                            std::to_string(o.retention_priority));
  }
  if (o.retention_duration_ns < 0) return invalid_argument("retention_duration_ns must be >= 0");
  return ok_status();
}

// ---------------------------------------------------------------- block bookkeeping

void ControlPlane::unlist(LogicalId id) {
  if (blocks_[id].listed) queue_of(blocks_[id].tier).erase(id);
}

void ControlPlane::release_block(LogicalId id, const Sequence& owner) {
  BlockInfo& b = blocks_[id];
  if (--b.ref > 0) return;
  b.last_access = ++tick_;
  if (b.node < 0) {
    blocks_.release(id);
    return;
  }
  // A registered block stays cached in its tier for later prompts.
  ++cached_unref_[static_cast<int>(b.tier)];
  b.retention = owner.options.retention_priority;
  b.expiry_ns =
      owner.options.retention_duration_ns > 0 ? now_ns() + owner.options.retention_duration_ns : 0;
  queue_of(b.tier).schedule_expiry(id);
  list_if_evictable(id);
}

void ControlPlane::release_tail(Sequence* s, size_t keep) {
  for (size_t i = s->blocks.size(); i > keep; --i) release_block(s->blocks[i - 1], *s);
  if (s->blocks.size() > keep) {
    s->blocks.resize(keep);
    s->mark_changed(keep);
  }
}

void ControlPlane::remove_node(NodeId node) {
  const PrefixNode& x = index_.node(node);
  const LogicalId id = x.block;
  const NodeId parent = x.parent;
  emit_block_event(EventKind::kBlockRemoved, node);
  if (parent != kRootNode && blocks_[id].tier == Tier::kDevice) {
    --blocks_[index_.node(parent).block].device_children;
  }
  index_.remove(node);
  blocks_[id].node = -1;
  // The parent may now be a leaf (host) or free of device children (device): evictable.
  if (parent != kRootNode) list_if_evictable(index_.node(parent).block);
}

void ControlPlane::register_full_block(Sequence* s, size_t i) {
  const LogicalId ours = s->blocks[i];
  if (blocks_[ours].node >= 0) return;
  NodeId parent = kRootNode;
  if (i > 0) {
    parent = blocks_[s->blocks[i - 1]].node;
    if (parent < 0) return;  // the chain is broken (see dedupe on the host tier below)
  }
  const TokenId* tokens = &s->tokens[i * static_cast<size_t>(block_size_)];
  const NodeId existing = index_.find(parent, s->options.ns, tokens);
  if (existing < 0) {
    blocks_[ours].node = index_.insert(parent, s->options.ns, tokens, ours);
    if (parent != kRootNode) ++blocks_[index_.node(parent).block].device_children;
    emit_block_event(EventKind::kBlockStored, blocks_[ours].node);
    return;
  }
  const LogicalId theirs = index_.node(existing).block;
  // The same prefix was computed elsewhere. On the device: use the cached block and free ours
  // (same tokens, same keys and values), so the index keeps one block per prefix. On the host:
  // keep ours unregistered; the offloaded copy stays the registered one.
  if (blocks_[theirs].tier != Tier::kDevice) return;
  BlockInfo& t = blocks_[theirs];
  if (t.ref++ == 0) {
    --cached_unref_[static_cast<int>(Tier::kDevice)];
    unlist(theirs);
  }
  t.last_access = ++tick_;
  s->blocks[i] = theirs;
  s->mark_changed(i);
  release_block(ours, *s);
}

void ControlPlane::emit_block_event(EventKind kind, NodeId node, Tier tier, bool revocable) {
  if (!events_enabled_) return;
  const PrefixNode& x = index_.node(node);
  ControlEvent e;
  e.kind = kind;
  e.tier = tier;
  e.block_hash = x.hash;
  e.parent_hash = x.parent_hash;
  e.ns = x.ns;
  if (kind == EventKind::kBlockStored) {
    const TokenId* t = index_.tokens(node);
    e.tokens.assign(t, t + block_size_);
  }
  events_.push(std::move(e), revocable);
}

void ControlPlane::emit_sequence_event(EventKind kind, SequenceId id, bool revocable) {
  if (!events_enabled_) return;
  ControlEvent e;
  e.kind = kind;
  e.sequence = id;
  events_.push(std::move(e), revocable);
}

void ControlPlane::update_victim(Sequence* s) {
  if (s->active || s->offloaded) {
    seqs_.clear_victim(s);
    return;
  }
  const uint64_t order =
      config_.eviction_policy == EvictionPolicy::kFifo ? s->arrival : s->last_used;
  seqs_.set_victim(s, SequenceTable::VictimKey(s->options.priority, order, s->id));
}

void ControlPlane::touch(Sequence* s) {
  s->last_used = ++tick_;
  if (s->is_victim && config_.eviction_policy != EvictionPolicy::kFifo) update_victim(s);
}

// ---------------------------------------------------------------- sequences

StatusOr<int64_t> ControlPlane::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                             const SequenceOptions& options) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("add_sequence"));
  if (seqs_.find(id) != nullptr) return already_exists(seq_name(id) + " already exists");
  PAGEDKV_RETURN_IF_ERROR(validate_options(options));
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (len > config_.max_sequence_length) {
    return out_of_range("prompt of " + std::to_string(len) +
                        " tokens exceeds max_sequence_length " +
                        std::to_string(config_.max_sequence_length));
  }
  // Longest match over full blocks in either tier. Host-resident ones make the sequence
  // offloaded: its first reserve (or a restore/prefetch) onboards them before any use.
  std::vector<LogicalId> matched;
  if (config_.enable_prefix_caching) {
    NodeId parent = kRootNode;
    for (int64_t i = 0; (i + 1) * block_size_ <= len; ++i) {
      const NodeId n =
          index_.find(parent, options.ns, &prompt[static_cast<size_t>(i * block_size_)]);
      if (n < 0) break;
      matched.push_back(index_.node(n).block);
      parent = n;
    }
  }
  int64_t cached = static_cast<int64_t>(matched.size()) * block_size_;
  // At least one token is left to compute; its block (if matched) is copied on write.
  if (cached == len && len > 0) cached = len - 1;
  matched.resize(static_cast<size_t>((cached + block_size_ - 1) / block_size_));

  Sequence* s = seqs_.create(id);
  s->options = options;
  s->tokens.assign(prompt.begin(), prompt.begin() + cached);
  s->blocks = matched;
  bool on_host = false;
  for (size_t i = 0; i < matched.size(); ++i) {
    BlockInfo& info = blocks_[matched[i]];
    if (info.ref++ == 0) {
      --cached_unref_[static_cast<int>(info.tier)];
      unlist(matched[i]);
    }
    info.last_access = ++tick_;
    if (info.tier == Tier::kHost) {
      on_host = true;
      // Counted like prefix_hit_blocks: whole blocks of the hit (not a last, partly used one).
      if (static_cast<int64_t>(i + 1) * block_size_ <= cached) ++counters_.prefix_host_hit_blocks;
    }
  }
  if (on_host) {
    s->offloaded = true;
    ++counters_.offloaded_sequences;
  }
  s->arrival = ++tick_;
  s->last_used = s->arrival;
  update_victim(s);

  ++counters_.prefix_queries;
  counters_.prefix_query_tokens += len;
  counters_.prefix_hit_tokens += cached;
  const int64_t hit_blocks = cached / block_size_;
  counters_.prefix_hit_blocks += hit_blocks;
  counters_.prefix_miss_blocks += len / block_size_ - hit_blocks;
  return cached;
}

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
    for (LogicalId b : s.blocks) need.host_blocks += blocks_[b].tier == Tier::kHost ? 1 : 0;
  }
  return need;
}

void ControlPlane::apply_reserve(Sequence* s, int64_t n, const ReserveNeed& need,
                                 ReserveResult* result) {
  // Nothing here can fail: the caller made room for need.device_blocks().
  Transfers& out = result->transfers;
  if (s->offloaded) do_restore(s, &out);
  Journal::SavedSequence& saved = journal_sequence(s);
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
      info.ref = 0;
      journal_release(tail);
      blocks_.release(tail);
    } else {
      deferred_release_.emplace_back(s, tail);
    }
  }
  if (need.cow) {
    const LogicalId src = s->blocks[need.write_block];
    saved.cow_index = static_cast<int32_t>(need.write_block);
    saved.cow_source = src;
    const LogicalId dst = take_device_block(&out);
    out.copies.push_back(BlockCopy{blocks_[src].phys, blocks_[dst].phys});
    s->blocks[need.write_block] = dst;
    s->mark_changed(need.write_block);
    if (blocks_[src].ref > 1) {
      --blocks_[src].ref;  // still held by others: nothing can evict it
      journal_unref(src);
    } else {
      deferred_release_.emplace_back(s, src);
    }
    ++counters_.copy_on_write;
  }
  for (int64_t i = 0; i < need.new_blocks; ++i) s->blocks.push_back(take_device_block(&out));
  s->pending = n;
  touch(s);
  const int64_t len = s->length();
  for (int64_t p = len; p < len + n; ++p) {
    const int64_t phys = blocks_[s->blocks[static_cast<size_t>(bdiv_.div(p))]].phys;
    result->slots.push_back(phys * block_size_ + bdiv_.mod(p));
  }
}

Status ControlPlane::run_reserve(SequenceId id, int64_t n, ReserveResult* result) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (n < 0) return invalid_argument("reserve: n must be >= 0, got " + std::to_string(n));
  PAGEDKV_RETURN_IF_ERROR(check_reserve_length(*s, n));
  const ReserveNeed need = reserve_need(*s, n);
  Plan plan;
  PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(need.device_blocks(), s, &plan));
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
  if (upper > avail) {
    int64_t need = 0;
    for (const Sequence* s : resolved_) need += reserve_need(*s, n_each).device_blocks();
    if (need > avail) {
      Plan plan;
      PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(need, nullptr, &plan, resolved_epoch_));
      apply_plan(plan, &result->transfers);
    }
  }
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
    apply_reserve(s, n_each, reserve_need(*s, n_each), result);
  }
  flush_deferred_releases();
  return ok_status();
}

StatusOr<ReserveResult> ControlPlane::reserve(SequenceId id, int64_t n) {
  ReserveResult result;
  PAGEDKV_RETURN_IF_ERROR(reserve_into(id, n, &result));
  return result;
}

Status ControlPlane::commit(SequenceId id, const TokenId* tokens, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("commit"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (n < 0) return invalid_argument("commit: n must be >= 0");
  if (n > 0 && tokens == nullptr) return invalid_argument("commit: tokens is null");
  if (n > s->pending) {
    return failed_precondition("commit: " + std::to_string(n) + " tokens but only " +
                               std::to_string(s->pending) + " reserved for " + seq_name(id));
  }
  if (s->offloaded) return failed_precondition("commit: " + seq_name(id) + " is offloaded");
  const int64_t old_len = s->length();
  s->tokens.insert(s->tokens.end(), tokens, tokens + n);
  s->pending -= n;
  touch(s);
  if (config_.enable_prefix_caching) {
    const int64_t new_len = old_len + n;
    for (int64_t i = old_len / block_size_; (i + 1) * block_size_ <= new_len; ++i) {
      register_full_block(s, static_cast<size_t>(i));
    }
  }
  return ok_status();
}

Status ControlPlane::commit_batch(const std::vector<SequenceId>& ids, const TokenId* tokens,
                                  int64_t n_each) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("commit_batch"));
  if (n_each < 0) return invalid_argument("commit_batch: n_each must be >= 0");
  if (n_each > 0 && !ids.empty() && tokens == nullptr) {
    return invalid_argument("commit_batch: tokens is null");
  }
  std::vector<SequenceId> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return invalid_argument("commit_batch: ids are not distinct");
  }
  for (SequenceId id : ids) {
    const Sequence* s = seqs_.find(id);
    if (s == nullptr) return unknown(id);
    if (n_each > s->pending) {
      return failed_precondition("commit_batch: " + std::to_string(n_each) + " tokens but only " +
                                 std::to_string(s->pending) + " reserved for " + seq_name(id));
    }
    if (s->offloaded) return failed_precondition("commit_batch: " + seq_name(id) + " is offloaded");
  }
  // Nothing below can fail: commit() checks only what was checked above.
  for (size_t i = 0; i < ids.size(); ++i) {
    const Status st = commit(ids[i], tokens + static_cast<int64_t>(i) * n_each, n_each);
    if (!st.ok()) return internal_error("commit_batch failed after its checks: " + st.message());
  }
  return ok_status();
}

Status ControlPlane::rollback(SequenceId id, int64_t length) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("rollback"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (length < 0 || length > s->length()) {
    return out_of_range("rollback: length " + std::to_string(length) + " outside [0, " +
                        std::to_string(s->length()) + "] for " + seq_name(id));
  }
  s->tokens.resize(static_cast<size_t>(length));
  s->pending = 0;
  release_tail(s, static_cast<size_t>((length + block_size_ - 1) / block_size_));
  s->mark_changed(0);
  touch(s);
  return ok_status();
}

Status ControlPlane::fork(SequenceId parent, SequenceId child) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("fork"));
  Sequence* p = seqs_.find(parent);
  if (p == nullptr) return unknown(parent);
  if (seqs_.find(child) != nullptr) return already_exists(seq_name(child) + " already exists");
  if (p->offloaded) return failed_precondition("fork: " + seq_name(parent) + " is offloaded");
  Sequence* c = seqs_.create(child);
  c->options = p->options;
  c->tokens = p->tokens;
  const size_t keep = static_cast<size_t>((p->length() + block_size_ - 1) / block_size_);
  c->blocks.assign(p->blocks.begin(), p->blocks.begin() + static_cast<std::ptrdiff_t>(keep));
  for (LogicalId b : c->blocks) ++blocks_[b].ref;  // held by the parent: never 0 -> 1
  c->arrival = ++tick_;
  c->last_used = c->arrival;
  update_victim(c);
  return ok_status();
}

Status ControlPlane::finish(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("finish"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (s->active) {
    active_.erase(std::find(active_.begin(), active_.end(), id));
    s->active = false;
  }
  if (s->offloaded) --counters_.offloaded_sequences;
  seqs_.clear_victim(s);
  release_tail(s, 0);
  seqs_.destroy(id);
  return ok_status();
}

Status ControlPlane::erase(SequenceId id) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("erase"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  std::vector<LogicalId> held = s->blocks;
  PAGEDKV_RETURN_IF_ERROR(finish(id));
  // Drop the cached blocks nobody else references, deepest first so each is a leaf in turn.
  for (size_t i = held.size(); i > 0; --i) {
    const LogicalId b = held[i - 1];
    if (!blocks_.live(b)) continue;
    const BlockInfo& info = blocks_[b];
    if (info.ref != 0 || info.node < 0 || index_.node(info.node).children != 0) continue;
    unlist(b);
    --cached_unref_[static_cast<int>(info.tier)];
    remove_node(info.node);
    blocks_.release(b);
  }
  return ok_status();
}

Status ControlPlane::set_active(const std::vector<SequenceId>& ids) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("set_active"));
  for (SequenceId id : ids) {
    if (seqs_.find(id) == nullptr) return unknown(id);
  }
  std::vector<SequenceId> old;
  old.swap(active_);
  for (SequenceId id : old) seqs_.find(id)->active = false;
  for (SequenceId id : ids) {
    Sequence* s = seqs_.find(id);
    if (!s->active) {
      s->active = true;
      active_.push_back(id);
    }
  }
  for (SequenceId id : old) update_victim(seqs_.find(id));
  for (SequenceId id : active_) update_victim(seqs_.find(id));
  return ok_status();
}

Status ControlPlane::set_priority(SequenceId id, int32_t priority) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("set_priority"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  s->options.priority = priority;
  update_victim(s);
  return ok_status();
}

// ---------------------------------------------------------------- tiers

Status ControlPlane::run_offload(SequenceId id, Transfers* out) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  // Without a host tier nothing can move: an "offloaded" sequence whose blocks all stayed on the
  // device (empty, or every block shared) would be refused by build_batch yet read by gathers.
  if (config_.num_host_blocks == 0) {
    return failed_precondition("offload: " + seq_name(id) +
                               ": there is no host tier: num_host_blocks is 0");
  }
  if (s->active) return failed_precondition("offload: " + seq_name(id) + " is active");
  if (s->offloaded) return failed_precondition("offload: " + seq_name(id) + " is offloaded");
  const int64_t e = exclusive_device_blocks(*s);
  if (e > host_room()) {
    return resource_exhausted("offload: " + seq_name(id) + " needs " + std::to_string(e) +
                              " host blocks, " + std::to_string(host_room()) +
                              " free or held by cached blocks");
  }
  begin_journal();
  do_offload(s, out);
  return ok_status();
}

Status ControlPlane::run_restore(SequenceId id, Transfers* out) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (!s->offloaded) return failed_precondition("restore: " + seq_name(id) + " is not offloaded");
  int64_t host_blocks = 0;
  for (LogicalId b : s->blocks) host_blocks += blocks_[b].tier == Tier::kHost ? 1 : 0;
  Plan plan;
  PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(host_blocks, s, &plan));
  begin_journal();
  apply_plan(plan, out);
  do_restore(s, out);
  return ok_status();
}

StatusOr<Residency> ControlPlane::residency(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  Residency r;
  for (LogicalId b : s->blocks) {
    if (blocks_[b].tier == Tier::kDevice) {
      ++r.device_blocks;
    } else {
      ++r.host_blocks;
    }
  }
  r.offloaded = s->offloaded;
  return r;
}

// ---------------------------------------------------------------- queries

StatusOr<std::vector<BlockLocation>> ControlPlane::block_locations(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  std::vector<BlockLocation> out;
  out.reserve(s->blocks.size());
  for (LogicalId b : s->blocks) out.push_back(BlockLocation{blocks_[b].tier, blocks_[b].phys});
  return out;
}

StatusOr<int64_t> ControlPlane::length(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  return s->length();
}

StatusOr<int64_t> ControlPlane::pending(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  return s->pending;
}

Status ControlPlane::resolve(const std::vector<SequenceId>& ids, bool check_offloaded,
                             const char* what) {
  if (resolved_generation_ == seqs_.generation() && ids == resolved_ids_) {
    if (check_offloaded) {
      for (const Sequence* s : resolved_) {
        if (s->offloaded) {
          return failed_precondition(std::string(what) + ": " + seq_name(s->id) + " is offloaded");
        }
      }
    }
    return ok_status();
  }
  resolved_generation_ = ~uint64_t{0};  // invalid until this lookup succeeds
  resolved_.clear();
  const uint64_t epoch = ++batch_epoch_;
  for (SequenceId id : ids) {
    Sequence* s = seqs_.find(id);
    if (s == nullptr) return unknown(id);
    if (check_offloaded && s->offloaded) {
      return failed_precondition(std::string(what) + ": " + seq_name(id) + " is offloaded");
    }
    if (s->batch_mark == epoch)
      return invalid_argument(std::string(what) + ": " + seq_name(id) + " twice");
    s->batch_mark = epoch;
    resolved_.push_back(s);
  }
  resolved_ids_ = ids;
  resolved_epoch_ = epoch;
  resolved_generation_ = seqs_.generation();
  return ok_status();
}

StatusOr<const BatchMetadata*> ControlPlane::build_batch(const std::vector<SequenceId>& ids,
                                                         const BatchOptions& options) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("build_batch"));
  PAGEDKV_RETURN_IF_ERROR(resolve(ids, /*check_offloaded=*/true, "batch"));
  PAGEDKV_RETURN_IF_ERROR(batch_.build(resolved_, blocks_, options));
  return &batch_.metadata();
}

ControlStats ControlPlane::stats() const {
  ControlStats st = counters_;
  st.events_dropped = events_.dropped_total();
  const int64_t bb = config_.block_bytes();
  TierStats* tiers[kNumTiers] = {&st.device, &st.host};
  for (int t = 0; t < kNumTiers; ++t) {
    TierStats& x = *tiers[t];
    const Tier tier = static_cast<Tier>(t);
    x.total_blocks = blocks_.capacity(tier);
    x.free_blocks = blocks_.free_count(tier);
    x.cached_blocks = cached_unref_[t];
    x.used_blocks = x.total_blocks - x.free_blocks - x.cached_blocks;
    x.total_bytes = x.total_blocks * bb;
    x.used_bytes = (x.total_blocks - x.free_blocks) * bb;
  }
  st.sequences = seqs_.size();
  st.active_sequences = static_cast<int64_t>(active_.size());
  return st;
}

std::vector<ControlEvent> ControlPlane::drain_events() { return events_.drain(); }

}  // namespace core
}  // namespace pagedkv
