// UploadArena over several targets (the ranks of a tensor-parallel cache): an upload is packed
// once and copied to every target's device on that target's stream, and a chunk's staging is
// refilled only after every target's copies and readers are done, however slow one target is.
#include "runtime/upload_arena.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "pagedkv/cpu_backend.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::runtime {
namespace {

// Two devices: target 0 undelayed, target 1's copies sleep on its stream's worker, so they run
// long after the host has moved on to the next uploads.
struct TwoTargets {
  std::unique_ptr<Backend> fast = create_cpu_backend();
  std::unique_ptr<Backend> slow;
  Stream fast_stream{}, slow_stream{};

  TwoTargets() {
    CpuBackendOptions o;
    o.copy_delay = std::chrono::microseconds(300);
    slow = create_cpu_backend(o);
    fast_stream = fast->create_stream().value();
    slow_stream = slow->create_stream().value();
  }
  ~TwoTargets() {
    fast->destroy_stream(fast_stream);
    slow->destroy_stream(slow_stream);
  }
  std::vector<UploadTarget> targets() {
    return {UploadTarget{fast.get(), fast_stream}, UploadTarget{slow.get(), slow_stream}};
  }
};

TEST(UploadArena, EveryTargetReadsEveryUploadAsPackedWhileChunksRollOver) {
  TwoTargets t;
  std::vector<UploadTarget> targets = t.targets();
  auto arena = UploadArena::create(targets, 4096);
  ASSERT_OK(arena);
  std::mt19937 rng(7);
  // Per upload: the bytes sent (two arrays) and what each target's reader copied back.
  std::vector<std::vector<uint8_t>> sent;
  std::vector<std::vector<std::vector<uint8_t>>> read(targets.size());
  constexpr int kUploads = 96;
  for (int u = 0; u < kUploads; ++u) {
    std::vector<uint8_t> a(100 + rng() % 1500), b(1 + rng() % 900);
    for (uint8_t& x : a) x = static_cast<uint8_t>(rng());
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    StatusOr<UploadLease> lease = (*arena)->upload({part(a), part(b)});
    ASSERT_OK(lease);
    std::vector<uint8_t> both = a;
    both.insert(both.end(), b.begin(), b.end());
    sent.push_back(both);
    // Each target's reader of the region, queued on its stream before the lease goes back.
    for (size_t i = 0; i < targets.size(); ++i) {
      read[i].emplace_back(both.size());
      std::vector<uint8_t>& out = read[i].back();
      ASSERT_OK(targets[i].backend->copy_async(out.data(), lease->device(0, i), a.size(),
                                               CopyKind::kDeviceToHost, targets[i].stream));
      ASSERT_OK(targets[i].backend->copy_async(out.data() + a.size(), lease->device(1, i), b.size(),
                                               CopyKind::kDeviceToHost, targets[i].stream));
    }
    if (targets.size() > 1) {
      EXPECT_NE(lease->device(0, 0), lease->device(0, 1)) << "each target has its own copy";
    }
  }  // each lease is released here, its readers queued
  for (const UploadTarget& target : targets) {
    ASSERT_OK(target.backend->synchronize_stream(target.stream));
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    for (int u = 0; u < kUploads; ++u) {
      ASSERT_EQ(read[i][static_cast<size_t>(u)], sent[static_cast<size_t>(u)])
          << "target " << i << ", upload " << u;
    }
  }
  EXPECT_EQ((*arena)->live_leases(), 0);
  EXPECT_LE((*arena)->num_chunks(), UploadArena::kMaxChunks);
}

TEST(UploadArena, RefusesNoTargetsTooManyAndATargetWithoutABackend) {
  TwoTargets t;
  EXPECT_EQ(UploadArena::create(std::vector<UploadTarget>{}, 4096).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<UploadTarget> many(UploadLease::kMaxTargets + 1, t.targets()[0]);
  EXPECT_EQ(UploadArena::create(many, 4096).status().code(), StatusCode::kInvalidArgument);
  std::vector<UploadTarget> missing = t.targets();
  missing[1].backend = nullptr;
  EXPECT_EQ(UploadArena::create(missing, 4096).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv::runtime
