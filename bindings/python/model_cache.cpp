// pagedkv._C.ModelKvCache: a model of several KV groups (full attention, sliding window, MLA
// latent), its per-group batches and a read-only view of each group's cache.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "forwarders.hpp"

namespace pagedkv::python {
namespace {

using Ids = std::vector<SequenceId>;

/// One group of a ModelKvCache, read-only: its pools, stats and block locations. Sequence calls
/// and events are the model's (one plan and one event stream for every group).
struct PyModelGroup {
  nb::object model;  // keeps the ModelKvCache alive
  PyModelCache* owner = nullptr;
  int32_t index = 0;

  GroupRef ref() const { return GroupRef(*owner->model, index); }
};

// "group 1 (window)", as the C++ messages name a group.
std::string group_label(const CacheConfig& c, int32_t g) {
  std::string s = "group " + std::to_string(g);
  if (!c.groups.empty() && !c.groups[size_t(g)].name.empty()) {
    s += " (" + c.groups[size_t(g)].name + ")";
  }
  return s;
}

// The prefix of a binding's message about model layer `layer`'s group; empty for a model of
// one group, as in ModelKvCache's own messages.
std::string where(const ModelKvCache& m, int32_t g) {
  return m.num_groups() == 1 ? std::string() : group_label(m.config(), g) + ": ";
}

LayerGroup layer_group(const ModelKvCache& m, int32_t layer) {
  return value_or_throw(m.layer_group(layer));  // immutable after create: no lock needed
}

void check_group(const ModelKvCache& m, int32_t g) {
  if (g < 0 || g >= m.num_groups()) {
    throw StatusError(out_of_range("group " + std::to_string(g) + " outside the model's " +
                                   std::to_string(m.num_groups()) + " groups"));
  }
}

// `storage`: None, or one FileTier, RedisTier or None per group.
void init_model(PyModelCache* self, const CacheConfig& config, bool enable_events,
                size_t event_capacity, nb::handle storage, int64_t storage_staging_blocks) {
  ModelKvCacheOptions options;
  options.cache.enable_events = enable_events;
  options.cache.event_capacity = event_capacity;
  options.cache.storage_staging_blocks = storage_staging_blocks;
  std::vector<nb::handle> stores;
  std::vector<std::string> what;
  if (!storage.is_none()) {
    if (!nb::isinstance<nb::sequence>(storage) || nb::isinstance<nb::str>(storage)) {
      throw_invalid("storage: a list of one store (FileTier, RedisTier or None) per group, got " +
                    nb::cast<std::string>(storage.type().attr("__name__")));
    }
    for (nb::handle h : storage) {
      what.push_back("storage[" + std::to_string(stores.size()) + "]");
      stores.push_back(h);
    }
  }
  StoreClaim claim(self, stores, what);
  options.storage = claim.tiers();
  construct_cache(self, &PyModelCache::model, claim,
                  [&] { return ModelKvCache::create(config, std::move(options)); });
}

// The ModelBatch of `obj`, checked to be one of this model's. kInvalidArgument otherwise.
PyModelBatch& model_batch(const PyModelCache& s, nb::handle obj) {
  if (!nb::isinstance<PyModelBatch>(obj)) {
    throw_invalid("batch: not a ModelBatch (build it with this ModelKvCache's build_batch)");
  }
  PyModelBatch& b = nb::cast<PyModelBatch&>(obj);
  if (b.owner != &s) throw_invalid("batch: built by another ModelKvCache");
  return b;
}

PyModelBatch* build_model_batch(nb::handle self, const Ids& ids, const BatchOptions& options) {
  PyModelCache& s = nb::cast<PyModelCache&>(self);
  std::vector<std::unique_ptr<PyBatch>> parts;
  uint64_t serial = 0;
  // Copies what the batches keep while the model is locked (another thread's build_batch would
  // change it). The serial moves on even when the call fails, as for a KvCache.
  check(unlocked(s, [&](ModelKvCache& m) -> Status {
    serial = ++s.batch_serial;
    PAGEDKV_ASSIGN_OR_RETURN(ModelBatch mb, m.build_batch(ids, options));
    for (const DeviceBatch& d : mb.groups) {
      auto p = std::make_unique<PyBatch>();
      p->device = d;
      p->built_host = d.host;
      p->host = *d.host;
      p->device.host = &p->host;
      parts.push_back(std::move(p));
    }
    return ok_status();
  }));
  auto out = std::make_unique<PyModelBatch>();
  out->cache = nb::borrow(self);
  out->owner = &s;
  out->serial = serial;
  out->ids = ids;
  const int dev = backend_device_type(s.model->cache());
  for (size_t g = 0; g < parts.size(); ++g) {
    PyBatch& p = *parts[g];
    p.cache = nb::borrow(self);
    p.owner = &s;
    p.serial_source = &s.batch_serial;
    p.serial = serial;
    p.device_type = dev;
    p.device_id = backend_device_id(s.model->cache());
    p.group = static_cast<int32_t>(g);
    p.ids = ids;
    out->device.groups.push_back(p.as_built());  // for write_kv_batch (ModelKvCache checks it)
    out->groups.push_back(nb::cast(parts[g].release(), nb::rv_policy::take_ownership));
  }
  return out.release();  // Python owns it (rv_policy::automatic takes a pointer's ownership)
}

void register_group(nb::module_& m) {
  nb::class_<PyModelGroup>(m, "ModelGroup",
                           "One KV group of a ModelKvCache, read-only: its pools (layer_kv), "
                           "config, stats and block locations. Sequence calls and events go "
                           "through the ModelKvCache, which plans every group at once.")
      .def_ro("index", &PyModelGroup::index, "The group's index in the model.")
      .def_prop_ro(
          "name",
          [](const PyModelGroup& g) {
            const CacheConfig& c = g.owner->model->config();
            return c.groups.empty() ? std::string() : c.groups[size_t(g.index)].name;
          },
          "The group's name ('' for a model without groups).")
      .def_prop_ro(
          "layers",
          [](const PyModelGroup& g) {
            const CacheConfig& c = g.owner->model->config();
            if (!c.groups.empty()) return c.groups[size_t(g.index)].layers;
            std::vector<int32_t> all(size_t(c.num_layers));
            for (size_t l = 0; l < all.size(); ++l) all[l] = static_cast<int32_t>(l);
            return all;
          },
          "The model layers the group holds; layer_kv(i) is the i-th of them.")
      .def_prop_ro(
          "config", [](const PyModelGroup& g) { return g.ref().config(); },
          "The group's one-group config (its layers numbered from 0).")
      .def_prop_ro(
          "pool_info",
          [](const PyModelGroup& g) { return pool_info_dict(g.owner->model->cache().pool_info()); },
          "Bytes of the model's pools (every group's, which one cache holds) and their "
          "allocation times.")
      .def(
          "layer_kv",
          [](nb::handle self, int32_t layer) {
            const PyModelGroup& g = nb::cast<const PyModelGroup&>(self);
            return layer_views(self, g.ref(), layer);
          },
          nb::arg("layer"),
          "(K, V) zero-copy views of the group's device pool for its layer `layer` (an index "
          "into .layers), as KvCache.layer_kv; (latents, None) for a latent group. They keep "
          "the model alive. OutOfRangeError.")
      .def(
          "stats",
          [](PyModelGroup& g) {
            return stats_dict(value_or_throw(
                unlocked(*g.owner, [&](ModelKvCache& m) { return m.group_stats(g.index); })));
          },
          "The group's counters (C++ KvCache::group_stats): its own pools' device and host "
          "counts, the pages it evicted and released from its window; every other counter is "
          "the model's.")
      .def(
          "block_locations",
          [](PyModelGroup& g, SequenceId id) {
            return location_pairs(value_or_throw(unlocked(
                *g.owner, [&](ModelKvCache& m) { return m.block_locations(id, g.index); })));
          },
          nb::arg("id"),
          "(Tier, physical block id) of each block of the sequence in this group; -1 for a block "
          "that fell out of a sliding window. NotFoundError.")
      .def("__repr__", [](const PyModelGroup& g) {
        const CacheConfig& c = g.ref().config();
        return "ModelGroup(" + group_label(g.owner->model->config(), g.index) +
               ", layers=" + std::to_string(c.num_layers) +
               ", kv_kind=" + (c.kv_kind == KvKind::kLatent ? "latent" : "key_value") +
               ", sliding_window=" + std::to_string(c.sliding_window) + ")";
      });
}

void register_model_batch(nb::module_& m) {
  nb::class_<PyModelBatch>(m, "ModelBatch",
                           "One ModelKvCache.build_batch: a Batch per group (batch[g] or "
                           ".groups), each with the group's block tables, CSR arrays and slot "
                           "mapping; device arrays valid until the model's next build_batch.")
      .def_prop_ro(
          "groups", [](const PyModelBatch& b) { return b.groups; }, "The Batch of each group.")
      .def("__len__", [](const PyModelBatch& b) { return b.groups.size(); })
      .def(
          "__getitem__",
          [](const PyModelBatch& b, int64_t g) {
            if (g < 0 || g >= int64_t(b.groups.size())) {
              throw StatusError(out_of_range("group " + std::to_string(g) +
                                             " outside the batch's " +
                                             std::to_string(b.groups.size()) + " groups"));
            }
            return b.groups[size_t(g)];
          },
          nb::arg("group"), "The Batch of group `group`. OutOfRangeError.")
      .def_prop_ro("num_groups", [](const PyModelBatch& b) { return b.groups.size(); })
      .def_prop_ro("ids", [](const PyModelBatch& b) { return b.ids; })
      .def_prop_ro("is_current", &PyModelBatch::current)
      .def("__repr__", [](const PyModelBatch& b) {
        return "ModelBatch(groups=" + std::to_string(b.groups.size()) +
               ", batch_size=" + std::to_string(b.ids.size()) +
               ", current=" + (b.current() ? "True" : "False") + ")";
      });
}

}  // namespace

void register_model_cache(nb::module_& m) {
  register_group(m);
  register_model_batch(m);
  nb::class_<PyModelCache> cls(m, "_ModelKvCache",
                               "The C++ ModelKvCache (use pagedkv.ModelKvCache).");
  cls.def("__init__", &init_model, nb::arg("config"), nb::arg("enable_events") = true,
          nb::arg("event_capacity") = 65536, nb::arg("storage").none() = nb::none(),
          nb::arg("storage_staging_blocks") = 64,
          "Creates the one KvCache whose KV groups share the logical blocks, from a C++ "
          "CacheConfig (use pagedkv.ModelKvCache); `storage` None or one store (or None) per "
          "group, each of its group's layout and its own model id; the model holds them.");
  cls.def_prop_ro("config", [](PyModelCache& s) { return s.model->config(); });
  cls.def_prop_ro("num_groups", [](PyModelCache& s) { return s.model->num_groups(); });
  cls.def_prop_ro("backend_description",
                  [](PyModelCache& s) { return s.model->cache().backend().description(); });
  cls.def_prop_ro("device_type",
                  [](PyModelCache& s) { return backend_device_type(s.model->cache()); });
  cls.def(
      "layer_group",
      [](PyModelCache& s, int32_t layer) {
        const LayerGroup lg = layer_group(*s.model, layer);
        return std::make_pair(lg.group, lg.layer);
      },
      nb::arg("layer"), "(group, layer index inside the group) of a model layer. OutOfRangeError.");
  cls.def(
      "group",
      [](nb::handle self, int32_t g) {
        PyModelCache& s = nb::cast<PyModelCache&>(self);
        check_group(*s.model, g);
        return PyModelGroup{nb::borrow(self), &s, g};
      },
      nb::arg("group"),
      "A read-only view of group `group` (its pools, config, stats); it keeps the model "
      "alive. OutOfRangeError.");
  cls.def(
      "stats",
      [](PyModelCache& s) {
        return stats_dict(unlocked(s, [](ModelKvCache& m) { return m.stats(); }));
      },
      "The model's counters, as KvCache.stats(): device and host counts of the blocks (the "
      "owner group's), and what every group does once (sequences, prefix lookups, moves); "
      "group(g).stats() has each group's pages.");

  // ---- sequences ----
  def_add_sequence(cls);
  cls.def(
      "reserve",
      [](PyModelCache& s, SequenceId id, int64_t n) {
        auto slots =
            value_or_throw(unlocked(s, [&](ModelKvCache& mc) { return mc.reserve(id, n); }));
        nb::list out;
        for (std::vector<int64_t>& g : slots) out.append(to_numpy(std::move(g)));
        return out;
      },
      nb::arg("id"), nb::arg("n"),
      "Reserves the next n tokens in every group; returns each group's slots (int64 numpy, block "
      "* block_size + offset in that group's pool). ResourceExhaustedError drops the reservation "
      "in every group.");
  cls.def(
      "reserve_batch",
      [](PyModelCache& s, const Ids& ids, int64_t n_each) {
        check(unlocked(s, [&](ModelKvCache& mc) { return mc.reserve_batch(ids, n_each); }));
      },
      nb::arg("ids"), nb::arg("n_each") = 1,
      "Reserves n_each tokens for each of ids (distinct) in every group; the slots are in the "
      "next build_batch's slot_mapping of each group.");
  def_lifecycle_calls(cls);

  // ---- tiers ----
  def_tier_calls(cls);

  // ---- reading ----
  cls.def(
      "build_batch",
      [](nb::handle self, const Ids& ids, bool csr, int64_t pad_slots_to, bool ring_window_tables) {
        return build_model_batch(self, ids, batch_options(csr, pad_slots_to, ring_window_tables));
      },
      nb::arg("ids"), nb::arg("csr") = false, nb::arg("pad_slots_to") = 0,
      nb::arg("ring_window_tables") = false,
      "Builds a step's batch metadata in every group; returns a ModelBatch (batch[g] is group "
      "g's Batch; its device arrays are valid until the next build_batch). "
      "ring_window_tables=True: window groups beside the full one get ring tables (Batch."
      "ring_table: a row's block i at column i % max_blocks while in the window).");
  cls.def(
      "write_kv",
      [](PyModelCache& s, SequenceId id, int32_t layer, nb::handle key, nb::handle value) {
        const LayerGroup lg = layer_group(*s.model, layer);
        const std::pair<KvInput, KvInput> in =
            kv_inputs(GroupRef(*s.model, lg.group), key, value, where(*s.model, lg.group));
        write_reserved_kv(s, id, layer, in.first, in.second);
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      "Writes model layer `layer` of the reserved tokens into its group: key/value [pending, "
      "heads, dim] of that group's shape; a latent group takes the latents as key and "
      "value=None. Host (numpy) inputs are read before the call returns.");
  cls.def(
      "write_kv_batch",
      [](PyModelCache& s, nb::handle batch, int32_t layer, nb::handle key, nb::handle value) {
        PyModelBatch& b = model_batch(s, batch);
        const LayerGroup lg = layer_group(*s.model, layer);
        const PyBatch& part = nb::cast<const PyBatch&>(b.groups[size_t(lg.group)]);
        const std::pair<KvInput, KvInput> in =
            kv_batch_inputs(GroupRef(*s.model, lg.group), key, value, part.host.slot_mapping.size(),
                            where(*s.model, lg.group));
        const KvInput &k = in.first, &v = in.second;
        write_and_wait(s, k, [&](ModelKvCache& mc) {
          return mc.write_kv_batch(b.device, layer, k.data, v.data, k.dtype, k.row_stride);
        });
      },
      nb::arg("batch"), nb::arg("layer"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      "Writes model layer `layer` of every token of the current ModelBatch through its group's "
      "slot mapping; key/value [len(batch[group].host.slot_mapping), heads, dim] (value=None for "
      "a latent group).");
  cls.def(
      "write_kv_batch_all_layers",
      [](PyModelCache& s, nb::handle batch, int32_t group, nb::handle key, nb::handle value) {
        PyModelBatch& b = model_batch(s, batch);
        if (group < 0 || group >= s.model->num_groups()) {
          throw StatusError(out_of_range("group " + std::to_string(group) +
                                         " outside the model's " +
                                         std::to_string(s.model->num_groups()) + " groups"));
        }
        const PyBatch& part = nb::cast<const PyBatch&>(b.groups[size_t(group)]);
        const std::pair<KvInput, KvInput> in =
            kv_all_layers_inputs(GroupRef(*s.model, group), key, value,
                                 part.host.slot_mapping.size(), where(*s.model, group));
        const KvInput &k = in.first, &v = in.second;
        write_and_wait(s, k, [&](ModelKvCache& mc) {
          return mc.write_kv_batch_all_layers(b.device, group, k.data, v.data, k.dtype,
                                              k.row_stride, k.layer_stride);
        });
      },
      nb::arg("batch"), nb::arg("group"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      "Writes every layer of group `group` of the current ModelBatch in one launch: key/value "
      "[len(group.layers), len(batch[group].host.slot_mapping), heads, dim], the layers in the "
      "order the group lists them (value=None for a latent group).");
  cls.def(
      "gather_layer",
      [](nb::handle self, SequenceId id, int32_t layer, const std::string& layout,
         std::optional<DType> dtype, int64_t begin, int64_t num_tokens) {
        PyModelCache& s = nb::cast<PyModelCache&>(self);
        const GroupRef kv(*s.model, layer_group(*s.model, layer).group);
        return gather_to_arrays<PyModelCache>(self, kv, id, layer, layout, dtype, begin,
                                              num_tokens);
      },
      nb::arg("id"), nb::arg("layer"), nb::arg("layout") = "token_major",
      nb::arg("dtype") = nb::none(), nb::arg("begin") = 0, nb::arg("num_tokens") = -1,
      "Packs positions [begin, begin + num_tokens) of model layer `layer` of a sequence into new "
      "arrays, as KvCache.gather_layer; (latents, None) for a latent group. OutOfRangeError for "
      "positions a window group no longer holds.");
  cls.def(
      "layer_kv",
      [](nb::handle self, int32_t layer) {
        PyModelCache& s = nb::cast<PyModelCache&>(self);
        const LayerGroup lg = layer_group(*s.model, layer);
        return layer_views(self, GroupRef(*s.model, lg.group), lg.layer);
      },
      nb::arg("layer"),
      "(K, V) zero-copy views of model layer `layer` in its group's device pool, as "
      "KvCache.layer_kv; (latents, None) for a latent group. OutOfRangeError.");
  def_synchronize(cls);

  // ---- storage tiers ----
  cls.def_prop_ro(
      "storage",
      [](PyModelCache& s) {
        nb::list out;
        for (size_t g = 0; g < size_t(s.model->num_groups()); ++g) {
          out.append(g < s.stores.size() ? s.stores[g] : nb::none());
        }
        return out;
      },
      "Each group's storage tier (FileTier or RedisTier) or None, in group order.");
  def_fetch_from_storage(cls);
  def_storage_progress(cls);

  // ---- queries ----
  def_sequence_queries(cls);
  cls.def(
      "held_blocks",
      [](PyModelCache& s, SequenceId id, int32_t g) {
        return value_or_throw(unlocked(s, [&](ModelKvCache& mc) { return mc.held_blocks(id, g); }));
      },
      nb::arg("id"), nb::arg("group"),
      "Blocks the sequence holds in group `group` (not those that fell out of its window). "
      "NotFoundError, OutOfRangeError.");
  cls.def(
      "held_bytes",
      [](PyModelCache& s, SequenceId id) {
        return value_or_throw(unlocked(s, [&](ModelKvCache& mc) { return mc.held_bytes(id); }));
      },
      nb::arg("id"),
      "Bytes of the blocks the sequence holds over all groups, on either tier. NotFoundError.");
  def_check_invariants(cls);

  // ---- events ----
  def_drain_events(cls);
}

}  // namespace pagedkv::python
