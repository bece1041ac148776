// device_data.hpp: argument checks, and the backend's side: the stream's CUDA work
// (device_data_cuda.cu) or Thrust's host system on the calling thread after the stream has drained.
// CMakeLists.txt compiles this file with THRUST_DEVICE_SYSTEM=CPP: no CUDA compiler needed.
#include "device_data.hpp"

#include <thrust/system/cpp/execution_policy.h>

#include <string>

#include "device_data_cuda.hpp"
#include "device_data_ops.inl"

namespace pagedkv::testing {
namespace {

bool on_cuda(const Backend& backend) { return backend.kind() == BackendKind::kCuda; }

Status check_buffer(const char* what, const void* p, int64_t n) {
  if (n < 0) return invalid_argument(std::string(what) + ": negative size " + std::to_string(n));
  if (n > 0 && p == nullptr) return invalid_argument(std::string(what) + ": null buffer");
  return ok_status();
}

/// Where a CPU-backend call may run: after the stream's queued work.
Status drain(Backend& backend, Stream stream) { return backend.synchronize_stream(stream); }

/// The first mismatching byte of each side (backend memory), read back one byte each.
StatusOr<Mismatch> mismatch_at(Backend& backend, Stream stream, const void* want, const void* got,
                               int64_t at) {
  Mismatch m;
  m.index = at;
  PAGEDKV_RETURN_IF_ERROR(backend.copy_async(&m.want, static_cast<const uint8_t*>(want) + at, 1,
                                             CopyKind::kDeviceToHost, stream));
  PAGEDKV_RETURN_IF_ERROR(backend.copy_async(&m.got, static_cast<const uint8_t*>(got) + at, 1,
                                             CopyKind::kDeviceToHost, stream));
  PAGEDKV_RETURN_IF_ERROR(backend.synchronize_stream(stream));
  return m;
}

}  // namespace

Status fill_pattern(Backend& backend, Stream stream, void* dst, int64_t n, DType dtype,
                    uint64_t seed) {
  PAGEDKV_RETURN_IF_ERROR(check_buffer("fill_pattern", dst, n));
  if (n == 0) return ok_status();
  if (on_cuda(backend)) {
    PAGEDKV_ASSIGN_OR_RETURN(void* native, backend.native_stream(stream));
    return device_data_detail::cuda_fill_pattern(native, dst, n, dtype, seed);
  }
  PAGEDKV_RETURN_IF_ERROR(drain(backend, stream));
  device_data_detail::pattern_fill(thrust::cpp::par, dst, n, dtype, seed);
  return ok_status();
}

Status fill_model_rows(Backend& backend, Stream stream, uint16_t* dst, const ModelRows& rows) {
  if (rows.heads <= 0 || rows.head_dim <= 0) {
    return invalid_argument("fill_model_rows: heads and head_dim must be positive");
  }
  PAGEDKV_RETURN_IF_ERROR(check_buffer("fill_model_rows", dst, rows.rows));
  PAGEDKV_RETURN_IF_ERROR(check_buffer("fill_model_rows positions", rows.positions, rows.rows));
  PAGEDKV_RETURN_IF_ERROR(check_buffer("fill_model_rows tokens", rows.tokens, rows.rows));
  if (rows.rows == 0) return ok_status();
  if (on_cuda(backend)) {
    PAGEDKV_ASSIGN_OR_RETURN(void* native, backend.native_stream(stream));
    return device_data_detail::cuda_fill_model_rows(native, dst, rows);
  }
  PAGEDKV_RETURN_IF_ERROR(drain(backend, stream));
  device_data_detail::model_rows_fill(thrust::cpp::par, dst, rows);
  return ok_status();
}

StatusOr<std::optional<Mismatch>> first_mismatch(Backend& backend, Stream stream, const void* want,
                                                 const void* got, size_t bytes) {
  PAGEDKV_RETURN_IF_ERROR(check_buffer("first_mismatch want", want, bytes > 0 ? 1 : 0));
  PAGEDKV_RETURN_IF_ERROR(check_buffer("first_mismatch got", got, bytes > 0 ? 1 : 0));
  if (bytes == 0) return std::optional<Mismatch>();
  int64_t at = -1;
  if (on_cuda(backend)) {
    PAGEDKV_ASSIGN_OR_RETURN(void* native, backend.native_stream(stream));
    PAGEDKV_ASSIGN_OR_RETURN(at, device_data_detail::cuda_mismatch_index(native, want, got, bytes));
  } else {
    PAGEDKV_RETURN_IF_ERROR(drain(backend, stream));
    at = device_data_detail::mismatch_index(thrust::cpp::par, want, got, bytes);
  }
  if (at < 0) return std::optional<Mismatch>();
  PAGEDKV_ASSIGN_OR_RETURN(Mismatch m, mismatch_at(backend, stream, want, got, at));
  return std::optional<Mismatch>(m);
}

StatusOr<uint64_t> checksum(Backend& backend, Stream stream, const void* data, size_t bytes) {
  PAGEDKV_RETURN_IF_ERROR(check_buffer("checksum", data, bytes > 0 ? 1 : 0));
  if (bytes == 0) return uint64_t{0};
  if (on_cuda(backend)) {
    PAGEDKV_ASSIGN_OR_RETURN(void* native, backend.native_stream(stream));
    return device_data_detail::cuda_checksum(native, data, bytes);
  }
  PAGEDKV_RETURN_IF_ERROR(drain(backend, stream));
  return device_data_detail::checksum_of(thrust::cpp::par, data, bytes);
}

}  // namespace pagedkv::testing
