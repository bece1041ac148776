// check_invariants(): recounts every reference and state from scratch and compares with the
// incremental bookkeeping. O(everything); meant for tests.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {

namespace {

Status broken(const std::string& what) { return internal_error("invariant: " + what); }

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Status ControlPlane::check_invariants() const {
  const int64_t nlog = blocks_.num_logical();
  // Physical slots <-> logical blocks, per tier.
  int64_t live_per_tier[kNumTiers] = {0, 0};
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    int64_t owned = 0;
    for (int64_t p = 0; p < blocks_.capacity(tier); ++p) {
      const LogicalId id = blocks_.owner(tier, static_cast<int32_t>(p));
      if (id == kNoBlock) continue;
      ++owned;
      if (id < 0 || id >= nlog || !blocks_.live(id) || blocks_[id].tier != tier ||
          blocks_[id].phys != p) {
        return broken("tier " + str(t) + " slot " + str(p) + " and its logical block disagree");
      }
    }
    if (owned + blocks_.free_count(tier) != blocks_.capacity(tier)) {
      return broken("tier " + str(t) + ": owned " + str(owned) + " + free " +
                    str(blocks_.free_count(tier)) + " != total " + str(blocks_.capacity(tier)));
    }
  }
  for (LogicalId id = 0; id < nlog; ++id) {
    if (blocks_.live(id)) ++live_per_tier[static_cast<int>(blocks_[id].tier)];
  }
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    if (live_per_tier[t] != blocks_.capacity(tier) - blocks_.free_count(tier)) {
      return broken("tier " + str(t) + ": live logical blocks != occupied slots");
    }
  }

  // References: recount from every sequence's block table.
  std::vector<int32_t> refs(static_cast<size_t>(nlog), 0);
  int64_t victims = 0;
  int64_t offloaded = 0;
  int64_t active = 0;
  for (const auto& kv : seqs_.all()) {
    const Sequence& s = *kv.second;
    // Names are built only for a failure: this runs after every call in the tests.
    const auto name = [&s] { return "sequence " + std::to_string(s.id); };
    if (s.pending < 0) return broken(name() + " has negative pending");
    const int64_t total = s.length() + s.pending;
    if (total > config_.max_sequence_length) return broken(name() + " past max_sequence_length");
    if (static_cast<int64_t>(s.blocks.size()) != (total + block_size_ - 1) / block_size_) {
      return broken(name() + " holds " + str(static_cast<int64_t>(s.blocks.size())) +
                    " blocks for " + str(total) + " tokens");
    }
    // Blocks before the window: none held, and only blocks its next token no longer needs.
    if (s.first_live > window_first_block(s.length()) && s.first_live > 0) {
      return broken(name() + " dropped block " + str(static_cast<int64_t>(s.first_live) - 1) +
                    " that its window still needs");
    }
    for (size_t i = 0; i < s.first_live && i < s.blocks.size(); ++i) {
      if (s.blocks[i] != kNoBlock) return broken(name() + " holds a block before its window");
    }
    for (size_t i = s.first_live; i < s.blocks.size(); ++i) {
      const LogicalId b = s.blocks[i];
      if (b < 0 || b >= nlog || !blocks_.live(b)) return broken(name() + " holds a free block");
      if (++refs[static_cast<size_t>(b)] > 1 &&
          std::count(s.blocks.begin(), s.blocks.end(), b) > 1) {
        return broken(name() + " holds a block twice");
      }
      const BlockInfo& info = blocks_[b];
      if (!s.offloaded && info.tier != Tier::kDevice) {
        return broken(name() + " is not offloaded but holds a host block");
      }
      if (info.node >= 0) {
        const PrefixNode& node = index_.node(info.node);
        // A registered block's whole prefix is registered and held by the same sequence (in a
        // window cache: its predecessor, when held, is registered and is its prefix).
        const NodeId want_parent =
            i == 0 || s.blocks[i - 1] == kNoBlock ? kRootNode : blocks_[s.blocks[i - 1]].node;
        if (window_ > 0) {
          if (node.parent != kRootNode ||
              (i > 0 && s.blocks[i - 1] != kNoBlock &&
               (want_parent < 0 || node.parent_hash != index_.node(want_parent).hash)) ||
              (i == 0 && node.parent_hash != PrefixIndex::root_hash(s.options.ns))) {
            return broken(name() + " block " + str(static_cast<int64_t>(i)) +
                          " is registered after another prefix than its predecessor's");
          }
        } else if (node.parent != want_parent || (i > 0 && want_parent < 0)) {
          return broken(name() + " block " + str(static_cast<int64_t>(i)) +
                        " is registered under a different parent than its predecessor");
        }
        if (node.ns != s.options.ns) return broken(name() + " shares a block of another namespace");
        const int64_t start = static_cast<int64_t>(i) * block_size_;
        const int64_t upto = std::min<int64_t>(s.length(), start + block_size_);
        for (int64_t p = start; p < upto; ++p) {
          if (index_.tokens(info.node)[p - start] != s.tokens[static_cast<size_t>(p)]) {
            return broken(name() + " token " + str(p) + " differs from its cached block");
          }
        }
      }
    }
    if (s.is_victim != (!s.active && !s.offloaded)) return broken(name() + " victim membership");
    if (s.is_victim) {
      ++victims;
      const uint64_t order =
          config_.eviction_policy == EvictionPolicy::kFifo ? s.arrival : s.last_used;
      if (s.victim_key != SequenceTable::VictimKey(s.options.priority, order, s.id) ||
          seqs_.victims().count(s.victim_key) != 1) {
        return broken(name() + " victim key is stale");
      }
    }
    offloaded += s.offloaded ? 1 : 0;
    active += s.active ? 1 : 0;
  }
  // Blocks coming back from a store are held by their arrival: unregistered host blocks.
  for (const auto& [id, arrival] : arrivals_) {
    for (LogicalId b : arrival.blocks) {
      if (b < 0 || b >= nlog || !blocks_.live(b)) return broken("an arrival holds a free block");
      if (blocks_[b].tier != Tier::kHost || blocks_[b].node >= 0) {
        return broken("arrival " + str(static_cast<int64_t>(id)) +
                      " holds a block that is not an unregistered host block");
      }
      ++refs[static_cast<size_t>(b)];
    }
  }
  if (victims != static_cast<int64_t>(seqs_.victims().size())) return broken("victim set size");
  if (offloaded != counters_.offloaded_sequences) return broken("offloaded sequence count");
  if (active != static_cast<int64_t>(active_.size())) return broken("active set size");
  for (SequenceId id : active_) {
    const Sequence* s = seqs_.find(id);
    if (s == nullptr || !s->active) return broken("active list names an inactive sequence");
  }

  // Block states: referenced, cached-evictable, or free; nothing else.
  int64_t cached[kNumTiers] = {0, 0};
  int64_t used[kNumTiers] = {0, 0};
  int64_t listed[kNumTiers] = {0, 0};
  std::vector<int32_t> children(static_cast<size_t>(index_.capacity()), 0);
  std::vector<int32_t> device_children(static_cast<size_t>(index_.capacity()), 0);
  for (LogicalId id = 0; id < nlog; ++id) {
    if (!blocks_.live(id)) continue;
    const BlockInfo& b = blocks_[id];
    const auto name = [id] { return "block " + str(id); };
    if (b.ref != refs[static_cast<size_t>(id)]) {
      return broken(name() + " ref " + str(b.ref) + " but " + str(refs[static_cast<size_t>(id)]) +
                    " holders");
    }
    const int t = static_cast<int>(b.tier);
    if (b.ref > 0) {
      ++used[t];
    } else if (b.node >= 0) {
      ++cached[t];
    } else {
      return broken(name() + " is unreferenced, uncached and not free (leaked)");
    }
    if (b.node >= 0) {
      if (b.node >= index_.capacity() || !index_.node(b.node).live ||
          index_.node(b.node).block != id) {
        return broken(name() + " and its prefix node disagree");
      }
    }
    // A tier that demotes: listed once no child is in the tier (or parked while its children are
    // all below). The last tier: listed once it is a leaf.
    const bool qualifies =
        b.ref == 0 && b.node >= 0 &&
        (tier(b.tier).spec().last ? index_.node(b.node).children == 0 : b.device_children == 0);
    const bool parked =
        qualifies && b.tier == Tier::kDevice && !b.listed && index_.node(b.node).children > 0;
    if (b.listed != qualifies && !parked) {
      return broken(name() + (b.listed ? " is evictable but referenced or not a cached leaf"
                                       : " is a cached unreferenced leaf missing from its queue"));
    }
    if (b.node < 0 && b.device_children != 0) return broken(name() + " uncached with children");
    if (b.listed) {
      ++listed[t];
      if (!tier(b.tier).queue().contains(id)) {
        return broken(name() + " listed under a stale key");
      }
    }
  }
  // Each tier store's own invariants against the recount (available + evictable + referenced
  // == total among them).
  for (int t = 0; t < kNumTiers; ++t) {
    const Status st = tier(static_cast<Tier>(t)).check(cached[t], listed[t], used[t]);
    if (!st.ok()) return broken(st.message());
  }

  // Prefix index: nodes, hashes, children and the hash map agree with the blocks.
  int64_t nodes = 0;
  for (NodeId n = 0; n < index_.capacity(); ++n) {
    const PrefixNode& x = index_.node(n);
    if (!x.live) continue;
    ++nodes;
    const auto name = [n] { return "node " + str(n); };
    if (x.block < 0 || x.block >= nlog || !blocks_.live(x.block) || blocks_[x.block].node != n) {
      return broken(name() + " points to a block that does not point back");
    }
    if (x.parent != kRootNode) {
      if (!index_.node(x.parent).live) return broken(name() + " has a removed parent");
      if (index_.node(x.parent).ns != x.ns) return broken(name() + " crosses namespaces");
      ++children[static_cast<size_t>(x.parent)];
      if (blocks_[x.block].tier == Tier::kDevice) ++device_children[static_cast<size_t>(x.parent)];
      if (blocks_[x.block].ref > 0 && blocks_[index_.node(x.parent).block].ref == 0) {
        return broken(name() + " is referenced but its parent is not");
      }
    }
    if (x.parent != kRootNode && window_ > 0) return broken(name() + " is not flat (window)");
    // A flat node's parent_hash names whatever prefix it continues.
    if ((window_ == 0 && x.parent_hash != index_.prefix_hash(x.parent, x.ns)) ||
        x.hash != index_.chain_hash(x.parent_hash, index_.tokens(n))) {
      return broken(name() + " chained hash is wrong");
    }
    if (!index_.reachable(n)) return broken(name() + " is not reachable through the hash map");
    const NodeId newest = x.newest_child;  // match()'s guess: a live child or none
    if (newest >= 0 && (!index_.node(newest).live || index_.node(newest).parent != n)) {
      return broken(name() + " names a newest child that is not its child");
    }
  }
  if (nodes != index_.size()) return broken("prefix index size");
  for (NodeId n = 0; n < index_.capacity(); ++n) {
    if (!index_.node(n).live) continue;
    if (index_.node(n).children != children[static_cast<size_t>(n)]) {
      return broken("node " + str(n) + " children count");
    }
    if (blocks_[index_.node(n).block].device_children != device_children[static_cast<size_t>(n)]) {
      return broken("node " + str(n) + " device-resident children count");
    }
  }
  if (groups_.empty()) return ok_status();
  // The groups' pages an arrival from a store holds until its finish.
  std::vector<std::vector<LogicalId>> arriving(groups_.size());
  for (const auto& kv : arrivals_) {
    for (const GroupArrival& ga : kv.second.groups) {
      for (const int32_t k : ga.index) {
        arriving[groups_.window_index(ga.group)].push_back(
            kv.second.blocks[static_cast<size_t>(k)]);
      }
    }
  }
  return groups_.check(seqs_, arriving);
}

}  // namespace core
}  // namespace pagedkv
