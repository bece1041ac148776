// Every count of ControlStats under one dotted name ("device.free_blocks", "blocks_demoted"),
// generated from PAGEDKV_CONTROL_STATS_FIELDS / PAGEDKV_TIER_STATS_FIELDS: what reports, logs and
// tests iterate instead of naming the fields by hand, so a new counter reaches all of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "pagedkv/control_types.hpp"

namespace pagedkv {

namespace detail {
#define PAGEDKV_STATS_COUNT_(type, name, doc) +stat_count_of<type>()
template <typename T>
constexpr size_t stat_count_of();
template <>
constexpr size_t stat_count_of<int64_t>() {
  return 1;
}
template <>
constexpr size_t stat_count_of<TierStats>() {
  return 0 PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_STATS_COUNT_);
}
template <>
constexpr size_t stat_count_of<ControlStats>() {
  return 0 PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_STATS_COUNT_);
}
#undef PAGEDKV_STATS_COUNT_
}  // namespace detail

/// Counts in one TierStats.
inline constexpr size_t kNumTierStats = detail::stat_count_of<TierStats>();
/// Counts in one ControlStats, each tier's counts included.
inline constexpr size_t kNumStats = detail::stat_count_of<ControlStats>();

/// The dotted name of one count and its short meaning (from the field lists).
struct StatInfo {
  std::string name;  // "device.free_blocks", "blocks_demoted"
  const char* doc = "";
};

namespace detail {

// Calls visit(name_prefix, member_name, value, doc) for every int64_t count of `s` (a possibly
// const ControlStats), descending into the TierStats members.
template <typename TierStatsT, typename Visit>
void visit_tier_stats(const char* tier, TierStatsT& t, Visit& visit) {
#define PAGEDKV_STATS_VISIT_(type, name, doc) visit(tier, #name, t.name, doc);
  PAGEDKV_TIER_STATS_FIELDS(PAGEDKV_STATS_VISIT_)
#undef PAGEDKV_STATS_VISIT_
}

template <typename Member, typename Visit>
void visit_member(const char* name, Member& m, const char* doc, Visit& visit) {
  if constexpr (std::is_same_v<std::remove_const_t<Member>, TierStats>) {
    visit_tier_stats(name, m, visit);
  } else {
    static_assert(std::is_same_v<std::remove_const_t<Member>, int64_t>,
                  "a ControlStats field is a TierStats or an int64_t count");
    visit(static_cast<const char*>(nullptr), name, m, doc);
  }
}

template <typename Stats, typename Visit>
void visit_stats(Stats& s, Visit& visit) {
#define PAGEDKV_STATS_VISIT_(type, name, doc) visit_member(#name, s.name, doc, visit);
  PAGEDKV_CONTROL_STATS_FIELDS(PAGEDKV_STATS_VISIT_)
#undef PAGEDKV_STATS_VISIT_
}

}  // namespace detail

/// Names and meanings of every count, in for_each_stat order (built once).
inline const std::array<StatInfo, kNumStats>& stat_infos() {
  static const std::array<StatInfo, kNumStats> infos = [] {
    std::array<StatInfo, kNumStats> out;
    size_t i = 0;
    const ControlStats s;
    auto visit = [&](const char* tier, const char* name, const int64_t&, const char* doc) {
      out[i].name = tier != nullptr ? std::string(tier) + "." + name : std::string(name);
      out[i].doc = doc;
      ++i;
    };
    detail::visit_stats(s, visit);
    return out;
  }();
  return infos;
}

/// Every count of `s`, in for_each_stat order (index i is named stat_infos()[i].name).
inline std::array<int64_t, kNumStats> stat_values(const ControlStats& s) {
  std::array<int64_t, kNumStats> out{};
  size_t i = 0;
  auto visit = [&](const char*, const char*, const int64_t& v, const char*) { out[i++] = v; };
  detail::visit_stats(s, visit);
  return out;
}

namespace detail {
template <typename Stats, typename Fn>
void for_each_stat_impl(Stats& s, Fn& fn) {
  const std::array<StatInfo, kNumStats>& infos = stat_infos();
  size_t i = 0;
  auto visit = [&](const char*, const char*, auto& value, const char*) {
    const StatInfo& info = infos[i++];
    if constexpr (std::is_invocable_v<Fn&, const std::string&, decltype(value), const char*>) {
      fn(info.name, value, info.doc);
    } else {
      fn(info.name, value);
    }
  };
  visit_stats(s, visit);
}
}  // namespace detail

/// Calls `fn(name, value)` or `fn(name, value, doc)` for every count of `s` in declaration order:
/// the device tier's counts ("device.total_blocks", ...), the host tier's, then the counters
/// ("sequences", ...). `name` is a const std::string&, `value` a const int64_t& (an int64_t& for a
/// non-const `s`), `doc` a const char*.
template <typename Fn>
void for_each_stat(const ControlStats& s, Fn&& fn) {
  detail::for_each_stat_impl(s, fn);
}
template <typename Fn>
void for_each_stat(ControlStats& s, Fn&& fn) {
  detail::for_each_stat_impl(s, fn);
}

}  // namespace pagedkv
