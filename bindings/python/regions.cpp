// pagedkv._C.BlockGeometry, pair_block_runs and KvCache.regions() / block_geometry(): a cache's
// pools as regions a transfer engine registers, and block ids as addresses (regions.hpp).
#include "pagedkv/regions.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"

namespace pagedkv::python {
namespace {

MemoryKind memory_from_name(const std::string& name) {
  if (name == "DRAM") return MemoryKind::kHost;
  if (name == "VRAM") return MemoryKind::kDevice;
  throw_invalid("memory: \"DRAM\" or \"VRAM\", not \"" + name + "\"");
}

nb::dict region_dict(const PoolRegion& r) {
  nb::dict d;
  d["group"] = r.group;
  d["tier"] = r.tier;
  d["base"] = static_cast<uint64_t>(r.base);
  d["bytes"] = r.bytes;
  d["memory"] = memory_kind_name(r.memory);
  d["device"] = r.device;
  d["rank"] = r.rank;
  return d;
}

// The wire form another process rebuilds with BlockGeometry.from_dict: plain ints and strings.
nb::dict geometry_dict(const BlockGeometry& g) {
  nb::dict d = region_dict(g.region);
  d["tier"] = static_cast<int>(g.region.tier);
  d["num_blocks"] = g.num_blocks;
  d["block_bytes"] = g.block_bytes;
  d["layer_bytes"] = g.layer_bytes;
  nb::list bases;
  for (uintptr_t b : g.layer_base) bases.append(static_cast<uint64_t>(b));
  d["layer_base"] = bases;
  d["block_size"] = g.block_size;
  d["num_layers"] = g.num_layers;
  d["num_kv_heads"] = g.num_kv_heads;
  d["head_dim"] = g.head_dim;
  d["dtype"] = static_cast<int>(g.dtype);
  d["page_layout"] = static_cast<int>(g.page_layout);
  d["kv_kind"] = static_cast<int>(g.kv_kind);
  d["fingerprint"] = g.fingerprint;
  return d;
}

template <typename T>
T field(const nb::dict& d, const char* name) {
  if (!d.contains(name)) throw_invalid(std::string("geometry: no field \"") + name + "\"");
  T value{};
  if (!nb::try_cast(d[name], value)) {
    throw_invalid(std::string("geometry: field \"") + name + "\" has the wrong type");
  }
  return value;
}

BlockGeometry geometry_from_dict(const nb::dict& d) {
  BlockGeometry g;
  g.region.group = field<int32_t>(d, "group");
  g.region.tier = static_cast<Tier>(field<int>(d, "tier"));
  g.region.base = static_cast<uintptr_t>(field<uint64_t>(d, "base"));
  g.region.bytes = field<int64_t>(d, "bytes");
  g.region.memory = memory_from_name(field<std::string>(d, "memory"));
  g.region.device = field<int32_t>(d, "device");
  g.num_blocks = field<int64_t>(d, "num_blocks");
  g.block_bytes = field<int64_t>(d, "block_bytes");
  g.layer_bytes = field<int64_t>(d, "layer_bytes");
  for (uint64_t b : field<std::vector<uint64_t>>(d, "layer_base")) {
    g.layer_base.push_back(static_cast<uintptr_t>(b));
  }
  g.block_size = field<int32_t>(d, "block_size");
  g.num_layers = field<int32_t>(d, "num_layers");
  g.num_kv_heads = field<int32_t>(d, "num_kv_heads");
  g.head_dim = field<int32_t>(d, "head_dim");
  g.dtype = static_cast<DType>(field<int>(d, "dtype"));
  g.page_layout = static_cast<PageLayout>(field<int>(d, "page_layout"));
  g.kv_kind = static_cast<KvKind>(field<int>(d, "kv_kind"));
  g.fingerprint = field<uint64_t>(d, "fingerprint");
  if (g.num_blocks < 0 || g.block_bytes <= 0 || g.region.bytes < g.num_blocks * g.block_bytes) {
    throw_invalid("geometry: num_blocks x block_bytes does not fit the region's bytes");
  }
  return g;
}

}  // namespace

void register_regions(nb::module_& m, nb::class_<PyCache>& cache) {
  nb::class_<BlockGeometry>(m, "BlockGeometry",
                            "How one pool lays its blocks out (pagedkv/regions.hpp): block b is "
                            "the block_bytes bytes at base + b * block_bytes, layer l of it at "
                            "layer_base[l] + b * block_bytes. Send to_dict() to a peer, which "
                            "rebuilds it with BlockGeometry.from_dict.")
      .def_prop_ro("group", [](const BlockGeometry& g) { return g.region.group; })
      .def_prop_ro("tier", [](const BlockGeometry& g) { return g.region.tier; })
      .def_prop_ro("base", [](const BlockGeometry& g) { return uint64_t{g.region.base}; })
      .def_prop_ro("bytes", [](const BlockGeometry& g) { return g.region.bytes; })
      .def_prop_ro(
          "memory", [](const BlockGeometry& g) { return memory_kind_name(g.region.memory); },
          "\"DRAM\" or \"VRAM\" (NIXL's memory types).")
      .def_prop_ro("device", [](const BlockGeometry& g) { return g.region.device; })
      .def_ro("num_blocks", &BlockGeometry::num_blocks)
      .def_ro("block_bytes", &BlockGeometry::block_bytes)
      .def_ro("layer_bytes", &BlockGeometry::layer_bytes)
      .def_prop_ro("layer_base",
                   [](const BlockGeometry& g) {
                     return std::vector<uint64_t>(g.layer_base.begin(), g.layer_base.end());
                   })
      .def_ro("block_size", &BlockGeometry::block_size)
      .def_ro("num_layers", &BlockGeometry::num_layers)
      .def_ro("num_kv_heads", &BlockGeometry::num_kv_heads)
      .def_ro("head_dim", &BlockGeometry::head_dim)
      .def_ro("dtype", &BlockGeometry::dtype)
      .def_ro("page_layout", &BlockGeometry::page_layout)
      .def_ro("kv_kind", &BlockGeometry::kv_kind)
      .def_ro("fingerprint", &BlockGeometry::fingerprint)
      .def(
          "block_address",
          [](const BlockGeometry& g, int64_t block) {
            if (block < 0 || block >= g.num_blocks) {
              throw_invalid("block " + std::to_string(block) + " outside the pool's " +
                            std::to_string(g.num_blocks) + " blocks");
            }
            return uint64_t{g.block_address(block)};
          },
          nb::arg("block"), "The address of the block's first byte. InvalidArgumentError.")
      .def("to_dict", &geometry_dict, "Plain ints and strings, for the wire (e.g. json.dumps).")
      .def_static("from_dict", &geometry_from_dict, nb::arg("d"),
                  "The geometry to_dict() described. InvalidArgumentError for a missing or "
                  "mistyped field, or a region too small for its blocks.");

  m.def(
      "check_same_block_layout",
      [](const BlockGeometry& a, const BlockGeometry& b) { check(check_same_block_layout(a, b)); },
      nb::arg("a"), nb::arg("b"),
      "Raises FailedPreconditionError unless blocks of a and b hold the same bytes for the same "
      "tokens (same layout fingerprint, model id included, and block size in bytes).");
  m.def(
      "pair_block_runs",
      [](const BlockGeometry& src, const std::vector<int32_t>& src_ids, const BlockGeometry& dst,
         const std::vector<int32_t>& dst_ids) {
        const std::vector<BlockRun> runs =
            value_or_throw(pair_block_runs(src, src_ids, dst, dst_ids));
        std::vector<std::tuple<int64_t, int64_t, int64_t, uint64_t, uint64_t, int64_t>> out;
        out.reserve(runs.size());
        for (const BlockRun& r : runs) {
          out.emplace_back(r.src_block, r.dst_block, r.blocks, uint64_t{r.src}, uint64_t{r.dst},
                           r.bytes);
        }
        return out;
      },
      nb::arg("src"), nb::arg("src_ids"), nb::arg("dst"), nb::arg("dst_ids"),
      "Block src_ids[i] of src goes to dst_ids[i] of dst: the copies as runs (src_block, "
      "dst_block, blocks, src_address, dst_address, bytes), consecutive ids on both sides merged. "
      "InvalidArgumentError (sizes, ids), FailedPreconditionError (layouts differ).");

  cache.def(
      "regions",
      [](PyCache& s) {
        nb::list out;
        for (const PoolRegion& r : s.kv->regions()) out.append(region_dict(r));
        return out;
      },
      "Every pool as a region to register with a transfer engine: dicts {group, tier, base, "
      "bytes, memory ('DRAM'/'VRAM'), device, rank}, per tensor-parallel rank and group the "
      "device pool then the host pool.");
  cache.def(
      "block_geometry",
      [](PyCache& s, int32_t group, Tier tier, const std::string& model_id, int32_t rank) {
        return value_or_throw(s.kv->block_geometry(group, tier, model_id, rank));
      },
      nb::arg("group") = 0, nb::arg("tier") = Tier::kDevice, nb::arg("model_id") = "",
      nb::arg("rank") = 0,
      "The BlockGeometry of a group's pool on a tier (Tier.DEVICE or Tier.HOST), its fingerprint "
      "naming model_id too. A peer writes a sequence's blocks after the reserve that gave them "
      "and synchronize(), before commit. With tensor parallelism, rank `rank`'s pool (its "
      "fingerprint names the tp_size and the rank). OutOfRangeError, InvalidArgumentError, "
      "FailedPreconditionError (no host tier).");
}

}  // namespace pagedkv::python
