// ASSERT_OK / EXPECT_OK for a Status or a StatusOr: on failure they print the expression and
// the status (code and message), which a bare `.ok()` assertion does not.
#pragma once

#include <gtest/gtest.h>

#include "pagedkv/status.hpp"

namespace pagedkv::testing {

inline const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const StatusOr<T>& s) {
  return s.status();
}

}  // namespace pagedkv::testing

#define ASSERT_OK(expr)                                                                    \
  do {                                                                                     \
    const auto& pagedkv_result_ = (expr);                                                  \
    const ::pagedkv::Status& pagedkv_st_ = ::pagedkv::testing::status_of(pagedkv_result_); \
    ASSERT_TRUE(pagedkv_st_.ok()) << #expr << ": " << pagedkv_st_.to_string();             \
  } while (0)

#define EXPECT_OK(expr)                                                                    \
  do {                                                                                     \
    const auto& pagedkv_result_ = (expr);                                                  \
    const ::pagedkv::Status& pagedkv_st_ = ::pagedkv::testing::status_of(pagedkv_result_); \
    EXPECT_TRUE(pagedkv_st_.ok()) << #expr << ": " << pagedkv_st_.to_string();             \
  } while (0)
