// kill -9 of a FileTier writer mid-job, then a restart, for the packed and the O_DIRECT
// segment formats alike: a child process puts job after job of odd_layout() blocks and reports
// each finished one through a pipe; after three reports it is killed. A store opened anew on the
// directory must read every block that reads at all with the bytes written, every job the child
// reported whole, and take new puts.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "storage/storage_test_util.hpp"

namespace pagedkv::testing {

/// Runs the scenario with stores of `options` (odd_layout(), blocks of `payload` bytes); keys
/// from `key_base`, block bytes from `seed`, so that two suites use distinct ones.
inline void kill_writer_mid_job_and_restart(const FileTierOptions& options, int64_t payload,
                                            uint64_t key_base, uint32_t seed) {
  constexpr size_t kPerJob = 24;
  const auto job_keys = [&](size_t j) { return keys_from(key_base * (j + 1), kPerJob); };
  const auto job_blocks = [&](size_t j) {
    return random_blocks(kPerJob, payload, seed + static_cast<uint32_t>(j));
  };
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    auto made = make_file_tier(odd_layout(), options);
    if (!made.ok()) ::_exit(2);
    std::unique_ptr<StorageTier> tier = std::move(made).value();
    for (size_t j = 0;; ++j) {
      const auto blocks = job_blocks(j);
      if (!tier->submit_put(job_keys(j), cptrs(blocks)).ok()) ::_exit(3);
      tier->drain();
      for (const StorageCompletion& c : tier->poll()) {
        if (!c.ok) ::_exit(4);
      }
      const char done = 'j';
      if (::write(pipe_fds[1], &done, 1) != 1) ::_exit(5);
    }
  }
  ::close(pipe_fds[1]);
  char c;
  for (int reported = 0; reported < 3; ++reported) {  // some progress, then the kill
    ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1) << "the writer died early";
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  size_t finished = 3;
  while (::read(pipe_fds[0], &c, 1) == 1) ++finished;
  ::close(pipe_fds[0]);

  auto made = make_file_tier(odd_layout(), options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<StorageTier> tier = std::move(made).value();
  for (size_t j = 0; j < finished + 2; ++j) {
    const auto keys = job_keys(j);
    const auto blocks = job_blocks(j);
    auto out = poisoned(kPerJob, payload);
    std::vector<uint64_t> gets;
    for (size_t i = 0; i < kPerJob; ++i) {
      gets.push_back(tier->submit_get({keys[i]}, {out[i].data()}).value());
    }
    tier->drain();
    auto done = collect(*tier, gets);
    for (size_t i = 0; i < kPerJob; ++i) {
      const StorageCompletion& d = done[gets[i]];
      if (d.ok) {
        EXPECT_EQ(out[i], blocks[i]) << "job " << j << " block " << i;
      }
      if (j < finished) {
        EXPECT_TRUE(d.ok) << "job " << j << " block " << i << ": " << d.error;
      }
    }
  }
  // New puts after the restart.
  const auto keys = keys_from(key_base / 0x10000 + 0xc00, 5);
  const auto blocks = random_blocks(5, payload, seed + 500);
  auto out = poisoned(keys.size(), payload);
  const StorageCompletion put = finish(*tier, tier->submit_put(keys, cptrs(blocks)));
  ASSERT_TRUE(put.ok) << put.error;
  const StorageCompletion got = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_TRUE(got.ok) << got.error;
  EXPECT_EQ(out, blocks);
}

}  // namespace pagedkv::testing
