// The generator: deterministic for a seed, and it produces every feature the scheduler drives.
#include "workload.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "support/status_matchers.hpp"

namespace pagedkv::sim {
namespace {

TEST(Workload, SameSeedGivesTheSameRequests) {
  WorkloadConfig c;
  c.num_requests = 200;
  c.seed = 42;
  auto a = generate_workload(c), b = generate_workload(c);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a.value(), b.value());
  c.seed = 43;
  auto d = generate_workload(c);
  ASSERT_OK(d);
  EXPECT_NE(a.value(), d.value());
}

TEST(Workload, ProducesEveryFeature) {
  WorkloadConfig c;
  c.num_requests = 400;
  auto w = generate_workload(c);
  ASSERT_OK(w);
  const std::vector<Request>& r = w.value();
  ASSERT_EQ(r.size(), 400u);
  int parallel = 0, spec = 0, later_turns = 0;
  double last_arrival = 0;
  for (const Request& q : r) {
    parallel += q.samples > 1;
    spec += q.speculative;
    EXPECT_GE(q.arrival_s, last_arrival);
    EXPECT_GE(q.priority, 0);
    EXPECT_LT(q.priority, c.priorities);
    if (q.after == 0) {
      last_arrival = q.arrival_s;
      continue;
    }
    ++later_turns;
    // A later turn's prompt is the previous prompt + its answer (sample 0) + a new message.
    const Request& prev = r[q.after - 1];
    ASSERT_EQ(prev.id, q.after);
    ASSERT_GT(q.prompt.size(), prev.prompt.size() + static_cast<size_t>(prev.output_len));
    EXPECT_TRUE(std::equal(prev.prompt.begin(), prev.prompt.end(), q.prompt.begin()));
    for (int32_t i = 0; i < prev.output_len; ++i)
      ASSERT_EQ(q.prompt[prev.prompt.size() + static_cast<size_t>(i)], output_token(prev.id, 0, i));
  }
  EXPECT_GT(parallel, 0);
  EXPECT_GT(spec, 0);
  EXPECT_GT(later_turns, 0);
}

TEST(Workload, SharedSystemPromptsStartTheirPrompts) {
  WorkloadConfig c;
  c.num_requests = 50;
  c.system_prompts = 1;
  c.system_prompt_share = 1.0;
  c.multi_turn_share = 0;
  auto w = generate_workload(c);
  ASSERT_OK(w);
  const std::vector<TokenId> sys = prefix_tokens(0, c.system_prompt_len);
  for (const Request& q : w.value())
    EXPECT_TRUE(std::equal(sys.begin(), sys.end(), q.prompt.begin())) << q.id;
}

TEST(Workload, BadConfigNamesTheField) {
  WorkloadConfig c;
  c.arrival_rate = 0;
  auto w = generate_workload(c);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("rate"), std::string::npos);
}

}  // namespace
}  // namespace pagedkv::sim
