// ControlPlane: the paged control plane behind KvCache. It decides which physical block holds
// which tokens of which sequence, reuses cached prefixes, and chooses what to evict or offload;
// it never touches KV bytes. Every call validates first and either succeeds or returns an error,
// changing nothing. Single owner thread; not internally locked.
//
// The tier-moving calls (reserve, reserve_batch, offload, restore, prefetch) come in two forms:
// plan_*() returns an open TierPlan that the runtime carries out and then commits or undoes
// (tier_plan.hpp); the plain form keeps its decision at once (tests, sizing runs without data).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/arrivals.hpp"
#include "core/batch_metadata.hpp"
#include "core/block_allocator.hpp"
#include "core/event_ring.hpp"
#include "core/eviction_queue.hpp"
#include "core/journal.hpp"
#include "core/prefix_index.hpp"
#include "core/sequence_table.hpp"
#include "core/shared_groups.hpp"
#include "core/slot_origins.hpp"
#include "core/tier_plan.hpp"
#include "core/tier_store.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace core {

/// Nanosecond clock used for retention expiry; injectable for tests.
using Clock = std::function<int64_t()>;

/// Construction options that are not part of CacheConfig.
struct ControlOptions {
  /// Defaults to std::chrono::steady_clock.
  Clock clock;
  /// Record events for drain_events(); off saves an allocation per stored block.
  bool enable_events = true;
  /// The most events held between drains; on overflow the oldest are dropped and the next
  /// drain begins with one EventKind::kEventsDropped event. Must be >= 1, even with events off
  /// (0 is kInvalidArgument from create()); slots are allocated as events arrive.
  size_t event_capacity = 65536;
  /// Report the cached host blocks the host LRU drops in Transfers::host_drops, so the runtime
  /// can write them back to a storage tier.
  bool report_host_drops = false;
};

/// The paged control plane (see the file comment).
///
/// Several KV groups: a config with `groups` (at least two) gives one plane whose groups share
/// the logical blocks. Every group of a model has the same block size, so a sequence's blocks
/// start and end at the same tokens in every group: the plane keeps one block table per
/// sequence, the full-attention group's, and each sliding-window group keeps a page of its own
/// pool for the blocks a holder still attends to (GroupPages; all of them in SharedGroups, which
/// does to every group what a call does to a block). A decode step reads each
/// sequence's record, table entry and block record once for all groups. A window group's page
/// is in the pool of the tier its block is on (an offload or restore moves held pages, named by
/// group in Transfers::moves; a cached page follows its block when that tier's pool has a free or
/// cached page to give it, and is dropped otherwise). The calls, their checks and
/// their errors are the one-group plane's; a plan's undo restores the window groups' pages too.
/// Blocks arriving from a store have no window pages (a hit needs its window's pages). Further
/// full-attention groups (several shapes, or an MLA latent group) are such page maps too, with
/// no window: a page for every block their holders hold, never trimmed.
class ControlPlane {
 public:
  /// Validates `config` (which must be paged mode) and `options` (kInvalidArgument) and builds
  /// empty pools. With `groups`: the group that attends furthest back owns the logical blocks
  /// (SharedGroups::check_config: a full-attention group, the one with the most device blocks,
  /// else the widest window), the others keep pages of them (a full or latent one a page per
  /// block), any number of them with a window.
  static StatusOr<std::unique_ptr<ControlPlane>> create(const CacheConfig& config,
                                                        ControlOptions options = {});

  // ---- sequences ----

  /// Adds a sequence, sharing the longest cached prefix of `prompt` (full blocks, at least one
  /// token left to compute). Returns the number of tokens already cached, which become the
  /// sequence's committed length; the caller then reserves and commits the rest.
  /// kAlreadyExists, kInvalidArgument (bad retention priority), kOutOfRange (too long).
  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options = {});
  /// As above, sharing at most `max_cached` tokens (-1: no bound): a model with several KV
  /// groups shares the longest prefix every group can supply (cached_prefix()).
  /// kInvalidArgument for max_cached < -1.
  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options, int64_t max_cached);
  /// The tokens add_sequence(prompt, ns, max_cached) would share now, without adding anything.
  /// With a sliding window only the blocks inside the window of that length are needed, so
  /// the answer is the longest usable length up to `max_cached`, not the longest match: a
  /// shorter length whose window blocks were evicted is not usable. kOutOfRange, kInvalidArgument
  /// as add_sequence.
  StatusOr<int64_t> cached_prefix(const std::vector<TokenId>& prompt, NamespaceId ns,
                                  int64_t max_cached = -1) const;
  /// Reserves device slots for the next `n` tokens after the committed length (replacing any
  /// earlier reservation), allocating blocks, copying-on-write a shared or cached block and
  /// restoring an offloaded sequence. kNotFound, kInvalidArgument, kOutOfRange (past
  /// max_sequence_length), kResourceExhausted (nothing changed).
  StatusOr<ReserveResult> reserve(SequenceId id, int64_t n);
  /// As reserve(), but appends the transfers and slots to `*out` (caller-owned, reused across
  /// calls, so a decode step allocates nothing); on error `*out` is left as it was.
  Status reserve_into(SequenceId id, int64_t n, ReserveResult* out);
  /// Batched reserve_into() for a decode step: reserves `n_each` slots for each of `ids`
  /// (distinct), in order, appending all transfers and slots (grouped by sequence, in `ids`
  /// order) to `*out`. With room for the whole batch the result equals reserve_into() called per
  /// id; under pressure the planner frees room for the whole batch at once and never takes a
  /// member. Ids and lengths are checked before anything changes, so an error (kNotFound,
  /// kInvalidArgument, kOutOfRange, kResourceExhausted) changes nothing and leaves `*out` as it
  /// was. Resolving `ids` is memoised: repeating the previous batch skips the id lookups.
  Status reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each, ReserveResult* out);
  /// Commits the token ids written into the first `n` reserved slots; completed full blocks
  /// enter the prefix index. kNotFound, kFailedPrecondition (more than reserved, or offloaded).
  Status commit(SequenceId id, const TokenId* tokens, int64_t n);
  /// Vector form of commit().
  Status commit(SequenceId id, const std::vector<TokenId>& tokens) {
    return commit(id, tokens.data(), static_cast<int64_t>(tokens.size()));
  }
  /// commit() of `n_each` tokens for each of `ids` (distinct); `tokens` holds them sequence
  /// after sequence. Everything is checked first (kInvalidArgument, kNotFound,
  /// kFailedPrecondition), so an error commits nothing.
  Status commit_batch(const std::vector<SequenceId>& ids, const TokenId* tokens, int64_t n_each);
  /// The checks of commit_batch() alone: ok exactly when that call would succeed. Changes
  /// nothing (it memoises the resolved ids, as every batch call does).
  Status check_commit_batch(const std::vector<SequenceId>& ids, const TokenId* tokens,
                            int64_t n_each);
  /// Shortens the committed length to `length` and drops the reservation; blocks past it are
  /// released. kNotFound, kOutOfRange (negative or longer than the sequence).
  Status rollback(SequenceId id, int64_t length);
  /// Creates `child` sharing all committed blocks of `parent` (no reservation, inactive).
  /// kNotFound, kAlreadyExists, kFailedPrecondition (parent offloaded).
  Status fork(SequenceId parent, SequenceId child);
  /// Removes a sequence; its full blocks stay cached (evictable). kNotFound.
  Status finish(SequenceId id);
  /// Removes a sequence and the cached blocks only it referenced. kNotFound.
  Status erase(SequenceId id);
  /// Replaces the active set (active sequences are never evicted or offloaded). kNotFound.
  Status set_active(const std::vector<SequenceId>& ids);
  /// Sets a sequence's scheduling priority. kNotFound.
  Status set_priority(SequenceId id, int32_t priority);

  // ---- tiers ----

  /// Moves the blocks only this sequence holds to the host tier. kNotFound,
  /// kFailedPrecondition (active or already offloaded), kResourceExhausted (host full).
  StatusOr<Transfers> offload(SequenceId id);
  /// Moves an offloaded sequence's blocks back to the device, evicting/offloading others when
  /// needed. kNotFound, kFailedPrecondition (not offloaded), kResourceExhausted.
  StatusOr<Transfers> restore(SequenceId id);
  /// Moves the listed offloaded sequences (or new ones whose prefix hit host-resident blocks)
  /// back to the device while free or evictable device blocks suffice, in order, never
  /// offloading or dropping anything; the rest stay on the host. Unknown ids: kNotFound,
  /// nothing changed.
  StatusOr<Transfers> prefetch(const std::vector<SequenceId>& ids);
  /// Where a sequence's blocks are. kNotFound.
  StatusOr<Residency> residency(SequenceId id) const;

  // ---- tier plans (the runtime's form of the calls above) ----

  /// As reserve(), returned as an open plan whose slots() are the reservation's.
  StatusOr<TierPlan> plan_reserve(SequenceId id, int64_t n);
  /// As reserve_batch(), returned as an open plan.
  StatusOr<TierPlan> plan_reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each);
  /// As offload(), restore() and prefetch(), returned as open plans (no slots).
  StatusOr<TierPlan> plan_offload(SequenceId id);
  StatusOr<TierPlan> plan_restore(SequenceId id);
  StatusOr<TierPlan> plan_prefetch(const std::vector<SequenceId>& ids);
  /// Whether a plan is open; every mutating call is kFailedPrecondition until it is closed.
  bool plan_open() const { return journal_.open; }

  // ---- storage tier (storage_arrivals.cpp) ----

  /// The keys a store may hold for `prompt` in namespace `ns`: the chained hashes of its full
  /// blocks after the longest prefix the index holds (either tier), at most `max_blocks`. With a
  /// sliding window, the blocks the longest hit of at most `max_cached` tokens (-1: no bound)
  /// needs inside its window and the index lacks, or none when they are more than `max_blocks`
  /// (a window with a hole is no hit). Read-only. kOutOfRange for a prompt past
  /// max_sequence_length, kInvalidArgument for max_cached < -1.
  StatusOr<StorageLookup> storage_lookup(const std::vector<TokenId>& prompt, NamespaceId ns,
                                         int64_t max_blocks, int64_t max_cached = -1) const;
  /// The longest hit the lookup's prompt reaches once the first `n` listed blocks have arrived:
  /// with a window, only all of them complete it.
  int64_t storage_reach(const StorageLookup& lookup, int64_t n) const;
  /// Host slots an arrival could take now: the free ones and, with full attention, those of
  /// cached host blocks (begin_arrival drops least recently used cached leaves for it).
  int64_t arrival_room() const;
  /// Takes host slots for the first `n` blocks of `lookup`, held until finish_arrival(): free
  /// ones first, then, with full attention, slots of the least recently used cached host leaves
  /// (dropped as the host LRU drops them, never the prefix the lookup continues nor a block a
  /// sequence holds); a sliding-window cache takes free slots only. Fewer than `n` when fewer
  /// can be had. An empty result (n == 0, no slot to be had, or the prefix the lookup continues
  /// is gone) holds nothing. kInvalidArgument for a bad n.
  /// Several groups: `group_held`, when given, has an entry per config group (the owner's is
  /// ignored; an empty one: that group has no store), saying which of the `n` blocks that
  /// group's store holds; each such group takes host pages for the held blocks a hit needs (all
  /// of them without a window, those of the longest hit's window with one), free ones first,
  /// then its least recently cached host pages, as far as its host pool allows.
  StatusOr<Arrival> begin_arrival(const StorageLookup& lookup, int64_t n,
                                  const std::vector<std::vector<bool>>* group_held = nullptr);
  /// The store's answer for an arrival: `ok` registers its blocks in the prefix index as cached
  /// host blocks, so later prompts hit them (a block already indexed meanwhile, or, with full
  /// attention, one whose prefix was evicted meanwhile, is freed instead; a window cache's flat
  /// blocks stand alone); not ok frees them all. Returns how many blocks became prefix-cache
  /// blocks. kNotFound for an unknown arrival.
  StatusOr<int64_t> finish_arrival(uint64_t arrival, bool ok);
  /// finish_arrival() of a read whose first `intact` blocks arrived read and verified and the
  /// rest did not (StorageCompletion::blocks_ok): with full attention those join the index (the
  /// ones after them would not be reachable), with a window only all of them (a window with a
  /// hole is no hit). kNotFound for an unknown arrival, kInvalidArgument for intact < 0.
  /// Several groups: a group's page of a registered block becomes a cached host page when it
  /// arrived intact (`group_ok[config index][k]` for Arrival::groups' k-th page; without
  /// `group_ok`, when its block is among the first `intact`), and is freed otherwise.
  StatusOr<int64_t> finish_arrival_partly(uint64_t arrival, int64_t intact,
                                          const std::vector<std::vector<bool>>* group_ok = nullptr);
  /// Records that a block the host tier dropped is now kept by the storage tier (an event
  /// kBlockStored on Tier::kStorage, for routers; runtime::StorageAnnouncer decides when).
  void record_stored_in_storage(const DroppedBlock& block);
  /// Arrivals begun and not finished.
  int64_t arrivals_in_flight() const { return static_cast<int64_t>(arrivals_.size()); }
  /// Whether the prefix index holds a block of chained hash `hash` (on any tier): routers know
  /// it from the events.
  bool indexes_hash(uint64_t hash) const { return index_.contains_hash(hash); }

  // ---- queries ----

  /// Tier and physical id of each block of the sequence. kNotFound.
  StatusOr<std::vector<BlockLocation>> block_locations(SequenceId id) const;
  /// Committed token count. kNotFound.
  StatusOr<int64_t> length(SequenceId id) const;
  /// Reserved, uncommitted token count. kNotFound.
  StatusOr<int64_t> pending(SequenceId id) const;
  /// Whether a sequence exists.
  bool contains(SequenceId id) const { return seqs_.find(id) != nullptr; }
  /// The device slot (`block * block_size + offset`) of `position`, a committed or reserved
  /// position of the sequence. The sequence table is the only owner of slots: callers ask here
  /// instead of keeping copies that a later offload or restore would make stale. kNotFound,
  /// kOutOfRange (not below length + pending), kFailedPrecondition (offloaded, or the block is
  /// on the host).
  StatusOr<int64_t> slot(SequenceId id, int64_t position) const;
  /// Appends the slots of the sequence's reserved positions, in position order, to `*out`
  /// (nothing on error). kNotFound, kFailedPrecondition (offloaded).
  Status reserved_slots(SequenceId id, std::vector<int64_t>* out) const;
  /// As block_locations() in group `g` (a config index): a window group's pages, -1 (on the
  /// device tier) for the blocks outside its window. Requires 0 <= g < num_groups().
  StatusOr<std::vector<BlockLocation>> group_block_locations(SequenceId id, int32_t g) const;
  /// As reserved_slots() in group `g`: `page * block_size + offset` in a window group's pool.
  /// Requires 0 <= g < num_groups().
  Status group_reserved_slots(SequenceId id, int32_t g, std::vector<int64_t>* out) const;

  /// Builds the metadata of a step for `ids` (each device-resident, no duplicates). The result
  /// stays valid until the next build. kNotFound, kInvalidArgument, kFailedPrecondition
  /// (offloaded), kOutOfRange (int32 overflow). Shares reserve_batch()'s memo, so the usual
  /// step (reserve_batch then build_batch on the same ids) looks every id up once at most.
  StatusOr<const BatchMetadata*> build_batch(const std::vector<SequenceId>& ids,
                                             const BatchOptions& options = {});
  /// Groups in the plane: 1, or the config's groups.
  int32_t num_groups() const { return num_groups_; }
  /// The config index of the group whose blocks the others share (0 with one group). Its
  /// physical ids are the ones every other call reports (slots, block locations, transfers).
  int32_t full_group() const { return full_group_; }
  /// The metadata of group `g` (a config index) from the last build_batch(): the returned one
  /// for full_group(), the window group's own block tables, CSR and slot mapping for the others
  /// (-1 for blocks out of its window). Requires 0 <= g < num_groups().
  const BatchMetadata& group_batch(int32_t g) const;
  /// Group `g`'s pages: in use (held or cached), cached, and cached pages evicted so far (a
  /// window group's evictions of its pages alone; the full group's are blocks_evicted).
  struct GroupPageCounts {
    int64_t used = 0;
    int64_t cached = 0;
    int64_t evicted = 0;
  };
  GroupPageCounts group_pages(int32_t g) const;
  /// The counters as group `g` (a config index) sees them, its pages being `page_bytes` each:
  /// the two tiers' counts of its own pool, its evicted pages and pages released by its window
  /// (blocks_evicted, window_released_blocks); every other counter is the plane's, which counts
  /// once for every group (sequences, prefix lookups, logical blocks moved). The owner group's
  /// are stats() without the window groups' releases. Requires 0 <= g < num_groups().
  ControlStats group_stats(int32_t g, int64_t page_bytes) const;

  /// Current counters.
  ControlStats stats() const;
  /// Returns and clears the recorded events, oldest first; if the ring overflowed since the
  /// last drain, the first is one kEventsDropped event with the count lost (resync).
  std::vector<ControlEvent> drain_events();
  /// Recounts every reference and state; names the first broken invariant (kInternal).
  Status check_invariants() const;

  /// The config of the full-attention group (the whole config with one group).
  const CacheConfig& config() const { return config_; }

 private:
  friend class TierPlan;
  ControlPlane(const CacheConfig& config, ControlOptions options);

  // kFailedPrecondition naming `what` while a plan is open.
  Status check_no_open_plan(const char* what) const;
  // The tier-moving calls, writing into `out`; the journal is open afterwards, also after an
  // error (with nothing changed), so callers close it or hand it to a plan.
  Status run_reserve(SequenceId id, int64_t n, ReserveResult* out);
  Status run_reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each, ReserveResult* out);
  Status run_offload(SequenceId id, Transfers* out);
  Status run_restore(SequenceId id, Transfers* out);
  Status run_prefetch(const std::vector<SequenceId>& ids, Transfers* out);
  // The plain form of offload, restore and prefetch: `run(&out)`, then the journal is closed.
  template <typename Run>
  StatusOr<Transfers> keep_at_once(const char* what, Run run);
  // Empties plan_result_ (keeping its storage) for a new plan.
  void reset_plan_result();
  // Opens a plan over plan_result_ when `st` is ok; else closes the journal and returns `st`.
  StatusOr<TierPlan> open_plan(const Status& st);
  void close_journal() { journal_.open = false; }
  // undo_log.cpp: takes the open plan back (see TierPlan::undo).
  std::vector<BlockMove> undo_plan(int64_t moves_done, std::vector<int32_t>* inverts);

  // A plan for freeing device blocks: sequences to offload or drop, in order.
  struct VictimPlan {
    std::vector<Sequence*> offload;
    std::vector<Sequence*> drop;
    std::vector<bool> order;  // true: next from offload, false: next from drop
  };

  // What reserving n tokens of a sequence takes, computed before anything changes.
  struct ReserveNeed {
    size_t need_total = 0;   // blocks covering length + n
    size_t write_block = 0;  // block where position `length` lands
    bool cow = false;        // that block must be copied first
    int64_t new_blocks = 0;
    int64_t host_blocks = 0;  // to restore
    int64_t device_blocks() const { return new_blocks + (cow ? 1 : 0) + host_blocks; }
  };

  // planner.cpp
  int64_t device_available() const;
  // Plans to free device blocks, never choosing `protect` nor, when protect_mark != 0, a
  // sequence whose batch_mark equals it.
  Status plan_device_blocks(int64_t need, const Sequence* protect, VictimPlan* plan,
                            uint64_t protect_mark = 0);
  // As plan_device_blocks() for the window groups: `need`[w] device pages in window group w,
  // adding drops of inactive sequences to `plan` (the full group's offloads and drops there
  // already count).
  Status plan_group_pages(const std::vector<int64_t>& need, const Sequence* protect,
                          VictimPlan* plan, uint64_t protect_mark = 0);
  // Whether each window group's `host_free` pages hold what offloading `v` moves there (its
  // held pages of the device blocks only it references), written into `*pages`.
  bool group_pages_fit(const Sequence& v, const std::vector<int64_t>& host_free,
                       std::vector<int64_t>* pages) const;
  void apply_plan(const VictimPlan& plan, Transfers* out);
  LogicalId take_device_block(Transfers* out);
  int64_t exclusive_device_blocks(const Sequence& s) const;
  void do_offload(Sequence* s, Transfers* out);
  void do_restore(Sequence* s, Transfers* out);
  void do_drop(Sequence* s);

  // tiers.cpp: the tiers' cached blocks and the moves between tiers. Device cached blocks
  // without device-resident children are listed in the device tier's queue; evicting one demotes
  // it to the tier its spec names when a slot there can be had, else drops it (or, with children
  // left in the tier below, parks it until they are gone). Cached leaves of the last tier are
  // dropped least recently used first.
  TierStore& tier(Tier t) { return tiers_[static_cast<size_t>(t)]; }
  const TierStore& tier(Tier t) const { return tiers_[static_cast<size_t>(t)]; }
  // Lists an unreferenced cached block in its tier's queue when it qualifies.
  void list_if_evictable(LogicalId id);
  // Moves a block between tiers (journaled), keeping the parent's device-children count, the
  // cached counts and the queues right; appends the move to `out`.
  void move_block(LogicalId id, Tier dst, Transfers* out);
  // `announce`: emit the block's tier-change events (not when an undo moves it back).
  void after_tier_change(LogicalId id, Tier from, bool announce = true);
  // Frees one device slot from the cached blocks (requires one to be evictable).
  void evict_one(Transfers* out);
  // Prefetches what evicting the victims listed after `victim` will read (tiers.cpp).
  void prefetch_victims_after(LogicalId victim) const;
  // When evicting `victim` makes its parent evictable (a chain's usual order), prefetches what
  // evicting the parent and its parent will read, and returns true.
  bool prefetch_parents_of(LogicalId victim) const;
  void relist_parked();
  // Drops the first cached leaf of tier `t`'s queue (reported in out->host_drops for the
  // write-back when asked to); false when there is none.
  bool drop_lru(Tier t, Transfers* out);
  // Frees slots of tier `t` until `n` are free (requires tier(t).room() >= n).
  void make_room(Tier t, int64_t n, Transfers* out);
  // Drops the first droppable device cached block (no children); false when there is none.
  bool drop_device_cached();

  // undo_log.cpp: opens the journal of a tier-moving call (see TierPlan::undo()).
  void begin_journal();

  // control_plane.cpp helpers
  Status check_reserve_length(const Sequence& s, int64_t n) const;
  ReserveNeed reserve_need(const Sequence& s, int64_t n) const;
  void apply_reserve(Sequence* s, int64_t n, const ReserveNeed& need, ReserveResult* result);
  // apply_reserve() of a decode step's usual row: resident, no longer reservation to shrink, no
  // copy-on-write. Returns false, having changed nothing, for any other row.
  bool apply_reserve_plain(Sequence* s, int64_t n, ReserveResult* result);
  // Whether reserving `n_each` more tokens for each of `rows` sequences surely passes every check
  // of reserve_batch without reading them: none offloaded, none can pass max_sequence_length,
  // and the worst case of every member (its blocks begun plus a copy-on-write) fits.
  bool batch_surely_fits(size_t rows, int64_t n_each) const;
  // reserve_batch's apply pass over resolved_, once room is made.
  void apply_reserve_rows(int64_t n_each, ReserveResult* result);
  // Looks `ids` up into resolved_ (kNotFound, kInvalidArgument on a duplicate, and with
  // check_offloaded kFailedPrecondition, in id order); a repeat of the last successful ids
  // while no sequence was destroyed reuses the pointers.
  Status resolve(const std::vector<SequenceId>& ids, bool check_offloaded, const char* what);
  // The chained hash of a block's key computed ahead (to prefetch its slot), with the hash of
  // the prefix it was computed after: used when that prefix is still the block's parent.
  struct KeyHash {
    uint64_t parent_hash = 0;
    uint64_t hash = 0;
  };
  // kFailedPrecondition when `n` tokens are more than the sequence reserved.
  Status check_commit_count(const Sequence& s, int64_t n, const char* what) const;
  // The effect of a checked commit: appends the tokens, indexes completed blocks, trims the window.
  // `first`: the first filled block's key hashed ahead (prefetch_first_fill), if it was.
  void append_committed(Sequence* s, const TokenId* tokens, int64_t n,
                        const KeyHash* first = nullptr);
  // append_committed() without the indexing and trims (commit_batch registers after all rows).
  void append_tokens(Sequence* s, const TokenId* tokens, int64_t n);
  // What commit_batch does after its appends: filled_ in order, in runs whose keys are hashed
  // (and their records fetched) ahead.
  struct CommitWork;
  void finish_commits();
  // Hashes the keys of filled_[begin, end) and prefetches what their indexing reads, in passes.
  void hash_ahead(size_t begin, size_t end);
  void prefetch_trim(const Sequence& s) const;
  // commit()'s first filled block, when `tokens` hold all its ids: hashes its key into `*key`
  // and prefetches the key's hash slot; false when it did not.
  bool prefetch_first_fill(const Sequence& s, const TokenId* tokens, int64_t n, KeyHash* key) const;
  // Whether a window (the plane's or a window group's) passed the sequence's first held block.
  bool window_moved(const Sequence& s) const;
  void release_block(LogicalId id, const Sequence& owner);
  void release_tail(Sequence* s, size_t keep);
  void unlist(LogicalId id);
  // Frees a logical block with no reference and no node, and its window groups' pages.
  void release_logical(LogicalId id);
  // A reserve or commit uses the sequence now (LRU order).
  void touch(Sequence* s) {
    s->last_used = ++tick_;
    if (s->is_victim && config_.eviction_policy != EvictionPolicy::kFifo) update_victim(s);
  }
  void update_victim(Sequence* s);
  void register_full_block(Sequence* s, size_t index, const KeyHash* ahead = nullptr);
  // The index node block i's key hangs under (kRootNode for a first block); false when the
  // block before is not held or not indexed: the chain is broken, the block is not indexed.
  bool key_parent(const Sequence& s, size_t i, NodeId* parent) const {
    *parent = kRootNode;
    if (i == 0) return true;
    const LogicalId before = s.blocks[i - 1];
    if (before == kNoBlock || blocks_[before].node < 0) return false;
    *parent = blocks_[before].node;
    return true;
  }
  // sequences.cpp: the longest cached prefix of `prompt` usable now (at most `cap` tokens, at
  // least one token left to compute) and, when `blocks` is given, the blocks covering it
  // (kNoBlock before the window). `cap` >= 0.
  int64_t match_prefix(const std::vector<TokenId>& prompt, NamespaceId ns, int64_t cap,
                       std::vector<LogicalId>* blocks) const;
  // The first block a sequence of `length` committed tokens still needs: 0 without a window.
  size_t window_first_block(int64_t length) const {
    return window_ == 0 ? 0
                        : static_cast<size_t>(bdiv_.div(std::max<int64_t>(0, length - window_)));
  }
  // Releases the blocks that fell out of the window (commit), leaving kNoBlock behind.
  void trim_window(Sequence* s);
  // storage_arrivals.cpp: storage_lookup() of a window cache (flat nodes).
  void storage_lookup_window(const std::vector<TokenId>& prompt, int64_t cap, int64_t max_blocks,
                             StorageLookup* out) const;
  // Drops least recently used cached host leaves (never `parent`'s block) until `n` host slots
  // are free or none is left to drop; the drops go to out->host_drops.
  void make_arrival_room(NodeId parent, int64_t n, Arrival* out);
  // Several groups: the host pages each group with a store takes for an arrival of `take`
  // blocks (begin_arrival), the hit they give, and what finish_arrival does with them.
  void take_arrival_pages(const StorageLookup& lookup, const std::vector<LogicalId>& blocks,
                          const std::vector<std::vector<bool>>& group_held, Arrival* out);
  int64_t grouped_reach(const StorageLookup& lookup, int64_t take,
                        const std::vector<GroupArrival>& pages) const;
  // grouped_reach() of a window cache's lookup (flat blocks, all or none), `arrived`[w][i]
  // telling whether window group w gets a page for the i-th arriving block.
  int64_t grouped_window_reach(const StorageLookup& lookup, int64_t take,
                               const std::vector<std::vector<bool>>& arrived) const;
  void settle_arrival_pages(const std::vector<GroupArrival>& pages,
                            const std::vector<LogicalId>& blocks,
                            const std::vector<bool>& registered, int64_t intact,
                            const std::vector<std::vector<bool>>* group_ok);
  // Registers an arrived block as a cached host block under `node` (already inserted).
  void register_arrived(LogicalId id, NodeId node);
  void remove_node(NodeId node);
  // A block event on `tier` (default: the tier the block is on now). A revocable event goes
  // with its call when the call is undone (EventRing::erase_revocable_since).
  // `group`: a window group's event (its config index); -1: the full group's.
  void emit_block_event(EventKind kind, NodeId node, Tier tier, bool revocable, int32_t group = -1);
  // A window group's page of the indexed block `b` was stored (cached from now on) or removed.
  void emit_page_event(EventKind kind, LogicalId b, const GroupPages& g, Tier tier = Tier::kDevice,
                       bool revocable = false);
  void emit_block_event(EventKind kind, NodeId node) {
    emit_block_event(kind, node, blocks_[index_.node(node).block].tier, false);
  }
  void emit_sequence_event(EventKind kind, SequenceId id, bool revocable = false);
  int64_t now_ns() const { return clock_(); }
  Status validate_options(const SequenceOptions& o) const;

  CacheConfig config_;
  Clock clock_;
  bool events_enabled_;
  bool report_host_drops_;
  int64_t block_size_;
  int64_t window_;  // config_.sliding_window: 0 for full attention
  int32_t num_groups_ = 1;
  int32_t full_group_ = 0;
  SharedGroups groups_;  // the groups sharing the owner's blocks (none: one group)
  std::vector<BatchMetadataBuilder> group_batch_;  // theirs, in the same order
  BlockDivider bdiv_;
  BlockAllocator blocks_;
  PrefixIndex index_;
  std::vector<TierStore> tiers_;  // one per tier, from tier_specs(config), indexed by Tier
  SequenceTable seqs_;
  BatchMetadataBuilder batch_;
  std::vector<SequenceId> active_;
  EventRing events_;
  // Memo of the last resolve(): its ids, their sequences (all marked with resolved_epoch_) and
  // the sequence-table generation it is valid for.
  std::vector<SequenceId> resolved_ids_;
  std::vector<Sequence*> resolved_;
  uint64_t resolved_epoch_ = 0;
  uint64_t resolved_generation_ = ~uint64_t{0};
  uint64_t tick_ = 0;
  // Upper bounds, never lowered, of every sequence's committed length and table size so far:
  // a decode step's calls skip their per-row checks when these bounds already pass them.
  int64_t longest_ = 0;
  size_t widest_ = 0;
  uint64_t batch_epoch_ = 0;
  ControlStats counters_;
  // Copy-on-write sources (and dropped tails) whose reference a reserve drops once all its
  // blocks are taken, so that no source is evicted (and overwritten) within the call that
  // copies it; with the table index it had, for the window groups' holders.
  struct DeferredRelease {
    Sequence* owner;
    LogicalId block;
    size_t index;
    bool pages_only;  // the reference is gone already; only the window groups' holds are left
  };
  std::vector<DeferredRelease> deferred_release_;
  // A block a commit_batch filled (sequence, table index), registered after its appends, or
  // (index kTrim) the trim of the sequence's windows, after its registrations.
  struct CommitWork {
    static constexpr size_t kTrim = SIZE_MAX;
    CommitWork(Sequence* seq, size_t block) : s(seq), index(block) {}
    Sequence* s;
    size_t index;
    bool hashed = false;  // `key` holds the block's hash (hash_ahead())
    KeyHash key;
  };
  std::vector<CommitWork> filled_;
  void flush_deferred_releases();
  // Cached device blocks taken out of the device queue while they had host children and no
  // host room.
  std::vector<LogicalId> parked_;

  Journal journal_;
  // Where the open call's moves took each slot's bytes from (kept when host drops are reported:
  // the write-back reads a dropped block from its origin).
  SlotOrigins origins_;
  // The transfers and slots of the open plan (reused: a decode step allocates nothing).
  ReserveResult plan_result_;
  // Blocks coming back from a store: held (ref 1, unregistered) until finish_arrival.
  struct ArrivalRecord {
    StorageLookup lookup;  // trimmed to the blocks taken
    std::vector<LogicalId> blocks;
    std::vector<GroupArrival> groups;  // pages held (one holder each) until the finish
  };
  std::unordered_map<uint64_t, ArrivalRecord> arrivals_;
  uint64_t next_arrival_ = 1;
};

}  // namespace core
}  // namespace pagedkv
