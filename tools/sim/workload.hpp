// The simulated workload: requests as the scheduler sees them, and a seeded generator of
// realistic LLM-serving traffic (Poisson arrivals, shared system prompts, multi-turn
// conversations, parallel sampling, speculative decoding, priorities).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace sim {

/// One request. Output token ids are not stored: they are a pure function of (id, sample,
/// position) (output_token), so a later turn's prompt can contain an earlier turn's answer and
/// a replayed trace generates the same tokens.
struct Request {
  uint64_t id = 0;       // unique, > 0
  double arrival_s = 0;  // when it reaches the server (simulated seconds)
  std::vector<TokenId> prompt;
  int32_t output_len = 1;  // tokens generated per sample
  int32_t priority = 0;    // higher is scheduled first and preempted last
  NamespaceId ns = 0;
  int32_t samples = 1;       // parallel sampling: n > 1 forks the prompt n - 1 times
  bool speculative = false;  // decodes with draft tokens, some rejected (rollback)
  uint64_t after = 0;        // multi-turn: arrives only once request `after` has completed
  double think_s = 0;        // ... and then `think_s` seconds later
  friend bool operator==(const Request& a, const Request& b) {
    return a.id == b.id && a.arrival_s == b.arrival_s && a.prompt == b.prompt &&
           a.output_len == b.output_len && a.priority == b.priority && a.ns == b.ns &&
           a.samples == b.samples && a.speculative == b.speculative && a.after == b.after &&
           a.think_s == b.think_s;
  }
};

/// Parameters of the generator. Lengths are drawn from a log-normal with the given mean and
/// clamped to [min, max]; a sigma of 0 makes them constant.
struct WorkloadConfig {
  uint64_t seed = 1;
  int32_t num_requests = 600;  // conversations count their turns individually
  double arrival_rate = 12.0;  // requests per simulated second (Poisson)
  double prompt_mean = 192, prompt_sigma = 0.6;
  int32_t prompt_min = 8, prompt_max = 2048;
  double output_mean = 96, output_sigma = 0.6;
  int32_t output_min = 4, output_max = 1024;
  int32_t system_prompts = 4;        // distinct shared system prompts
  int32_t system_prompt_len = 256;   // tokens of each
  double system_prompt_share = 0.7;  // share of conversations that start with one
  double multi_turn_share = 0.25;    // share of conversations with more than one turn
  int32_t max_turns = 4;             // turns of a multi-turn conversation: uniform 2..max
  double think_s = 2.0;              // mean pause between a reply and the next turn
  double parallel_share = 0.1;       // share of requests sampled n times
  int32_t samples = 4;               // n of those
  double speculative_share = 0.2;    // share of requests decoded speculatively
  int32_t priorities = 3;            // priorities are drawn uniformly from [0, priorities)
  int32_t namespaces = 1;            // adapters / cache salts, drawn uniformly
  /// kInvalidArgument naming the first bad field.
  Status validate() const;
};

/// Generates `config.num_requests` requests, sorted by id; the same config gives the same
/// requests on every platform (the generator uses its own PRNG and distributions).
StatusOr<std::vector<Request>> generate_workload(const WorkloadConfig& config);

/// Token `position` of the answer of `sample` of request `request_id`.
TokenId output_token(uint64_t request_id, int32_t sample, int64_t position);

/// The tokens of shared prefix `group` (a system prompt), `length` long; the same for every
/// request and every trace that names the group.
std::vector<TokenId> prefix_tokens(int32_t group, int32_t length);

/// Tokens unique to request `request_id` (its user message), `length` long.
std::vector<TokenId> unique_tokens(uint64_t request_id, int32_t salt, int32_t length);

/// A small, portable PRNG (splitmix64) with the distributions the generator needs; std::
/// distributions differ between standard libraries, so they are not used.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  /// Uniform in [0, 1).
  double uniform();
  /// Exponential with the given mean.
  double exponential(double mean);
  /// Standard normal (Box-Muller).
  double normal();

 private:
  uint64_t state_;
};

/// A 64-bit mix of `x` (splitmix64 finaliser): cheap, deterministic hashing.
uint64_t mix64(uint64_t x);

}  // namespace sim
}  // namespace pagedkv
