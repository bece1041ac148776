#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace pagedkv {
namespace sim {

namespace {

// Token ids are drawn from a 32k vocabulary above the reserved low ids, so that different
// prompts practically never share a full block by chance.
constexpr TokenId kFirstToken = 1000;
constexpr uint64_t kVocab = 31000;

TokenId token_from(uint64_t h) { return kFirstToken + static_cast<TokenId>(h % kVocab); }

int32_t draw_length(Rng& rng, double mean, double sigma, int32_t lo, int32_t hi) {
  double v = mean;
  if (sigma > 0) {
    // A log-normal whose mean is `mean`: mu = ln(mean) - sigma^2 / 2.
    const double mu = std::log(mean) - sigma * sigma / 2;
    v = std::exp(mu + sigma * rng.normal());
  }
  return std::clamp(static_cast<int32_t>(std::lround(v)), lo, hi);
}

Status check(bool ok, const char* field, const std::string& what) {
  return ok ? ok_status() : invalid_argument(std::string(field) + ": " + what);
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Rng::next() {
  state_ += 0x9e3779b97f4a7c15ull;
  return mix64(state_);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

double Rng::normal() {
  const double u1 = 1.0 - uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

TokenId output_token(uint64_t request_id, int32_t sample, int64_t position) {
  return token_from(mix64(request_id * 0x100000001b3ull ^ mix64(static_cast<uint64_t>(sample)) ^
                          mix64(static_cast<uint64_t>(position) + 0x5151)));
}

std::vector<TokenId> prefix_tokens(int32_t group, int32_t length) {
  std::vector<TokenId> t(static_cast<size_t>(std::max(length, 0)));
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = token_from(mix64(0xabcdef0000ull + static_cast<uint64_t>(group) * 1000003ull + i));
  return t;
}

std::vector<TokenId> unique_tokens(uint64_t request_id, int32_t salt, int32_t length) {
  std::vector<TokenId> t(static_cast<size_t>(std::max(length, 0)));
  const uint64_t base = mix64(request_id ^ (static_cast<uint64_t>(salt) << 48) ^ 0x77);
  for (size_t i = 0; i < t.size(); ++i) t[i] = token_from(mix64(base + i));
  return t;
}

Status WorkloadConfig::validate() const {
  auto share = [](double v) { return v >= 0 && v <= 1; };
  PAGEDKV_RETURN_IF_ERROR(check(num_requests >= 0, "requests", "must be >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(arrival_rate > 0, "rate", "must be > 0"));
  PAGEDKV_RETURN_IF_ERROR(check(prompt_mean >= 1 && prompt_sigma >= 0, "prompt-mean",
                                "mean must be >= 1 and sigma >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(prompt_min >= 1 && prompt_max >= prompt_min, "prompt-max",
                                "need 1 <= prompt-min <= prompt-max"));
  PAGEDKV_RETURN_IF_ERROR(check(output_mean >= 1 && output_sigma >= 0, "output-mean",
                                "mean must be >= 1 and sigma >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(output_min >= 1 && output_max >= output_min, "output-max",
                                "need 1 <= output-min <= output-max"));
  PAGEDKV_RETURN_IF_ERROR(check(system_prompts >= 0, "system-prompts", "must be >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(system_prompt_len >= 0, "system-prompt-len", "must be >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(share(system_prompt_share), "system-prompt-share", "not in [0,1]"));
  PAGEDKV_RETURN_IF_ERROR(check(share(multi_turn_share), "multi-turn-share", "not in [0,1]"));
  PAGEDKV_RETURN_IF_ERROR(check(max_turns >= 2, "max-turns", "must be >= 2"));
  PAGEDKV_RETURN_IF_ERROR(check(think_s >= 0, "think", "must be >= 0"));
  PAGEDKV_RETURN_IF_ERROR(check(share(parallel_share), "parallel-share", "not in [0,1]"));
  PAGEDKV_RETURN_IF_ERROR(check(samples >= 1 && samples <= 64, "samples", "not in [1,64]"));
  PAGEDKV_RETURN_IF_ERROR(check(share(speculative_share), "spec-share", "not in [0,1]"));
  PAGEDKV_RETURN_IF_ERROR(check(priorities >= 1, "priorities", "must be >= 1"));
  return check(namespaces >= 1, "namespaces", "must be >= 1");
}

StatusOr<std::vector<Request>> generate_workload(const WorkloadConfig& c) {
  PAGEDKV_RETURN_IF_ERROR(c.validate());
  Rng rng(c.seed);
  std::vector<Request> out;
  out.reserve(static_cast<size_t>(c.num_requests));
  double clock = 0;
  while (static_cast<int32_t>(out.size()) < c.num_requests) {
    // A conversation: its first turn arrives by the Poisson process; later turns wait for the
    // previous answer (Request::after) and a think time.
    clock += rng.exponential(1.0 / c.arrival_rate);
    const bool multi = rng.uniform() < c.multi_turn_share;
    const int32_t turns =
        multi ? 2 + static_cast<int32_t>(rng.next() % static_cast<uint64_t>(c.max_turns - 1)) : 1;
    const bool shared = c.system_prompts > 0 && rng.uniform() < c.system_prompt_share;
    const int32_t group =
        shared ? static_cast<int32_t>(rng.next() % static_cast<uint64_t>(c.system_prompts)) : -1;
    const int32_t priority = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(c.priorities));
    const NamespaceId ns = rng.next() % static_cast<uint64_t>(c.namespaces);
    std::vector<TokenId> context;
    if (shared) context = prefix_tokens(group, c.system_prompt_len);
    for (int32_t turn = 0; turn < turns && static_cast<int32_t>(out.size()) < c.num_requests;
         ++turn) {
      Request r;
      r.id = out.size() + 1;
      r.arrival_s = clock;
      r.priority = priority;
      r.ns = ns;
      const int32_t message =
          draw_length(rng, c.prompt_mean, c.prompt_sigma, c.prompt_min, c.prompt_max);
      const std::vector<TokenId> m = unique_tokens(r.id, 0, message);
      context.insert(context.end(), m.begin(), m.end());
      r.prompt = context;
      r.output_len = draw_length(rng, c.output_mean, c.output_sigma, c.output_min, c.output_max);
      r.samples = rng.uniform() < c.parallel_share ? c.samples : 1;
      r.speculative = rng.uniform() < c.speculative_share;
      if (turn > 0) {
        r.after = out.back().id;
        r.think_s = rng.exponential(c.think_s);
      }
      // The next turn's prompt: this prompt + this answer (sample 0) + a new message.
      for (int32_t i = 0; i < r.output_len; ++i) context.push_back(output_token(r.id, 0, i));
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace sim
}  // namespace pagedkv
