// Enums, CacheConfig and the value types a caller reads back (events).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"

namespace pagedkv::python {

void register_types(nb::module_& m) {
  m.def("_cuda_backend_built", &cuda_backend_built, "Whether this build has the CUDA backend.");
  m.def("_cuda_device_available", &cuda_device_available,
        "Whether the CUDA backend is built and a device is present.");
  nb::enum_<StatusCode>(m, "StatusCode", "Error codes by meaning (pagedkv/status.hpp).")
      .value("OK", StatusCode::kOk)
      .value("INVALID_ARGUMENT", StatusCode::kInvalidArgument)
      .value("NOT_FOUND", StatusCode::kNotFound)
      .value("ALREADY_EXISTS", StatusCode::kAlreadyExists)
      .value("OUT_OF_RANGE", StatusCode::kOutOfRange)
      .value("FAILED_PRECONDITION", StatusCode::kFailedPrecondition)
      .value("RESOURCE_EXHAUSTED", StatusCode::kResourceExhausted)
      .value("UNAVAILABLE", StatusCode::kUnavailable)
      .value("UNIMPLEMENTED", StatusCode::kUnimplemented)
      .value("INTERNAL", StatusCode::kInternal);
  nb::enum_<DType>(m, "DType", "Element type of a pool or of an input array.")
      .value("FLOAT16", DType::kFloat16)
      .value("BFLOAT16", DType::kBFloat16)
      .value("FLOAT32", DType::kFloat32)
      .value("FLOAT8_E4M3", DType::kFloat8E4M3);
  nb::enum_<PageLayout>(m, "PageLayout", "NHD: [block_size, heads, dim]; HND: [heads, ...].")
      .value("NHD", PageLayout::kNHD)
      .value("HND", PageLayout::kHND);
  nb::enum_<EvictionPolicy>(m, "EvictionPolicy")
      .value("NONE", EvictionPolicy::kNone)
      .value("LRU", EvictionPolicy::kLru)
      .value("FIFO", EvictionPolicy::kFifo);
  nb::enum_<CacheMode>(m, "CacheMode", "Paged (the KvCache) or dense (seed surface only).")
      .value("PAGED", CacheMode::kPaged)
      .value("DENSE", CacheMode::kDense);
  nb::enum_<KvKind>(m, "KvKind",
                    "What a page holds per token: KEY_VALUE (keys and values) or LATENT (one MLA "
                    "latent vector, keys only).")
      .value("KEY_VALUE", KvKind::kKeyValue)
      .value("LATENT", KvKind::kLatent);
  nb::enum_<BackendKind>(m, "BackendKind")
      .value("AUTO", BackendKind::kAuto)
      .value("CPU", BackendKind::kCpu)
      .value("CUDA", BackendKind::kCuda)
      .value("NULL", BackendKind::kNull);
  nb::enum_<Tier>(m, "Tier", "Where a block's bytes live; STORAGE appears only in events.")
      .value("DEVICE", Tier::kDevice)
      .value("HOST", Tier::kHost)
      .value("STORAGE", Tier::kStorage);
  nb::enum_<SequenceResidency>(m, "SequenceResidency")
      .value("DEVICE", SequenceResidency::kDevice)
      .value("IN_FLIGHT", SequenceResidency::kInFlight)
      .value("HOST", SequenceResidency::kHost);
  nb::enum_<EventKind>(m, "EventKind")
      .value("BLOCK_STORED", EventKind::kBlockStored)
      .value("BLOCK_REMOVED", EventKind::kBlockRemoved)
      .value("SEQUENCE_EVICTED", EventKind::kSequenceEvicted)
      .value("SEQUENCE_OFFLOADED", EventKind::kSequenceOffloaded)
      .value("SEQUENCE_RESTORED", EventKind::kSequenceRestored)
      .value("EVENTS_DROPPED", EventKind::kEventsDropped);

  nb::class_<KvGroup>(m, "_KvGroup", "The C++ KvGroup (use pagedkv.KvGroup).")
      .def(nb::init<>())
      .def_rw("name", &KvGroup::name)
      .def_rw("layers", &KvGroup::layers)
      .def_rw("num_kv_heads", &KvGroup::num_kv_heads)
      .def_rw("head_dim", &KvGroup::head_dim)
      .def_rw("dtype", &KvGroup::dtype)
      .def_rw("kv_kind", &KvGroup::kv_kind)
      .def_rw("rope_dim", &KvGroup::rope_dim)
      .def_rw("sliding_window", &KvGroup::sliding_window)
      .def_rw("num_device_blocks", &KvGroup::num_device_blocks)
      .def_rw("num_host_blocks", &KvGroup::num_host_blocks);

  nb::class_<CacheConfig>(m, "_CacheConfig", "The C++ CacheConfig (use pagedkv.CacheConfig).")
      .def(nb::init<>())
      .def_rw("num_layers", &CacheConfig::num_layers)
      .def_rw("num_kv_heads", &CacheConfig::num_kv_heads)
      .def_rw("head_dim", &CacheConfig::head_dim)
      .def_rw("block_size", &CacheConfig::block_size)
      .def_rw("num_device_blocks", &CacheConfig::num_device_blocks)
      .def_rw("num_host_blocks", &CacheConfig::num_host_blocks)
      .def_rw("dtype", &CacheConfig::dtype)
      .def_rw("page_layout", &CacheConfig::page_layout)
      .def_rw("mode", &CacheConfig::mode)
      .def_rw("eviction_policy", &CacheConfig::eviction_policy)
      .def_rw("enable_prefix_caching", &CacheConfig::enable_prefix_caching)
      .def_rw("cache_prefixes_on_host", &CacheConfig::cache_prefixes_on_host)
      .def_rw("max_sequence_length", &CacheConfig::max_sequence_length)
      .def_rw("sliding_window", &CacheConfig::sliding_window)
      .def_rw("kv_kind", &CacheConfig::kv_kind)
      .def_rw("rope_dim", &CacheConfig::rope_dim)
      .def_rw("backend", &CacheConfig::backend)
      .def_rw("groups", &CacheConfig::groups)
      .def("num_groups", &CacheConfig::num_groups)
      .def("block_bytes", &CacheConfig::block_bytes)
      .def("page_bytes", &CacheConfig::page_bytes)
      .def(
          "group_config",
          [](const CacheConfig& c, int32_t g) {
            if (g < 0 || g >= c.num_groups()) {
              check(out_of_range("group " + std::to_string(g) + " outside the config's " +
                                 std::to_string(c.num_groups()) + " groups"));
            }
            return c.group_config(g);
          },
          nb::arg("g"), "The one-group config of group g. OutOfRangeError.")
      .def(
          "blocks_per_sequence",
          [](const CacheConfig& c, int64_t context) {
            if (c.block_size < 1 || c.sliding_window < 0 || context < 0) {
              check(
                  invalid_argument("blocks_per_sequence: needs block_size >= 1, "
                                   "sliding_window >= 0 and context >= 0"));
            }
            return c.blocks_per_sequence(context);
          },
          nb::arg("context"))
      .def(
          "with_pools",
          [](const CacheConfig& c, int64_t device_bytes, int64_t host_bytes, int64_t context) {
            return value_or_throw(c.with_pools(device_bytes, host_bytes, context));
          },
          nb::arg("device_bytes"), nb::arg("host_bytes"), nb::arg("context"))
      .def(
          "rank_config",
          [](const CacheConfig& c, int32_t tp_size) {
            return value_or_throw(rank_config(c, tp_size));
          },
          nb::arg("tp_size"));

  nb::class_<ControlEvent>(m, "ControlEvent",
                           "One control-plane event: block stored/removed on a tier, sequence "
                           "evicted/offloaded/restored, or events dropped (resync).")
      .def_ro("kind", &ControlEvent::kind)
      .def_ro("tier", &ControlEvent::tier)
      .def_ro("sequence", &ControlEvent::sequence)
      .def_ro("block_hash", &ControlEvent::block_hash)
      .def_ro("parent_hash", &ControlEvent::parent_hash)
      .def_ro("ns", &ControlEvent::ns)
      .def_ro("tokens", &ControlEvent::tokens)
      .def_ro("dropped_events", &ControlEvent::dropped_events)
      .def_ro("group", &ControlEvent::group,
              "The KV group whose cache recorded the event: 0 from a KvCache, the group's index "
              "in CacheConfig.groups from a ModelKvCache (or one of its ModelGroup views).")
      .def("__repr__", [](nb::handle e) -> nb::str {
        return nb::str(
                   "ControlEvent(kind={}, group={}, tier={}, sequence={}, block_hash={:#x}, "
                   "tokens={}, dropped_events={})")
            .format(e.attr("kind"), e.attr("group"), e.attr("tier"), e.attr("sequence"),
                    e.attr("block_hash"), nb::len(nb::object(e.attr("tokens"))),
                    e.attr("dropped_events"));
      });
}

}  // namespace pagedkv::python
