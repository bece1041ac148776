// The planner: when device blocks are needed and none are free, (1) evict cached blocks nobody
// references (demoting them to the host tier where it has room), (2) offload inactive sequences
// to the host tier while it has room (free, or held by cached host blocks), (3) drop inactive
// sequences, (4) fail. It plans first (counting only) and applies after, so a request
// that cannot be met changes nothing. Victims come from ordered sets, never from scans.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {

int64_t ControlPlane::device_available() const {
  // Every unreferenced cached block can be evicted: its descendants are unreferenced too
  // (a sequence holds the whole chain of a registered block), so leaves-first reaches it.
  return tier(Tier::kDevice).room();
}

bool ControlPlane::group_pages_fit(const Sequence& v, const std::vector<int64_t>& host_free,
                                   std::vector<int64_t>* pages) const {
  for (size_t w = 0; w < groups_.size(); ++w) {
    (*pages)[w] = groups_.offload_pages(v, w);
    if ((*pages)[w] > host_free[w]) return false;
  }
  return true;
}

int64_t ControlPlane::exclusive_device_blocks(const Sequence& s) const {
  int64_t e = 0;
  for (LogicalId b : s.live_blocks()) {
    const BlockInfo& info = blocks_[b];
    e += (info.ref == 1 && info.tier == Tier::kDevice) ? 1 : 0;
  }
  return e;
}

Status ControlPlane::plan_device_blocks(int64_t need, const Sequence* protect, VictimPlan* plan,
                                        uint64_t protect_mark) {
  int64_t avail = device_available();
  if (avail >= need) return ok_status();
  if (config_.eviction_policy == EvictionPolicy::kNone) {
    return resource_exhausted("out of device blocks: need " + std::to_string(need) + ", " +
                              std::to_string(avail) + " free or evictable (eviction policy none)");
  }
  int64_t host_room = tier(Tier::kHost).room();  // where offloads go
  // Each window group's free host pages, for the held pages an offload moves there.
  std::vector<int64_t> group_host(groups_.size());
  for (size_t w = 0; w < groups_.size(); ++w) group_host[w] = groups_[w].room(Tier::kHost);
  std::vector<int64_t> pages(groups_.size());
  const auto groups_take = [&](const Sequence& v) {
    if (!group_pages_fit(v, group_host, &pages)) return false;
    for (size_t w = 0; w < groups_.size(); ++w) group_host[w] -= pages[w];
    return true;
  };
  // References that planned drops will release, so later victims are counted right.
  std::unordered_map<LogicalId, int32_t> dropped_refs;
  for (const auto& key : seqs_.victims()) {
    Sequence* v = seqs_.find(std::get<2>(key));
    if (v == protect || (protect_mark != 0 && v->batch_mark == protect_mark)) continue;
    if (host_room > 0) {
      int64_t e = 0;
      for (LogicalId b : v->live_blocks()) {
        const BlockInfo& info = blocks_[b];
        int32_t ref = info.ref;
        if (!dropped_refs.empty()) {
          auto it = dropped_refs.find(b);
          if (it != dropped_refs.end()) ref -= it->second;
        }
        e += ref == 1 ? 1 : 0;
      }
      if (e > 0 && e <= host_room && groups_take(*v)) {
        host_room -= e;
        avail += e;
        plan->offload.push_back(v);
        plan->order.push_back(true);
        if (avail >= need) return ok_status();
        continue;
      }
    }
    int64_t gain = 0;
    for (LogicalId b : v->live_blocks()) {
      const int32_t d = ++dropped_refs[b];
      gain += blocks_[b].ref - d == 0 ? 1 : 0;
    }
    if (gain == 0) {  // everything it holds is shared: dropping it frees nothing
      for (LogicalId b : v->live_blocks()) --dropped_refs[b];
      continue;
    }
    avail += gain;
    plan->drop.push_back(v);
    plan->order.push_back(false);
    if (avail >= need) return ok_status();
  }
  return resource_exhausted("out of device blocks: need " + std::to_string(need) + ", " +
                            std::to_string(avail) +
                            " obtainable by evicting, offloading and dropping inactive sequences");
}

Status ControlPlane::plan_group_pages(const std::vector<int64_t>& need, const Sequence* protect,
                                      VictimPlan* plan, uint64_t protect_mark) {
  // Device pages each window group will have once the plan is applied: sequences planned to
  // go (for the full group) give back the pages only they held (an offload moves its own to
  // the host), each further victim likewise.
  const size_t ng = groups_.size();
  std::vector<int64_t> room(ng);
  for (size_t w = 0; w < ng; ++w) room[w] = groups_[w].room();
  std::vector<std::unordered_map<LogicalId, int32_t>> dropped(ng);
  const auto gains = [&](const Sequence& v, bool keep) {
    int64_t useful = 0;
    for (size_t w = 0; w < ng; ++w) {
      int64_t gain = 0;
      const size_t first = groups_[w].first_held(v);
      for (size_t i = first; i < v.blocks.size(); ++i) {
        const LogicalId b = v.blocks[i];
        const int32_t d = ++dropped[w][b];
        gain += groups_[w].holders(b) - d == 0 && blocks_[b].tier == Tier::kDevice ? 1 : 0;
      }
      if (!keep) {
        for (size_t i = first; i < v.blocks.size(); ++i) --dropped[w][v.blocks[i]];
      } else {
        room[w] += gain;
      }
      if (room[w] < need[w]) useful += gain;
    }
    return useful;
  };
  const auto short_group = [&]() -> int64_t {
    for (size_t w = 0; w < ng; ++w) {
      if (room[w] < need[w]) return static_cast<int64_t>(w);
    }
    return -1;
  };
  for (const Sequence* v : plan->drop) (void)gains(*v, true);
  for (const Sequence* v : plan->offload) {
    for (size_t w = 0; w < ng; ++w) room[w] += groups_.offload_pages(*v, w);
  }
  if (short_group() < 0) return ok_status();
  // A victim goes to the host tier, as for the full group, when every group's host pool has
  // room for what its offload moves; else it is dropped. The room left is counted as if every
  // planned drop came before the planned offloads, which can only make those move more (a block
  // a drop leaves to one holder becomes that holder's own), so it never promises too much. A
  // victim that shares a block with a planned drop is dropped too: what its offload would move
  // then depends on the order.
  std::unordered_map<LogicalId, int32_t> drop_refs;
  for (const Sequence* v : plan->drop) {
    for (LogicalId b : v->live_blocks()) ++drop_refs[b];
  }
  const auto own = [&](LogicalId b) {
    auto it = drop_refs.find(b);
    return blocks_[b].tier == Tier::kDevice &&
           blocks_[b].ref - (it == drop_refs.end() ? 0 : it->second) == 1;
  };
  int64_t host_room = tier(Tier::kHost).room();
  std::vector<int64_t> group_host(ng);
  for (size_t w = 0; w < ng; ++w) group_host[w] = groups_[w].room(Tier::kHost);
  for (const Sequence* v : plan->offload) {
    for (size_t i = v->first_live; i < v->blocks.size(); ++i) {
      const LogicalId b = v->blocks[i];
      if (!own(b)) continue;
      --host_room;
      for (size_t w = 0; w < ng; ++w) {
        group_host[w] -= i >= groups_[w].first_held(*v) && groups_[w].page(b) >= 0 ? 1 : 0;
      }
    }
  }
  std::vector<int64_t> pages(ng);
  const auto offloadable = [&](const Sequence& v) {
    int64_t blocks = 0;
    for (size_t i = v.first_live; i < v.blocks.size(); ++i) {
      if (drop_refs.count(v.blocks[i]) != 0) return false;
      blocks += own(v.blocks[i]) ? 1 : 0;
    }
    if (blocks == 0 || blocks > host_room || !group_pages_fit(v, group_host, &pages)) return false;
    bool useful = false;
    for (size_t w = 0; w < ng; ++w) useful |= pages[w] > 0 && room[w] < need[w];
    if (!useful) return false;
    host_room -= blocks;
    for (size_t w = 0; w < ng; ++w) {
      group_host[w] -= pages[w];
      room[w] += pages[w];
    }
    return true;
  };
  if (config_.eviction_policy != EvictionPolicy::kNone) {
    for (const auto& key : seqs_.victims()) {
      Sequence* v = seqs_.find(std::get<2>(key));
      if (v == protect || (protect_mark != 0 && v->batch_mark == protect_mark)) continue;
      if (std::find(plan->drop.begin(), plan->drop.end(), v) != plan->drop.end()) continue;
      if (std::find(plan->offload.begin(), plan->offload.end(), v) != plan->offload.end()) {
        continue;
      }
      if (gains(*v, false) == 0) continue;  // frees no page a short group needs
      if (offloadable(*v)) {
        plan->offload.push_back(v);
        plan->order.push_back(true);
        if (short_group() < 0) return ok_status();
        continue;
      }
      (void)gains(*v, true);
      plan->drop.push_back(v);
      plan->order.push_back(false);
      for (LogicalId b : v->live_blocks()) ++drop_refs[b];
      if (short_group() < 0) return ok_status();
    }
  }
  const size_t w = static_cast<size_t>(short_group());
  const GroupPages& g = groups_[w];
  const std::string kind =
      g.window() > 0 ? "window " + std::to_string(g.window()) : std::string("full attention");
  return resource_exhausted("out of pages in group " + std::to_string(g.config_index()) + " (" +
                            kind + "): need " + std::to_string(need[w]) + ", " +
                            std::to_string(room[w]) +
                            " free, cached or held by inactive sequences");
}

void ControlPlane::apply_plan(const VictimPlan& plan, Transfers* out) {
  size_t o = 0;
  size_t d = 0;
  for (bool is_offload : plan.order) {
    if (is_offload) {
      do_offload(plan.offload[o++], out);
    } else {
      Sequence* v = plan.drop[d++];
      out->evicted.push_back(v->id);
      do_drop(v);
    }
  }
}

void ControlPlane::do_drop(Sequence* s) {
  seqs_.clear_victim(s);
  release_tail(s, 0);
  const SequenceId id = s->id;
  seqs_.destroy(id);
  ++counters_.sequences_evicted;
  emit_sequence_event(EventKind::kSequenceEvicted, id);
}

}  // namespace core
}  // namespace pagedkv
