// copy_blocks: whole blocks for a batch of (src, dst) pairs in one launch.
#include <cstring>
#include <string>

#include "common/nvtx.hpp"
#include "ops/launch_shape.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv {

Status copy_blocks(Backend& backend, const PoolRef& pool, const CopyBlocksArgs& args,
                   Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::copy_blocks");
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pool(pool));
  if (args.index_type != IndexType::kInt32 && args.index_type != IndexType::kInt64) {
    return invalid_argument("index_type: unknown value");
  }
  if (args.num_pairs < 0) return invalid_argument("num_pairs: negative");
  if (args.num_pairs == 0) return ok_status();
  const size_t index_size = args.index_type == IndexType::kInt64 ? 8 : 4;
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(args.pairs, index_size, "pairs"));
  int64_t pairs_reach = 0;  // the last index of [num_pairs][2]
  if (!ops_detail::add_reach(args.num_pairs, 2, &pairs_reach) ||
      !ops_detail::add_reach(2, 1, &pairs_reach)) {
    return invalid_argument("num_pairs: " + std::to_string(args.num_pairs) +
                            " pairs overflow 64-bit offsets");
  }
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_reach(args.pairs, args.pairs, index_size,
                                                     pairs_reach, "num_pairs", "pairs"));

  const int64_t block_bytes =
      pool.layout.block_elems() * static_cast<int64_t>(dtype_size(pool.dtype));
  ops_detail::BlockCopyPools pools;
  pools.dst = static_cast<char*>(pool.data);
  pools.dst_blocks = pool.num_blocks;
  pools.src = static_cast<const char*>(pool.data);
  pools.src_blocks = pool.num_blocks;
  pools.block_bytes = block_bytes;
  return ops_detail::launch_copy_blocks(backend, pools, args.pairs, args.index_type, args.num_pairs,
                                        stream);
}

namespace ops_detail {

Status launch_copy_blocks(Backend& backend, const BlockCopyPools& pools, const void* pairs,
                          IndexType index_type, int64_t num_pairs, Stream stream,
                          int32_t max_blocks) {
  kernels::CopyBlocksBody b;
  std::memset(static_cast<void*>(&b), 0, sizeof(b));
  b.dst_pool = pools.dst;
  b.src_pool = pools.src;
  b.pairs = pairs;
  b.pairs_int64 = index_type == IndexType::kInt64 ? 1 : 0;
  b.src_blocks = pools.src_blocks;
  b.dst_blocks = pools.dst_blocks;
  b.block_bytes = pools.block_bytes;
  b.vec_bytes = choose_vec_bytes({reinterpret_cast<uintptr_t>(pools.dst),
                                  reinterpret_cast<uintptr_t>(pools.src),
                                  static_cast<uint64_t>(b.block_bytes)});
  // Wide: one block per index. Narrow: one vector per index.
  b.chunk_bytes = wide_launch(backend) ? b.block_bytes : b.vec_bytes;
  b.chunks_per_block = b.block_bytes / b.chunk_bytes;
  b.chunks_div = kernels::FastDivmod::make(static_cast<uint64_t>(b.chunks_per_block));
  KernelLaunch launch;
  launch.kernel = KernelId::kCopyBlocks;
  launch.params = &b;
  launch.params_size = sizeof(b);
  launch.max_blocks = max_blocks;
  if (__builtin_mul_overflow(num_pairs, b.chunks_per_block, &launch.num_items)) {
    return invalid_argument("num_pairs: " + std::to_string(num_pairs) +
                            " pairs make an index space past int64");
  }
  return backend.launch(launch, stream);
}

}  // namespace ops_detail

}  // namespace pagedkv
