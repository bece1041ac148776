#include "pagedkv/status.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

TEST(Status, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_OK(s);
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.to_string(), "kOk");
}

TEST(Status, HelpersCarryCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    const char* name;
  };
  const std::vector<Case> cases = {
      {invalid_argument("a"), StatusCode::kInvalidArgument, "kInvalidArgument"},
      {not_found("a"), StatusCode::kNotFound, "kNotFound"},
      {already_exists("a"), StatusCode::kAlreadyExists, "kAlreadyExists"},
      {out_of_range("a"), StatusCode::kOutOfRange, "kOutOfRange"},
      {failed_precondition("a"), StatusCode::kFailedPrecondition, "kFailedPrecondition"},
      {resource_exhausted("a"), StatusCode::kResourceExhausted, "kResourceExhausted"},
      {unavailable("a"), StatusCode::kUnavailable, "kUnavailable"},
      {unimplemented("a"), StatusCode::kUnimplemented, "kUnimplemented"},
      {internal_error("a"), StatusCode::kInternal, "kInternal"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "a");
    EXPECT_EQ(c.status.to_string(), std::string(c.name) + ": a");
    EXPECT_STREQ(status_code_name(c.code), c.name);
  }
}

TEST(Status, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(not_found("x"), not_found("x"));
  EXPECT_NE(not_found("x"), not_found("y"));
  EXPECT_NE(not_found("x"), invalid_argument("x"));
}

TEST(StatusOr, HoldsValue) {
  StatusOr<int> v = 42;
  ASSERT_OK(v);
  EXPECT_OK(v.status());
  EXPECT_EQ(*v, 42);
  EXPECT_EQ(v.value_or(7), 42);
}

TEST(StatusOr, HoldsError) {
  StatusOr<int> v = not_found("sequence 3");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(v.status().message(), "sequence 3");
  EXPECT_EQ(v.value_or(7), 7);
}

TEST(StatusOr, OkStatusWithoutValueBecomesInternalError) {
  StatusOr<int> v = Status();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, MoveOnlyValueAndCopies) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(5);
  ASSERT_OK(p);
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 5);

  StatusOr<std::string> a = std::string("hello");
  StatusOr<std::string> b = a;  // copy keeps both
  EXPECT_EQ(*a, "hello");
  EXPECT_EQ(*b, "hello");
  b = not_found("gone");
  EXPECT_FALSE(b.ok());
  b = a;
  EXPECT_EQ(b->size(), 5u);
}

Status fail_if(bool fail) { return fail ? out_of_range("too far") : ok_status(); }

Status chain(bool fail, int* reached) {
  PAGEDKV_RETURN_IF_ERROR(fail_if(fail));
  *reached = 1;
  return ok_status();
}

StatusOr<int> half_of(int x) {
  if (x % 2 != 0) return invalid_argument("odd");
  return x / 2;
}

StatusOr<int> quarter_of(int x) {
  PAGEDKV_ASSIGN_OR_RETURN(int h, half_of(x));
  PAGEDKV_ASSIGN_OR_RETURN(int q, half_of(h));
  return q;
}

TEST(StatusMacros, ReturnIfErrorStopsAtTheFirstError) {
  int reached = 0;
  EXPECT_EQ(chain(true, &reached).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(reached, 0);
  EXPECT_OK(chain(false, &reached));
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacros, AssignOrReturnPropagatesErrors) {
  EXPECT_EQ(*quarter_of(12), 3);
  EXPECT_EQ(quarter_of(6).status().code(), StatusCode::kInvalidArgument);  // 3 is odd
  EXPECT_EQ(quarter_of(5).status().message(), "odd");
}

}  // namespace
}  // namespace pagedkv
