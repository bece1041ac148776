#include "trace.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace pagedkv {
namespace sim {

namespace {

using nlohmann::json;

// Reads an optional integer field into *out within [lo, hi]; an error message, or "" when fine.
template <typename T>
std::string get_int(const json& j, const char* key, bool required, T lo, T hi, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return required ? std::string("missing field \"") + key + "\"" : "";
  if (!it->is_number_integer()) return std::string("field \"") + key + "\" must be an integer";
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi) || (lo > 0 && v < static_cast<uint64_t>(lo)))
      return std::string("field \"") + key + "\" out of range [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]";
    *out = static_cast<T>(v);
    return "";
  }
  const int64_t v = it->get<int64_t>();
  if (v < static_cast<int64_t>(lo) || v > static_cast<int64_t>(hi))
    return std::string("field \"") + key + "\" out of range [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]";
  *out = static_cast<T>(v);
  return "";
}

std::string get_number(const json& j, const char* key, bool required, double* out) {
  auto it = j.find(key);
  if (it == j.end()) return required ? std::string("missing field \"") + key + "\"" : "";
  if (!it->is_number()) return std::string("field \"") + key + "\" must be a number";
  const double v = it->get<double>();
  if (!(v >= 0) || v > 1e12) return std::string("field \"") + key + "\" must be >= 0";
  *out = v;
  return "";
}

// Parses one line into *r; returns an error message or "".
std::string parse_line(const std::string& line, Request* r) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "not valid JSON";
  if (!j.is_object()) return "a line must be a JSON object";
  static const std::unordered_set<std::string> kKnown = {
      "id",       "arrival_s", "prompt",  "prefix_group", "prefix_len", "prompt_len", "output_len",
      "priority", "namespace", "samples", "speculative",  "after",      "think_s"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (kKnown.count(it.key()) == 0) return "unknown field \"" + it.key() + "\"";
  std::string e;
  constexpr int32_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (!(e = get_int<uint64_t>(j, "id", true, 1, std::numeric_limits<int64_t>::max(), &r->id))
           .empty() ||
      !(e = get_number(j, "arrival_s", true, &r->arrival_s)).empty() ||
      !(e = get_int<int32_t>(j, "output_len", true, 1, kMaxI32, &r->output_len)).empty() ||
      !(e = get_int<int32_t>(j, "priority", false, std::numeric_limits<int32_t>::min(), kMaxI32,
                             &r->priority))
           .empty() ||
      !(e = get_int<uint64_t>(j, "namespace", false, 0, std::numeric_limits<int64_t>::max(),
                              &r->ns))
           .empty() ||
      !(e = get_int<int32_t>(j, "samples", false, 1, 64, &r->samples)).empty() ||
      !(e = get_int<uint64_t>(j, "after", false, 0, std::numeric_limits<int64_t>::max(), &r->after))
           .empty() ||
      !(e = get_number(j, "think_s", false, &r->think_s)).empty())
    return e;
  if (auto it = j.find("speculative"); it != j.end()) {
    if (!it->is_boolean()) return "field \"speculative\" must be true or false";
    r->speculative = it->get<bool>();
  }
  const bool has_prompt = j.contains("prompt");
  const bool has_group = j.contains("prefix_group") || j.contains("prefix_len");
  if (has_prompt == (has_group || j.contains("prompt_len")))
    return "give either \"prompt\" (token ids) or \"prefix_group\", \"prefix_len\" and "
           "\"prompt_len\"";
  if (has_prompt) {
    const json& p = j["prompt"];
    if (!p.is_array() || p.empty()) return "field \"prompt\" must be a non-empty array";
    r->prompt.reserve(p.size());
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxI32)
        return "field \"prompt\" must hold token ids in [0, 2^31)";
      r->prompt.push_back(t.get<TokenId>());
    }
  } else {
    int32_t group = -1, prefix_len = 0, prompt_len = 0;
    if (!(e = get_int<int32_t>(j, "prefix_group", false, -1, kMaxI32, &group)).empty() ||
        !(e = get_int<int32_t>(j, "prefix_len", false, 0, kMaxI32, &prefix_len)).empty() ||
        !(e = get_int<int32_t>(j, "prompt_len", true, 1, kMaxI32, &prompt_len)).empty())
      return e;
    if (prefix_len > prompt_len) return "\"prefix_len\" is longer than \"prompt_len\"";
    if (group < 0 && prefix_len > 0) return "\"prefix_len\" needs a \"prefix_group\" >= 0";
    r->prompt = prefix_tokens(group, group < 0 ? 0 : prefix_len);
    const std::vector<TokenId> rest =
        unique_tokens(r->id, 0, prompt_len - static_cast<int32_t>(r->prompt.size()));
    r->prompt.insert(r->prompt.end(), rest.begin(), rest.end());
  }
  return "";
}

}  // namespace

StatusOr<std::vector<Request>> read_trace(std::istream& in, const std::string& source) {
  std::vector<Request> out;
  std::unordered_set<uint64_t> ids;
  std::string line;
  int64_t number = 0;
  auto fail = [&](const std::string& what) {
    return invalid_argument(source + ":" + std::to_string(number) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    Request r;
    const std::string e = parse_line(line, &r);
    if (!e.empty()) return fail(e);
    if (!ids.insert(r.id).second) return fail("duplicate id " + std::to_string(r.id));
    if (r.after != 0 && ids.count(r.after) == 0)
      return fail("\"after\": " + std::to_string(r.after) + " is not an earlier request's id");
    out.push_back(std::move(r));
  }
  if (in.bad()) return invalid_argument(source + ": read error");
  std::stable_sort(out.begin(), out.end(), [](const Request& a, const Request& b) {
    return a.arrival_s != b.arrival_s ? a.arrival_s < b.arrival_s : a.id < b.id;
  });
  return out;
}

StatusOr<std::vector<Request>> read_trace_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open trace " + path);
  return read_trace(in, path);
}

Status write_trace(std::ostream& out, const std::vector<Request>& requests) {
  for (const Request& r : requests) {
    json j;
    j["id"] = r.id;
    j["arrival_s"] = r.arrival_s;
    j["prompt"] = r.prompt;
    j["output_len"] = r.output_len;
    j["priority"] = r.priority;
    j["namespace"] = r.ns;
    if (r.samples != 1) j["samples"] = r.samples;
    if (r.speculative) j["speculative"] = true;
    if (r.after != 0) {
      j["after"] = r.after;
      j["think_s"] = r.think_s;
    }
    out << j.dump() << '\n';
  }
  out.flush();
  return out ? ok_status() : internal_error("writing the trace failed");
}

Status write_trace_file(const std::string& path, const std::vector<Request>& requests) {
  std::ofstream out(path);
  if (!out) return unavailable("cannot write " + path);
  return write_trace(out, requests);
}

}  // namespace sim
}  // namespace pagedkv
