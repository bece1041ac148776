// Trace replay: round trip, the prefix-group form, and clear errors for malformed lines.
#include "trace.hpp"

#include <gtest/gtest.h>

#include <sstream>

#include "support/status_matchers.hpp"

namespace pagedkv::sim {
namespace {

TEST(Trace, RoundTripsAGeneratedWorkload) {
  WorkloadConfig c;
  c.num_requests = 120;
  c.seed = 7;
  auto w = generate_workload(c);
  ASSERT_OK(w);
  std::stringstream buf;
  ASSERT_OK(write_trace(buf, w.value()));
  auto back = read_trace(buf, "mem");
  ASSERT_OK(back);
  // The reader sorts by arrival; the generator emits later turns with their conversation's
  // start time, so compare as sets ordered by id.
  std::vector<Request> a = w.value(), b = back.value();
  auto by_id = [](const Request& x, const Request& y) { return x.id < y.id; };
  std::sort(a.begin(), a.end(), by_id);
  std::sort(b.begin(), b.end(), by_id);
  EXPECT_EQ(a, b);
}

TEST(Trace, PrefixGroupFormBuildsSharedPrefixes) {
  std::istringstream in(
      "{\"id\": 1, \"arrival_s\": 0.0, \"prefix_group\": 3, \"prefix_len\": 32, "
      "\"prompt_len\": 40, \"output_len\": 5, \"priority\": 2, \"namespace\": 9}\n"
      "\n"
      "{\"id\": 2, \"arrival_s\": 0.5, \"prefix_group\": 3, \"prefix_len\": 32, "
      "\"prompt_len\": 50, \"output_len\": 5}\n");
  auto t = read_trace(in, "t");
  ASSERT_OK(t);
  ASSERT_EQ(t.value().size(), 2u);
  const Request& a = t.value()[0];
  const Request& b = t.value()[1];
  EXPECT_EQ(a.prompt.size(), 40u);
  EXPECT_EQ(b.prompt.size(), 50u);
  EXPECT_EQ(a.priority, 2);
  EXPECT_EQ(a.ns, 9u);
  EXPECT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + 32, b.prompt.begin()));
  EXPECT_NE(a.prompt[32], b.prompt[32]);
}

// Each malformed line is reported with its line number; nothing is returned.
TEST(Trace, MalformedLinesNameTheLine) {
  const std::string good =
      "{\"id\": 1, \"arrival_s\": 0, \"prompt\": [5, 6, 7], \"output_len\": 2}\n";
  const struct {
    const char* line;
    const char* expect;
  } cases[] = {
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5], \"output_len\": 2", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5]}", "output_len"},
      {"{\"id\": 2, \"arrival_s\": -1, \"prompt\": [5], \"output_len\": 2}", "arrival_s"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [\"a\"], \"output_len\": 2}", "prompt"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5], \"output_len\": 0}", "output_len"},
      {"{\"id\": 1, \"arrival_s\": 0, \"prompt\": [5], \"output_len\": 2}", "duplicate id"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5], \"output_len\": 2, \"after\": 9}", "after"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5], \"output_len\": 2, \"colour\": 1}",
       "unknown field \"colour\""},
      {"{\"id\": 2, \"arrival_s\": 0, \"prompt\": [5], \"prompt_len\": 4, \"output_len\": 2}",
       "either"},
      {"{\"id\": 2, \"arrival_s\": 0, \"prefix_group\": 1, \"prefix_len\": 9, \"prompt_len\": 4, "
       "\"output_len\": 2}",
       "prefix_len"},
  };
  for (const auto& c : cases) {
    const std::string last =
        "{\"id\": 99, \"arrival_s\": 1, \"prompt\": [5, 6, 7], \"output_len\": 2}\n";
    std::istringstream in(good + "\n" + c.line + "\n" + last);
    auto t = read_trace(in, "trace.jsonl");
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message().rfind("trace.jsonl:3: ", 0), 0u) << t.status().message();
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().message();
  }
}

TEST(Trace, MissingFileIsNotFound) {
  auto t = read_trace_file("/nonexistent/trace.jsonl");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pagedkv::sim
