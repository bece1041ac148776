// DLPack in and out: dtype and device mapping, input checks, backend memory owned by Python.
#include "common.hpp"

namespace pagedkv::python {
namespace {

/// Backend memory exported to Python; holds a reference to the cache so the backend that
/// allocated it outlives it.
struct DeviceMemory {
  nb::object cache;  // the backend's owner; released after free_device (members die after the
                     // destructor body)
  Backend* backend = nullptr;
  void* ptr = nullptr;
  ~DeviceMemory() {
    if (ptr != nullptr) backend->free_device(ptr);
  }
};

}  // namespace

int backend_device_type(const GroupRef& kv) {
  return kv.backend().kind() == BackendKind::kCuda ? static_cast<int>(nb::device::cuda::value)
                                                   : static_cast<int>(nb::device::cpu::value);
}

int backend_device_id(const GroupRef& kv) { return kv.backend().device_ordinal(); }

GroupRef rank_ref(const KvCache& kv, int32_t rank) {
  if (rank < 0 || rank >= kv.tp_size()) {
    throw StatusError(out_of_range("rank: " + std::to_string(rank) + " outside the cache's " +
                                   std::to_string(kv.tp_size()) + " tensor-parallel ranks"));
  }
  return GroupRef(kv, rank);
}

nb::dlpack::dtype to_dlpack(DType t) {
  switch (t) {
    case DType::kFloat16:
      return {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBFloat16:
      return {uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::kFloat32:
      return {uint8_t(nb::dlpack::dtype_code::Float), 32, 1};
    case DType::kFloat8E4M3:
      return {uint8_t(nb::dlpack::dtype_code::Float8_E4M3FN), 8, 1};
  }
  return {};
}

DType from_dlpack(nb::dlpack::dtype t, const char* what) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    if (to_dlpack(d) == t) return d;
  }
  throw_invalid(std::string(what) + ": dtype must be float16, bfloat16 or float32");
}

nb::ndarray<> as_array(nb::handle obj, const char* what) {
  nb::ndarray<> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    throw_invalid(std::string(what) +
                  ": not an array (a DLPack producer, an unused DLPack capsule or a buffer)");
  }
  return a;
}

void check_device(const GroupRef& kv, const nb::ndarray<>& a, const char* what) {
  if (a.device_type() != backend_device_type(kv) || a.device_id() != backend_device_id(kv)) {
    throw_invalid(std::string(what) + ": the array lives on DLPack device (" +
                  std::to_string(a.device_type()) + ", " + std::to_string(a.device_id()) +
                  "), the cache's backend on (" + std::to_string(backend_device_type(kv)) + ", " +
                  std::to_string(backend_device_id(kv)) + ")");
  }
}

nb::ndarray<> as_index_buffer(const GroupRef& kv, nb::handle obj, nb::dlpack::dtype dtype,
                              size_t ndim, const char* what) {
  nb::ndarray<> a = as_array(obj, what);
  check_device(kv, a, what);
  if (a.dtype() != dtype) throw_invalid(std::string(what) + ": wrong dtype (int32 or int64)");
  if (a.ndim() != ndim) throw_invalid(std::string(what) + ": wrong number of dimensions");
  int64_t expected = 1;
  for (size_t d = ndim; d-- > 0;) {
    if (a.shape(d) > 1 && a.stride(d) != expected) {
      throw_invalid(std::string(what) + ": must be C-contiguous");
    }
    expected *= static_cast<int64_t>(a.shape(d));
  }
  return a;
}

nb::object allocate_device(nb::handle owner, Backend& backend, size_t bytes, void** out) {
  auto* mem = new DeviceMemory();
  mem->cache = nb::borrow(owner);
  mem->backend = &backend;
  auto ptr = mem->backend->allocate_device(bytes == 0 ? 1 : bytes);
  if (!ptr.ok()) {
    delete mem;
    throw StatusError(ptr.status());
  }
  mem->ptr = *ptr;
  *out = mem->ptr;
  return nb::cast(mem, nb::rv_policy::take_ownership);
}

nb::object allocate_device(nb::handle cache, size_t bytes, void** out) {
  return allocate_device(cache, nb::cast<PyCache&>(cache).kv->backend(), bytes, out);
}

void register_arrays(nb::module_& m) {
  nb::class_<DeviceMemory>(m, "_DeviceMemory", "Backend memory owned by exported arrays.");
}

}  // namespace pagedkv::python
