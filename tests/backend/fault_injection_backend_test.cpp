// FaultInjectionBackend: every call delegates to the wrapped backend, and exactly the armed n-th
// call of a kind fails, once, without touching the wrapped backend.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"
#include "support/stream_gate.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

constexpr FaultKind kAllKinds[] = {FaultKind::kAllocation, FaultKind::kCopy, FaultKind::kLaunch,
                                   FaultKind::kEvent,      FaultKind::kSync, FaultKind::kQuery};

template <typename Body>
KernelLaunch make_launch(KernelId id, const Body& body, int64_t n) {
  return KernelLaunch{id, &body, sizeof(body), n};
}

std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u + seed) | 1u;
  return v;
}

using testing::StreamGate;

class FaultInjectionBackendTest : public ::testing::Test {
 protected:
  FaultInjectionBackendTest() : inner_(create_cpu_backend()), fi_(*inner_) {
    StatusOr<Event> e = inner_->create_event();  // made on the inner backend: not counted
    EXPECT_OK(e);
    if (e.ok()) recorded_ = *e;
    EXPECT_OK(inner_->record_event(recorded_, Stream{}));
  }
  ~FaultInjectionBackendTest() override { inner_->destroy_event(recorded_); }

  // One call of `kind` through the wrapper; its status. Resources it makes are released.
  Status call(FaultKind kind) {
    switch (kind) {
      case FaultKind::kAllocation: {
        StatusOr<void*> p = fi_.allocate_device(64);
        if (p.ok()) fi_.free_device(*p);
        return p.status();
      }
      case FaultKind::kCopy:
        return fi_.copy_async(scratch_b_.data(), scratch_a_.data(), scratch_a_.size(),
                              CopyKind::kHostToHost, Stream{});
      case FaultKind::kLaunch:
        return fi_.launch_host_func(Stream{}, [] {});
      case FaultKind::kEvent: {
        StatusOr<Event> e = fi_.create_event();
        if (e.ok()) fi_.destroy_event(*e);
        return e.status();
      }
      case FaultKind::kSync:
        return fi_.synchronize_stream(Stream{});
      case FaultKind::kQuery:
        return fi_.query_event(recorded_).status();
    }
    return internal_error("unknown kind");
  }

  // Declared first so they outlive the backend's streams (copies into them may be queued).
  std::vector<uint8_t> scratch_a_ = std::vector<uint8_t>(64, 1);
  std::vector<uint8_t> scratch_b_ = std::vector<uint8_t>(64, 2);
  std::unique_ptr<Backend> inner_;
  FaultInjectionBackend fi_;
  Event recorded_{};  // recorded on the default stream, for query_event
};

TEST_F(FaultInjectionBackendTest, ReportsTheInnerKindAndDescription) {
  EXPECT_EQ(fi_.kind(), inner_->kind());
  EXPECT_NE(fi_.description().find(inner_->description()), std::string::npos);
  EXPECT_STREQ(fault_kind_name(FaultKind::kAllocation), "allocation");
  EXPECT_STREQ(fault_kind_name(FaultKind::kCopy), "copy");
  EXPECT_STREQ(fault_kind_name(FaultKind::kLaunch), "launch");
  EXPECT_STREQ(fault_kind_name(FaultKind::kEvent), "event");
  EXPECT_STREQ(fault_kind_name(FaultKind::kSync), "sync");
  EXPECT_STREQ(fault_kind_name(FaultKind::kQuery), "query");
}

TEST_F(FaultInjectionBackendTest, PassthroughGivesTheInnerBackendsResults) {
  const size_t n = 1000;
  const std::vector<uint32_t> src = pattern(n, 7);
  // The same program on the inner backend and through the wrapper (on its own buffers).
  auto run = [&](Backend& be) {
    auto a = be.allocate_device(n * 4);
    auto b = be.allocate_device(n * 4);
    auto staging = be.allocate_pinned(n * 4);
    EXPECT_OK(a);
    EXPECT_OK(b);
    EXPECT_OK(staging);
    std::memcpy(*staging, src.data(), n * 4);
    auto copy_stream = be.create_stream();
    auto ev = be.create_event();
    EXPECT_OK(copy_stream);
    EXPECT_OK(ev);
    EXPECT_OK(be.copy_async(*a, *staging, n * 4, CopyKind::kHostToDevice, *copy_stream));
    EXPECT_OK(be.record_event(*ev, *copy_stream));
    EXPECT_OK(be.wait_event(Stream{}, *ev));
    const kernels::FillBody fill{static_cast<uint32_t*>(*b), 0xabcd1234u};
    EXPECT_OK(be.launch(make_launch(KernelId::kFill, fill, n / 2), Stream{}));
    // The second half of b from a, after the fill, in stream order.
    EXPECT_OK(be.copy_async(static_cast<uint32_t*>(*b) + n / 2, static_cast<uint32_t*>(*a) + n / 2,
                            n / 2 * 4, CopyKind::kDeviceToDevice, Stream{}));
    bool host_func_ran = false;
    EXPECT_OK(be.launch_host_func(Stream{}, [&] { host_func_ran = true; }));
    EXPECT_OK(be.synchronize_event(*ev));
    EXPECT_OK(be.synchronize_stream(Stream{}));
    auto done = be.query_event(*ev);
    EXPECT_OK(done);
    EXPECT_TRUE(done.value_or(false));
    EXPECT_TRUE(host_func_ran);
    std::vector<uint32_t> out(n);
    EXPECT_OK(be.copy_async(out.data(), *b, n * 4, CopyKind::kDeviceToHost, Stream{}));
    EXPECT_OK(be.synchronize_stream(Stream{}));
    EXPECT_OK(be.native_stream(*copy_stream));
    be.destroy_event(*ev);
    be.destroy_stream(*copy_stream);
    be.free_device(*a);
    be.free_device(*b);
    be.free_pinned(*staging);
    return out;
  };
  const std::vector<uint32_t> expected = run(*inner_);
  const std::vector<uint32_t> got = run(fi_);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got[0], 0xabcd1234u);
  EXPECT_EQ(got[n - 1], src[n - 1]);
  EXPECT_EQ(fi_.injected(), 0);
  EXPECT_EQ(fi_.count(FaultKind::kAllocation), 3);
  EXPECT_EQ(fi_.count(FaultKind::kCopy), 3);
  EXPECT_EQ(fi_.count(FaultKind::kLaunch), 2);
  EXPECT_EQ(fi_.count(FaultKind::kEvent), 4);  // create_stream, create_event, record, wait
  EXPECT_EQ(fi_.count(FaultKind::kSync), 3);   // synchronize_event, 2 synchronize_stream
  EXPECT_EQ(fi_.count(FaultKind::kQuery), 1);
  EXPECT_EQ(fi_.live(), LiveObjects{});
}

TEST_F(FaultInjectionBackendTest, ExactlyTheNthCallOfTheArmedKindFailsOnce) {
  for (FaultKind kind : kAllKinds) {
    fi_.reset_counts();
    fi_.fail_nth(kind, 3);
    EXPECT_TRUE(fi_.armed(kind));
    for (int i = 1; i <= 6; ++i) {
      const Status s = call(kind);
      if (i == 3) {
        EXPECT_EQ(s.code(), StatusCode::kInternal) << fault_kind_name(kind);
        EXPECT_NE(s.message().find(std::string("injected fault: ") + fault_kind_name(kind) + " #3"),
                  std::string::npos)
            << s.message();
        EXPECT_EQ(fi_.last_fault(), s.message());
      } else {
        EXPECT_OK(s) << fault_kind_name(kind) << " call " << i;
      }
    }
    EXPECT_FALSE(fi_.armed(kind));
    EXPECT_EQ(fi_.count(kind), 6) << fault_kind_name(kind);
    EXPECT_EQ(fi_.injected(), 1) << fault_kind_name(kind);
    for (FaultKind other : kAllKinds) {
      EXPECT_EQ(fi_.injected(other), other == kind ? 1 : 0) << fault_kind_name(other);
    }
  }
}

TEST_F(FaultInjectionBackendTest, MessageNamesTheCall) {
  fi_.fail_nth(FaultKind::kAllocation, 1);
  EXPECT_EQ(fi_.allocate_pinned(64).status().message(),
            "injected fault: allocation #1 (allocate_pinned)");
  fi_.fail_nth(FaultKind::kLaunch, 1);
  const kernels::FillBody fill{static_cast<uint32_t*>(nullptr), 0u};
  EXPECT_EQ(fi_.launch(make_launch(KernelId::kFill, fill, 0), Stream{}).message(),
            "injected fault: launch #1 (launch)");
  fi_.fail_nth(FaultKind::kEvent, 1);
  EXPECT_EQ(fi_.create_stream().status().message(), "injected fault: event #1 (create_stream)");
  fi_.fail_nth(FaultKind::kSync, 1);
  EXPECT_EQ(fi_.synchronize_stream(Stream{}).message(),
            "injected fault: sync #1 (synchronize_stream)");
  fi_.fail_nth(FaultKind::kQuery, 1);
  EXPECT_EQ(fi_.query_event(Event{}).status().message(), "injected fault: query #1 (query_event)");
}

TEST_F(FaultInjectionBackendTest, OtherKindsAreUnaffected) {
  for (FaultKind armed : kAllKinds) {
    fi_.reset_counts();
    fi_.fail_nth(armed, 1);
    for (FaultKind other : kAllKinds) {
      if (other == armed) continue;
      for (int i = 0; i < 3; ++i) {
        const Status s = call(other);
        EXPECT_OK(s) << fault_kind_name(other) << " with " << fault_kind_name(armed);
      }
      EXPECT_EQ(fi_.count(other), 3);
    }
    EXPECT_EQ(fi_.injected(), 0);
    EXPECT_TRUE(fi_.armed(armed));
    EXPECT_FALSE(call(armed).ok());
    EXPECT_EQ(fi_.injected(), 1);
  }
}

TEST_F(FaultInjectionBackendTest, ArmingCountsFromNowAndZeroDisarms) {
  for (int i = 0; i < 4; ++i) ASSERT_OK(call(FaultKind::kCopy));
  fi_.fail_nth(FaultKind::kCopy, 2);  // call #6 overall
  EXPECT_OK(call(FaultKind::kCopy));
  EXPECT_NE(call(FaultKind::kCopy).message().find("copy #6"), std::string::npos);

  fi_.fail_nth(FaultKind::kCopy, 1);
  fi_.fail_nth(FaultKind::kCopy, 0);
  EXPECT_FALSE(fi_.armed(FaultKind::kCopy));
  EXPECT_OK(call(FaultKind::kCopy));

  fi_.fail_nth(FaultKind::kCopy, 1);
  fi_.fail_nth(FaultKind::kCopy, 2);  // replaces the first arming
  EXPECT_OK(call(FaultKind::kCopy));
  EXPECT_FALSE(call(FaultKind::kCopy).ok());

  fi_.fail_nth(FaultKind::kCopy, 1);
  fi_.fail_nth(FaultKind::kLaunch, 1);
  fi_.disarm_all();
  EXPECT_OK(call(FaultKind::kCopy));
  EXPECT_OK(call(FaultKind::kLaunch));
  EXPECT_EQ(fi_.injected(), 2);

  fi_.fail_nth(FaultKind::kCopy, 1);
  fi_.reset_counts();
  EXPECT_EQ(fi_.count(FaultKind::kCopy), 0);
  EXPECT_EQ(fi_.injected(), 0);
  EXPECT_EQ(fi_.last_fault(), "");
  EXPECT_FALSE(fi_.armed(FaultKind::kCopy));
  EXPECT_OK(call(FaultKind::kCopy));
}

TEST_F(FaultInjectionBackendTest, CallsThatCannotFailAreNotCounted) {
  auto s = fi_.create_stream();
  auto e = fi_.create_event();
  auto d = fi_.allocate_device(64);
  auto p = fi_.allocate_pinned(64);
  ASSERT_OK(s);
  ASSERT_OK(e);
  ASSERT_OK(d);
  ASSERT_OK(p);
  fi_.reset_counts();
  (void)fi_.kind();
  (void)fi_.description();
  EXPECT_OK(fi_.native_stream(*s));
  fi_.destroy_event(*e);
  fi_.destroy_stream(*s);
  fi_.free_device(*d);
  fi_.free_pinned(*p);
  for (FaultKind kind : kAllKinds) EXPECT_EQ(fi_.count(kind), 0) << fault_kind_name(kind);
  EXPECT_EQ(fi_.live(), LiveObjects{});
}

// wrap_stream is no fault point: forwarded, never counted or failed. A wrapped handle is a shared
// name that needs no release, so it is no live object, and forgetting it releases nothing.
TEST_F(FaultInjectionBackendTest, WrapStreamIsForwardedAndNeitherCountedNorLive) {
  for (FaultKind kind : kAllKinds) fi_.fail_nth(kind, 1);
  int token = 0;
  auto wrapped = fi_.wrap_stream(&token);
  ASSERT_OK(wrapped);
  auto again = fi_.wrap_stream(&token);
  ASSERT_OK(again);
  EXPECT_EQ(*again, *wrapped);
  EXPECT_EQ(fi_.wrap_stream(nullptr).status().code(), StatusCode::kInvalidArgument);
  for (FaultKind kind : kAllKinds) {
    EXPECT_EQ(fi_.count(kind), 0) << fault_kind_name(kind);
    EXPECT_TRUE(fi_.armed(kind)) << fault_kind_name(kind);
  }
  EXPECT_EQ(fi_.injected(), 0);
  auto native = fi_.native_stream(*wrapped);
  ASSERT_OK(native);
  EXPECT_EQ(*native, static_cast<void*>(&token));
  // The inner backend knows the same stream.
  auto inner_again = inner_->wrap_stream(&token);
  ASSERT_OK(inner_again);
  EXPECT_EQ(*inner_again, *wrapped);
  EXPECT_EQ(fi_.live(), LiveObjects{});
  auto created = fi_.create_stream();  // the armed kEvent fault
  EXPECT_EQ(created.status().code(), StatusCode::kInternal);
  fi_.disarm_all();
  created = fi_.create_stream();
  ASSERT_OK(created);
  fi_.destroy_stream(*wrapped);  // forgotten; the created stream is still live
  LiveObjects expected;
  expected.streams = 1;
  EXPECT_EQ(fi_.live(), expected);
  EXPECT_EQ(inner_->synchronize_stream(*wrapped).code(), StatusCode::kInvalidArgument);
  fi_.destroy_stream(*created);
  EXPECT_EQ(fi_.live(), LiveObjects{});
}

TEST_F(FaultInjectionBackendTest, LiveObjectsTrackWhatIsNotReleased) {
  auto d = fi_.allocate_device(64);
  auto s = fi_.create_stream();
  ASSERT_OK(d);
  ASSERT_OK(s);
  LiveObjects expected;
  expected.device_allocations = 1;
  expected.streams = 1;
  EXPECT_EQ(fi_.live(), expected);
  fi_.free_device(nullptr);      // no-op, not counted
  fi_.destroy_stream(Stream{});  // the default stream is never destroyed
  EXPECT_EQ(fi_.live(), expected);
  fi_.free_device(*d);
  fi_.destroy_stream(*s);
  EXPECT_EQ(fi_.live(), LiveObjects{});
}

TEST(FaultInjectionBackend, AFailedAllocationTakesNothing) {
  CpuBackendOptions options;
  options.device_memory_limit = 4096;
  options.pinned_memory_limit = 4096;
  auto inner = create_cpu_backend(options);
  FaultInjectionBackend fi(*inner);
  fi.fail_nth(FaultKind::kAllocation, 1);
  EXPECT_EQ(fi.allocate_device(4096).status().code(), StatusCode::kInternal);
  fi.fail_nth(FaultKind::kAllocation, 1);
  EXPECT_EQ(fi.allocate_pinned(4096).status().code(), StatusCode::kInternal);
  EXPECT_EQ(fi.live(), LiveObjects{});
  // The whole limit is still available: the failed calls took nothing from the inner backend.
  auto d = inner->allocate_device(4096);
  auto p = inner->allocate_pinned(4096);
  ASSERT_OK(d);
  ASSERT_OK(p);
  inner->free_device(*d);
  inner->free_pinned(*p);
}

TEST(FaultInjectionBackend, AFailedCopyLeavesTheDestinationUnchanged) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::microseconds(200);
  auto inner = create_cpu_backend(options);
  FaultInjectionBackend fi(*inner);
  const size_t n = 512;
  const std::vector<uint32_t> before = pattern(n, 1);
  const std::vector<uint32_t> src = pattern(n, 2);
  DeviceBuffer dst(*inner, n * 4);
  DeviceBuffer from(*inner, n * 4);
  dst.upload(before);
  from.upload(src);
  auto copy_stream = fi.create_stream();
  ASSERT_OK(copy_stream);
  for (CopyKind kind : {CopyKind::kDeviceToDevice, CopyKind::kHostToDevice}) {
    const void* source =
        kind == CopyKind::kHostToDevice ? static_cast<const void*>(src.data()) : from.data();
    for (Stream stream : {Stream{}, *copy_stream}) {
      fi.fail_nth(FaultKind::kCopy, 1);
      const Status s = fi.copy_async(dst.data(), source, n * 4, kind, stream);
      EXPECT_EQ(s.code(), StatusCode::kInternal);
      ASSERT_OK(fi.synchronize_stream(stream));
      EXPECT_EQ(dst.download<uint32_t>(), before);
    }
  }
  // The fault was one-shot: the same copy now goes through.
  ASSERT_OK(fi.copy_async(dst.data(), from.data(), n * 4, CopyKind::kDeviceToDevice, *copy_stream));
  ASSERT_OK(fi.synchronize_stream(*copy_stream));
  EXPECT_EQ(dst.download<uint32_t>(), src);
  fi.destroy_stream(*copy_stream);
}

TEST(FaultInjectionBackend, AFailedLaunchRunsNothing) {
  auto inner = create_cpu_backend();
  FaultInjectionBackend fi(*inner);
  const size_t n = 300;
  const std::vector<uint32_t> before = pattern(n, 3);
  DeviceBuffer out(*inner, n * 4);
  out.upload(before);
  const kernels::FillBody fill{static_cast<uint32_t*>(out.data()), 0x5a5a5a5au};
  fi.fail_nth(FaultKind::kLaunch, 1);
  EXPECT_EQ(fi.launch(make_launch(KernelId::kFill, fill, n), Stream{}).code(),
            StatusCode::kInternal);
  std::atomic<bool> ran{false};
  fi.fail_nth(FaultKind::kLaunch, 1);
  EXPECT_EQ(fi.launch_host_func(Stream{}, [&] { ran = true; }).code(), StatusCode::kInternal);
  ASSERT_OK(fi.synchronize_stream(Stream{}));
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(out.download<uint32_t>(), before);
  ASSERT_OK(fi.launch(make_launch(KernelId::kFill, fill, n), Stream{}));
  EXPECT_EQ(out.download<uint32_t>(), std::vector<uint32_t>(n, 0x5a5a5a5au));
}

TEST(FaultInjectionBackend, FailedEventAndSyncCallsDoNothing) {
  auto inner = create_cpu_backend();
  FaultInjectionBackend fi(*inner);
  auto ev = fi.create_event();
  auto other = fi.create_stream();
  ASSERT_OK(ev);
  ASSERT_OK(other);

  // A failed record leaves the event as it was (never recorded: complete), even though the
  // stream is blocked; the real record that follows captures the blocked work.
  StreamGate gate;
  ASSERT_OK(gate.close(*inner, Stream{}));
  fi.fail_nth(FaultKind::kEvent, 1);
  EXPECT_EQ(fi.record_event(*ev, Stream{}).code(), StatusCode::kInternal);
  auto done = fi.query_event(*ev);
  ASSERT_OK(done);
  EXPECT_TRUE(*done);
  ASSERT_OK(fi.record_event(*ev, Stream{}));
  done = fi.query_event(*ev);
  ASSERT_OK(done);
  EXPECT_FALSE(*done);

  // A failed wait orders nothing: work on `other` runs while the default stream is blocked.
  fi.fail_nth(FaultKind::kEvent, 1);
  EXPECT_EQ(fi.wait_event(*other, *ev).code(), StatusCode::kInternal);
  std::atomic<bool> ran{false};
  ASSERT_OK(fi.launch_host_func(*other, [&] { ran = true; }));
  ASSERT_OK(inner->synchronize_stream(*other));
  EXPECT_TRUE(ran.load());

  // A failed synchronize returns at once, without waiting.
  fi.fail_nth(FaultKind::kSync, 1);
  EXPECT_EQ(fi.synchronize_stream(Stream{}).code(), StatusCode::kInternal);
  fi.fail_nth(FaultKind::kSync, 1);
  EXPECT_EQ(fi.synchronize_event(*ev).code(), StatusCode::kInternal);
  fi.fail_nth(FaultKind::kQuery, 1);
  EXPECT_EQ(fi.query_event(*ev).status().code(), StatusCode::kInternal);
  done = inner->query_event(*ev);
  ASSERT_OK(done);
  EXPECT_FALSE(*done);

  gate.release();
  EXPECT_OK(fi.synchronize_event(*ev));

  // Failed creations make nothing.
  fi.fail_nth(FaultKind::kEvent, 1);
  EXPECT_EQ(fi.create_event().status().code(), StatusCode::kInternal);
  fi.fail_nth(FaultKind::kEvent, 1);
  EXPECT_EQ(fi.create_stream().status().code(), StatusCode::kInternal);
  LiveObjects expected;
  expected.streams = 1;
  expected.events = 1;
  EXPECT_EQ(fi.live(), expected);
  EXPECT_EQ(fi.injected(), 7);
  fi.destroy_event(*ev);
  fi.destroy_stream(*other);
  EXPECT_EQ(fi.live(), LiveObjects{});
}

TEST(FaultInjectionBackend, CountersAreExactUnderConcurrentCalls) {
  auto inner = create_cpu_backend();  // allocations are internally locked
  FaultInjectionBackend fi(*inner);
  constexpr int kThreads = 4;
  constexpr int kCalls = 500;
  fi.fail_nth(FaultKind::kAllocation, kThreads * kCalls / 2);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        StatusOr<void*> p = fi.allocate_device(256);
        if (p.ok()) {
          fi.free_device(*p);
        } else {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(fi.injected(), 1);
  EXPECT_EQ(fi.count(FaultKind::kAllocation), kThreads * kCalls);
  EXPECT_EQ(fi.live(), LiveObjects{});
}

}  // namespace
}  // namespace pagedkv
