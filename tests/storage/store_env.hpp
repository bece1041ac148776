// The stores' conformance fixture: each test runs against the file store in a scratch directory
// and the Redis store against a redis-server the test starts (skipped, with the reason, when the
// build has no hiredis or the machine no redis-server). Shared by the conformance tests and the
// raw-call tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "storage/segment_files.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

// A bit-at-a-time CRC-32C, independent of the library's table and SSE4.2 code.
inline uint32_t reference_crc32c(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ ((c & 1u) != 0 ? 0x82F63B78u : 0u);
  }
  return ~c;
}

class StoreEnv {
 public:
  virtual ~StoreEnv() = default;
  /// Empty when the store can be made here, else why the test skips.
  virtual std::string setup() = 0;
  virtual StatusOr<std::unique_ptr<StorageTier>> make(const StorageLayout& layout,
                                                      int32_t threads = 2,
                                                      int64_t max_queued = 4096) = 0;
  /// The bytes the store holds for `key` (header and payload); nullopt when none.
  virtual std::optional<std::string> raw(const StorageLayout& layout, const StorageKey& key) = 0;
  /// Replaces them (as a crash or another writer could have left them).
  virtual void write_raw(const StorageLayout& layout, const StorageKey& key,
                         const std::string& bytes) = 0;
  /// What a get of a block cut short says.
  virtual const char* short_block_reason() const { return "size"; }
};

class FileEnv : public StoreEnv {
 public:
  /// `direct`: segments written with O_DIRECT (aligned records).
  explicit FileEnv(bool direct = false) : direct_(direct) {}
  std::string setup() override { return dir_.path().empty() ? "mkdtemp failed" : ""; }
  StatusOr<std::unique_ptr<StorageTier>> make(const StorageLayout& layout, int32_t threads,
                                              int64_t max_queued) override {
    FileTierOptions o;
    o.directory = dir_.path();
    o.threads = threads;
    o.max_queued_blocks = max_queued;
    o.direct_io = direct_;
    return make_file_tier(layout, o);
  }
  // The body of the key's block record in its segment (segment_files.hpp).
  std::optional<std::string> raw(const StorageLayout& layout, const StorageKey& key) override {
    const auto r = block_record(dir_.path(), layout, key);
    if (!r) return std::nullopt;
    return file_bytes(r->path).substr(size_t(r->offset) + 40, 48 + size_t(layout.block_bytes));
  }
  // In place: a record cannot shrink in the middle of a segment, so bytes past a shorter
  // replacement read as zeros.
  void write_raw(const StorageLayout& layout, const StorageKey& key,
                 const std::string& bytes) override {
    const auto r = block_record(dir_.path(), layout, key);
    ASSERT_TRUE(r.has_value());
    std::string body = bytes;
    body.resize(48 + size_t(layout.block_bytes), '\0');
    write_at(r->path, r->offset + 40, body);
  }
  const char* short_block_reason() const override { return "checksum"; }

 private:
  bool direct_;
  TempDir dir_;
};

class RedisEnv : public StoreEnv {
 public:
  std::string setup() override {
    if (RedisServer::binary().empty()) return "redis-server is not installed";
    // No hiredis in this build: make_redis_tier says so.
    auto probe = make_redis_tier(odd_layout(), no_port());
    if (!probe.ok() && probe.status().code() == StatusCode::kUnimplemented) {
      return probe.status().to_string();
    }
    return server_.start();
  }
  StatusOr<std::unique_ptr<StorageTier>> make(const StorageLayout& layout, int32_t threads,
                                              int64_t max_queued) override {
    RedisTierOptions o;
    o.port = server_.port();
    o.key_prefix = "pagedkv-test";
    o.threads = threads;
    o.max_queued_blocks = max_queued;
    return make_redis_tier(layout, o);
  }
  // The documented key: <prefix>:<fingerprint>:<ns>:<hash>.
  static std::string key(const StorageLayout& layout, const StorageKey& k) {
    return "pagedkv-test:" + hex(layout.fingerprint()) + ":" + hex(k.ns) + ":" + hex(k.block_hash);
  }
  std::optional<std::string> raw(const StorageLayout& layout, const StorageKey& k) override {
    RespClient c(server_.port());
    auto r = c.command({"GET", key(layout, k)});
    if (!r || r->empty() || (*r)[0] != '$') return std::nullopt;
    return r->substr(1);
  }
  void write_raw(const StorageLayout& layout, const StorageKey& k,
                 const std::string& bytes) override {
    RespClient c(server_.port());
    auto r = c.command({"SET", key(layout, k), bytes});
    ASSERT_TRUE(r && *r == "+OK");
  }

 private:
  RedisServer server_;
};

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "file" || GetParam() == "file_direct") {
      env_ = std::make_unique<FileEnv>(GetParam() == "file_direct");
    } else {
      env_ = std::make_unique<RedisEnv>();
    }
    const std::string skip = env_->setup();
    if (!skip.empty()) GTEST_SKIP() << skip;
  }
  std::unique_ptr<StorageTier> make(const StorageLayout& layout, int32_t threads = 2,
                                    int64_t max_queued = 4096) {
    auto t = env_->make(layout, threads, max_queued);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<StoreEnv> env_;
};

}  // namespace pagedkv::testing
