// The sequence calls that move no block between tiers: adding a sequence (with its prefix
// hit), committing reserved tokens (which registers full blocks in the prefix index), rollback,
// fork, finish, erase, the active set and priorities.
#include <algorithm>
#include <string>

#include "core/control_plane.hpp"
#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

int64_t ControlPlane::match_prefix(const std::vector<TokenId>& prompt, NamespaceId ns, int64_t cap,
                                   std::vector<LogicalId>* blocks) const {
  if (blocks != nullptr) blocks->clear();
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (!config_.enable_prefix_caching || len == 0 || cap == 0) return 0;
  cap = std::min(cap, len);  // a caller's bound may be anything up to INT64_MAX
  // Cached blocks in either tier, block by block from the start (and no further than `cap`
  // needs). Full attention follows the tree and stops at the first miss; a window cache's flat
  // nodes are looked up by the chained hash of the tokens before them, misses and all.
  const int64_t full = std::min(len, cap + block_size_ - 1) / block_size_;
  std::vector<LogicalId> local;  // without `blocks`, the blocks found are only counted
  std::vector<LogicalId>& found = blocks != nullptr ? *blocks : local;
  found.reserve(static_cast<size_t>(full));
  if (window_ == 0) {
    index_.match(ns, prompt.data(), full, &found);
  } else {
    uint64_t hash = PrefixIndex::root_hash(ns);
    for (int64_t i = 0; i < full; ++i) {
      const TokenId* t = &prompt[static_cast<size_t>(i * block_size_)];
      const NodeId n = index_.find_flat(hash, ns, t);
      found.push_back(n < 0 ? kNoBlock : index_.node(n).block);
      hash = index_.chain_hash(hash, t);
    }
  }
  // Candidates, longest first: k whole blocks, or one token short of the prompt when the prompt
  // is all whole blocks (that block is then copied on write). A candidate is usable when every
  // block its next token attends to is cached: all of them, or the window's.
  for (int64_t k = static_cast<int64_t>(found.size()); k > 0; --k) {
    const int64_t c = std::min(k * block_size_, len - 1);
    if (c > cap || c == 0) continue;
    const size_t first = window_first_block(c);
    const size_t end = static_cast<size_t>(bdiv_.ceil_div(c));
    bool usable = true;
    for (size_t i = first; i < end && usable; ++i) usable = found[i] != kNoBlock;
    if (!usable || (!groups_.empty() && !groups_.cover(found, c))) continue;
    found.resize(end);
    std::fill(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(first), kNoBlock);
    return c;
  }
  found.clear();
  return 0;
}

namespace {

Status check_prompt(const std::vector<TokenId>& prompt, int64_t max_cached,
                    const CacheConfig& config) {
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (len > config.max_sequence_length) {
    return out_of_range("prompt of " + std::to_string(len) +
                        " tokens exceeds max_sequence_length " +
                        std::to_string(config.max_sequence_length));
  }
  if (max_cached < -1) {
    return invalid_argument("max_cached must be >= 0 (or -1: no bound), got " +
                            std::to_string(max_cached));
  }
  return ok_status();
}

}  // namespace

StatusOr<int64_t> ControlPlane::cached_prefix(const std::vector<TokenId>& prompt, NamespaceId ns,
                                              int64_t max_cached) const {
  PAGEDKV_RETURN_IF_ERROR(check_prompt(prompt, max_cached, config_));
  const int64_t cap = max_cached < 0 ? static_cast<int64_t>(prompt.size()) : max_cached;
  return match_prefix(prompt, ns, cap, nullptr);
}

StatusOr<int64_t> ControlPlane::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                             const SequenceOptions& options) {
  return add_sequence(id, prompt, options, -1);
}

StatusOr<int64_t> ControlPlane::add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                             const SequenceOptions& options, int64_t max_cached) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("add_sequence"));
  if (seqs_.find(id) != nullptr) return already_exists(seq_name(id) + " already exists");
  PAGEDKV_RETURN_IF_ERROR(validate_options(options));
  PAGEDKV_RETURN_IF_ERROR(check_prompt(prompt, max_cached, config_));
  const int64_t len = static_cast<int64_t>(prompt.size());
  // Host-resident blocks make the sequence offloaded: its first reserve (or a restore/prefetch)
  // onboards them before any use.
  std::vector<LogicalId> matched;
  const int64_t cached =
      match_prefix(prompt, options.ns, max_cached < 0 ? len : max_cached, &matched);

  Sequence* s = seqs_.create(id);
  s->options = options;
  s->tokens.assign(prompt.begin(), prompt.begin() + cached);
  s->blocks = std::move(matched);
  longest_ = std::max(longest_, cached);
  widest_ = std::max(widest_, s->blocks.size());
  const std::vector<LogicalId>& held = s->blocks;
  s->first_live = window_first_block(cached);
  if (!groups_.empty()) {
    groups_.set_first_held(s, cached);
    for (size_t i = 0; i < held.size(); ++i) groups_.hold(*s, i, held[i]);
  }
  bool on_host = false;
  for (size_t i = s->first_live; i < held.size(); ++i) {
    BlockInfo& info = blocks_[held[i]];
    if (info.ref++ == 0) {
      tier(info.tier).remove_cached();
      unlist(held[i]);
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

Status ControlPlane::commit(SequenceId id, const TokenId* tokens, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("commit"));
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (n < 0) return invalid_argument("commit: n must be >= 0");
  if (n > 0 && tokens == nullptr) return invalid_argument("commit: tokens is null");
  // The key of the block this commit fills lands in a random hash slot: a miss in a large index
  // that the checks and the append can hide.
  KeyHash first;
  const bool hashed = config_.enable_prefix_caching && prefetch_first_fill(*s, tokens, n, &first);
  PAGEDKV_RETURN_IF_ERROR(check_commit_count(*s, n, "commit"));
  if (s->offloaded) return failed_precondition("commit: " + seq_name(id) + " is offloaded");
  append_committed(s, tokens, n, hashed ? &first : nullptr);
  return ok_status();
}

Status ControlPlane::check_commit_count(const Sequence& s, int64_t n, const char* what) const {
  if (n <= s.pending) return ok_status();
  return failed_precondition(std::string(what) + ": " + std::to_string(n) + " tokens but only " +
                             std::to_string(s.pending) + " reserved for " + seq_name(s.id));
}

// Inline: the per-id commit() path calls it once per token run.
inline void ControlPlane::append_tokens(Sequence* s, const TokenId* tokens, int64_t n) {
  if (n == 1) {
    s->tokens.push_back(*tokens);  // the decode step's case, without a ranged insert
  } else {
    s->tokens.insert(s->tokens.end(), tokens, tokens + n);
  }
  s->pending -= n;
  longest_ = std::max(longest_, s->length());
  touch(s);
}

void ControlPlane::append_committed(Sequence* s, const TokenId* tokens, int64_t n,
                                    const KeyHash* first) {
  const int64_t old_len = s->length();
  append_tokens(s, tokens, n);
  if (config_.enable_prefix_caching) {
    const int64_t new_len = old_len + n;
    const int64_t first_block = bdiv_.div(old_len);
    for (int64_t i = first_block; (i + 1) * block_size_ <= new_len; ++i) {
      register_full_block(s, static_cast<size_t>(i), i == first_block ? first : nullptr);
    }
  }
  // The groups first: their windows are no wider than the owner's, so the blocks the owner
  // releases hold no page of theirs by then.
  if (!groups_.empty()) counters_.window_released_blocks += groups_.trim_windows(s);
  if (window_ > 0) trim_window(s);
}

// Inlined into commit_batch's row loop: it runs once per row of every step.
[[gnu::always_inline]] inline bool ControlPlane::window_moved(const Sequence& s) const {
  const int64_t len = s.length();
  bool moved = window_first_block(len) > s.first_live;
  for (const GroupPages& g : groups_) {
    moved |= g.first_block(len) > g.first_held(s);
  }
  return moved;
}

Status ControlPlane::commit_batch(const std::vector<SequenceId>& ids, const TokenId* tokens,
                                  int64_t n_each) {
  PAGEDKV_RETURN_IF_ERROR(check_commit_batch(ids, tokens, n_each));
  // check_commit_batch resolved `ids`; nothing below can fail.
  // Each row appends to its own token array, a line the rest of the step has pushed out of the
  // cache: fetch a few rows ahead, the record first, then (once it has arrived) that line.
  // A row's commit is the append plus, now and then, the indexing of the blocks it filled
  // (whose new keys land in random hash slots) and the trims of the windows it moved: those are
  // done after all appends, row by row in row order as commit() per id would (the same events
  // and outcome: the appends touch nothing they read), each prefetching the next one's data.
  const bool index = config_.enable_prefix_caching;
  const bool windows = window_ > 0 || !groups_.empty();
  filled_.clear();
  const size_t rows = resolved_.size();
  for (size_t i = 0; i < rows; ++i) {
    if (i + 32 < rows) __builtin_prefetch(resolved_[i + 32]);
    if (i + 16 < rows) {
      const std::vector<TokenId>& t = resolved_[i + 16]->tokens;
      __builtin_prefetch(t.data() + t.size(), 1);
    }
    Sequence* s = resolved_[i];
    const int64_t old_len = s->length();
    append_tokens(s, tokens + static_cast<int64_t>(i) * n_each, n_each);
    const int64_t new_len = old_len + n_each;
    if (index) {
      for (int64_t b = bdiv_.div(old_len); (b + 1) * block_size_ <= new_len; ++b) {
        filled_.emplace_back(s, static_cast<size_t>(b));
      }
    }
    if (windows && window_moved(*s)) filled_.emplace_back(s, CommitWork::kTrim);
  }
  finish_commits();
  return ok_status();
}

void ControlPlane::finish_commits() {
  // Indexing a filled block reads a chain of records that a large plane has out of the cache
  // (the block before it, that block's index node, the new key's hash slot). hash_ahead()
  // fetches each link for a run of blocks in one pass before the next pass reads it, so the
  // misses of a run overlap instead of queueing one block at a time.
  constexpr size_t kRun = 64;
  const size_t n = filled_.size();
  for (size_t begin = 0; begin < n; begin += kRun) {
    const size_t end = std::min(n, begin + kRun);
    if (config_.enable_prefix_caching) hash_ahead(begin, end);
    for (size_t k = begin; k < end; ++k) {
      const CommitWork& w = filled_[k];
      if (k + 1 < n && filled_[k + 1].index == CommitWork::kTrim) prefetch_trim(*filled_[k + 1].s);
      if (w.index == CommitWork::kTrim) {
        if (!groups_.empty()) counters_.window_released_blocks += groups_.trim_windows(w.s);
        if (window_ > 0) trim_window(w.s);  // after the groups' (commit())
      } else {
        register_full_block(w.s, w.index, w.hashed ? &w.key : nullptr);
      }
    }
  }
  filled_.clear();  // no pointer outlives the call
}

void ControlPlane::hash_ahead(size_t begin, size_t end) {
  // The block before each one to index (its parent's block), and the ids to hash.
  for (size_t k = begin; k < end; ++k) {
    const CommitWork& w = filled_[k];
    if (w.index == CommitWork::kTrim) continue;
    const Sequence& s = *w.s;
    __builtin_prefetch(&s.tokens[w.index * static_cast<size_t>(block_size_)]);
    if (w.index > 0 && s.blocks[w.index - 1] != kNoBlock) {
      __builtin_prefetch(&blocks_[s.blocks[w.index - 1]]);
    }
  }
  // The parent's index node, which holds the prefix's hash.
  for (size_t k = begin; k < end; ++k) {
    const CommitWork& w = filled_[k];
    if (w.index == CommitWork::kTrim || w.index == 0) continue;
    const LogicalId before = w.s->blocks[w.index - 1];
    if (before != kNoBlock && blocks_[before].node >= 0) index_.prefetch_node(blocks_[before].node);
  }
  // The key's hash, and its slot. A block whose parent is filled in this run too (a row that
  // fills several) is not indexed yet: register_full_block hashes it then.
  for (size_t k = begin; k < end; ++k) {
    CommitWork& w = filled_[k];
    if (w.index == CommitWork::kTrim) continue;
    const Sequence& s = *w.s;
    NodeId parent = kRootNode;
    if (!key_parent(s, w.index, &parent)) continue;
    w.key.parent_hash = index_.prefix_hash(parent, s.options.ns);
    w.key.hash =
        index_.chain_hash(w.key.parent_hash, &s.tokens[w.index * static_cast<size_t>(block_size_)]);
    w.hashed = true;
    index_.prefetch_hash(w.key.hash);
  }
}

void ControlPlane::prefetch_trim(const Sequence& s) const {
  // The records of the first block leaving a window: the block's and its pages'.
  size_t i = window_ > 0 ? s.first_live : SIZE_MAX;
  if (!groups_.empty()) i = std::min<size_t>(i, groups_[0].first_held(s));
  if (i < s.blocks.size() && s.blocks[i] != kNoBlock) {
    const LogicalId b = s.blocks[i];
    __builtin_prefetch(&blocks_[b]);
    for (const GroupPages& g : groups_) g.prefetch(b);
  }
}

bool ControlPlane::prefetch_first_fill(const Sequence& s, const TokenId* tokens, int64_t n,
                                       KeyHash* key) const {
  const int64_t len = s.length();
  const int64_t i = bdiv_.div(len);
  // Only a block the argument fills from its start (a prompt's, or a block-sized commit); the
  // block must be reserved (else the commit is refused) and not yet indexed.
  if (i * block_size_ != len || n < block_size_ || static_cast<size_t>(i) >= s.blocks.size()) {
    return false;
  }
  const LogicalId ours = s.blocks[static_cast<size_t>(i)];
  if (ours == kNoBlock || blocks_[ours].node >= 0) return false;
  NodeId parent = kRootNode;
  if (!key_parent(s, static_cast<size_t>(i), &parent)) return false;
  key->parent_hash = index_.prefix_hash(parent, s.options.ns);
  key->hash = index_.chain_hash(key->parent_hash, tokens);
  index_.prefetch_hash(key->hash);
  return true;
}

Status ControlPlane::check_commit_batch(const std::vector<SequenceId>& ids, const TokenId* tokens,
                                        int64_t n_each) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("commit_batch"));
  if (n_each < 0) return invalid_argument("commit_batch: n_each must be >= 0");
  if (n_each > 0 && !ids.empty() && tokens == nullptr) {
    return invalid_argument("commit_batch: tokens is null");
  }
  // A decode step commits the batch reserve_batch and build_batch resolved: the memo skips the
  // id lookups (and the duplicate check it already passed).
  PAGEDKV_RETURN_IF_ERROR(resolve(ids, /*check_offloaded=*/false, "commit_batch"));
  const size_t rows = resolved_.size();
  // The usual case first, in a light pass; the first refused member is found again below.
  bool refused = false;
  for (size_t i = 0; i < rows; ++i) {
    if (i + 8 < rows) __builtin_prefetch(&resolved_[i + 8]->pending);
    const Sequence* s = resolved_[i];
    refused |= (s->pending < n_each) | s->offloaded;
  }
  if (!refused) return ok_status();
  for (size_t i = 0; i < rows; ++i) {  // in commit()'s order of checks
    const Sequence* s = resolved_[i];
    PAGEDKV_RETURN_IF_ERROR(check_commit_count(*s, n_each, "commit_batch"));
    if (s->offloaded) {
      return failed_precondition("commit_batch: " + seq_name(s->id) + " is offloaded");
    }
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
  if (length > 0 && window_first_block(length) < s->first_live) {
    return failed_precondition(
        "rollback: " + seq_name(id) + " no longer holds the tokens before " +
        std::to_string(static_cast<int64_t>(s->first_live) * block_size_) +
        " (they fell out of the sliding window); the shortest length it "
        "can roll back to is " +
        std::to_string(static_cast<int64_t>(s->first_live) * block_size_ + window_) + " (or 0)");
  }
  if (!groups_.empty()) PAGEDKV_RETURN_IF_ERROR(groups_.check_rollback(*s, length));
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
  c->first_live = std::min(p->first_live, keep);
  for (LogicalId b : c->live_blocks()) ++blocks_[b].ref;  // held by the parent: never 0 -> 1
  for (size_t w = 0; w < groups_.size(); ++w) {
    const GroupPages& g = groups_[w];
    g.set_first_held(c, std::min(g.first_held(*p), keep));
  }
  for (size_t i = 0; i < c->blocks.size(); ++i) {
    if (!groups_.empty()) groups_.hold(*c, i, c->blocks[i]);
  }
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
    if (b == kNoBlock || !blocks_.live(b)) continue;
    const BlockInfo& info = blocks_[b];
    if (info.ref != 0 || info.node < 0 || index_.node(info.node).children != 0) continue;
    unlist(b);
    tier(info.tier).remove_cached();
    remove_node(info.node);
    release_logical(b);
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

}  // namespace core
}  // namespace pagedkv
