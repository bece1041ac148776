// Options of the CPU backend, for tests and for planning on machines without a GPU.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "pagedkv/backend.hpp"

namespace pagedkv {

/// Knobs of the CPU backend. The defaults behave like an unlimited, undelayed executor.
struct CpuBackendOptions {
  /// Each copy queued on a stream made by create_stream() (a transfer engine's copy stream, say)
  /// sleeps this long on its worker before moving bytes, so tests can show that ordering comes
  /// from events and not from copies finishing quickly. A copy_batch() sleeps once for the whole
  /// batch, and so does a launch of the block-copy kernel (KernelId::kCopyBlocks: the transfer
  /// engine's copy path for small blocks) on such a stream. Default-stream copies are not
  /// delayed.
  std::chrono::microseconds copy_delay{0};
  /// Each kernel launch sleeps this long on its worker before running.
  std::chrono::microseconds kernel_delay{0};
  /// Total bytes allocate_device may hand out; 0 means no limit beyond the host's.
  size_t device_memory_limit = 0;
  /// Total bytes allocate_pinned may hand out; 0 means no limit beyond the host's.
  size_t pinned_memory_limit = 0;
  /// When a stream is idle (nothing queued, nothing running), copies, kernel launches, event
  /// records and waits on completed events run at once on the caller's thread instead of being
  /// handed to the stream's worker; stream order is unchanged. Host functions, waits on events
  /// not yet complete, and copies or launches delayed by the options above always go through the
  /// worker (and so does everything queued behind them). False hands everything to the worker.
  bool run_inline_when_idle = true;
  /// The ordinal device_ordinal() reports (DLPack's device_id of its memory): a stand-in for a
  /// device other than 0 in tests of code that must carry the ordinal through.
  int32_t device_ordinal = 0;
};

/// A CPU backend with the given options (create_backend(kCpu) uses the defaults).
std::unique_ptr<Backend> create_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace pagedkv
