// Helpers of the storage tests: scratch directories, random blocks, layouts, collecting
// completions, and a redis-server the test starts and stops itself (with a tiny RESP client, so
// the tests talk to the server without going through the code under test).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/storage_tier.hpp"
#include "storage/queued_tier.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/pagedkv-storage-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The odd-sized layout most tests use: 1 layer x 27 KV heads x 19 dims x 4 tokens, fp8:
/// 2 * 4 * 27 * 19 = 4104 bytes per block.
inline StorageLayout odd_layout(std::string model_id = "tiny-model/rev7") {
  StorageLayout l;
  l.num_layers = 1;
  l.num_kv_heads = 27;
  l.head_dim = 19;
  l.block_size = 4;
  l.dtype = DType::kFloat8E4M3;
  l.page_layout = PageLayout::kHND;
  l.model_id = std::move(model_id);
  l.block_bytes = 4104;
  return l;
}

/// `n` blocks of random bytes.
inline std::vector<std::vector<unsigned char>> random_blocks(size_t n, int64_t bytes,
                                                             uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<unsigned char>> out(n, std::vector<unsigned char>(size_t(bytes)));
  for (auto& b : out)
    for (auto& x : b) x = static_cast<unsigned char>(rng());
  return out;
}

/// Buffers filled with a poison pattern, to read blocks into.
inline std::vector<std::vector<unsigned char>> poisoned(size_t n, int64_t bytes) {
  return std::vector<std::vector<unsigned char>>(n,
                                                 std::vector<unsigned char>(size_t(bytes), 0xA5));
}

inline std::vector<StorageKey> keys_from(uint64_t first_hash, size_t n, NamespaceId ns = 7) {
  std::vector<StorageKey> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(StorageKey{first_hash + 0x1000193ull * i, ns});
  return keys;
}

inline std::vector<const void*> cptrs(const std::vector<std::vector<unsigned char>>& b) {
  std::vector<const void*> out;
  for (const auto& x : b) out.push_back(x.data());
  return out;
}

inline std::vector<void*> ptrs(std::vector<std::vector<unsigned char>>& b) {
  std::vector<void*> out;
  for (auto& x : b) out.push_back(x.data());
  return out;
}

/// Polls until the completions of `jobs` have all arrived (or `timeout` passes); returns them by
/// job id. A job completed twice, or one not asked for, fails the test.
inline std::map<uint64_t, StorageCompletion> collect(
    StorageTier& tier, std::vector<uint64_t> jobs,
    std::chrono::seconds timeout = std::chrono::seconds(20)) {
  std::map<uint64_t, StorageCompletion> got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got.size() < jobs.size() && std::chrono::steady_clock::now() < deadline) {
    for (StorageCompletion& c : tier.poll()) {
      EXPECT_TRUE(std::find(jobs.begin(), jobs.end(), c.job) != jobs.end()) << "job " << c.job;
      EXPECT_EQ(got.count(c.job), 0u) << "job " << c.job << " completed twice";
      got[c.job] = c;
    }
    if (got.size() < jobs.size()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(got.size(), jobs.size()) << "completions missing after the timeout";
  return got;
}

/// Runs one job to completion and returns its completion.
inline StorageCompletion finish(StorageTier& tier, StatusOr<uint64_t> job) {
  EXPECT_OK(job);
  if (!job.ok()) return StorageCompletion{0, false, job.status().to_string()};
  tier.drain();
  auto got = collect(tier, {job.value()});
  return got.empty() ? StorageCompletion{} : got.begin()->second;
}

/// The test seam of the stores: pause (true) or resume the I/O threads.
inline void set_paused(StorageTier& tier, bool paused) {
  auto* q = dynamic_cast<detail::QueuedStorageTier*>(&tier);
  ASSERT_NE(q, nullptr);
  q->set_paused(paused);
}

inline int64_t outage_warnings(StorageTier& tier) {
  auto* q = dynamic_cast<detail::QueuedStorageTier*>(&tier);
  return q == nullptr ? -1 : q->outage_warnings();
}

/// 16 lower-case hex digits, written here independently of the library's.
inline std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- redis-server ----

/// Options make_redis_tier rejects (kInvalidArgument) without connecting anywhere; a build
/// without hiredis answers kUnimplemented to them, which is how the tests tell.
inline RedisTierOptions no_port() {
  RedisTierOptions o;
  o.port = 0;
  return o;
}

/// A blocking RESP connection to 127.0.0.1:port. Replies: "+..." status, "-..." error,
/// ":n" integer, "$" + bytes for a bulk string, "nil".
class RespClient {
 public:
  explicit RespClient(int port);
  ~RespClient();
  RespClient(const RespClient&) = delete;
  RespClient& operator=(const RespClient&) = delete;
  bool connected() const { return fd_ >= 0; }
  /// Sends one command; std::nullopt when the connection failed.
  std::optional<std::string> command(const std::vector<std::string>& args);

 private:
  bool read_line(std::string* line);
  bool read_exact(size_t n, std::string* out);
  int fd_ = -1;
  std::string buffered_;
};

/// redis-server on 127.0.0.1 at a free port, without persistence, stopped on destruction.
class RedisServer {
 public:
  /// The server's path, or empty when redis-server is not installed.
  static std::string binary();
  RedisServer();
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// Starts the server (on the same port as before, if it ran already) and waits until it
  /// answers PING. Empty string on success, else why not.
  std::string start();
  /// SIGKILL (crash) or SIGTERM, then waits for the process.
  void stop(bool crash = false);
  int port() const { return port_; }
  bool running() const { return pid_ > 0; }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace pagedkv::testing
