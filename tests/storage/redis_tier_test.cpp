// What only the Redis store does: following its server through a crash and a restart, and its
// option checks. The server is started by the fixture and stopped in TearDown (also when a test
// fails); the tests skip, with the reason, when the build has no hiredis or redis-server is
// missing.
#include <thread>

#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto probe = make_redis_tier(odd_layout(), no_port());
    if (!probe.ok() && probe.status().code() == StatusCode::kUnimplemented) {
      GTEST_SKIP() << probe.status().to_string();
    }
    if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    const std::string why = server_.start();
    ASSERT_TRUE(why.empty()) << why;
  }
  void TearDown() override { server_.stop(); }

  std::unique_ptr<StorageTier> make(int port) {
    RedisTierOptions o;
    o.port = port;
    o.timeout_ms = 5000;  // a crash shows as a reset connection; this only guards a loaded machine
    auto t = make_redis_tier(odd_layout(), o);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  RedisServer server_;
};

TEST_F(RedisTierTest, ServerCrashTurnsLookupsIntoMissesAndTheStoreRecovers) {
  auto tier = make(server_.port());
  ASSERT_NE(tier, nullptr);
  EXPECT_STREQ(tier->medium(), "REDIS");
  const auto keys = keys_from(0x900, 8);
  const auto blocks = random_blocks(8, 4104, 30);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  ASSERT_EQ(tier->batch_exists(keys).value(), 8u);
  EXPECT_EQ(outage_warnings(*tier), 0);

  server_.stop(/*crash=*/true);  // kill -9
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tier->batch_exists(keys).value(), 0u);
  const StorageCompletion put = finish(*tier, tier->submit_put(keys, cptrs(blocks)));
  EXPECT_FALSE(put.ok);
  EXPECT_EQ(tier->stats().failed_puts, 8);
  auto out = poisoned(8, 4104);
  EXPECT_FALSE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(tier->stats().failed_gets, 8);
  EXPECT_EQ(outage_warnings(*tier), 1) << "one warning per outage, not one per call";

  // The server is back (empty: no persistence). Puts succeed again once the store reconnects.
  const std::string why = server_.start();
  ASSERT_TRUE(why.empty()) << why;
  bool stored = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!stored && std::chrono::steady_clock::now() < deadline) {
    stored = finish(*tier, tier->submit_put({keys[0]}, {blocks[0].data()})).ok;
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(stored) << "puts still fail after the server came back";
  while (tier->batch_exists({keys[0]}).value() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(tier->batch_exists(keys).value(), 1u);
  ASSERT_TRUE(finish(*tier, tier->submit_get({keys[0]}, {out[0].data()})).ok);
  EXPECT_EQ(out[0], blocks[0]);
  EXPECT_EQ(outage_warnings(*tier), 1);
}

TEST_F(RedisTierTest, AStoreCreatedWithoutAServerMissesUntilOneAnswers) {
  RedisServer later;  // a free port nobody listens on yet
  auto tier = make(later.port());
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xa00, 2);
  const auto blocks = random_blocks(2, 4104, 31);
  EXPECT_EQ(tier->batch_exists(keys).value(), 0u);
  EXPECT_FALSE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  EXPECT_EQ(outage_warnings(*tier), 1);
  const std::string why = later.start();
  ASSERT_TRUE(why.empty()) << why;
  bool stored = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!stored && std::chrono::steady_clock::now() < deadline) {
    stored = finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok;
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(stored);
  later.stop();
}

TEST_F(RedisTierTest, BadOptionsAreRejected) {
  const auto code = [](RedisTierOptions o, StorageLayout l = odd_layout()) {
    return make_redis_tier(l, o).status().code();
  };
  RedisTierOptions o;
  o.port = server_.port();
  EXPECT_EQ(code(o), StatusCode::kOk);
  StorageLayout bad = odd_layout();
  bad.block_bytes = 1;
  EXPECT_EQ(code(o, bad), StatusCode::kInvalidArgument);
  o.host = "";
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.host = "127.0.0.1";
  o.port = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.port = 70000;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.port = server_.port();
  o.timeout_ms = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.timeout_ms = 100;
  o.key_prefix = "";
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.key_prefix = "p";
  o.threads = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.threads = 1;
  o.max_queued_blocks = -3;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv::testing
