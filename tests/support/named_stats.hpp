// Every counter and tier count of ControlStats under its name, so that tests can compare two
// snapshots field by field and say which fields changed.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "pagedkv/control_types.hpp"

namespace pagedkv::testing {

using NamedStats = std::map<std::string, int64_t>;

inline NamedStats named_stats(const ControlStats& s) {
  return {{"device.free_blocks", s.device.free_blocks},
          {"device.cached_blocks", s.device.cached_blocks},
          {"device.used_blocks", s.device.used_blocks},
          {"host.free_blocks", s.host.free_blocks},
          {"host.cached_blocks", s.host.cached_blocks},
          {"host.used_blocks", s.host.used_blocks},
          {"sequences", s.sequences},
          {"active_sequences", s.active_sequences},
          {"offloaded_sequences", s.offloaded_sequences},
          {"prefix_queries", s.prefix_queries},
          {"prefix_hit_blocks", s.prefix_hit_blocks},
          {"prefix_miss_blocks", s.prefix_miss_blocks},
          {"prefix_query_tokens", s.prefix_query_tokens},
          {"prefix_hit_tokens", s.prefix_hit_tokens},
          {"prefix_host_hit_blocks", s.prefix_host_hit_blocks},
          {"blocks_evicted", s.blocks_evicted},
          {"sequences_evicted", s.sequences_evicted},
          {"sequences_offloaded", s.sequences_offloaded},
          {"blocks_offloaded", s.blocks_offloaded},
          {"sequences_restored", s.sequences_restored},
          {"blocks_restored", s.blocks_restored},
          {"copy_on_write", s.copy_on_write},
          {"blocks_demoted", s.blocks_demoted},
          {"host_blocks_dropped", s.host_blocks_dropped},
          {"events_dropped", s.events_dropped}};
}

/// The fields that differ, "name a->b; ..." ("" when equal).
inline std::string stats_diff(const NamedStats& a, const NamedStats& b) {
  std::ostringstream os;
  for (const auto& [name, value] : a) {
    if (b.at(name) != value) os << name << " " << value << "->" << b.at(name) << "; ";
  }
  return os.str();
}

}  // namespace pagedkv::testing
