// pagedkv._C.KvCache: the step loop, tiers, queries, zero-copy pool views and K/V I/O.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <optional>
#include <tuple>

#include "common.hpp"
#include "forwarders.hpp"

namespace pagedkv::python {
namespace {

using Ids = std::vector<SequenceId>;

// A stream argument: None, a handle (int), or an object with a `cuda_stream` handle (torch's
// Stream and ExternalStream, CuPy's). Null for None and for 0 (CUDA's legacy default stream,
// with which the cache's own default stream is ordered anyway).
void* stream_handle(nb::handle stream) {
  if (stream.is_none()) return nullptr;
  nb::handle h = nb::hasattr(stream, "cuda_stream") ? stream.attr("cuda_stream") : stream;
  uintptr_t value = 0;
  if (!nb::try_cast(h, value)) {
    throw_invalid(
        "stream: an int handle or an object with a `cuda_stream` handle, e.g. "
        "torch.cuda.current_stream()");
  }
  return reinterpret_cast<void*>(value);
}

// __init__ (construct_cache: the instance is constructed only once the cache exists).
void init_cache(PyCache* self, const CacheConfig& config, bool enable_events, size_t event_capacity,
                nb::handle storage, int64_t storage_staging_blocks, int32_t device,
                nb::handle stream, std::optional<std::tuple<int32_t, int64_t, int64_t>> step_shape,
                int32_t tp_size, bool record_step_plans) {
  KvCacheOptions options;
  options.tp_size = tp_size;
  options.record_step_plans = record_step_plans;
  if (step_shape.has_value()) {
    const auto [max_batch, max_blocks, max_tokens] = *step_shape;
    if (max_blocks > INT32_MAX) throw_invalid("step_shape: max_blocks_per_sequence is too large");
    options.step_shape = StepShape{max_batch, static_cast<int32_t>(max_blocks), max_tokens};
  }
  options.enable_events = enable_events;
  options.event_capacity = event_capacity;
  options.device = device;
  if (nb::isinstance<nb::list>(stream) || nb::isinstance<nb::tuple>(stream)) {
    for (nb::handle s : stream) options.rank_native_compute_streams.push_back(stream_handle(s));
  } else {
    options.native_compute_stream = stream_handle(stream);
  }
  StoreClaim claim(self, {storage}, {"storage"});
  options.storage = claim.tiers()[0];
  options.storage_staging_blocks = storage_staging_blocks;
  construct_cache(self, &PyCache::kv, claim,
                  [&] { return KvCache::create(config, std::move(options)); });
}

}  // namespace

nb::class_<PyCache> register_cache(nb::module_& m) {
  nb::class_<PyCache> cls(m, "_KvCache", "The C++ KvCache (use pagedkv.KvCache).");
  cls.def("__init__", &init_cache, nb::arg("config"), nb::arg("enable_events") = true,
          nb::arg("event_capacity") = 65536, nb::arg("storage").none() = nb::none(),
          nb::arg("storage_staging_blocks") = 64, nb::arg("device") = -1,
          nb::arg("stream").none() = nb::none(), nb::arg("step_shape").none() = nb::none(),
          nb::arg("tp_size") = 1, nb::arg("record_step_plans") = false,
          "Creates the cache from a C++ CacheConfig (use pagedkv.KvCache(config, **fields)); "
          "`storage` a FileTier or RedisTier of the config's layout, which the cache holds; "
          "`device` the CUDA device (-1: the current one); `stream` the caller's stream (an int "
          "handle or an object with `cuda_stream`), on which the cache then queues its work (with "
          "tp_size > 1 a list of one per rank: KvCacheOptions::rank_native_compute_streams); "
          "`step_shape` (max_batch, max_blocks_per_sequence, max_tokens) the largest step, for "
          "which the upload arena is sized now (KvCacheOptions::step_shape); `tp_size` the "
          "tensor-parallel ranks (KvCacheOptions::tp_size): one control plane over that many "
          "pools, each of its share of the heads, one backend each (GPU r, or the CPU's); "
          "`record_step_plans` records the moves, copies and batches of its calls for "
          "take_step_plan (KvCacheOptions::record_step_plans).");
  cls.def(
      "take_step_plan",
      [](PyCache& s) {
        const std::string bytes =
            unlocked(s, [&](KvCache& kv) { return kv.take_step_plan().encode(); });
        return nb::bytes(bytes.data(), bytes.size());
      },
      "The moves, copies and batches the calls since the last take recorded, as the bytes a "
      "worker's apply_step_plan takes (pagedkv/step_plan.hpp); a plan of no steps without "
      "record_step_plans.");
  cls.def_prop_ro(
      "tp_size", [](PyCache& s) { return s.kv->tp_size(); },
      "Tensor-parallel ranks: the `rank` of write_kv, gather_layer, layer_kv and the batch "
      "writes is in [0, tp_size).");
  cls.def_prop_ro(
      "rank_heads", [](PyCache& s) { return s.kv->shard_config(s.kv->full_group()).num_kv_heads; },
      "KV heads one rank holds (num_kv_heads / tp_size; a latent cache's 1): rank r holds heads "
      "[r * rank_heads, (r + 1) * rank_heads).");
  cls.def_prop_ro("config", [](PyCache& s) { return s.kv->config(); });
  cls.def_prop_ro("backend_description", [](PyCache& s) { return s.kv->backend().description(); });
  cls.def_prop_ro("device_type", [](PyCache& s) { return backend_device_type(*s.kv); });
  cls.def_prop_ro(
      "device", [](PyCache& s) { return backend_device_id(*s.kv); },
      "The device ordinal of the pools (DLPack's device_id of every export).");
  cls.def_prop_ro(
      "compute_stream",
      [](PyCache& s) {
        void* h = value_or_throw(s.kv->backend().native_stream(s.kv->compute_stream()));
        return reinterpret_cast<uintptr_t>(h);
      },
      "The native handle of the stream the cache queues its work on (the `stream` it was given, "
      "else its own; 0 for the CPU backend's own): torch.cuda.ExternalStream(cache.compute_stream) "
      "lets torch wait_stream on it.");
  cls.def(
      "rank_compute_stream",
      [](PyCache& s, int32_t rank) {
        const GroupRef on = rank_ref(*s.kv, rank);
        void* h = value_or_throw(on.backend().native_stream(s.kv->compute_stream(rank)));
        return reinterpret_cast<uintptr_t>(h);
      },
      nb::arg("rank"),
      "compute_stream of rank `rank` (the stream of `stream`'s list given for it, else the "
      "rank's own). OutOfRangeError for a rank outside the cache.");
  cls.def_prop_ro("pool_info", [](PyCache& s) { return pool_info_dict(s.kv->pool_info()); });

  // ---- sequences ----
  def_add_sequence(cls);
  cls.def(
      "reserve",
      [](PyCache& s, SequenceId id, int64_t n) {
        return to_numpy(
            value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.reserve(id, n); })));
      },
      nb::arg("id"), nb::arg("n"),
      "Reserves device slots for the next n tokens (allocates, copy-on-write, restores); returns "
      "the slots (block * block_size + offset) as int64 numpy. NotFoundError, OutOfRangeError, "
      "ResourceExhaustedError.");
  cls.def(
      "reserve_batch",
      [](PyCache& s, const Ids& ids, int64_t n_each) {
        return to_numpy(value_or_throw(
            unlocked(s, [&](KvCache& kv) { return kv.reserve_batch(ids, n_each); })));
      },
      nb::arg("ids"), nb::arg("n_each") = 1,
      "Reserves n_each slots for each of ids (distinct) in one call; returns every slot, grouped "
      "by sequence in ids order. Nothing changes on error.");
  def_lifecycle_calls(cls);

  // ---- tiers ----
  def_tier_calls(cls);
  def_synchronize(cls);

  // ---- storage tier ----
  cls.def_prop_ro(
      "storage", [](PyCache& s) { return s.stores[0]; },
      "The storage tier (FileTier or RedisTier) the cache was created with, or None.");
  def_fetch_from_storage(cls);
  cls.def(
      "fetch_prefix_from_storage",
      [](PyCache& s, const std::vector<TokenId>& prompt, int64_t max_cached, NamespaceId ns) {
        SequenceOptions o;
        o.ns = ns;
        const StorageFetch f = value_or_throw(unlocked(
            s, [&](KvCache& kv) { return kv.fetch_prefix_from_storage(prompt, o, max_cached); }));
        return std::make_pair(f.blocks, f.reach);
      },
      nb::arg("prompt"), nb::arg("max_cached") = -1, nb::arg("ns") = 0,
      "fetch_from_storage for a hit of at most max_cached tokens (-1: no bound); returns "
      "(blocks on their way, tokens a hit reaches once they land). InvalidArgumentError for "
      "max_cached < -1.");
  def_storage_progress(cls);

  // ---- queries and observability ----
  def_sequence_queries(cls);
  cls.def(
      "block_locations",
      [](PyCache& s, SequenceId id) {
        return location_pairs(
            value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.block_locations(id); })));
      },
      nb::arg("id"),
      "(Tier, physical block id) of each block of the sequence, reserved ones included.");
  cls.def(
      "stats",
      [](PyCache& s) { return stats_dict(unlocked(s, [&](KvCache& kv) { return kv.stats(); })); },
      "Counters as a dict: 'device' and 'host' tier dicts plus the control-plane counts.");
  def_drain_events(cls);
  def_check_invariants(cls);

  // ---- data ----
  cls.def(
      "layer_kv",
      [](nb::handle self, int32_t layer, int32_t rank) {
        return layer_views(self, rank_ref(*nb::cast<PyCache&>(self).kv, rank), layer);
      },
      nb::arg("layer"), nb::arg("rank") = 0,
      "(K, V): zero-copy DLPack views of one layer of the whole device pool, [num_blocks, "
      "block_size, heads, dim] (NHD) or [num_blocks, heads, block_size, dim] (HND), page stride = "
      "one block of all layers; (latents, None) for a latent (MLA) cache, heads = 1. They keep "
      "the cache alive; read them after synchronize() or on the compute stream. With tensor "
      "parallelism, rank `rank`'s pool, of its heads. OutOfRangeError.");
  cls.def(
      "write_kv",
      [](PyCache& s, SequenceId id, int32_t layer, nb::handle key, nb::handle value, int32_t rank) {
        const std::pair<KvInput, KvInput> in = kv_inputs(rank_ref(*s.kv, rank), key, value, "");
        write_reserved_kv(s, id, layer, in.first, in.second, rank);
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      nb::arg("rank") = 0,
      "Writes K/V of the tokens reserved by the last reserve() into one layer. key/value: any "
      "DLPack producer on the cache's device, [pending, heads, dim], float16/bfloat16/float32, any "
      "row stride; a latent (MLA) cache takes the latents as key and value=None. Host (numpy) "
      "inputs are read before the call returns. With tensor parallelism, rank `rank`'s heads "
      "[pending, rank_heads, dim] into its pool.");
  cls.def(
      "gather_layer",
      [](nb::handle self, SequenceId id, int32_t layer, const std::string& layout,
         std::optional<DType> dtype, int64_t begin, int64_t num_tokens, int32_t rank) {
        return gather_to_arrays<PyCache>(self, rank_ref(*nb::cast<PyCache&>(self).kv, rank), id,
                                         layer, layout, dtype, begin, num_tokens, rank);
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("layout") = "token_major",
      nb::arg("dtype") = nb::none(), nb::arg("begin") = 0, nb::arg("num_tokens") = -1,
      nb::arg("rank") = 0,
      "Packs positions [begin, begin + num_tokens) of one layer of a sequence into new arrays "
      "(token_major [len, heads, dim] or head_major [heads, len, dim]); (latents, None) for a "
      "latent (MLA) cache. Waits for the copy. With tensor parallelism, rank `rank`'s heads.");
  return cls;
}

}  // namespace pagedkv::python
