// ASSERT_OK / EXPECT_OK (support/status_matchers.hpp): their failure text names the expression
// and the status, they take a streamed message, evaluate the expression once and nest in an
// unbraced if/else.
#include "support/status_matchers.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "pagedkv/status.hpp"

namespace pagedkv {
namespace {

// EXPECT_(NON)FATAL_FAILURE's statement cannot see locals, so the failing calls and the
// evaluation counter live at namespace scope.
int g_calls = 0;

Status missing_block() {
  ++g_calls;
  return not_found("block 7 is not resident");
}

StatusOr<std::unique_ptr<int>> exhausted_pool() {
  ++g_calls;
  return resource_exhausted("pool has 0 free blocks");
}

StatusOr<std::unique_ptr<int>> a_value() { return std::make_unique<int>(3); }

TEST(StatusMatchers, PassOnOkStatusAndStatusOr) {
  ASSERT_OK(ok_status());
  EXPECT_OK(ok_status());
  const StatusOr<std::unique_ptr<int>> held = a_value();
  ASSERT_OK(held);
  EXPECT_OK(a_value()) << "never streamed";
}

TEST(StatusMatchers, ExpectOkFailureShowsExpressionAndStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(missing_block()),
                          "missing_block() is not OK: kNotFound: block 7 is not resident");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(exhausted_pool()) << "while growing",
                          "kResourceExhausted: pool has 0 free blocks\nwhile growing");
}

TEST(StatusMatchers, AssertOkFailureIsFatalAndShowsStatusOfTemporary) {
  // The StatusOr is a temporary: the message must outlive it.
  EXPECT_FATAL_FAILURE(ASSERT_OK(exhausted_pool()),
                       "exhausted_pool() is not OK: kResourceExhausted: pool has 0 free blocks");
  EXPECT_FATAL_FAILURE(ASSERT_OK(missing_block()) << "step " << 3,
                       "kNotFound: block 7 is not resident\nstep 3");
}

TEST(StatusMatchers, AssertOkStopsTheFunction) {
  static bool reached_after = false;
  EXPECT_FATAL_FAILURE(
      {
        ASSERT_OK(missing_block());
        reached_after = true;
      },
      "block 7");
  EXPECT_FALSE(reached_after);
}

TEST(StatusMatchers, EvaluatesTheExpressionOnce) {
  g_calls = 0;
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(missing_block()) << "x", "block 7");
  EXPECT_EQ(g_calls, 1);
  g_calls = 0;
  EXPECT_FATAL_FAILURE(ASSERT_OK(exhausted_pool()), "pool");
  EXPECT_EQ(g_calls, 1);

  int calls = 0;
  auto counted_ok = [&calls] {
    ++calls;
    return ok_status();
  };
  ASSERT_OK(counted_ok());
  EXPECT_OK(counted_ok()) << "message";
  EXPECT_EQ(calls, 2);
}

TEST(StatusMatchers, NestsInUnbracedIfElse) {
  int branch = 0;
  for (const bool first : {true, false}) {
    if (first)
      ASSERT_OK(ok_status()) << "first";
    else
      EXPECT_OK(ok_status());
    if (first)
      EXPECT_OK(ok_status());
    else
      branch = 2;  // binds to `if (first)`, not to the macro's own if
  }
  EXPECT_EQ(branch, 2);
}

}  // namespace
}  // namespace pagedkv
