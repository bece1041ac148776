// The null backend: a Backend for sizing runs without KV bytes (pagedkv-sim --no-data). A
// KvCache on it makes every control-plane decision it makes on a real backend (the same
// sequences, blocks, offloads and stats) while nothing is copied or computed.
//
// Copies, copy batches and kernel launches are checked as on the CPU backend and then dropped;
// host functions run at once; every event is complete. Memory is anonymous mmap with
// MAP_NORESERVE whose pages are touched only by whoever writes them: the pools (written only by
// the dropped copies and kernels) cost address space, not memory, so an 80 GiB device pool fits
// on a small machine, while host buffers the runtime itself fills with the CPU (the upload
// arena's staging, a storage tier's reads) become real memory as they are written. Nothing
// reads the pools for a result: gathers and exports give whatever the pages hold (zeros).
#pragma once

#include <cstdint>
#include <memory>

#include "pagedkv/backend.hpp"

namespace pagedkv {

/// Knobs of the null backend.
struct NullBackendOptions {
  /// The ordinal device_ordinal() reports.
  int32_t device_ordinal = 0;
};

/// A null backend (create_backend(BackendKind::kNull) uses the default options).
std::unique_ptr<Backend> create_null_backend(const NullBackendOptions& options = {});

}  // namespace pagedkv
