// Every counter and tier count of ControlStats under its name (for_each_stat, so generated from
// PAGEDKV_CONTROL_STATS_FIELDS: a new counter is compared without an edit here), so that tests can
// compare two snapshots field by field and say which fields changed.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "pagedkv/control_types.hpp"
#include "pagedkv/stats_fields.hpp"

namespace pagedkv::testing {

using NamedStats = std::map<std::string, int64_t>;

inline NamedStats named_stats(const ControlStats& s) {
  NamedStats out;
  for_each_stat(s, [&out](const std::string& name, int64_t value) { out[name] = value; });
  return out;
}

/// The fields that differ, "name a->b; ..." ("" when equal).
inline std::string stats_diff(const NamedStats& a, const NamedStats& b) {
  std::ostringstream os;
  for (const auto& [name, value] : a) {
    if (b.at(name) != value) os << name << " " << value << "->" << b.at(name) << "; ";
  }
  return os.str();
}

/// The fields of two ControlStats that differ, "name a->b; ..." in declaration order ("" when
/// equal, which is exactly when a == b).
inline std::string stats_diff(const ControlStats& a, const ControlStats& b) {
  const auto x = stat_values(a);
  const auto y = stat_values(b);
  std::string out;
  for (size_t i = 0; i < kNumStats; ++i) {
    if (x[i] == y[i]) continue;
    out += stat_infos()[i].name + " " + std::to_string(x[i]) + "->" + std::to_string(y[i]) + "; ";
  }
  return out;
}

}  // namespace pagedkv::testing
