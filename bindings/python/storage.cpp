// pagedkv._C storage tiers: StorageLayout, and FileTier and RedisTier, Python objects that own
// a C++ StorageTier. A cache given a store holds its Python object (PyCache::stores), so the
// store outlives every cache that uses it; a store serves one cache at a time (StoreClaim).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdio>

#include "common.hpp"

namespace pagedkv::python {
namespace {

struct PyFileTier : PyStore {
  FileTierOptions options;
};
struct PyRedisTier : PyStore {
  RedisTierOptions options;
};

std::string python_type(nb::handle obj) {
  return nb::cast<std::string>(obj.type().attr("__name__"));
}

// The one-group config a store of `config` (group `group`, if given) holds blocks of.
CacheConfig store_config(const CacheConfig& config, std::optional<int32_t> group) {
  check(config.validate());
  if (!group.has_value()) {
    if (config.num_groups() > 1) {
      throw_invalid("group: the config has " + std::to_string(config.num_groups()) +
                    " KV groups and a store holds one group's blocks: give its group");
    }
    return config.group_config(0);
  }
  if (*group < 0 || *group >= config.num_groups()) {
    throw StatusError(out_of_range("group: " + std::to_string(*group) + " outside the config's " +
                                   std::to_string(config.num_groups()) + " groups"));
  }
  return config.group_config(*group);
}

// The layout of `obj`: a StorageLayout (its model_id replaced when one is given), or that of a
// CacheConfig (the C++ one or the package's dataclass) and a model id.
StorageLayout layout_of(nb::handle obj, const std::optional<std::string>& model_id,
                        std::optional<int32_t> group) {
  if (nb::isinstance<StorageLayout>(obj)) {
    if (group.has_value()) throw_invalid("group: only with a CacheConfig, not a StorageLayout");
    StorageLayout l = nb::cast<StorageLayout>(obj);
    if (model_id.has_value()) l.model_id = *model_id;
    return l;
  }
  nb::object config = nb::borrow(obj);
  if (!nb::isinstance<CacheConfig>(config) && nb::hasattr(config, "_to_cpp")) {
    config = config.attr("_to_cpp")();  // pagedkv.CacheConfig
  }
  if (!nb::isinstance<CacheConfig>(config)) {
    throw_invalid("layout_or_config: expected a StorageLayout or CacheConfig, got " +
                  python_type(obj));
  }
  if (!model_id.has_value()) {
    throw_invalid(
        "model_id: required with a CacheConfig (it names the model whose blocks the store "
        "holds; stores of other model ids never share a block)");
  }
  return StorageLayout::from_config(store_config(nb::cast<const CacheConfig&>(config), group),
                                    *model_id);
}

// Makes the store of `layout` with `make` (without the GIL: a file store's restart lists its
// directory) and moves it into the instance under construction.
template <typename T, typename Make>
void construct(T* self, const StorageLayout& layout, decltype(T::options) o, Make make) {
  auto tier = [&] {
    nb::gil_scoped_release release;
    return make(layout, o);
  }();
  if (!tier.ok()) throw StatusError(tier.status());
  new (self) T();
  self->tier = std::move(tier).value();
  self->options = std::move(o);
}

void init_file_tier(PyFileTier* self, nb::handle layout_or_config, const std::string& directory,
                    const std::optional<std::string>& model_id, std::optional<int32_t> group,
                    int64_t max_bytes, bool fsync, int64_t max_queued_blocks, int32_t threads,
                    bool direct_io, int32_t direct_read_depth) {
  const StorageLayout layout = layout_of(layout_or_config, model_id, group);
  FileTierOptions o;
  o.directory = directory;
  o.max_bytes = max_bytes;
  o.fsync = fsync;
  o.direct_io = direct_io;
  o.direct_read_depth = direct_read_depth;
  o.max_queued_blocks = max_queued_blocks;
  o.threads = threads;
  construct(self, layout, std::move(o), &make_file_tier);
}

void init_redis_tier(PyRedisTier* self, nb::handle layout_or_config,
                     const std::optional<std::string>& model_id, std::optional<int32_t> group,
                     const std::string& host, int32_t port, int32_t timeout_ms,
                     const std::string& key_prefix, int64_t max_queued_blocks, int32_t threads) {
  const StorageLayout layout = layout_of(layout_or_config, model_id, group);
  RedisTierOptions o;
  o.host = host;
  o.port = port;
  o.timeout_ms = timeout_ms;
  o.key_prefix = key_prefix;
  o.max_queued_blocks = max_queued_blocks;
  o.threads = threads;
  construct(self, layout, std::move(o), &make_redis_tier);
}

nb::dict storage_stats_dict(const StorageStats& s) {
  nb::dict d;
  d["puts"] = s.puts;
  d["gets"] = s.gets;
  d["bytes_written"] = s.bytes_written;
  d["bytes_read"] = s.bytes_read;
  d["failed_puts"] = s.failed_puts;
  d["failed_gets"] = s.failed_gets;
  d["gets_direct"] = s.gets_direct;
  d["gets_in_place"] = s.gets_in_place;
  d["rejected_puts"] = s.rejected_puts;
  d["removed"] = s.removed;
  return d;
}

std::string layout_repr(const StorageLayout& l) {
  char fp[19];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(l.fingerprint()));
  return "StorageLayout(model_id='" + l.model_id + "', num_layers=" + std::to_string(l.num_layers) +
         ", num_kv_heads=" + std::to_string(l.num_kv_heads) +
         ", head_dim=" + std::to_string(l.head_dim) +
         ", block_size=" + std::to_string(l.block_size) +
         ", block_bytes=" + std::to_string(l.block_bytes) + ", fingerprint=" + fp + ")";
}

}  // namespace

void release_stores(HeldStores& stores) {
  for (nb::object& o : stores) {
    if (!o.is_none()) nb::inst_ptr<PyStore>(o)->user = nullptr;
  }
  stores.clear();
}

StoreClaim::StoreClaim(const void* cache, const std::vector<nb::handle>& objs,
                       const std::vector<std::string>& what) {
  try {
    for (size_t i = 0; i < objs.size(); ++i) {
      objects_.push_back(nb::borrow(objs[i]));
      if (objs[i].is_none()) {
        tiers_.push_back(nullptr);
        continue;
      }
      if (!nb::isinstance<PyStore>(objs[i]) || !nb::inst_ready(objs[i])) {
        throw_invalid(what[i] + ": expected a pagedkv.FileTier or RedisTier (or None), got " +
                      (nb::isinstance<PyStore>(objs[i]) ? "one whose __init__ did not run"
                                                        : python_type(objs[i])));
      }
      PyStore* s = nb::inst_ptr<PyStore>(objs[i]);
      // The same store twice for one cache is the C++ create()'s to refuse (it names both).
      if (s->user != nullptr && s->user != cache) {
        throw_invalid(what[i] + ": this " + python_type(objs[i]) +
                      " already serves another cache (a store serves one cache; give each "
                      "cache its own store, or drop the other cache first)");
      }
      if (s->user == nullptr) {
        s->user = cache;
        claimed_.push_back(s);
      }
      tiers_.push_back(s->tier.get());
    }
  } catch (...) {
    for (PyStore* s : claimed_) s->user = nullptr;
    throw;
  }
}

StoreClaim::~StoreClaim() {
  if (!committed_) {
    for (PyStore* s : claimed_) s->user = nullptr;
  }
}

void StoreClaim::commit(HeldStores* held) {
  committed_ = true;
  *held = std::move(objects_);
}

void register_storage(nb::module_& m) {
  nb::class_<StorageLayout>(m, "StorageLayout",
                            "What a stored block's bytes mean (shape, dtype, page layout, kind, "
                            "model id); any difference makes a different store namespace.")
      .def(nb::init<>())
      .def_rw("num_layers", &StorageLayout::num_layers)
      .def_rw("num_kv_heads", &StorageLayout::num_kv_heads)
      .def_rw("head_dim", &StorageLayout::head_dim)
      .def_rw("block_size", &StorageLayout::block_size)
      .def_rw("dtype", &StorageLayout::dtype)
      .def_rw("page_layout", &StorageLayout::page_layout)
      .def_rw("kv_kind", &StorageLayout::kv_kind)
      .def_rw("rope_dim", &StorageLayout::rope_dim)
      .def_rw("model_id", &StorageLayout::model_id)
      .def_rw("block_bytes", &StorageLayout::block_bytes)
      .def_rw("engine_digest", &StorageLayout::engine_digest,
              "Set by opaque(): the name of another engine's block layout.")
      .def_static(
          "opaque",
          [](int64_t block_bytes, const std::string& engine_digest) {
            if (engine_digest.empty()) throw_invalid("engine_digest: must not be empty");
            return StorageLayout::opaque(block_bytes, engine_digest);
          },
          nb::arg("block_bytes"), nb::arg("engine_digest"),
          "Blocks of block_bytes bytes that pagedkv stores and checksums but does not "
          "interpret (another engine's chunks), named by engine_digest: everything that changes "
          "their bytes. For stores driven through the raw calls; no cache takes such a store.")
      .def_static(
          "from_config",
          [](nb::handle config, const std::string& model_id, std::optional<int32_t> group) {
            return layout_of(config, model_id, group);
          },
          nb::arg("config"), nb::arg("model_id"), nb::arg("group") = nb::none(),
          "The layout of a CacheConfig (or of its group `group`, required for a config of "
          "several KV groups). InvalidArgumentError, OutOfRangeError for a bad group.")
      .def("fingerprint", &StorageLayout::fingerprint,
           "A stable 64-bit digest of every field (docs/storage.md).")
      .def(
          "__eq__",
          [](const StorageLayout& a, const StorageLayout& b) {
            return a.fingerprint() == b.fingerprint() && a.block_bytes == b.block_bytes;
          },
          nb::is_operator())
      .def("__hash__",
           [](const StorageLayout& l) {
             return static_cast<size_t>(l.fingerprint() ^ static_cast<uint64_t>(l.block_bytes));
           })
      .def("__repr__", &layout_repr);

  nb::class_<PyStore> store(m, "StorageTier",
                            "A store of whole KV blocks behind a cache's host tier (FileTier, "
                            "RedisTier), or driven directly through its raw calls. It serves one "
                            "cache at a time; the cache keeps it alive.");
  store
      .def_prop_ro(
          "medium", [](const PyStore& s) { return std::string(s.tier->medium()); },
          "'DISK' or 'REDIS'.")
      .def_prop_ro(
          "layout", [](const PyStore& s) { return s.tier->layout(); },
          "The StorageLayout every block of the store has (a copy).")
      .def_prop_ro(
          "in_use", [](const PyStore& s) { return s.user != nullptr; },
          "Whether a live cache uses the store.")
      .def(
          "stats",
          // The counters are atomics: no need for the lock of the cache using the store.
          [](const PyStore& s) { return storage_stats_dict(s.tier->stats()); },
          "Counters since the store was created, as a dict: puts, gets, bytes_written, "
          "bytes_read, failed_puts, failed_gets, rejected_puts, removed, gets_direct, "
          "gets_in_place (blocks "
          "unless "
          "bytes).");
  def_raw_store_calls(store);

  nb::class_<PyFileTier, PyStore>(
      m, "FileTier",
      "The file store: one directory of segment files, which outlives the process (a restart on "
      "the same directory and layout finds its blocks). docs/storage.md.")
      .def("__init__", &init_file_tier, nb::arg("layout_or_config"), nb::arg("directory"),
           nb::kw_only(), nb::arg("model_id").none() = nb::none(),
           nb::arg("group").none() = nb::none(), nb::arg("max_bytes") = 0, nb::arg("fsync") = false,
           nb::arg("max_queued_blocks") = 4096, nb::arg("threads") = 2,
           nb::arg("direct_io") = false, nb::arg("direct_read_depth") = 0,
           "A store in `directory` (created when missing) for the blocks of a StorageLayout, or "
           "of a CacheConfig (group `group` of a model's config) and `model_id`. max_bytes bounds "
           "it (least recently used blocks go; 0: no bound); fsync makes every block survive a "
           "power loss; direct_io writes its segments with O_DIRECT, past the page cache (where "
           "the filesystem refuses O_DIRECT it logs a warning and writes through the page "
           "cache); with direct_read_depth > 0, reads of blocks the page cache does not hold go "
           "around it with O_DIRECT, that many in flight per I/O thread (0: all through it). "
           "InvalidArgumentError for a bad layout or option, UnavailableError when the "
           "directory cannot be created or written.")
      .def_prop_ro(
          "directory", [](const PyFileTier& s) { return s.options.directory; },
          "The store's directory.")
      .def_prop_ro(
          "max_bytes", [](const PyFileTier& s) { return s.options.max_bytes; },
          "The size bound (0: none).")
      .def("__repr__", [](const PyFileTier& s) {
        return "FileTier('" + s.options.directory + "', model_id='" + s.tier->layout().model_id +
               "', in_use=" + (s.user != nullptr ? "True" : "False") + ")";
      });

  nb::class_<PyRedisTier, PyStore>(
      m, "RedisTier", "The Redis (or Valkey) store, shared between replicas. docs/storage.md.")
      .def("__init__", &init_redis_tier, nb::arg("layout_or_config"), nb::kw_only(),
           nb::arg("model_id").none() = nb::none(), nb::arg("group").none() = nb::none(),
           nb::arg("host") = "127.0.0.1", nb::arg("port") = 6379, nb::arg("timeout_ms") = 1000,
           nb::arg("key_prefix") = "pagedkv", nb::arg("max_queued_blocks") = 4096,
           nb::arg("threads") = 2,
           "A store on the server at host:port, created even when it cannot be reached yet "
           "(lookups miss until it can). UnimplementedError when this build has no hiredis; "
           "InvalidArgumentError for a bad layout or option.")
      .def_prop_ro(
          "address",
          [](const PyRedisTier& s) {
            return s.options.host + ":" + std::to_string(s.options.port);
          },
          "host:port of the server.")
      .def("__repr__", [](const PyRedisTier& s) {
        return "RedisTier('" + s.options.host + ":" + std::to_string(s.options.port) +
               "', model_id='" + s.tier->layout().model_id +
               "', in_use=" + (s.user != nullptr ? "True" : "False") + ")";
      });
}

}  // namespace pagedkv::python
