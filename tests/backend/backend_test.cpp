// The executors themselves: memory, copies, kernel bodies over an index space, stream order and
// events. Typed over backends; the CUDA instantiation skips where no device is present.
#include "support/backend_test.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::BackendTest;
using testing::DeviceBuffer;
using testing::launch_spin;

template <typename Body>
KernelLaunch make_launch(KernelId id, const Body& body, int64_t n) {
  return KernelLaunch{id, &body, sizeof(body), n};
}

std::vector<uint32_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u + seed) | 1u;
  return v;
}

// The values of cudaStreamLegacy (CUDA's legacy stream 0) and cudaStreamPerThread; on the CPU
// backend any non-null value names a stream, so the same handles serve both backends.
void* const kLegacyStream = reinterpret_cast<void*>(uintptr_t{1});
void* const kPerThreadStream = reinterpret_cast<void*>(uintptr_t{2});

template <typename Tag>
class BackendExecTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(BackendExecTest, testing::AllBackends, testing::BackendName);

TYPED_TEST(BackendExecTest, ReportsItsKind) {
  EXPECT_EQ(this->backend().kind(), TypeParam::kKind);
  EXPECT_FALSE(this->backend().description().empty());
}

TYPED_TEST(BackendExecTest, ZeroByteAllocationIsInvalid) {
  EXPECT_EQ(this->backend().allocate_device(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(this->backend().allocate_pinned(0).status().code(), StatusCode::kInvalidArgument);
}

TYPED_TEST(BackendExecTest, AllocationsAreAligned) {
  auto d = this->backend().allocate_device(1000);
  auto p = this->backend().allocate_pinned(1000);
  ASSERT_OK(d);
  ASSERT_OK(p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*d) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
  this->backend().free_device(*d);
  this->backend().free_pinned(*p);
}

TYPED_TEST(BackendExecTest, CopiesRoundTrip) {
  std::vector<uint8_t> src(4099);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  DeviceBuffer a(this->backend(), src.size());
  DeviceBuffer b(this->backend(), src.size());
  a.upload(src);
  ASSERT_OK(this->backend().copy_async(b.data(), a.data(), src.size(), CopyKind::kDeviceToDevice,
                                       Stream{}));
  EXPECT_EQ(b.download<uint8_t>(), src);
}

TYPED_TEST(BackendExecTest, RunsABodyOverEveryIndexOfAnOddSpace) {
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{100003}}) {
    DeviceBuffer out(this->backend(), static_cast<size_t>(n) * sizeof(int64_t));
    const kernels::FillBody poison{static_cast<uint32_t*>(out.data()), 0xdeadbeefu};
    ASSERT_OK(this->backend().launch(make_launch(KernelId::kFill, poison, n * 2), Stream{}));
    const kernels::IotaBody iota{static_cast<int64_t*>(out.data()), 11, -3};
    ASSERT_OK(this->backend().launch(make_launch(KernelId::kIota, iota, n), Stream{}));
    const std::vector<int64_t> got = out.download<int64_t>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], 11 - 3 * i) << "n=" << n;
  }
}

// KernelLaunch::max_blocks only shapes the grid: a capped launch still runs every index (on CUDA
// each of the few CTAs walks the space in grid-stride steps).
TYPED_TEST(BackendExecTest, ACappedGridRunsEveryIndex) {
  const int64_t n = 100003;
  for (int32_t cap : {1, 2, 16, 1 << 20}) {
    DeviceBuffer out(this->backend(), static_cast<size_t>(n) * sizeof(int64_t));
    const kernels::FillBody poison{static_cast<uint32_t*>(out.data()), 0xdeadbeefu};
    ASSERT_OK(this->backend().launch(make_launch(KernelId::kFill, poison, n * 2), Stream{}));
    const kernels::IotaBody iota{static_cast<int64_t*>(out.data()), 5, 2};
    KernelLaunch launch = make_launch(KernelId::kIota, iota, n);
    launch.max_blocks = cap;
    ASSERT_OK(this->backend().launch(launch, Stream{})) << "cap " << cap;
    const std::vector<int64_t> got = out.download<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], 5 + 2 * i) << "cap " << cap;
  }
}

// The spin kernel (the tests' stand-in for a model kernel) keeps its stream busy for the time
// asked: work queued behind it is not done while it spins, and the stream takes at least that
// long to drain.
TYPED_TEST(BackendExecTest, ASpinKernelKeepsItsStreamBusyForTheTimeAsked) {
  auto stream = this->backend().create_stream();
  ASSERT_OK(stream);
  auto behind = this->backend().create_event();
  ASSERT_OK(behind);
  const auto start = std::chrono::steady_clock::now();
  // 300 ms: a margin that a loaded machine (sanitizer builds beside) does not eat up between the
  // launch and the query.
  ASSERT_OK(launch_spin(this->backend(), *stream, 300'000'000));
  ASSERT_OK(this->backend().record_event(*behind, *stream));
  auto done = this->backend().query_event(*behind);
  ASSERT_OK(done);
  EXPECT_FALSE(*done) << "the event behind the spin completed at once";
  ASSERT_OK(this->backend().synchronize_stream(*stream));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  this->backend().destroy_event(*behind);
  this->backend().destroy_stream(*stream);
}

// Low-priority streams are ordinary streams that run work in order; an unknown priority is
// refused.
TYPED_TEST(BackendExecTest, ALowPriorityStreamRunsWork) {
  auto low = this->backend().create_stream(StreamPriority::kLow);
  ASSERT_OK(low);
  DeviceBuffer out(this->backend(), 64 * sizeof(int64_t));
  const kernels::IotaBody iota{static_cast<int64_t*>(out.data()), 1, 1};
  ASSERT_OK(this->backend().launch(make_launch(KernelId::kIota, iota, 64), *low));
  ASSERT_OK(this->backend().synchronize_stream(*low));
  const std::vector<int64_t> got = out.download<int64_t>();
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], 1 + i);
  this->backend().destroy_stream(*low);
  EXPECT_EQ(this->backend().create_stream(static_cast<StreamPriority>(9)).status().code(),
            StatusCode::kInvalidArgument);
}

TYPED_TEST(BackendExecTest, FillWritesEveryWord) {
  DeviceBuffer out(this->backend(), 37 * sizeof(uint32_t));
  const kernels::FillBody fill{static_cast<uint32_t*>(out.data()), 0x12345678u};
  ASSERT_OK(this->backend().launch(make_launch(KernelId::kFill, fill, 37), Stream{}));
  for (uint32_t w : out.download<uint32_t>()) ASSERT_EQ(w, 0x12345678u);
}

TYPED_TEST(BackendExecTest, RejectsMalformedLaunches) {
  int64_t dummy = 0;
  const kernels::IotaBody iota{&dummy, 0, 1};
  KernelLaunch wrong_size{KernelId::kIota, &iota, sizeof(iota) - 1, 1};
  EXPECT_EQ(this->backend().launch(wrong_size, Stream{}).code(), StatusCode::kInvalidArgument);
  KernelLaunch null_params{KernelId::kIota, nullptr, sizeof(iota), 1};
  EXPECT_EQ(this->backend().launch(null_params, Stream{}).code(), StatusCode::kInvalidArgument);
  KernelLaunch unknown{KernelId::kCount, &iota, sizeof(iota), 1};
  EXPECT_EQ(this->backend().launch(unknown, Stream{}).code(), StatusCode::kInvalidArgument);
  KernelLaunch negative{KernelId::kIota, &iota, sizeof(iota), -1};
  EXPECT_EQ(this->backend().launch(negative, Stream{}).code(), StatusCode::kInvalidArgument);
  KernelLaunch negative_cap{KernelId::kIota, &iota, sizeof(iota), 1, -1};
  EXPECT_EQ(this->backend().launch(negative_cap, Stream{}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dummy, 0);
}

TYPED_TEST(BackendExecTest, RejectsUnknownHandles) {
  int marker = 0;
  const Stream bogus_stream{&marker};
  const Event bogus_event{&marker};
  EXPECT_EQ(this->backend().synchronize_stream(bogus_stream).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(this->backend().synchronize_event(bogus_event).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(this->backend().query_event(bogus_event).status().code(), StatusCode::kInvalidArgument);
  auto e = this->backend().create_event();
  ASSERT_OK(e);
  EXPECT_EQ(this->backend().record_event(*e, bogus_stream).code(), StatusCode::kInvalidArgument);
  this->backend().destroy_event(*e);
}

TYPED_TEST(BackendExecTest, NativeStreamHandles) {
  auto native = this->backend().native_stream(Stream{});
  ASSERT_OK(native);
  // A cudaStream_t on CUDA (the default stream is a created blocking stream); none on CPU.
  EXPECT_EQ(*native != nullptr, TypeParam::kKind == BackendKind::kCuda);
  int marker = 0;
  EXPECT_EQ(this->backend().native_stream(Stream{&marker}).status().code(),
            StatusCode::kInvalidArgument);
}

TYPED_TEST(BackendExecTest, CopyWithNullPointerIsRejected) {
  DeviceBuffer a(this->backend(), 64);
  EXPECT_EQ(
      this->backend().copy_async(nullptr, a.data(), 64, CopyKind::kDeviceToDevice, Stream{}).code(),
      StatusCode::kInvalidArgument);
}

// A stream that waits on an event must not start its later work before the event's work is done,
// even when that work is slow. A kernel on a third stream, without the wait, finishes while the
// slow op still runs, which shows that the slow op really is in progress when unordered work
// executes, so the test can fail. The bystander is a kernel watched from the test thread, not a
// host function: CUDA may serialize host functions of different streams on one thread.
TYPED_TEST(BackendExecTest, WorkAfterAnEventWaitDoesNotStartBeforeTheEvent) {
  Backend& be = this->backend();
  auto producer = be.create_stream();
  auto consumer = be.create_stream();
  auto bystander = be.create_stream();
  auto event = be.create_event();
  ASSERT_OK(producer);
  ASSERT_OK(consumer);
  ASSERT_OK(bystander);
  ASSERT_OK(event);
  const int64_t n = 1000;
  const std::vector<uint32_t> poison = pattern(static_cast<size_t>(n), 17);
  DeviceBuffer consumer_out(be, n * sizeof(uint32_t));
  DeviceBuffer bystander_out(be, n * sizeof(uint32_t));
  consumer_out.upload(poison);
  bystander_out.upload(poison);

  std::atomic<bool> slow_op_done{false};
  std::atomic<int> observed_by_consumer{-1};

  // 600 ms: the checks below must end before it does, also on a loaded machine.
  ASSERT_OK(be.launch_host_func(*producer, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    slow_op_done = true;
  }));
  ASSERT_OK(be.record_event(*event, *producer));
  EXPECT_FALSE(*be.query_event(*event));  // the slow op is still sleeping

  ASSERT_OK(be.wait_event(*consumer, *event));
  ASSERT_OK(be.launch_host_func(*consumer, [&] { observed_by_consumer = slow_op_done ? 1 : 0; }));
  const kernels::FillBody consumer_fill{static_cast<uint32_t*>(consumer_out.data()), 0xc0ffee11u};
  ASSERT_OK(be.launch(make_launch(KernelId::kFill, consumer_fill, n), *consumer));
  const kernels::FillBody bystander_fill{static_cast<uint32_t*>(bystander_out.data()), 0xb1u};
  ASSERT_OK(be.launch(make_launch(KernelId::kFill, bystander_fill, n), *bystander));

  ASSERT_OK(be.synchronize_stream(*bystander));
  EXPECT_FALSE(slow_op_done.load()) << "unordered work should finish during the slow op";
  EXPECT_EQ(bystander_out.download<uint32_t>(), std::vector<uint32_t>(n, 0xb1u));
  EXPECT_EQ(consumer_out.download<uint32_t>(), poison) << "ordered work ran before the event";
  EXPECT_FALSE(slow_op_done.load()) << "the checks above took longer than the slow op";

  ASSERT_OK(be.synchronize_stream(*consumer));
  EXPECT_EQ(observed_by_consumer.load(), 1) << "ordered work ran before the event completed";
  EXPECT_EQ(consumer_out.download<uint32_t>(), std::vector<uint32_t>(n, 0xc0ffee11u));
  EXPECT_TRUE(*be.query_event(*event));

  be.destroy_event(*event);
  be.destroy_stream(*producer);
  be.destroy_stream(*consumer);
  be.destroy_stream(*bystander);
}

// Data ordering through an event: a kernel on one stream, delayed behind a slow op, produces a
// buffer that a copy on another stream consumes.
TYPED_TEST(BackendExecTest, CopyOrderedAfterKernelOnAnotherStream) {
  Backend& be = this->backend();
  auto producer = be.create_stream();
  auto consumer = be.create_stream();
  auto event = be.create_event();
  ASSERT_OK(producer);
  ASSERT_OK(consumer);
  ASSERT_OK(event);
  const int64_t n = 4097;
  DeviceBuffer x(be, n * sizeof(int64_t));
  DeviceBuffer y(be, n * sizeof(int64_t));
  const kernels::FillBody zero_y{static_cast<uint32_t*>(y.data()), 0u};
  ASSERT_OK(be.launch(make_launch(KernelId::kFill, zero_y, n * 2), Stream{}));
  ASSERT_OK(be.synchronize_stream(Stream{}));

  ASSERT_OK(be.launch_host_func(
      *producer, [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }));
  const kernels::IotaBody iota{static_cast<int64_t*>(x.data()), 5, 2};
  ASSERT_OK(be.launch(make_launch(KernelId::kIota, iota, n), *producer));
  ASSERT_OK(be.record_event(*event, *producer));
  ASSERT_OK(be.wait_event(*consumer, *event));
  ASSERT_OK(
      be.copy_async(y.data(), x.data(), n * sizeof(int64_t), CopyKind::kDeviceToDevice, *consumer));
  ASSERT_OK(be.synchronize_stream(*consumer));
  const std::vector<int64_t> got = y.download<int64_t>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], 5 + 2 * i);
  be.destroy_event(*event);
  be.destroy_stream(*producer);
  be.destroy_stream(*consumer);
}

TYPED_TEST(BackendExecTest, SynchronizeEventBlocksUntilItsWorkIsDone) {
  Backend& be = this->backend();
  auto stream = be.create_stream();
  auto event = be.create_event();
  ASSERT_OK(stream);
  ASSERT_OK(event);
  EXPECT_TRUE(*be.query_event(*event));  // never recorded: complete
  std::atomic<bool> done{false};
  ASSERT_OK(be.launch_host_func(*stream, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
  }));
  ASSERT_OK(be.record_event(*event, *stream));
  ASSERT_OK(be.synchronize_event(*event));
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(*be.query_event(*event));
  be.destroy_event(*event);
  be.destroy_stream(*stream);
}

TYPED_TEST(BackendExecTest, WorkOnOneStreamRunsInOrder) {
  Backend& be = this->backend();
  auto stream = be.create_stream();
  ASSERT_OK(stream);
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK(be.launch_host_func(*stream, [&order, i] {
      if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      order.push_back(i);
    }));
  }
  ASSERT_OK(be.synchronize_stream(*stream));
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  be.destroy_stream(*stream);
}

// The caller's stream (CUDA's legacy stream here) orders copies, kernels and host functions like a
// stream of the backend's own, and an event recorded on it orders another stream's work.
TYPED_TEST(BackendExecTest, AWrappedStreamOrdersWorkLikeAnyStream) {
  Backend& be = this->backend();
  auto wrapped = be.wrap_stream(kLegacyStream);
  auto consumer = be.create_stream();
  auto event = be.create_event();
  auto staging = be.allocate_pinned(4096 * sizeof(uint32_t));
  ASSERT_OK(wrapped);
  ASSERT_OK(consumer);
  ASSERT_OK(event);
  ASSERT_OK(staging);
  const size_t n = 4096;
  const std::vector<uint32_t> src = pattern(n, 5);
  std::memcpy(*staging, src.data(), n * sizeof(uint32_t));
  DeviceBuffer a(be, n * sizeof(uint32_t));
  DeviceBuffer b(be, n * sizeof(uint32_t));
  a.upload(pattern(n, 6));
  b.upload(pattern(n, 7));

  std::atomic<int> step{0};
  // A slow head keeps the rest of the wrapped stream's work queued, so the consumer really waits.
  ASSERT_OK(be.launch_host_func(*wrapped, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    step = 1;
  }));
  ASSERT_OK(
      be.copy_async(a.data(), *staging, n * sizeof(uint32_t), CopyKind::kHostToDevice, *wrapped));
  // After the copy, or the copy would overwrite it.
  const kernels::FillBody fill{static_cast<uint32_t*>(a.data()), 0x600dcafeu};
  ASSERT_OK(be.launch(make_launch(KernelId::kFill, fill, n / 2), *wrapped));
  ASSERT_OK(be.launch_host_func(*wrapped, [&] {
    int expected = 1;
    step.compare_exchange_strong(expected, 2);
  }));
  ASSERT_OK(be.record_event(*event, *wrapped));
  ASSERT_OK(be.wait_event(*consumer, *event));
  ASSERT_OK(be.copy_async(b.data(), a.data(), n * sizeof(uint32_t), CopyKind::kDeviceToDevice,
                          *consumer));
  ASSERT_OK(be.synchronize_stream(*consumer));
  EXPECT_EQ(step.load(), 2) << "the host functions ran out of order or not before the event";
  std::vector<uint32_t> expected = src;
  std::fill(expected.begin(), expected.begin() + n / 2, 0x600dcafeu);
  EXPECT_EQ(b.download<uint32_t>(), expected);

  be.destroy_event(*event);
  be.destroy_stream(*consumer);
  be.destroy_stream(*wrapped);
  be.free_pinned(*staging);
}

TYPED_TEST(BackendExecTest, WrappingTheSameHandleTwiceGivesTheSameStream) {
  Backend& be = this->backend();
  auto first = be.wrap_stream(kLegacyStream);
  auto again = be.wrap_stream(kLegacyStream);
  auto other = be.wrap_stream(kPerThreadStream);
  ASSERT_OK(first);
  ASSERT_OK(again);
  ASSERT_OK(other);
  EXPECT_EQ(*first, *again);
  EXPECT_NE(*first, *other);
  EXPECT_NE(*first, Stream{});
  EXPECT_NE(*other, Stream{});
  auto native = be.native_stream(*first);
  ASSERT_OK(native);
  EXPECT_EQ(*native, kLegacyStream);
  EXPECT_OK(be.synchronize_stream(*first));

  // Forgotten, not destroyed: the handle is unknown until wrapped again, and then usable.
  be.destroy_stream(*first);
  EXPECT_EQ(be.synchronize_stream(*first).code(), StatusCode::kInvalidArgument);
  auto rewrapped = be.wrap_stream(kLegacyStream);
  ASSERT_OK(rewrapped);
  DeviceBuffer out(be, 64 * sizeof(uint32_t));
  const kernels::FillBody fill{static_cast<uint32_t*>(out.data()), 0x7u};
  ASSERT_OK(be.launch(make_launch(KernelId::kFill, fill, 64), *rewrapped));
  ASSERT_OK(be.synchronize_stream(*rewrapped));
  EXPECT_EQ(out.download<uint32_t>(), std::vector<uint32_t>(64, 0x7u));
  be.destroy_stream(*rewrapped);
  be.destroy_stream(*other);
}

TYPED_TEST(BackendExecTest, WrappingANullStreamIsInvalid) {
  EXPECT_EQ(this->backend().wrap_stream(nullptr).status().code(), StatusCode::kInvalidArgument);
}

// On CUDA the native handle of one of the backend's own streams names that stream (the CPU
// backend has no native handles of its own to give out).
TYPED_TEST(BackendExecTest, WrappingTheNativeHandleOfAnOwnStreamGivesThatStream) {
  if (TypeParam::kKind == BackendKind::kCpu) GTEST_SKIP() << "CPU streams have no native handle";
  Backend& be = this->backend();
  auto created = be.create_stream();
  ASSERT_OK(created);
  auto native = be.native_stream(*created);
  auto default_native = be.native_stream(Stream{});
  ASSERT_OK(native);
  ASSERT_OK(default_native);
  auto wrapped = be.wrap_stream(*native);
  auto wrapped_default = be.wrap_stream(*default_native);
  ASSERT_OK(wrapped);
  ASSERT_OK(wrapped_default);
  EXPECT_EQ(*wrapped, *created);
  EXPECT_EQ(*wrapped_default, Stream{});
  be.destroy_stream(*created);
}

// A failed call (here an allocation CUDA refuses) must not fail later, unrelated calls: the
// runtime's last-error slot is cleared, and launches report only their own error.
TYPED_TEST(BackendExecTest, AFailedAllocationDoesNotFailLaterLaunches) {
  if (TypeParam::kKind == BackendKind::kCpu) {
    GTEST_SKIP() << "a 1 PiB aligned_alloc aborts under AddressSanitizer";
  }
  Backend& be = this->backend();
  auto huge = be.allocate_device(size_t(1) << 50);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().to_string();
  if (huge.ok()) be.free_device(*huge);
  const int64_t n = 3001;
  DeviceBuffer out(be, n * sizeof(uint32_t));
  out.upload(pattern(static_cast<size_t>(n), 9));
  const kernels::FillBody fill{static_cast<uint32_t*>(out.data()), 0x31415926u};
  const Status launched = be.launch(make_launch(KernelId::kFill, fill, n), Stream{});
  ASSERT_OK(launched);
  EXPECT_EQ(out.download<uint32_t>(), std::vector<uint32_t>(n, 0x31415926u));
}

}  // namespace
}  // namespace pagedkv
