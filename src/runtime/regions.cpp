// KvCache::regions() and block_geometry(), and the run pairing of regions.hpp.
#include "pagedkv/regions.hpp"

#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/layout.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {

const char* memory_kind_name(MemoryKind kind) {
  return kind == MemoryKind::kDevice ? "VRAM" : "DRAM";
}

Status check_same_block_layout(const BlockGeometry& a, const BlockGeometry& b) {
  if (a.fingerprint != b.fingerprint) {
    return failed_precondition(
        "the pools' block layouts differ (fingerprint " + std::to_string(a.fingerprint) + " vs " +
        std::to_string(b.fingerprint) +
        "): the model, shape, dtype, page layout or block size is not the same");
  }
  if (a.block_bytes != b.block_bytes) {
    return failed_precondition(
        "the pools' blocks differ in size: " + std::to_string(a.block_bytes) + " vs " +
        std::to_string(b.block_bytes) + " bytes");
  }
  return ok_status();
}

namespace {

Status check_ids(const char* side, const std::vector<int32_t>& ids, int64_t num_blocks) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_blocks) {
      return invalid_argument(std::string(side) + "[" + std::to_string(i) +
                              "] = " + std::to_string(ids[i]) + " outside the pool's " +
                              std::to_string(num_blocks) + " blocks");
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<std::vector<BlockRun>> pair_block_runs(const BlockGeometry& src,
                                                const std::vector<int32_t>& src_ids,
                                                const BlockGeometry& dst,
                                                const std::vector<int32_t>& dst_ids) {
  if (src_ids.size() != dst_ids.size()) {
    return invalid_argument("src_ids has " + std::to_string(src_ids.size()) + " blocks, dst_ids " +
                            std::to_string(dst_ids.size()));
  }
  PAGEDKV_RETURN_IF_ERROR(check_same_block_layout(src, dst));
  PAGEDKV_RETURN_IF_ERROR(check_ids("src_ids", src_ids, src.num_blocks));
  PAGEDKV_RETURN_IF_ERROR(check_ids("dst_ids", dst_ids, dst.num_blocks));
  std::vector<BlockRun> runs;
  for (size_t i = 0; i < src_ids.size(); ++i) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (src_ids[i] == last.src_block + last.blocks &&
          dst_ids[i] == last.dst_block + last.blocks) {
        ++last.blocks;
        last.bytes += src.block_bytes;
        continue;
      }
    }
    runs.push_back(BlockRun{src_ids[i], dst_ids[i], 1, src.block_address(src_ids[i]),
                            dst.block_address(dst_ids[i]), src.block_bytes});
  }
  return runs;
}

std::vector<PoolRegion> KvCache::regions() const {
  // The CPU backend's "device" pool is ordinary host memory: a transfer engine registers it as
  // DRAM, like the host tier.
  const Impl& c = *impl_;
  std::vector<PoolRegion> out;
  for (int32_t r = 0; r < c.num_ranks(); ++r) {
    const Impl::Rank& rank = c.ranks[static_cast<size_t>(r)];
    const bool gpu = rank.backend->kind() == BackendKind::kCuda;
    for (int32_t g = 0; g < c.num_groups(); ++g) {
      const Impl::GroupPool& p = rank.groups[static_cast<size_t>(g)];
      const CacheConfig& c = shard_config(g);
      const int64_t block = c.block_bytes();
      out.push_back(PoolRegion{g, Tier::kDevice, reinterpret_cast<uintptr_t>(p.device),
                               block * c.num_device_blocks,
                               gpu ? MemoryKind::kDevice : MemoryKind::kHost,
                               gpu ? rank.backend->device_ordinal() : 0, r});
      if (p.host != nullptr && c.num_host_blocks > 0) {
        out.push_back(PoolRegion{g, Tier::kHost, reinterpret_cast<uintptr_t>(p.host),
                                 block * c.num_host_blocks, MemoryKind::kHost, 0, r});
      }
    }
  }
  return out;
}

StatusOr<BlockGeometry> KvCache::block_geometry(int32_t group, Tier tier,
                                                const std::string& model_id, int32_t rank) const {
  PAGEDKV_RETURN_IF_ERROR(impl_->check_group(group));
  PAGEDKV_RETURN_IF_ERROR(impl_->check_rank(rank, "block_geometry"));
  if (tier == Tier::kStorage) {
    return invalid_argument("tier: the storage tier has no pool in this process");
  }
  BlockGeometry geo;
  bool found = false;
  for (const PoolRegion& r : regions()) {
    if (r.group == group && r.tier == tier && r.rank == rank) {
      geo.region = r;
      found = true;
    }
  }
  if (!found) {
    return failed_precondition("tier: group " + std::to_string(group) +
                               " has no host pool (num_host_blocks is 0)");
  }
  const CacheConfig& c = shard_config(group);
  const PoolLayout layout = PoolLayout::from_config(c);
  const auto elem = static_cast<int64_t>(dtype_size(c.dtype));
  geo.num_blocks = tier == Tier::kDevice ? c.num_device_blocks : c.num_host_blocks;
  geo.block_bytes = c.block_bytes();
  geo.layer_bytes = layout.layer_stride() * elem;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    geo.layer_base.push_back(geo.region.base + static_cast<uintptr_t>(l * geo.layer_bytes));
  }
  geo.block_size = c.block_size;
  geo.num_layers = c.num_layers;
  geo.num_kv_heads = c.num_kv_heads;
  geo.head_dim = c.head_dim;
  geo.dtype = c.dtype;
  geo.page_layout = c.page_layout;
  geo.kv_kind = c.kv_kind;
  // A rank's blocks hold its slice of the heads: they mean the same bytes only to the same
  // rank of a deployment of the same tensor-parallel size.
  const int32_t tp = impl_->num_ranks();
  const std::string tagged =
      tp == 1 ? model_id
              : model_id + " tp_size=" + std::to_string(tp) + " rank=" + std::to_string(rank);
  geo.fingerprint = StorageLayout::from_config(c, tagged).fingerprint();
  return geo;
}

}  // namespace pagedkv
