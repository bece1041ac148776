// The observable state of a KvCache that the fuzz target compares around a call: stats, and for
// every id the fuzzer can name, the sequence's existence, length, pending count and block
// locations. Three checks on two snapshots: a failed call changes nothing (diff); a tier-moving
// call that the backend failed part way through is taken back except for what needs no data
// (diff_taken_back); a successful prefetch only brings offloaded sequences back, as far as device
// room allows (check_prefetch).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/stats_fields.hpp"

namespace pagedkv::fuzz {

/// Every id pick_id() can return: 0-9 and UINT64_MAX.
inline constexpr SequenceId kTrackedIds[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ~SequenceId{0}};
inline constexpr size_t kNumTrackedIds = sizeof(kTrackedIds) / sizeof(kTrackedIds[0]);

struct Snapshot {
  ControlStats stats;
  struct Seq {
    bool exists = false;
    int64_t length = -1;
    int64_t pending = -1;
    std::vector<BlockLocation> blocks;
  };
  std::vector<Seq> seqs;  // one per kTrackedIds entry
  int64_t injected = 0;   // FaultInjectionBackend::injected() when taken
};

/// Reads the state without any backend call (so taking it never trips an armed fault).
inline Snapshot take_snapshot(const KvCache& cache, int64_t injected) {
  Snapshot s;
  s.stats = cache.stats();
  s.injected = injected;
  s.seqs.resize(kNumTrackedIds);
  for (size_t i = 0; i < kNumTrackedIds; ++i) {
    Snapshot::Seq& q = s.seqs[i];
    const SequenceId id = kTrackedIds[i];
    q.exists = cache.contains(id);
    if (!q.exists) continue;
    q.length = cache.length(id).value();
    q.pending = cache.pending(id).value();
    q.blocks = cache.block_locations(id).value();
  }
  return s;
}

/// Index of `id` in kTrackedIds, or -1.
inline int tracked_index(SequenceId id) {
  for (size_t i = 0; i < kNumTrackedIds; ++i)
    if (kTrackedIds[i] == id) return static_cast<int>(i);
  return -1;
}

inline std::string id_name(SequenceId id) {
  return id == ~SequenceId{0} ? std::string("UINT64_MAX") : std::to_string(id);
}

inline std::string describe(const Snapshot::Seq& s) {
  if (!s.exists) return "absent";
  std::string out = "length " + std::to_string(s.length) + ", pending " +
                    std::to_string(s.pending) + ", blocks [";
  for (const BlockLocation& b : s.blocks)
    out += (b.tier == Tier::kDevice ? " d" : " h") + std::to_string(b.block);
  return out + " ]";
}

inline bool same_seq(const Snapshot::Seq& s, const Snapshot::Seq& t) {
  return s.exists == t.exists && s.length == t.length && s.pending == t.pending &&
         s.blocks == t.blocks;
}

/// " stats.NAME a->b;" for every count of ControlStats that differs (for_each_stat order, so
/// every field of PAGEDKV_CONTROL_STATS_FIELDS), skipping those `skip(name)` is true for.
template <typename Skip>
std::string stats_diff(const ControlStats& x, const ControlStats& y, Skip skip) {
  const auto u = stat_values(x);
  const auto v = stat_values(y);
  std::string out;
  for (size_t i = 0; i < kNumStats; ++i) {
    const std::string& name = stat_infos()[i].name;
    if (u[i] == v[i] || skip(name)) continue;
    out += " stats." + name + " " + std::to_string(u[i]) + "->" + std::to_string(v[i]) + ";";
  }
  return out;
}

// The counts a tier-moving call that the backend failed part way through may leave changed when
// it is taken back; diff_taken_back checks each by what it may do. They are the counts of what
// needs no data and so stays done (sequences and sequences_evicted: inactive victims dropped;
// blocks_evicted, host_blocks_dropped: cached blocks evicted or dropped; events_dropped: control
// events lost to a full event ring stay lost) and the free / cached / used split and bytes of each
// tier that those change. Every other count, a new one included, must be as it was: a taken-back
// call restores it from its journal (src/core/undo_log.cpp).
inline constexpr const char* kMayChangeWhenTakenBack[] = {
    "sequences",         "blocks_evicted",     "sequences_evicted",    "host_blocks_dropped",
    "events_dropped",    "device.free_blocks", "device.cached_blocks", "device.used_blocks",
    "device.used_bytes", "host.free_blocks",   "host.cached_blocks",   "host.used_blocks",
    "host.used_bytes"};

inline bool may_change_when_taken_back(const std::string& name) {
  for (const char* n : kMayChangeWhenTakenBack)
    if (name == n) return true;
  return false;
}

/// " NAME is no count;" for each entry of kMayChangeWhenTakenBack that names no count (a renamed
/// field), so that a stale entry fails the fuzzer instead of exempting nothing silently.
inline std::string stale_exemptions() {
  std::string out;
  for (const char* n : kMayChangeWhenTakenBack) {
    bool found = false;
    for (const StatInfo& info : stat_infos()) found = found || info.name == n;
    if (!found) out += std::string(" ") + n + " is no count of ControlStats;";
  }
  return out;
}

/// The storage tier's write-back counts: write-backs finish on the store's schedule and are
/// collected by whichever call polls next, failed or not (the harness waits for every fetch, so
/// no read is left to land).
inline bool storage_write_back_count(const std::string& name) {
  return name == "storage_blocks_written" || name == "storage_bytes_written" ||
         name == "storage_failed_blocks" || name == "storage_writes_dropped";
}

/// Every difference between two snapshots ("" when equal): a failed call must change nothing
/// (but for the storage write-back counts).
inline std::string diff(const Snapshot& a, const Snapshot& b) {
  std::string out = stats_diff(a.stats, b.stats, storage_write_back_count);
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    if (!same_seq(a.seqs[i], b.seqs[i])) {
      out += " sequence " + id_name(kTrackedIds[i]) + ": {" + describe(a.seqs[i]) + "} -> {" +
             describe(b.seqs[i]) + "};";
    }
  }
  return out;
}

/// The differences (from `a` before to `b` after) that a tier-moving call (reserve, offload,
/// restore, prefetch) which the backend failed part way through may not have: it is taken back
/// (src/runtime/kv_cache.cpp recover(), src/core/undo_log.cpp), except what needs no data:
///   * cached blocks nobody referenced that it evicted from the device (blocks_evicted) or
///     dropped from the host tier (host_blocks_dropped, also a block it demoted and then dropped
///     in the same call), so free and cached counts may differ;
///   * inactive victims it dropped (`dropped`, from drain_evicted_sequences; sequences_evicted),
///     whose blocks became free or cached, so device used_blocks may shrink too.
/// Everything else, and every surviving sequence, must be exactly as before.
inline std::string diff_taken_back(const Snapshot& a, const Snapshot& b,
                                   const std::vector<SequenceId>& dropped) {
  const ControlStats& x = a.stats;
  const ControlStats& y = b.stats;
  std::string out;
  auto expect = [&out](bool ok, const std::string& what) {
    if (!ok) out += " " + what + ";";
  };
  auto pair = [](int64_t u, int64_t v) { return std::to_string(u) + "->" + std::to_string(v); };
  static const std::string stale = stale_exemptions();
  out += stale;
  // Every count not exempted, totals included, as it was.
  out += stats_diff(x, y, [](const std::string& name) {
    return may_change_when_taken_back(name) || storage_write_back_count(name);
  });
  const int64_t ndropped = static_cast<int64_t>(dropped.size());
  expect(y.blocks_evicted >= x.blocks_evicted,
         "stats.blocks_evicted went down " + pair(x.blocks_evicted, y.blocks_evicted));
  expect(
      y.host_blocks_dropped >= x.host_blocks_dropped,
      "stats.host_blocks_dropped went down " + pair(x.host_blocks_dropped, y.host_blocks_dropped));
  expect(y.events_dropped >= x.events_dropped,
         "stats.events_dropped went down " + pair(x.events_dropped, y.events_dropped));
  expect(y.sequences_evicted - x.sequences_evicted == ndropped,
         "stats.sequences_evicted " + pair(x.sequences_evicted, y.sequences_evicted) + " but " +
             std::to_string(ndropped) + " reported dropped");
  expect(x.sequences - y.sequences == ndropped, "stats.sequences " +
                                                    pair(x.sequences, y.sequences) + " but " +
                                                    std::to_string(ndropped) + " reported dropped");
  for (const auto& [name, s, t] : {std::make_tuple("device", &x.device, &y.device),
                                   std::make_tuple("host", &x.host, &y.host)}) {
    const std::string n = name;
    // Free and cached trade places only by evictions and drops: no block became used or unused.
    // Victims hold only device blocks (a sequence that is not offloaded has no host block, and
    // offloaded ones are never victims), so the host's used count never changes; the device's
    // shrinks by what victims held alone.
    if (ndropped == 0 || n == "host") {
      expect(s->used_blocks == t->used_blocks,
             n + ".used_blocks " + pair(s->used_blocks, t->used_blocks));
    } else {
      expect(t->used_blocks <= s->used_blocks,
             n + ".used_blocks grew " + pair(s->used_blocks, t->used_blocks));
    }
    if (ndropped == 0) {
      expect(t->cached_blocks <= s->cached_blocks,
             n + ".cached_blocks grew " + pair(s->cached_blocks, t->cached_blocks));
    }
  }
  if (ndropped == 0) {
    // Each cached block that is gone is one eviction (device) or one drop (host, including a
    // device block demoted and dropped within the call).
    const int64_t gone = (x.device.cached_blocks - y.device.cached_blocks) +
                         (x.host.cached_blocks - y.host.cached_blocks);
    const int64_t counted =
        (y.blocks_evicted - x.blocks_evicted) + (y.host_blocks_dropped - x.host_blocks_dropped);
    expect(gone == counted, std::to_string(gone) + " cached blocks gone but " +
                                std::to_string(counted) + " counted evicted or dropped");
  }
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    const SequenceId id = kTrackedIds[i];
    bool was_dropped = false;
    for (SequenceId d : dropped) was_dropped = was_dropped || d == id;
    if (was_dropped) {
      expect(a.seqs[i].exists && !b.seqs[i].exists,
             "sequence " + id_name(id) + " reported dropped: {" + describe(a.seqs[i]) + "} -> {" +
                 describe(b.seqs[i]) + "}");
    } else if (!same_seq(a.seqs[i], b.seqs[i])) {
      out += " sequence " + id_name(id) + ": {" + describe(a.seqs[i]) + "} -> {" +
             describe(b.seqs[i]) + "};";
    }
  }
  return out;
}

/// What a successful prefetch(ids) must have done and not done ("" when it did right), from the
/// snapshots before and after: it never offloads or drops a sequence, never moves a referenced
/// device block and changes no length or pending count; and, in the order of `ids`, it brings
/// every offloaded sequence whose host blocks (those not brought back for an earlier id) fit
/// into the free and evictable device blocks entirely to the device (KvCache::prefetch).
inline std::string check_prefetch(const std::vector<SequenceId>& ids, const Snapshot& before,
                                  const Snapshot& now) {
  const ControlStats& x = before.stats;
  const ControlStats& y = now.stats;
  if (y.sequences != x.sequences || y.sequences_evicted != x.sequences_evicted ||
      y.sequences_offloaded != x.sequences_offloaded || y.blocks_offloaded != x.blocks_offloaded) {
    return " offloaded or dropped a sequence:" + diff(before, now);
  }
  for (size_t i = 0; i < before.seqs.size(); ++i) {
    const Snapshot::Seq& s = before.seqs[i];
    const Snapshot::Seq& t = now.seqs[i];
    bool ok = s.exists == t.exists && s.length == t.length && s.pending == t.pending &&
              s.blocks.size() == t.blocks.size();
    for (size_t j = 0; ok && j < s.blocks.size(); ++j) {
      if (s.blocks[j].tier == Tier::kDevice) ok = s.blocks[j] == t.blocks[j];
    }
    if (!ok) {
      return " sequence " + id_name(kTrackedIds[i]) + ": {" + describe(s) + "} -> {" + describe(t) +
             "}";
    }
  }
  int64_t room = x.device.free_blocks + x.device.cached_blocks;
  std::set<int32_t> onboarded;  // host block ids brought back so far
  for (SequenceId id : ids) {
    const int i = tracked_index(id);
    if (i < 0 || !before.seqs[static_cast<size_t>(i)].exists) continue;
    std::vector<int32_t> host;
    for (const BlockLocation& l : before.seqs[static_cast<size_t>(i)].blocks)
      if (l.tier == Tier::kHost && onboarded.count(l.block) == 0) host.push_back(l.block);
    const int64_t h = static_cast<int64_t>(host.size());
    if (h == 0 || h > room) continue;
    room -= h;
    onboarded.insert(host.begin(), host.end());
    for (const BlockLocation& l : now.seqs[static_cast<size_t>(i)].blocks) {
      if (l.tier != Tier::kDevice) {
        return " sequence " + id_name(id) + " needed " + std::to_string(h) + " of " +
               std::to_string(room + h) + " free or evictable device blocks but is " +
               describe(now.seqs[static_cast<size_t>(i)]);
      }
    }
  }
  return {};
}

}  // namespace pagedkv::fuzz
