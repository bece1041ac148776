// Behaviour specific to the CPU backend and to backend selection.
#include "pagedkv/cpu_backend.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/status_matchers.hpp"
#include "support/stream_gate.hpp"

namespace pagedkv {
namespace {

std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u + seed) | 1u;
  return v;
}

// Queues dst[begin, end) = value on `stream`.
Status fill(Backend& be, std::vector<uint32_t>& dst, size_t begin, size_t end, uint32_t value,
            Stream stream) {
  const kernels::FillBody body{dst.data() + begin, value};
  return be.launch(
      KernelLaunch{KernelId::kFill, &body, sizeof(body), static_cast<int64_t>(end - begin)},
      stream);
}

Status copy(Backend& be, std::vector<uint32_t>& dst, const std::vector<uint32_t>& src,
            Stream stream) {
  return be.copy_async(dst.data(), src.data(), src.size() * sizeof(uint32_t), CopyKind::kHostToHost,
                       stream);
}

using testing::StreamGate;

TEST(CpuBackend, EnqueueReturnsBeforeTheWorkRuns) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::milliseconds(500);  // wide margins for a loaded machine
  auto be = create_cpu_backend(options);
  auto stream = be->create_stream();
  ASSERT_OK(stream);
  std::vector<char> src(1024, 'x');
  std::vector<char> dst(1024, 'o');
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(be->copy_async(dst.data(), src.data(), src.size(), CopyKind::kHostToHost, *stream));
  const auto queued = std::chrono::steady_clock::now() - start;
  EXPECT_LT(queued, std::chrono::milliseconds(250)) << "copy_async blocked the caller";
  // Asked through an event, not by reading `dst` while the worker may write it (a data race).
  auto done = be->create_event();
  ASSERT_OK(done);
  ASSERT_OK(be->record_event(*done, *stream));
  EXPECT_FALSE(*be->query_event(*done)) << "the delayed copy already happened";
  ASSERT_OK(be->synchronize_stream(*stream));
  EXPECT_TRUE(*be->query_event(*done));
  EXPECT_EQ(dst, src);
  be->destroy_event(*done);
  be->destroy_stream(*stream);
}

TEST(CpuBackend, MemoryLimitGivesResourceExhausted) {
  CpuBackendOptions options;
  options.device_memory_limit = 4096;
  options.pinned_memory_limit = 1024;
  auto be = create_cpu_backend(options);
  auto a = be->allocate_device(4000);
  ASSERT_OK(a);
  EXPECT_EQ(be->allocate_device(256).status().code(), StatusCode::kResourceExhausted);
  be->free_device(*a);
  auto b = be->allocate_device(4096);  // freed memory can be had again
  EXPECT_OK(b);
  be->free_device(*b);
  EXPECT_EQ(be->allocate_pinned(2048).status().code(), StatusCode::kResourceExhausted);
}

// The device ordinal a backend reports, which the Python exports carry as DLPack's device_id:
// the CPU backend takes one from its options (a stand-in for a GPU other than 0), create_backend
// passes it on, the fault injector forwards its inner backend's, and a cache that is given a
// backend refuses a device of its own.
TEST(BackendSelection, TheDeviceOrdinalTravelsFromTheFactoryToTheCache) {
  CpuBackendOptions o;
  o.device_ordinal = 3;
  EXPECT_EQ(create_cpu_backend(o)->device_ordinal(), 3);
  EXPECT_EQ(create_cpu_backend()->device_ordinal(), 0);
  auto two = create_backend(BackendKind::kCpu, 2);
  ASSERT_OK(two);
  EXPECT_EQ((*two)->device_ordinal(), 2);
  EXPECT_EQ((*create_backend(BackendKind::kCpu, -1))->device_ordinal(), 0);
  EXPECT_EQ(create_backend(BackendKind::kCpu, -2).status().code(), StatusCode::kInvalidArgument);
  FaultInjectionBackend faults(**two);
  EXPECT_EQ(faults.device_ordinal(), 2);

  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.num_device_blocks = 4;
  c.backend = BackendKind::kCpu;
  KvCacheOptions own;
  own.device = 1;
  auto cache = KvCache::create(c, own);
  ASSERT_OK(cache);
  EXPECT_EQ((*cache)->backend().device_ordinal(), 1);
  KvCacheOptions given;
  given.backend = two->get();
  given.device = 1;
  EXPECT_EQ(KvCache::create(c, given).status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendSelection, AutoPicksCudaOnlyWithADevice) {
  auto be = create_backend(BackendKind::kAuto);
  ASSERT_OK(be);
  EXPECT_EQ((*be)->kind(), cuda_device_available() ? BackendKind::kCuda : BackendKind::kCpu);
}

TEST(BackendSelection, ExplicitCudaWithoutDeviceIsUnavailable) {
  if (cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  auto be = create_backend(BackendKind::kCuda);
  EXPECT_EQ(be.status().code(), StatusCode::kUnavailable);
}

TEST(BackendSelection, UnknownKindIsInvalid) {
  EXPECT_EQ(create_backend(static_cast<BackendKind>(9)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CpuBackend, DelayedKernelsStayOnTheWorker) {
  CpuBackendOptions options;
  options.kernel_delay = std::chrono::milliseconds(500);  // wide margins for a loaded machine
  auto be = create_cpu_backend(options);
  auto event = be->create_event();
  ASSERT_OK(event);
  std::vector<uint32_t> out(256, 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_OK(fill(*be, out, 0, out.size(), 0x5eu, Stream{}));
  ASSERT_OK(be->record_event(*event, Stream{}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250))
      << "a delayed launch blocked the caller";
  EXPECT_FALSE(*be->query_event(*event)) << "the delayed kernel already ran";
  ASSERT_OK(be->synchronize_stream(Stream{}));
  EXPECT_EQ(out, std::vector<uint32_t>(out.size(), 0x5eu));
  be->destroy_event(*event);
}

TEST(CpuBackend, HostFunctionsRunOnTheStreamsWorkerEvenWhenIdle) {
  auto be = create_cpu_backend();
  std::thread::id ran_on;
  ASSERT_OK(be->launch_host_func(Stream{}, [&] { ran_on = std::this_thread::get_id(); }));
  ASSERT_OK(be->synchronize_stream(Stream{}));
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

// Work on an idle stream runs inline (its effect is visible as soon as the call returns); work
// queued behind a busy worker waits its turn, and the stream's order is the order of the calls.
// With the switch off, the same program gives the same bytes through the worker alone.
void check_inline_work_keeps_order_with_queued_work(bool run_inline) {
  CpuBackendOptions options;
  options.run_inline_when_idle = run_inline;
  auto be = create_cpu_backend(options);
  auto stream = be->create_stream();
  auto event = be->create_event();
  ASSERT_OK(stream);
  ASSERT_OK(event);
  const size_t n = 1024;
  const std::vector<uint32_t> src = pattern(n, 1);
  std::vector<uint32_t> buf = pattern(n, 2);
  std::vector<uint32_t> out = pattern(n, 3);
  const std::vector<uint32_t> out_before = out;

  ASSERT_OK(copy(*be, buf, src, *stream));
  ASSERT_OK(fill(*be, buf, 0, n / 4, 0xaaaau, *stream));  // after the copy
  std::vector<uint32_t> expected = src;
  std::fill(expected.begin(), expected.begin() + n / 4, 0xaaaau);
  if (run_inline) {
    EXPECT_EQ(buf, expected) << "idle-stream work did not run inline";
  }

  StreamGate gate;
  ASSERT_OK(gate.close(*be, *stream));
  // Each of these could run inline on an idle stream; behind the gate they must wait.
  ASSERT_OK(fill(*be, buf, n / 4, n / 2, 0xbbbbu, *stream));
  ASSERT_OK(copy(*be, out, buf, *stream));
  ASSERT_OK(be->record_event(*event, *stream));
  EXPECT_FALSE(*be->query_event(*event));
  // The worker is held at the gate, so nothing queued has touched `out` (no race to read it).
  EXPECT_EQ(out, out_before) << "work queued behind a running host function did not wait";
  gate.release();
  ASSERT_OK(be->synchronize_stream(*stream));
  EXPECT_TRUE(*be->query_event(*event));
  std::fill(expected.begin() + n / 4, expected.begin() + n / 2, 0xbbbbu);
  EXPECT_EQ(buf, expected);
  EXPECT_EQ(out, expected);

  // Drained: idle again, so inline again.
  ASSERT_OK(fill(*be, out, 0, n, 0xccccu, *stream));
  if (run_inline) {
    EXPECT_EQ(out, std::vector<uint32_t>(n, 0xccccu));
  }
  ASSERT_OK(be->synchronize_stream(*stream));
  EXPECT_EQ(out, std::vector<uint32_t>(n, 0xccccu));
  be->destroy_event(*event);
  be->destroy_stream(*stream);
}

TEST(CpuBackend, InlineWorkKeepsOrderWithQueuedWork) {
  check_inline_work_keeps_order_with_queued_work(true);
}

TEST(CpuBackend, WithoutInlineExecutionTheOrderIsTheSame) {
  check_inline_work_keeps_order_with_queued_work(false);
}

// A wait on an event that is not complete cannot run inline: it is queued, and everything after
// it on that stream, though the stream was idle, waits behind it. A wait on a completed event
// holds nothing back.
TEST(CpuBackend, AWaitOnAnIncompleteEventDefersTheWorkAfterIt) {
  auto be = create_cpu_backend();
  auto producer = be->create_stream();
  auto consumer = be->create_stream();
  auto produced = be->create_event();
  auto consumed = be->create_event();
  ASSERT_OK(producer);
  ASSERT_OK(consumer);
  ASSERT_OK(produced);
  ASSERT_OK(consumed);
  const size_t n = 512;
  const std::vector<uint32_t> src = pattern(n, 4);
  std::vector<uint32_t> dst = pattern(n, 5);
  const std::vector<uint32_t> dst_before = dst;

  StreamGate gate;
  ASSERT_OK(gate.close(*be, *producer));
  ASSERT_OK(be->record_event(*produced, *producer));
  ASSERT_OK(be->wait_event(*consumer, *produced));  // the consumer stream was idle
  ASSERT_OK(copy(*be, dst, src, *consumer));
  ASSERT_OK(fill(*be, dst, 0, 8, 0xddddu, *consumer));
  ASSERT_OK(be->record_event(*consumed, *consumer));
  EXPECT_FALSE(*be->query_event(*consumed)) << "the record ran before the wait was satisfied";
  EXPECT_EQ(dst, dst_before) << "work after an unsatisfied wait ran";

  gate.release();
  ASSERT_OK(be->synchronize_stream(*consumer));
  EXPECT_TRUE(*be->query_event(*produced));
  EXPECT_TRUE(*be->query_event(*consumed));
  std::vector<uint32_t> expected = src;
  std::fill(expected.begin(), expected.begin() + 8, 0xddddu);
  EXPECT_EQ(dst, expected);

  // The event is complete now: waiting on it again holds nothing back.
  const std::vector<uint32_t> src2 = pattern(n, 6);
  ASSERT_OK(be->wait_event(*consumer, *produced));
  ASSERT_OK(copy(*be, dst, src2, *consumer));
  EXPECT_EQ(dst, src2) << "work after a satisfied wait on an idle stream did not run inline";
  ASSERT_OK(be->synchronize_stream(*consumer));

  be->destroy_event(*produced);
  be->destroy_event(*consumed);
  be->destroy_stream(*producer);
  be->destroy_stream(*consumer);
}

TEST(CpuBackend, SynchronizeAfterInlineWorkReturns) {
  auto be = create_cpu_backend();
  auto stream = be->create_stream();
  auto event = be->create_event();
  ASSERT_OK(stream);
  ASSERT_OK(event);
  const std::vector<uint32_t> src = pattern(300, 7);
  std::vector<uint32_t> dst(300, 0);
  for (Stream s : {Stream{}, *stream}) {
    ASSERT_OK(copy(*be, dst, src, s));
    ASSERT_OK(be->synchronize_stream(s));
    ASSERT_OK(be->record_event(*event, s));
    EXPECT_TRUE(*be->query_event(*event));  // recorded on an idle stream: complete at once
    ASSERT_OK(be->synchronize_event(*event));
    // Inline, then queued, then inline-eligible (queued behind): one synchronize covers all.
    bool host_func_ran = false;
    ASSERT_OK(fill(*be, dst, 0, 1, 1u, s));
    ASSERT_OK(be->launch_host_func(s, [&] { host_func_ran = true; }));
    ASSERT_OK(fill(*be, dst, 1, 2, 2u, s));
    ASSERT_OK(be->synchronize_stream(s));
    EXPECT_TRUE(host_func_ran);
    EXPECT_EQ(dst[0], 1u);
    EXPECT_EQ(dst[1], 2u);
    EXPECT_EQ(dst[2], src[2]);
  }
  ASSERT_OK(copy(*be, dst, src, *stream));
  be->destroy_stream(*stream);  // drains and joins after inline work too
  EXPECT_EQ(dst, src);
  be->destroy_event(*event);
}

// On the CPU backend a wrapped handle only names a stream; the stream is the backend's own.
TEST(CpuBackend, AWrappedHandleNamesAStreamOfTheBackendsOwn) {
  auto be = create_cpu_backend();
  int token = 0;
  auto wrapped = be->wrap_stream(&token);
  ASSERT_OK(wrapped);
  EXPECT_NE(*wrapped, Stream{});
  auto native = be->native_stream(*wrapped);
  ASSERT_OK(native);
  EXPECT_EQ(*native, static_cast<void*>(&token));
  auto again = be->wrap_stream(&token);
  ASSERT_OK(again);
  EXPECT_EQ(*again, *wrapped);
  // A created stream has no native handle, so it cannot be named by one.
  auto created = be->create_stream();
  ASSERT_OK(created);
  auto created_native = be->native_stream(*created);
  ASSERT_OK(created_native);
  EXPECT_EQ(*created_native, nullptr);
  EXPECT_NE(*created, *wrapped);

  const std::vector<uint32_t> src = pattern(128, 8);
  std::vector<uint32_t> dst(128, 0);
  ASSERT_OK(copy(*be, dst, src, *wrapped));
  ASSERT_OK(be->synchronize_stream(*wrapped));
  EXPECT_EQ(dst, src);
  be->destroy_stream(*wrapped);
  EXPECT_EQ(be->native_stream(*wrapped).status().code(), StatusCode::kInvalidArgument);
  be->destroy_stream(*created);
  EXPECT_EQ(token, 0);  // the handle is a name; nothing is written through it
}

}  // namespace
}  // namespace pagedkv
