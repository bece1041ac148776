// pagedkv._C.KvCache: the step loop, tiers, queries, zero-copy pool views and K/V I/O.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"

namespace pagedkv::python {
namespace {

using Ids = std::vector<SequenceId>;

// __init__: the instance is constructed only once the cache exists, so a failed create()
// leaves no half-made object behind.
void init_cache(PyCache* self, const CacheConfig& config, bool enable_events, size_t event_capacity,
                nb::handle storage, int64_t storage_staging_blocks) {
  KvCacheOptions options;
  options.enable_events = enable_events;
  options.event_capacity = event_capacity;
  StoreClaim claim(self, {storage}, {"storage"});
  options.storage = claim.tiers()[0];
  options.storage_staging_blocks = storage_staging_blocks;
  auto kv = [&] {
    nb::gil_scoped_release release;
    return KvCache::create(config, std::move(options));
  }();
  if (!kv.ok()) throw StatusError(kv.status());
  new (self) PyCache();
  self->kv = std::move(*kv);
  claim.commit(&self->stores);
}

}  // namespace

nb::class_<PyCache> register_cache(nb::module_& m) {
  nb::class_<PyCache> cls(m, "_KvCache", "The C++ KvCache (use pagedkv.KvCache).");
  cls.def("__init__", &init_cache, nb::arg("config"), nb::arg("enable_events") = true,
          nb::arg("event_capacity") = 65536, nb::arg("storage").none() = nb::none(),
          nb::arg("storage_staging_blocks") = 64,
          "Creates the cache from a C++ CacheConfig (use pagedkv.KvCache(config, **fields)); "
          "`storage` a FileTier or RedisTier of the config's layout, which the cache holds.");
  cls.def_prop_ro("config", [](PyCache& s) { return s.kv->config(); });
  cls.def_prop_ro("backend_description", [](PyCache& s) { return s.kv->backend().description(); });
  cls.def_prop_ro("device_type", [](PyCache& s) { return backend_device_type(*s.kv); });
  cls.def_prop_ro("pool_info", [](PyCache& s) {
    nb::dict d;
    const PoolInfo& p = s.kv->pool_info();
    d["device_bytes"] = p.device_bytes;
    d["host_bytes"] = p.host_bytes;
    d["device_alloc_ms"] = p.device_alloc_ms;
    d["host_alloc_ms"] = p.host_alloc_ms;
    return d;
  });

  // ---- sequences ----
  cls.def(
      "add_sequence",
      [](PyCache& s, SequenceId id, const std::vector<TokenId>& prompt, int32_t priority,
         NamespaceId ns, int32_t retention_priority, int64_t retention_duration_ns) {
        SequenceOptions o;
        o.priority = priority;
        o.ns = ns;
        o.retention_priority = retention_priority;
        o.retention_duration_ns = retention_duration_ns;
        return value_or_throw(
            unlocked(s, [&](KvCache& kv) { return kv.add_sequence(id, prompt, o); }));
      },
      nb::arg("id"), nb::arg("prompt"), nb::arg("priority") = 0, nb::arg("ns") = 0,
      nb::arg("retention_priority") = kDefaultRetentionPriority,
      nb::arg("retention_duration_ns") = 0,
      "Adds a sequence; returns how many prompt tokens are already cached (full blocks of a known "
      "prefix). AlreadyExistsError, InvalidArgumentError.");
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
  cls.def(
      "commit",
      [](PyCache& s, SequenceId id, const std::vector<TokenId>& tokens) {
        check(unlocked(s, [&](KvCache& kv) { return kv.commit(id, tokens); }));
      },
      nb::arg("id"), nb::arg("tokens"),
      "Commits the token ids of the first len(tokens) reserved slots; full blocks enter the prefix "
      "index. FailedPreconditionError when nothing is reserved.");
  cls.def(
      "commit_batch",
      [](PyCache& s, const Ids& ids, const std::vector<TokenId>& tokens, int64_t n_each) {
        check(unlocked(s, [&](KvCache& kv) { return kv.commit_batch(ids, tokens, n_each); }));
      },
      nb::arg("ids"), nb::arg("tokens"), nb::arg("n_each") = 1,
      "Commits n_each tokens for each of ids: tokens holds them sequence after sequence. "
      "Everything is checked first.");
  cls.def(
      "rollback",
      [](PyCache& s, SequenceId id, int64_t length) {
        check(unlocked(s, [&](KvCache& kv) { return kv.rollback(id, length); }));
      },
      nb::arg("id"), nb::arg("length"),
      "Shortens a sequence to `length` committed tokens (speculative decoding).");
  cls.def(
      "fork",
      [](PyCache& s, SequenceId parent, SequenceId child) {
        check(unlocked(s, [&](KvCache& kv) { return kv.fork(parent, child); }));
      },
      nb::arg("parent"), nb::arg("child"),
      "Creates `child` sharing every block of `parent` (parallel sampling, beam search).");
  cls.def(
      "finish",
      [](PyCache& s, SequenceId id) {
        check(unlocked(s, [&](KvCache& kv) { return kv.finish(id); }));
      },
      nb::arg("id"), "Removes a sequence; its full blocks stay cached for later prompts.");
  cls.def(
      "erase",
      [](PyCache& s, SequenceId id) {
        check(unlocked(s, [&](KvCache& kv) { return kv.erase(id); }));
      },
      nb::arg("id"), "Removes a sequence and the blocks only it held.");
  cls.def(
      "set_active",
      [](PyCache& s, const Ids& ids) {
        check(unlocked(s, [&](KvCache& kv) { return kv.set_active(ids); }));
      },
      nb::arg("ids"), "Replaces the active set (never evicted or offloaded).");
  cls.def(
      "set_priority",
      [](PyCache& s, SequenceId id, int32_t priority) {
        check(unlocked(s, [&](KvCache& kv) { return kv.set_priority(id, priority); }));
      },
      nb::arg("id"), nb::arg("priority"),
      "Sets a sequence's scheduling priority (lower is offloaded or dropped first).");

  // ---- tiers ----
  cls.def(
      "offload",
      [](PyCache& s, SequenceId id) {
        check(unlocked(s, [&](KvCache& kv) { return kv.offload(id); }));
      },
      nb::arg("id"), "Queues the offload of an inactive sequence to the host tier (copy stream).");
  cls.def(
      "restore",
      [](PyCache& s, SequenceId id) {
        check(unlocked(s, [&](KvCache& kv) { return kv.restore(id); }));
      },
      nb::arg("id"),
      "Queues the restore of an offloaded sequence; later compute-stream work waits for it.");
  cls.def(
      "prefetch",
      [](PyCache& s, const Ids& ids) {
        check(unlocked(s, [&](KvCache& kv) { return kv.prefetch(ids); }));
      },
      nb::arg("ids"),
      "Queues the restore of those of ids that are offloaded while free device blocks suffice; "
      "never offloads others.");
  cls.def(
      "residency",
      [](PyCache& s, SequenceId id) {
        return value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.residency(id); }));
      },
      nb::arg("id"), "SequenceResidency.DEVICE, IN_FLIGHT or HOST. NotFoundError.");
  cls.def(
      "drain_evicted_sequences",
      [](PyCache& s) {
        return unlocked(s, [&](KvCache& kv) { return kv.drain_evicted_sequences(); });
      },
      "Sequences dropped (not offloaded) to make room since the last call.");
  cls.def(
      "synchronize",
      [](PyCache& s) { check(unlocked(s, [&](KvCache& kv) { return kv.synchronize(); })); },
      "Blocks until the cache's queued work (kernels and transfers) is done.");

  // ---- storage tier ----
  cls.def_prop_ro(
      "storage", [](PyCache& s) { return s.stores[0]; },
      "The storage tier (FileTier or RedisTier) the cache was created with, or None.");
  cls.def(
      "fetch_from_storage",
      [](PyCache& s, const std::vector<TokenId>& prompt, NamespaceId ns) {
        SequenceOptions o;
        o.ns = ns;
        return value_or_throw(
            unlocked(s, [&](KvCache& kv) { return kv.fetch_from_storage(prompt, o); }));
      },
      nb::arg("prompt"), nb::arg("ns") = 0,
      "Starts bringing the blocks the storage tier holds after the prompt's cached prefix into "
      "free host slots; returns how many blocks are on their way (0 without a storage tier). "
      "Never waits: they become prefix hits once landed (poll_storage, flush_storage). "
      "OutOfRangeError for a prompt past max_sequence_length.");
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
  cls.def(
      "poll_storage",
      [](PyCache& s) { check(unlocked(s, [&](KvCache& kv) { return kv.poll_storage(); })); },
      "Lands finished storage reads (now prefix hits) and hands staged write-backs to the "
      "store. Never waits; add_sequence, reserve and reserve_batch do it too.");
  cls.def(
      "storage_in_flight",
      [](PyCache& s) { return unlocked(s, [&](KvCache& kv) { return kv.storage_in_flight(); }); },
      "Blocks fetched from storage that have not landed yet.");
  cls.def(
      "flush_storage",
      [](PyCache& s) { check(unlocked(s, [&](KvCache& kv) { return kv.flush_storage(); })); },
      "Waits (without the GIL) until every staged write-back and storage read has finished and "
      "landed.");

  // ---- queries and observability ----
  cls.def(
      "contains",
      [](PyCache& s, SequenceId id) {
        return unlocked(s, [&](KvCache& kv) { return kv.contains(id); });
      },
      nb::arg("id"), "Whether the sequence exists (offloaded ones included).");
  cls.def(
      "length",
      [](PyCache& s, SequenceId id) {
        return value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.length(id); }));
      },
      nb::arg("id"), "Committed token count. NotFoundError.");
  cls.def(
      "pending",
      [](PyCache& s, SequenceId id) {
        return value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.pending(id); }));
      },
      nb::arg("id"), "Reserved, uncommitted token count. NotFoundError.");
  cls.def(
      "block_locations",
      [](PyCache& s, SequenceId id) {
        auto locs =
            value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.block_locations(id); }));
        std::vector<std::pair<Tier, int32_t>> out;
        for (const BlockLocation& l : locs) out.emplace_back(l.tier, l.block);
        return out;
      },
      nb::arg("id"),
      "(Tier, physical block id) of each block of the sequence, reserved ones included.");
  cls.def(
      "stats",
      [](PyCache& s) { return stats_dict(unlocked(s, [&](KvCache& kv) { return kv.stats(); })); },
      "Counters as a dict: 'device' and 'host' tier dicts plus the control-plane counts.");
  cls.def(
      "drain_events",
      [](PyCache& s) { return unlocked(s, [&](KvCache& kv) { return kv.drain_events(); }); },
      "Control events since the last drain, as ControlEvent objects (block events carry their "
      "tier).");
  cls.def(
      "check_invariants",
      [](PyCache& s) { check(unlocked(s, [&](KvCache& kv) { return kv.check_invariants(); })); },
      "Recounts every reference and state; InternalError names the first broken invariant.");

  // ---- data ----
  cls.def(
      "layer_kv",
      [](nb::handle self, int32_t layer) {
        return layer_views(self, *nb::cast<PyCache&>(self).kv, layer);
      },
      nb::arg("layer"),
      "(K, V): zero-copy DLPack views of one layer of the whole device pool, [num_blocks, "
      "block_size, heads, dim] (NHD) or [num_blocks, heads, block_size, dim] (HND), page stride = "
      "one block of all layers; (latents, None) for a latent (MLA) cache, heads = 1. They keep "
      "the cache alive; read them after synchronize() or on the compute stream. OutOfRangeError.");
  cls.def(
      "write_kv",
      [](PyCache& s, SequenceId id, int32_t layer, nb::handle key, nb::handle value) {
        const std::pair<KvInput, KvInput> in = kv_inputs(*s.kv, key, value, "");
        const KvInput &k = in.first, &v = in.second;
        check(unlocked(s, [&](KvCache& kv) -> Status {
          PAGEDKV_ASSIGN_OR_RETURN(int64_t pending, kv.pending(id));
          if (pending != k.rows) {
            return invalid_argument("key: " + std::to_string(k.rows) + " tokens, but sequence " +
                                    std::to_string(id) + " has " + std::to_string(pending) +
                                    " reserved");
          }
          PAGEDKV_RETURN_IF_ERROR(kv.write_kv(id, layer, k.data, v.data, k.dtype, k.row_stride));
          // Host inputs (numpy) may be freed when this returns: wait for the copy to read them.
          return k.host_memory ? kv.synchronize() : ok_status();
        }));
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      "Writes K/V of the tokens reserved by the last reserve() into one layer. key/value: any "
      "DLPack producer on the cache's device, [pending, heads, dim], float16/bfloat16/float32, any "
      "row stride; a latent (MLA) cache takes the latents as key and value=None. Host (numpy) "
      "inputs are read before the call returns.");
  cls.def(
      "gather_layer",
      [](nb::handle self, SequenceId id, int32_t layer, const std::string& layout,
         std::optional<DType> dtype, int64_t begin, int64_t num_tokens) {
        PyCache& s = nb::cast<PyCache&>(self);
        int64_t n = num_tokens;
        if (n < 0) {
          const int64_t length =
              value_or_throw(unlocked(s, [&](KvCache& kv) { return kv.length(id); }));
          n = length - begin;
          if (n < 0) throw StatusError(out_of_range("begin: past the committed tokens"));
        }
        GatherOutput out = gather_output(self, *s.kv, layout, dtype, n);
        check(unlocked(s, [&](KvCache& kv) -> Status {
          PAGEDKV_RETURN_IF_ERROR(
              kv.gather_layer(id, layer, out.key, out.value, out.dtype, out.layout, begin, n));
          return kv.synchronize();
        }));
        return gather_result(*s.kv, std::move(out));
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("layout") = "token_major",
      nb::arg("dtype") = nb::none(), nb::arg("begin") = 0, nb::arg("num_tokens") = -1,
      "Packs positions [begin, begin + num_tokens) of one layer of a sequence into new arrays "
      "(token_major [len, heads, dim] or head_major [heads, len, dim]); (latents, None) for a "
      "latent (MLA) cache. Waits for the copy.");
  return cls;
}

}  // namespace pagedkv::python
