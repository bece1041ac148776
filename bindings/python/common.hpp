// What the translation units of pagedkv._C share: the cache wrapper Python holds, the error
// bridge (Status -> one Python exception class per code) and array helpers.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/model_cache.hpp"
#include "pagedkv/status.hpp"
#include "pagedkv/storage_tier.hpp"

namespace pagedkv::python {

namespace nb = nanobind;

/// What the module returns for device memory: an object with __dlpack__ and
/// __dlpack_device__ (numpy.from_dlpack, torch.from_dlpack, cupy.from_dlpack take it).
using DlArray = nb::ndarray<nb::array_api>;

/// A failed Status on its way to Python; the translator raises the class registered for code.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), status_(s) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

/// Throws StatusError unless ok.
inline void check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T value_or_throw(StatusOr<T>&& s) {
  if (!s.ok()) throw StatusError(s.status());
  return std::move(s).value();
}
[[noreturn]] inline void throw_invalid(std::string message) {
  throw StatusError(invalid_argument(std::move(message)));
}

/// The object Python holds for a storage tier (pagedkv.FileTier, pagedkv.RedisTier). A store
/// serves one cache (KvCacheOptions::storage): `user` names it while it lives.
struct PyStore {
  // The buffers of raw submit_get jobs not yet reported by poll(), by job (GIL held). Declared
  // before `tier`, so they outlive the store's destructor, which waits for those jobs.
  std::unordered_map<uint64_t, std::vector<nb::object>> held_buffers;
  std::unique_ptr<StorageTier> tier;
  // The PyCache or PyModelCache this store serves, or null. Read and written with the GIL held.
  const void* user = nullptr;
  // Serializes the raw calls (raw_store.cpp), which run without the GIL.
  std::mutex raw_mu;
};

/// A cache's storage tiers (the Python objects, one per group, None where a group has none),
/// held so that every store outlives the cache that uses it; the cache's destructor destroys
/// the C++ cache first, then release_stores().
using HeldStores = std::vector<nb::object>;
/// Frees the stores of a destroyed cache for another cache and drops the references (GIL held).
void release_stores(HeldStores& stores);

/// The object Python holds. KvCache has one owner thread and no lock of its own: every call
/// takes `mu` after releasing the GIL, so Python threads may share a cache.
struct PyCache {
  std::unique_ptr<KvCache> kv;
  std::mutex mu;
  // build_batch calls so far: a batch's device arrays die at the next. Read without the lock.
  std::atomic<uint64_t> batch_serial{0};
  HeldStores stores;  // [the storage tier or None]

  ~PyCache() {
    {
      // Draining the store may wait on disk or a server; nothing else refers to the cache now.
      nb::gil_scoped_release unlocked;
      kv.reset();  // the store must still be alive
    }
    release_stores(stores);
  }
};

/// The object Python holds for a ModelKvCache; the same locking as PyCache.
struct PyModelCache {
  std::unique_ptr<ModelKvCache> model;
  std::mutex mu;
  std::atomic<uint64_t> batch_serial{0};  // model build_batch calls so far
  HeldStores stores;                      // per group: its storage tier or None

  ~PyModelCache() {
    {
      nb::gil_scoped_release unlocked;  // as ~PyCache
      model.reset();
    }
    release_stores(stores);
  }
};

/// The options of a build_batch(ids, csr, pad_slots_to[, ring_window_tables]) call.
inline BatchOptions batch_options(bool csr, int64_t pad_slots_to, bool ring_window_tables = false) {
  BatchOptions o;
  o.build_csr = csr;
  o.pad_slots_to = pad_slots_to;
  o.ring_window_tables = ring_window_tables;
  return o;
}

/// One build_batch of a KvCache, or one group's part of a ModelKvCache's: the device arrays
/// live in the cache's upload arena until the next build_batch; the host copies belong to this
/// object.
struct PyBatch {
  nb::object cache;             // keeps the cache (and its upload arena) alive
  const void* owner = nullptr;  // the PyCache or PyModelCache that built it
  const std::atomic<uint64_t>* serial_source = nullptr;  // the owner's build_batch count
  uint64_t serial = 0;
  int device_type = 0;  // DLPack device type of the owner's backend
  int device_id = 0;    // and its device ordinal
  int32_t group = -1;   // the group of a ModelKvCache's batch; -1 for a KvCache's
  DeviceBatch device;   // its host pointer leads to `host`, this batch's own copy
  BatchMetadata host;
  // The cache's metadata the built DeviceBatch pointed to: KvCache::built_here compares it.
  const BatchMetadata* built_host = nullptr;
  std::vector<SequenceId> ids;

  bool current() const { return *serial_source == serial; }
  /// The DeviceBatch as the cache built it, for the C++ calls that check KvCache::built_here;
  /// they read its host metadata only while it is current (then equal to `host`).
  DeviceBatch as_built() const {
    DeviceBatch d = device;
    d.host = built_host;
    return d;
  }
};

/// One ModelKvCache::build_batch: a PyBatch per group (Python objects, held here) and the
/// ModelBatch the C++ calls take (each group's batch as built: PyBatch::as_built).
struct PyModelBatch {
  nb::object cache;
  const PyModelCache* owner = nullptr;
  uint64_t serial = 0;
  std::vector<nb::object> groups;
  ModelBatch device;
  std::vector<SequenceId> ids;

  bool current() const { return owner->batch_serial == serial; }
};

/// Runs `fn(KvCache&)` without the GIL and under the cache's lock.
template <typename Fn>
auto unlocked(PyCache& self, Fn&& fn) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mu);
  return fn(*self.kv);
}
/// Runs `fn(ModelKvCache&)` without the GIL and under the model's lock.
template <typename Fn>
auto unlocked(PyModelCache& self, Fn&& fn) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mu);
  return fn(*self.model);
}

// ---- one group's cache, for the K/V helpers below ----

/// What the K/V helpers read of one group's cache: its one-group config, its device pool and the
/// backend. Made from a KvCache (implicitly: a one-group cache, or a group of a ModelKvCache of
/// a cache per group) or from group `g` of a ModelKvCache in either form, whose groups may share
/// one KvCache. Only valid while that cache lives; the helpers take it for one call.
class GroupRef {
 public:
  // A tensor-parallel cache's rank `rank` (0 <= rank < tp_size(): rank_ref checks it): its
  // share of the heads, its pool and backend.
  GroupRef(const KvCache& kv,  // NOLINT(google-explicit-constructor): every KvCache call site
           int32_t rank = 0)
      : config_(kv.tp_size() > 1 ? &kv.shard_config(kv.full_group()) : &kv.config()),
        pool_(kv.device_pool(kv.full_group(), rank)),
        backend_(&const_cast<KvCache&>(kv).backend(rank)) {}
  GroupRef(const ModelKvCache& m, int32_t g)
      : config_(&m.group_config(g)),
        pool_(m.device_pool(g)),
        backend_(&const_cast<KvCache&>(m.cache()).backend()) {}
  const CacheConfig& config() const { return *config_; }
  PoolRef device_pool() const { return pool_; }
  Backend& backend() const { return *backend_; }

 private:
  const CacheConfig* config_;
  PoolRef pool_;
  Backend* backend_;
};

/// Rank `rank` of `kv`; OutOfRangeError for a rank outside the cache.
GroupRef rank_ref(const KvCache& kv, int32_t rank);

// ---- arrays (arrays.cpp) ----

/// DLPack device type of the cache's backend memory (kDLCPU or kDLCUDA).
int backend_device_type(const GroupRef& kv);
/// DLPack device id of the cache's backend memory (Backend::device_ordinal).
int backend_device_id(const GroupRef& kv);
/// The DLPack dtype of a pagedkv dtype.
nb::dlpack::dtype to_dlpack(DType t);
/// The pagedkv dtype of a DLPack input; kInvalidArgument naming `what` if it has none.
DType from_dlpack(nb::dlpack::dtype t, const char* what);
/// Any DLPack producer (or capsule) as an array; kInvalidArgument naming `what` otherwise.
nb::ndarray<> as_array(nb::handle obj, const char* what);
/// `obj` as an array on the cache's device, of `dtype`, `ndim` dims, C-contiguous.
nb::ndarray<> as_index_buffer(const GroupRef& kv, nb::handle obj, nb::dlpack::dtype dtype,
                              size_t ndim, const char* what);
/// kInvalidArgument unless `a` lives where the cache's backend computes: the same DLPack device
/// type and device id.
void check_device(const GroupRef& kv, const nb::ndarray<>& a, const char* what);
/// A numpy array that owns `v`'s storage (no copy of the elements).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t n = owned->size();
  return nb::ndarray<nb::numpy, T>(owned->data(), {n}, del);
}
/// Device memory of `backend` that keeps `owner` (which keeps the backend) alive.
nb::object allocate_device(nb::handle owner, Backend& backend, size_t bytes, void** out);
/// allocate_device of a PyCache's backend.
nb::object allocate_device(nb::handle cache, size_t bytes, void** out);

// ---- K/V inputs and outputs, shared by KvCache and ModelKvCache (kv_io.cpp) ----

/// One K or V input of write_kv: [n, kv_heads, head_dim] with a row stride, on the device. Holds
/// the array, so that memory imported from a DLPack capsule stays alive until the write has run.
struct KvInput {
  nb::ndarray<> array;
  const void* data = nullptr;
  DType dtype = DType::kFloat16;
  int64_t rows = 0;
  int64_t row_stride = 0;
  bool host_memory = false;
  int64_t layer_stride = 0;  // elements between layers of an all-layers input (0: one layer)
};
/// The key and value inputs of a write_kv into `kv` (one group's cache): `value` must be None
/// for a latent (MLA) cache and an array otherwise; `where` prefixes the messages ("" or
/// "group 1 (mla): "). kInvalidArgument.
std::pair<KvInput, KvInput> kv_inputs(const GroupRef& kv, nb::handle key, nb::handle value,
                                      const std::string& where);
/// The key and value inputs of a write_kv_batch into `kv`: [rows, heads, dim] each.
std::pair<KvInput, KvInput> kv_batch_inputs(const GroupRef& kv, nb::handle key, nb::handle value,
                                            size_t rows, const std::string& where);
/// The inputs of a write_kv_batch_all_layers into `kv`: [num_layers, rows, heads, dim] each,
/// each token's [heads, dim] contiguous, any row and layer strides.
std::pair<KvInput, KvInput> kv_all_layers_inputs(const GroupRef& kv, nb::handle key,
                                                 nb::handle value, size_t rows,
                                                 const std::string& where);
/// "token_major"/"nhd" or "head_major"/"hnd"; kInvalidArgument otherwise.
PackedLayout parse_packed(const std::string& s);
/// (K, V) zero-copy views of one layer of `kv`'s device pool, owned by `owner`; a latent pool
/// has keys only and gives (latents, None). kOutOfRange for a layer outside the cache.
std::pair<DlArray, std::optional<DlArray>> layer_views(nb::handle owner, const GroupRef& kv,
                                                       int32_t layer);
/// Output buffers of a gather_layer of `n` tokens from `kv` (one group's cache): the K (or
/// latent) buffer and, unless latent, the V buffer, allocated on `kv`'s backend and owned by
/// `owner`.
struct GatherOutput {
  nb::object key_mem, value_mem;
  void* key = nullptr;
  void* value = nullptr;
  DType dtype = DType::kFloat32;
  PackedLayout layout = PackedLayout::kTokenMajor;
  int64_t tokens = 0;
};
GatherOutput gather_output(nb::handle owner, const GroupRef& kv, const std::string& layout,
                           std::optional<DType> dtype, int64_t tokens);
/// The arrays of a finished gather_layer: (K, V), or (latents, None).
std::pair<DlArray, std::optional<DlArray>> gather_result(const GroupRef& kv, GatherOutput&& out);
/// Every counter of ControlStats as a dict ("device" and "host" tier dicts included).
nb::dict stats_dict(const ControlStats& s);
/// The pools' sizes and allocation times as a dict (KvCache.pool_info, ModelGroup.pool_info).
nb::dict pool_info_dict(const PoolInfo& p);
/// block_locations as Python gives them: (tier, physical block id) pairs.
std::vector<std::pair<Tier, int32_t>> location_pairs(const std::vector<BlockLocation>& locations);

// ---- storage tiers (storage.cpp) ----

/// Claims the stores of a cache being created: `objs[i]` is a FileTier, RedisTier or None
/// (`what[i]` names the argument in messages). Returns the C++ stores (null for None).
/// InvalidArgumentError for another type or a store that already serves another cache; the
/// claim is taken back unless commit() is called once the cache exists, so a failed create
/// leaves every store free.
class StoreClaim {
 public:
  StoreClaim(const void* cache, const std::vector<nb::handle>& objs,
             const std::vector<std::string>& what);
  ~StoreClaim();
  StoreClaim(const StoreClaim&) = delete;
  StoreClaim& operator=(const StoreClaim&) = delete;

  const std::vector<StorageTier*>& tiers() const { return tiers_; }
  /// The cache exists: it holds the stores from now on (in `held`).
  void commit(HeldStores* held);

 private:
  std::vector<PyStore*> claimed_;    // stores this claim marked (each once)
  std::vector<nb::object> objects_;  // one per input, None included
  std::vector<StorageTier*> tiers_;
  bool committed_ = false;
};

/// The end of a cache wrapper's __init__: makes the C++ cache with `create` (without the GIL),
/// and only once it exists the wrapper `self` holding it in `member` and the stores of `claim`,
/// so a failed create() leaves no half-made object behind.
template <typename Wrapper, typename Cache, typename Create>
void construct_cache(Wrapper* self, std::unique_ptr<Cache> Wrapper::*member, StoreClaim& claim,
                     Create&& create) {
  auto made = [&] {
    nb::gil_scoped_release release;
    return create();
  }();
  if (!made.ok()) throw StatusError(made.status());
  new (self) Wrapper();
  self->*member = std::move(*made);
  claim.commit(&self->stores);
}

// ---- registration, one per translation unit ----
void register_errors(nb::module_& m);
void register_types(nb::module_& m);
void register_arrays(nb::module_& m);
nb::class_<PyCache> register_cache(nb::module_& m);
void register_batch(nb::module_& m, nb::class_<PyCache>& cls);
void register_reference(nb::module_& m, nb::class_<PyCache>& cls);
void register_model_cache(nb::module_& m);
void register_storage(nb::module_& m);
void register_regions(nb::module_& m, nb::class_<PyCache>& cache);
/// pagedkv.EventPublisher (events.cpp); only in an extension built with pagedkv_events.
void register_events(nb::module_& m);
/// The raw store calls (batch_exists, submit_put, submit_get, poll, drain, remove) on StorageTier.
void def_raw_store_calls(nb::class_<PyStore>& cls);

}  // namespace pagedkv::python
