// Invalid calls: each returns the named code and leaves every observable state unchanged
// (seed defect 8: bad input must never panic or half-apply).
#include <gtest/gtest.h>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

class InvalidCalls : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheConfig c = tiny_config(4, 6, 2);
    c.max_sequence_length = 20;
    cp_ = make_cp(c);
    add_and_fill(*cp_, 1, iota_tokens(9, 0));
    add_and_fill(*cp_, 2, iota_tokens(6, 0));
    ASSERT_OK(cp_->reserve(2, 2));
    ASSERT_OK(cp_->set_active({1}));
    ASSERT_OK(cp_->build_batch({1, 2}));
    cp_->drain_events();
    before_ = snapshot(*cp_, ids_);
  }
  void expect_unchanged() {
    EXPECT_EQ(snapshot(*cp_, ids_), before_);
    EXPECT_TRUE(cp_->drain_events().empty());
    PAGEDKV_EXPECT_INV(*cp_);
  }
  std::unique_ptr<ControlPlane> cp_;
  std::vector<SequenceId> ids_{1, 2, 3, 99};
  Snapshot before_;
};

TEST_F(InvalidCalls, UnknownIds) {
  EXPECT_EQ(cp_->reserve(99, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->commit(99, {1}).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->rollback(99, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->fork(99, 3).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->finish(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->erase(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->set_active({1, 99}).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->set_priority(99, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->offload(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->restore(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->residency(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->block_locations(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cp_->build_batch({1, 99}).status().code(), StatusCode::kNotFound);
  expect_unchanged();
}

TEST_F(InvalidCalls, DuplicatesAndBounds) {
  EXPECT_EQ(cp_->add_sequence(1, {5}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cp_->fork(1, 2).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cp_->add_sequence(3, iota_tokens(21, 0)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp_->reserve(1, 12).status().code(), StatusCode::kOutOfRange);  // 9 + 12 > 20
  EXPECT_EQ(cp_->reserve(1, -3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->rollback(1, 10).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp_->rollback(1, -1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp_->commit(2, iota_tokens(3, 0)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cp_->commit(1, {1}).code(), StatusCode::kFailedPrecondition);  // nothing reserved
  EXPECT_EQ(cp_->commit(2, nullptr, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->commit(2, nullptr, -1).code(), StatusCode::kInvalidArgument);
  SequenceOptions bad;
  bad.retention_priority = -1;
  EXPECT_EQ(cp_->add_sequence(3, {1}, bad).status().code(), StatusCode::kInvalidArgument);
  bad.retention_priority = 50;
  bad.retention_duration_ns = -5;
  EXPECT_EQ(cp_->add_sequence(3, {1}, bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->build_batch({1, 1}).status().code(), StatusCode::kInvalidArgument);
  BatchOptions bo;
  bo.pad_slots_to = -1;
  EXPECT_EQ(cp_->build_batch({1}, bo).status().code(), StatusCode::kInvalidArgument);
  expect_unchanged();
}

TEST_F(InvalidCalls, WrongStateAndExhaustion) {
  EXPECT_EQ(cp_->offload(1).status().code(), StatusCode::kFailedPrecondition);  // active
  EXPECT_EQ(cp_->restore(2).status().code(), StatusCode::kFailedPrecondition);  // resident
  // Sequence 2 holds 2 exclusive blocks (its first block is shared with 1); host has 2.
  ASSERT_OK(cp_->add_sequence(3, {}));
  ids_ = {1, 2, 3, 99};
  ASSERT_OK(cp_->reserve(3, 4));
  ASSERT_OK(cp_->set_active({1, 3}));
  cp_->drain_events();
  before_ = snapshot(*cp_, ids_);
  // 1 free block, nothing cached unreferenced, 2 movable: 3 obtainable; ask for 5.
  EXPECT_EQ(cp_->reserve(3, 20).status().code(), StatusCode::kResourceExhausted);
  expect_unchanged();
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
