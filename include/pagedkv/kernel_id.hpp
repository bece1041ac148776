// Names of the kernel bodies that a Backend can launch. The body types and their parameter
// structs live in kernels/*.hpp; kernels/registry.hpp maps each id to its body type.
#pragma once

#include <cstdint>

namespace pagedkv {

/// One entry per kernel body. Keep in step with PAGEDKV_KERNEL_LIST in kernels/registry.hpp.
enum class KernelId : uint16_t {
  kFill = 0,         // fill 32-bit words with a value (poisoning, clearing)
  kIota,             // out[i] = start + i * step (backend self-test)
  kPagedRows,        // rows between the pool and tensors (write, scatter, gather, import)
  kCopyBlocks,       // whole blocks for (src, dst) pairs (copy-on-write, fork)
  kExclusiveScan,    // indptr from sequence lengths (CPU path of build_indptr)
  kDecodeAttention,  // reference paged decode attention (examples, tests)
  kPagedRowsRaw,     // kPagedRows' raw copy (same dtype, no scale) with batched vector loads
  kSpin,             // busy-waits a given time per index (a model kernel's stand-in in tests)
  kCount,            // number of ids; not a kernel
};

}  // namespace pagedkv
