// Paged mode of SeedKvCache over a KvCache. The seed writes K/V at a position and makes it part
// of the sequence later (advance_sequence); here a write past the written positions extends the
// KvCache reservation, the bytes go straight to the reserved slots, and advance commits them.
// The reservation grows geometrically (KvCache::reserve hands out every pending slot again, so
// growing it one position at a time made an n-token append_token prefill O(n^2)); the slots
// reserved ahead are not written positions and are given back once everything written is
// advanced.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "runtime/seed_cache_impl.hpp"

namespace pagedkv::runtime {
namespace {

std::string seq_name(SequenceId id) { return "sequence " + std::to_string(id); }

class PagedSeedImpl final : public SeedImpl {
 public:
  PagedSeedImpl(const CacheConfig& config, std::unique_ptr<KvCache> cache,
                std::unique_ptr<UploadArena> uploads)
      : config_(config),
        cache_(std::move(cache)),
        uploads_(std::move(uploads)),
        mirror_(cache_->backend(), cache_->compute_stream(), config) {}

  Backend& backend() override { return cache_->backend(); }
  Stream stream() const override { return cache_->compute_stream(); }
  KvCache* paged() override { return cache_.get(); }

  bool contains(SequenceId id) const override { return cache_->contains(id); }
  StatusOr<int64_t> length(SequenceId id) const override { return cache_->length(id); }

  StatusOr<int64_t> allocate(SequenceId id, const std::vector<TokenId>& tokens) override {
    const int64_t cap = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - 1);
    if (cache_->contains(id)) {
      // The seed restores an offloaded sequence when it is allocated again.
      PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, cache_->block_locations(id));
      const bool offloaded = std::any_of(blocks.begin(), blocks.end(), [](const BlockLocation& b) {
        return b.tier == Tier::kHost;
      });
      if (offloaded) PAGEDKV_RETURN_IF_ERROR(restore(id));
      PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
      return std::min(len, cap);
    }
    PAGEDKV_ASSIGN_OR_RETURN(int64_t cached, cache_->add_sequence(id, tokens));
    state_[id] = State{};
    matchable_[id] = cached;
    if (std::find(requested_active_.begin(), requested_active_.end(), id) !=
        requested_active_.end()) {
      PAGEDKV_RETURN_IF_ERROR(apply_active());
    }
    return cached;
  }

  Status write_token(SequenceId id, int32_t layer, int64_t pos, const uint16_t* key,
                     const uint16_t* value, std::optional<TokenId> token) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, written_range(id, pos, 1));
    PAGEDKV_RETURN_IF_ERROR(resident(id));
    PAGEDKV_RETURN_IF_ERROR(extend(id, len, pos + 1));
    State& s = state_[id];
    const size_t row = static_cast<size_t>(config_.num_kv_heads) * config_.head_dim * 2;
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t slot, cache_->slot(id, pos));
    PAGEDKV_ASSIGN_OR_RETURN(UploadLease up,
                             uploads_->upload({{key, row}, {value, row}, {&slot, sizeof(slot)}}));
    WriteKvArgs args;
    args.key = up.device(0);
    args.value = up.device(1);
    args.input_dtype = DType::kFloat16;
    args.num_tokens = 1;
    args.slot_mapping = up.device<int64_t>(2);
    args.layer = layer;
    PAGEDKV_RETURN_IF_ERROR(pagedkv::write_kv(backend(), cache_->device_pool(), args, stream()));
    // The seed records token ids from layer 0 only; so do we.
    if (layer == 0 && token.has_value()) s.tokens[static_cast<size_t>(pos - len)] = *token;
    mirror_.invalidate(id, layer);
    return ok_status();
  }

  Status write_head_range(SequenceId id, int32_t layer, int32_t head, int64_t pos, int64_t n,
                          const uint16_t* key, const uint16_t* value) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, written_range(id, pos, n));
    PAGEDKV_RETURN_IF_ERROR(resident(id));
    PAGEDKV_RETURN_IF_ERROR(extend(id, len, pos + n));
    const size_t bytes = static_cast<size_t>(n) * config_.head_dim * 2;
    ScatterHeadRangeArgs args;
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<int32_t> table, device_table(id));
    PAGEDKV_ASSIGN_OR_RETURN(
        UploadLease up,
        uploads_->upload({{key, bytes}, {value, bytes}, {table.data(), table.size() * 4}}));
    args.key = up.device(0);
    args.value = up.device(1);
    args.block_table = up.device<int32_t>(2);
    args.block_table_len = static_cast<int32_t>(table.size());
    args.input_dtype = DType::kFloat16;
    args.layer = layer;
    args.head_begin = head;
    args.num_heads = 1;
    args.position_begin = pos;
    args.num_tokens = n;
    PAGEDKV_RETURN_IF_ERROR(
        pagedkv::scatter_head_range(backend(), cache_->device_pool(), args, stream()));
    mirror_.invalidate(id, layer);
    return ok_status();
  }

  Status advance(SequenceId id, int64_t delta) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
    State& s = synced(id);
    if (delta < 0 || delta > static_cast<int64_t>(s.tokens.size())) {
      return failed_precondition(seq_name(id) + ": cannot advance by " + std::to_string(delta) +
                                 ", only " + std::to_string(s.tokens.size()) +
                                 " written positions are pending");
    }
    if (delta == 0) return ok_status();
    std::vector<TokenId> tokens(s.tokens.begin(), s.tokens.begin() + delta);
    PAGEDKV_RETURN_IF_ERROR(cache_->commit(id, tokens));
    if (matchable(id, len) == len &&
        std::all_of(tokens.begin(), tokens.end(), [](TokenId t) { return t >= 0; })) {
      matchable_[id] = len + delta;
    }
    s.tokens.erase(s.tokens.begin(), s.tokens.begin() + delta);
    mirror_.invalidate_all(id);
    if (s.tokens.empty() && cache_->pending(id).value_or(0) > 0) {
      // Nothing written is pending: give the slots reserved ahead back (a reserve of none hands
      // out no slot). Best effort: the advance is done; on failure the spare stays reserved.
      (void)cache_->reserve(id, 0);
    }
    return ok_status();
  }

  Status rollback(SequenceId id, int64_t length) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
    if (length < 0 || length > len) {
      return out_of_range(seq_name(id) + ": cannot roll back to " + std::to_string(length) +
                          ", its length is " + std::to_string(len));
    }
    if (length == len) return ok_status();  // the seed keeps pending writes in this case
    PAGEDKV_RETURN_IF_ERROR(cache_->rollback(id, length));
    state_[id] = State{};
    matchable_[id] = std::min(matchable(id, len), length);
    mirror_.invalidate_all(id);
    return ok_status();
  }

  StatusOr<SeedKvView> layer_view(SequenceId id, int32_t layer) override {
    return packed_layer(id, layer);
  }

  StatusOr<SeedKvView> packed_layer(SequenceId id, int32_t layer) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
    if (len == 0) return failed_precondition(seq_name(id) + " is empty: no layer to pack");
    if (auto hit = mirror_.find(id, layer, len)) return *hit;
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, cache_->block_locations(id));
    for (const BlockLocation& b : blocks) {
      if (b.tier != Tier::kDevice) {
        return failed_precondition(seq_name(id) +
                                   " is offloaded: restore_offloaded_sequence first");
      }
    }
    PAGEDKV_ASSIGN_OR_RETURN(SeedKvView view, mirror_.slot(id, layer, len));
    // One gather launch into the reused buffer (seed defect 10: no per-(head, pos) loop).
    PAGEDKV_RETURN_IF_ERROR(cache_->gather_layer(id, layer, const_cast<void*>(view.key),
                                                 const_cast<void*>(view.value), DType::kFloat16,
                                                 PackedLayout::kHeadMajor, 0, len));
    mirror_.mark_valid(id, layer, len);
    return view;
  }

  Status import(SequenceId id, int32_t layer, int64_t length, const uint16_t* key,
                const uint16_t* value) override {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
    State& s = synced(id);
    if (length != len && !s.tokens.empty()) {
      return failed_precondition(seq_name(id) + ": " + std::to_string(s.tokens.size()) +
                                 " written positions are not advanced yet; advance or roll back "
                                 "before changing the length through overwrite_layer");
    }
    // Committed positions rewritten, and those of them in full blocks that other sequences may
    // read (shared through a prefix hit, or cached under real token ids).
    const int64_t keep = std::min(length, len);
    const int64_t bs = config_.block_size;
    const int64_t shared = std::min(keep, matchable(id, len)) / bs * bs;
    if (shared > 0 && !s.tokens.empty()) {
      return failed_precondition(seq_name(id) + ": " + std::to_string(s.tokens.size()) +
                                 " written positions are not advanced yet; advance or roll back "
                                 "before rewriting committed positions");
    }
    if (length > config_.max_sequence_length) {
      return out_of_range(seq_name(id) + ": length " + std::to_string(length) +
                          " exceeds max_sequence_length " +
                          std::to_string(config_.max_sequence_length));
    }
    PAGEDKV_RETURN_IF_ERROR(resident(id));
    int64_t base = len;  // committed positions left in place
    if (shared > 0) {
      PAGEDKV_RETURN_IF_ERROR(rebuild_private(id, layer, keep, length));
      base = 0;
    } else if (length > len) {
      PAGEDKV_RETURN_IF_ERROR(extend(id, len, length));
    } else if (length < len) {
      PAGEDKV_RETURN_IF_ERROR(cache_->rollback(id, length));
      state_[id] = State{};
      matchable_[id] = std::min(matchable(id, len), length);
    }
    if (length > 0) {
      const size_t bytes =
          static_cast<size_t>(config_.num_kv_heads) * length * config_.head_dim * 2;
      PAGEDKV_ASSIGN_OR_RETURN(UploadLease up, uploads_->upload({{key, bytes}, {value, bytes}}));
      // Only this layer's pages are written (seed defect 3: no freeing of the other layers).
      PAGEDKV_RETURN_IF_ERROR(import_packed(id, layer, length, up.device(0), up.device(1)));
    }
    if (length > base) PAGEDKV_RETURN_IF_ERROR(advance(id, length - base));
    if (length != len || shared > 0) {
      mirror_.invalidate_all(id);
    } else {
      mirror_.invalidate(id, layer);
    }
    return ok_status();
  }

  Status remove(SequenceId id) override {
    PAGEDKV_RETURN_IF_ERROR(cache_->finish(id));
    state_.erase(id);
    matchable_.erase(id);
    mirror_.erase(id);
    return ok_status();
  }

  // The seed's active set is a list of ids, allocated or not: keep it, and give the cache the
  // allocated ones (again whenever one of the others is allocated).
  Status set_active(const std::vector<SequenceId>& ids) override {
    std::vector<SequenceId> previous = std::move(requested_active_);
    requested_active_ = ids;
    const Status st = apply_active();
    if (!st.ok()) requested_active_ = std::move(previous);
    return st;
  }
  Status set_priority(SequenceId id, int32_t priority) override {
    return cache_->set_priority(id, priority);
  }

  std::vector<SequenceId> drain_evicted() override {
    std::vector<SequenceId> ids = cache_->drain_evicted_sequences();
    for (SequenceId id : ids) {
      state_.erase(id);
      matchable_.erase(id);
      mirror_.erase(id);
    }
    return ids;
  }

  Status restore(SequenceId id) override {
    // The reservation (and the written positions in it) survives the round trip; only its slots
    // moved, and the next write asks the cache for them.
    return cache_->restore(id);
  }

  SeedKvCacheStats stats() const override {
    const ControlStats c = cache_->stats();
    SeedKvCacheStats s;
    s.mode = CacheMode::kPaged;
    s.bytes_used = c.device.used_bytes;
    s.bytes_capacity = c.device.total_bytes;
    s.blocks_total = c.device.total_blocks;
    s.blocks_free = c.device.free_blocks;
    s.sequences = c.sequences;
    s.evicted_blocks = c.blocks_evicted;
    s.evicted_sequences = c.sequences_evicted;
    s.packed_layers = mirror_.valid_layers();
    s.cpu_offloaded_blocks = c.host.used_blocks;
    return s;
  }

  Status synchronize() override { return cache_->synchronize(); }

 private:
  // The written, not yet advanced positions length .. length + tokens.size() (one token id
  // each) of the cache's reservation; the rest of the reservation is reserved ahead and counts
  // for nothing. The slots are not kept here: the cache owns them and write_token asks for them.
  // `moves` is the cache's move count (moves()) when the sequence was last seen resident.
  struct State {
    std::vector<TokenId> tokens;
    int64_t moves = -1;
  };

  // Gives the cache the allocated ids of the requested active set.
  Status apply_active() {
    std::vector<SequenceId> known;
    for (SequenceId id : requested_active_) {
      if (cache_->contains(id)) known.push_back(id);
    }
    return cache_->set_active(known);
  }

  // The sequence's matchable positions (see matchable_) at committed length `len`. A sequence
  // the seed layer did not see allocated (say, forked through paged_cache()) counts as shared.
  int64_t matchable(SequenceId id, int64_t len) const {
    auto it = matchable_.find(id);
    return it == matchable_.end() ? len : std::min(it->second, len);
  }

  // Offloads and restores so far, of any sequence: a sequence can only have left the device when
  // this changed since it was last seen there.
  int64_t moves() const {
    const ControlStats c = cache_->stats();
    return c.sequences_offloaded + c.sequences_restored + c.blocks_offloaded + c.blocks_restored;
  }

  // Makes the sequence writable: restores it when it is offloaded (a write to the host copy
  // would be lost). Only after an offload or restore somewhere does this look at the blocks.
  Status resident(SequenceId id) {
    // Without a host tier nothing is ever offloaded: skip the check, whose moves() (a full
    // stats() of the cache) was the largest host cost of an append_token.
    if (!host_tier_) return ok_status();
    State& s = synced(id);
    if (s.moves == moves()) return ok_status();
    PAGEDKV_ASSIGN_OR_RETURN(SequenceResidency r, cache_->residency(id));
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, cache_->block_locations(id));
    bool offloaded = r == SequenceResidency::kHost;
    for (const BlockLocation& b : blocks) offloaded = offloaded || b.tier != Tier::kDevice;
    if (offloaded) PAGEDKV_RETURN_IF_ERROR(cache_->restore(id));
    synced(id).moves = moves();
    return ok_status();
  }

  // The cache drops a reservation on eviction or rollback: follow it.
  State& synced(SequenceId id) {
    State& s = state_[id];
    auto pending = cache_->pending(id);
    if (!pending.ok() || *pending < static_cast<int64_t>(s.tokens.size())) s = State{};
    return s;
  }

  // Checks that [pos, pos + n) starts inside or right after the written positions; returns the
  // committed length.
  StatusOr<int64_t> written_range(SequenceId id, int64_t pos, int64_t n) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t len, cache_->length(id));
    const int64_t end = len + static_cast<int64_t>(synced(id).tokens.size());
    if (pos < len) {
      return failed_precondition(seq_name(id) + ": position " + std::to_string(pos) +
                                 " is already committed (length " + std::to_string(len) +
                                 "); roll back before rewriting it");
    }
    if (pos > end) {
      return out_of_range(seq_name(id) + ": position " + std::to_string(pos) +
                          " leaves a gap; the next writable position is " + std::to_string(end));
    }
    if (pos + n > config_.max_sequence_length) {
      return out_of_range(seq_name(id) + ": positions up to " + std::to_string(pos + n) +
                          " exceed max_sequence_length " +
                          std::to_string(config_.max_sequence_length));
    }
    return len;
  }

  // Makes positions [len, end) written ones, extending the reservation when it is shorter.
  // The written positions keep their blocks (this sequence's own after the first reserve's
  // copy-on-write; a reserve of an offloaded sequence brings them back first).
  Status extend(SequenceId id, int64_t len, int64_t end) {
    State& s = synced(id);
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t have, cache_->pending(id));
    if (end - len > have) {
      PAGEDKV_RETURN_IF_ERROR(cache_->reserve(id, reserve_target(len, have, end - len)).status());
      s.moves = moves();
    }
    while (static_cast<int64_t>(s.tokens.size()) < end - len) {
      s.tokens.push_back(next_placeholder());
    }
    return ok_status();
  }

  // How many slots to reserve after `len` when `have` are reserved and `need` are needed: twice
  // `have` (so n appended positions cost O(n) slots over O(log n) reserves), but no more than
  // max_sequence_length allows, and the blocks beyond those `need` takes anyway only from the
  // free list, so reserving ahead never evicts a cached block or offloads a sequence. A first
  // reservation (have == 0: a decode step, or the first token of a prefill) is exact.
  int64_t reserve_target(int64_t len, int64_t have, int64_t need) const {
    int64_t n = std::min(2 * have, config_.max_sequence_length - len);
    if (n <= need) return need;
    const int64_t bs = config_.block_size;
    // With `have` > 0 the sequence holds exactly the blocks of positions [0, len + have).
    const int64_t held = (len + have + bs - 1) / bs;
    const int64_t taken = (len + need + bs - 1) / bs - held;
    const int64_t room = std::max(taken, cache_->stats().device.free_blocks);
    n = std::min(n, (held + room) * bs - len);
    return std::max(n, need);
  }

  // A position written without a token id gets a negative id never used before: with one
  // shared placeholder, two blocks of different bytes would hash alike and commit would
  // deduplicate one into the other. Prompts cannot hold negative ids, so none matches them.
  TokenId next_placeholder() {
    const TokenId t = placeholder_;
    placeholder_ = placeholder_ == std::numeric_limits<TokenId>::min() ? kSeedPlaceholderToken
                                                                       : placeholder_ - 1;
    return t;
  }

  // Writes packed [heads, n, head_dim] fp16 device arrays into positions [0, n) of one layer.
  Status import_packed(SequenceId id, int32_t layer, int64_t n, const void* key,
                       const void* value) {
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<int32_t> table, device_table(id));
    PAGEDKV_ASSIGN_OR_RETURN(UploadLease up, uploads_->upload({{table.data(), table.size() * 4}}));
    PackedLayerArgs args;
    // PackedLayerArgs serves gather (writes) and import (reads): import only reads these.
    args.key = const_cast<void*>(key);
    args.value = const_cast<void*>(value);
    args.block_table = up.device<int32_t>(0);
    args.block_table_len = static_cast<int32_t>(table.size());
    args.packed_dtype = DType::kFloat16;
    args.packed_layout = PackedLayout::kHeadMajor;
    args.layer = layer;
    args.num_tokens = n;
    return pagedkv::import_layer(backend(), cache_->device_pool(), args, stream());
  }

  // Before committed positions [0, keep) are rewritten: their blocks may be shared through a
  // prefix hit or fork, and full ones are cached for later prompts, so writing in place would
  // change what other sequences read. Moves the sequence onto blocks of its own: the layers
  // other than `layer` are gathered, the sequence rolled back to empty, `length` fresh slots
  // reserved (pending, with fresh placeholder ids, so commit never matches a cached block) and
  // those layers imported back. The caller writes `layer` and advances. Needs no pending writes.
  Status rebuild_private(SequenceId id, int32_t layer, int64_t keep, int64_t length) {
    const int64_t bs = config_.block_size;
    const int64_t need = (length + bs - 1) / bs;
    const int64_t free_blocks = cache_->stats().device.free_blocks;
    if (free_blocks < need) {
      return resource_exhausted(seq_name(id) + ": rewriting its committed positions copies them " +
                                "to " + std::to_string(need) + " blocks of its own; only " +
                                std::to_string(free_blocks) + " device blocks are free");
    }
    const size_t part = static_cast<size_t>(config_.num_kv_heads) * keep * config_.head_dim * 2;
    const int32_t others = config_.num_layers - 1;
    void* saved = nullptr;
    if (others > 0) {
      PAGEDKV_ASSIGN_OR_RETURN(saved, backend().allocate_device(2 * part * others));
    }
    auto at = [&](int32_t l, int kv) {
      const int32_t i = l < layer ? l : l - 1;
      return static_cast<char*>(saved) + (static_cast<size_t>(i) * 2 + kv) * part;
    };
    auto done = [&](Status st) {
      const Status sync = backend().synchronize_stream(stream());
      if (saved != nullptr) backend().free_device(saved);
      return st.ok() ? sync : st;
    };
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      if (l == layer) continue;
      const Status st = cache_->gather_layer(id, l, at(l, 0), at(l, 1), DType::kFloat16,
                                             PackedLayout::kHeadMajor, 0, keep);
      if (!st.ok()) return done(st);
    }
    // Past this point a failure loses the sequence's bytes: the checks above make it unlikely.
    Status st = cache_->rollback(id, 0);
    state_[id] = State{};
    matchable_[id] = 0;
    mirror_.invalidate_all(id);
    if (st.ok()) st = extend(id, 0, length);
    for (int32_t l = 0; st.ok() && l < config_.num_layers; ++l) {
      if (l != layer) st = import_packed(id, l, keep, at(l, 0), at(l, 1));
    }
    return done(st);
  }

  // The sequence's block table as the kernels read it (-1 for a block not on the device).
  StatusOr<std::vector<int32_t>> device_table(SequenceId id) const {
    PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, cache_->block_locations(id));
    std::vector<int32_t> table;
    table.reserve(blocks.size());
    for (const BlockLocation& b : blocks) table.push_back(b.tier == Tier::kDevice ? b.block : -1);
    return table;
  }

  CacheConfig config_;
  // Whether any group has host blocks, so that a sequence can be offloaded at all.
  bool host_tier_ = config_.num_host_blocks > 0 ||
                    std::any_of(config_.groups.begin(), config_.groups.end(),
                                [](const KvGroup& g) { return g.num_host_blocks > 0; });
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<UploadArena> uploads_;
  PackedMirror mirror_;
  std::unordered_map<SequenceId, State> state_;
  // Per sequence: its first positions that other sequences may read, those shared through the
  // prefix hit of allocate plus those committed after them with real token ids (cached blocks a
  // later prompt can match). A rewrite of committed positions copies their full blocks first.
  std::unordered_map<SequenceId, int64_t> matchable_;
  TokenId placeholder_ = kSeedPlaceholderToken;
  // The active set as set_active_sequences gave it (ids not allocated yet included).
  std::vector<SequenceId> requested_active_;
};

}  // namespace

StatusOr<std::unique_ptr<SeedImpl>> make_paged_seed_impl(const CacheConfig& config,
                                                         const SeedKvCacheOptions& options) {
  KvCacheOptions o;
  o.backend = options.backend;
  o.compute_stream = options.compute_stream;
  o.native_compute_stream = options.native_compute_stream;
  o.enable_events = options.enable_events;
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::create(config, o));
  PAGEDKV_ASSIGN_OR_RETURN(std::unique_ptr<UploadArena> uploads,
                           UploadArena::create(cache->backend(), cache->compute_stream(), 1 << 20));
  return std::unique_ptr<SeedImpl>(new PagedSeedImpl(config, std::move(cache), std::move(uploads)));
}

}  // namespace pagedkv::runtime
