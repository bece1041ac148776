// What the translation units of pagedkv._C share: the cache wrapper Python holds, the error
// bridge (Status -> one Python exception class per code) and array helpers.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/status.hpp"

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

/// The object Python holds. KvCache has one owner thread and no lock of its own: every call
/// takes `mu` after releasing the GIL, so Python threads may share a cache.
struct PyCache {
  std::unique_ptr<KvCache> kv;
  std::mutex mu;
  // build_batch calls so far: a batch's device arrays die at the next. Read without the lock.
  std::atomic<uint64_t> batch_serial{0};
};

/// One build_batch: the device arrays live in the cache's upload arena until the next
/// build_batch; the host copies belong to this object.
struct PyBatch {
  nb::object cache;  // keeps the cache (and its upload arena) alive
  PyCache* owner = nullptr;
  uint64_t serial = 0;
  DeviceBatch device;
  BatchMetadata host;
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

// ---- arrays (arrays.cpp) ----

/// DLPack device type of the cache's backend memory (kDLCPU or kDLCUDA).
int backend_device_type(const KvCache& kv);
/// The DLPack dtype of a pagedkv dtype.
nb::dlpack::dtype to_dlpack(DType t);
/// The pagedkv dtype of a DLPack input; kInvalidArgument naming `what` if it has none.
DType from_dlpack(nb::dlpack::dtype t, const char* what);
/// Any DLPack producer (or capsule) as an array; kInvalidArgument naming `what` otherwise.
nb::ndarray<> as_array(nb::handle obj, const char* what);
/// `obj` as an array on the cache's device, of `dtype`, `ndim` dims, C-contiguous.
nb::ndarray<> as_index_buffer(const KvCache& kv, nb::handle obj, nb::dlpack::dtype dtype,
                              size_t ndim, const char* what);
/// kInvalidArgument unless `a` lives where the cache's backend computes.
void check_device(const KvCache& kv, const nb::ndarray<>& a, const char* what);
/// A numpy array that owns `v`'s storage (no copy of the elements).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const size_t n = owned->size();
  return nb::ndarray<nb::numpy, T>(owned->data(), {n}, del);
}
/// Device memory of the cache's backend that keeps the cache (its backend) alive.
nb::object allocate_device(nb::handle cache, size_t bytes, void** out);

// ---- registration, one per translation unit ----
void register_errors(nb::module_& m);
void register_types(nb::module_& m);
void register_arrays(nb::module_& m);
nb::class_<PyCache> register_cache(nb::module_& m);
void register_batch(nb::module_& m, nb::class_<PyCache>& cls);
void register_reference(nb::module_& m, nb::class_<PyCache>& cls);

}  // namespace pagedkv::python
