// A cache's pools as memory regions a transfer engine (NIXL, UCX, RDMA verbs) can register, and
// the geometry that turns a block id into an address, so another process can read or write a
// sequence's blocks by id (prefill/decode disaggregation). Every pool is block-major
// (layout.hpp): block b of a pool is the `block_bytes` bytes at base + b * block_bytes, every
// layer of it inside, so a run of consecutive block ids is one contiguous range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// Which memory a region is in, as transfer engines name it: host memory (NIXL's DRAM: the host
/// tier, and every pool of the CPU backend) or GPU memory (VRAM: the CUDA backend's device pool).
enum class MemoryKind : uint8_t { kHost = 0, kDevice = 1 };

/// "DRAM" or "VRAM" (NIXL's names).
const char* memory_kind_name(MemoryKind kind);

/// One tier's pool of one KV group: register it once, address blocks inside it.
struct PoolRegion {
  int32_t group = 0;
  Tier tier = Tier::kDevice;
  uintptr_t base = 0;
  int64_t bytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  int32_t device = 0;  // the GPU ordinal for kDevice memory; 0 for host memory
  int32_t rank = 0;    // the tensor-parallel rank whose pool it is (KvCacheOptions::tp_size)
};

/// How the blocks of one pool are laid out: what a peer needs to address a block by id, and to
/// check that its own blocks mean the same bytes. Shaped like the region specs engines exchange
/// (vLLM's NixlAgentMetadata: per-layer base, bytes of one layer's page, block stride).
struct BlockGeometry {
  PoolRegion region;
  int64_t num_blocks = 0;
  /// Bytes of one block, all layers: the stride between blocks.
  int64_t block_bytes = 0;
  /// Bytes of one layer of one block (keys then values, or the latent page): layer l of block b
  /// is at layer_base[l] + b * block_bytes.
  int64_t layer_bytes = 0;
  std::vector<uintptr_t> layer_base;  // one per layer of the group
  int32_t block_size = 0;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kFloat16;
  PageLayout page_layout = PageLayout::kNHD;
  KvKind kv_kind = KvKind::kKeyValue;
  /// StorageLayout's fingerprint of the group's layout and the model id given: two pools whose
  /// fingerprints differ never exchange blocks.
  uint64_t fingerprint = 0;

  /// The address of block `block`'s first byte (no range check).
  uintptr_t block_address(int64_t block) const {
    return region.base + static_cast<uintptr_t>(block) * static_cast<uintptr_t>(block_bytes);
  }
};

/// Ok when blocks of `a` and `b` hold the same bytes for the same tokens (same fingerprint and
/// block bytes); otherwise kFailedPrecondition naming what differs.
Status check_same_block_layout(const BlockGeometry& a, const BlockGeometry& b);

/// One contiguous copy of `blocks` blocks from one pool to another.
struct BlockRun {
  int64_t src_block = 0;  // the first block of the run in the source pool
  int64_t dst_block = 0;  // and in the destination pool
  int64_t blocks = 0;
  uintptr_t src = 0;  // src.block_address(src_block)
  uintptr_t dst = 0;
  int64_t bytes = 0;  // blocks * block_bytes
};

/// Block src_ids[i] of `src` goes to block dst_ids[i] of `dst`; consecutive pairs whose ids
/// both go up by one are merged into one run, in the order given. kInvalidArgument for lists
/// of different sizes or an id outside its pool; check_same_block_layout's error for pools
/// whose blocks differ. Empty lists give no runs.
StatusOr<std::vector<BlockRun>> pair_block_runs(const BlockGeometry& src,
                                                const std::vector<int32_t>& src_ids,
                                                const BlockGeometry& dst,
                                                const std::vector<int32_t>& dst_ids);

}  // namespace pagedkv
