// ASSERT_OK / EXPECT_OK for a Status or a StatusOr: on failure they print the expression and
// the status (code and message), which a bare `.ok()` assertion does not. They are gtest
// predicate-format assertions, so like ASSERT_TRUE they evaluate the expression once, take a
// streamed message (`ASSERT_OK(x) << "context"`) and are safe in an unbraced if/else.
#pragma once

#include <gtest/gtest.h>

#include "pagedkv/status.hpp"

namespace pagedkv::testing {

inline const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const StatusOr<T>& s) {
  return s.status();
}

/// The predicate formatter behind ASSERT_OK / EXPECT_OK: success, or "<text> is not OK: <status>".
/// The status is read within the assertion's full expression, so a temporary StatusOr is fine.
template <typename T>
::testing::AssertionResult is_ok_format(const char* text, const T& result) {
  const Status& st = status_of(result);
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text << " is not OK: " << st.to_string();
}

}  // namespace pagedkv::testing

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::pagedkv::testing::is_ok_format, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::pagedkv::testing::is_ok_format, expr)
