// build_indptr: an int32 indptr from sequence lengths on the device (CUB on CUDA).
#include <string>

#include "common/nvtx.hpp"
#include "kernels/scan.hpp"
#include "ops/launch_shape.hpp"
#include "ops/ops_common.hpp"

namespace pagedkv {

StatusOr<size_t> build_indptr_scratch_bytes(Backend& backend, int32_t batch_size) {
  if (batch_size < 0) return invalid_argument("batch_size: negative");
#if defined(PAGEDKV_WITH_CUDA)
  if (backend.kind() == BackendKind::kCuda && batch_size > 0) {
    const size_t bytes =
        cuda::cub_inclusive_sum_scratch_bytes(batch_size, backend.device_ordinal());
    if (bytes == 0) return internal_error("CUB DeviceScan scratch query failed");
    return bytes;
  }
#else
  (void)backend;
#endif
  return size_t{0};
}

Status build_indptr(Backend& backend, const BuildIndptrArgs& args, Stream stream) {
  PAGEDKV_NVTX_RANGE("pagedkv::build_indptr");
  if (args.batch_size < 0) return invalid_argument("batch_size: negative");
  PAGEDKV_RETURN_IF_ERROR(ops_detail::validate_pointer(args.indptr, alignof(int32_t), "indptr"));
  if (args.batch_size > 0) {
    PAGEDKV_RETURN_IF_ERROR(
        ops_detail::validate_pointer(args.seq_lens, alignof(int32_t), "seq_lens"));
  }
  PAGEDKV_ASSIGN_OR_RETURN(const size_t needed,
                           build_indptr_scratch_bytes(backend, args.batch_size));
  if (args.scratch_bytes < needed || (needed > 0 && args.scratch == nullptr)) {
    return invalid_argument("scratch: " + std::to_string(args.scratch_bytes) +
                            " bytes given, build_indptr_scratch_bytes() asks for " +
                            std::to_string(needed));
  }
#if defined(PAGEDKV_WITH_CUDA)
  if (backend.kind() == BackendKind::kCuda) {
    PAGEDKV_ASSIGN_OR_RETURN(void* native, backend.native_stream(stream));
    const int err =
        cuda::cub_exclusive_indptr(args.seq_lens, args.indptr, args.batch_size, args.scratch,
                                   args.scratch_bytes, native, backend.device_ordinal());
    if (err != 0) {
      return internal_error(std::string("build_indptr: CUB DeviceScan failed: ") +
                            cuda::cuda_error_name(err));
    }
    return ok_status();
  }
#endif
  kernels::ExclusiveScanBody b;
  b.in = args.seq_lens;
  b.out = args.indptr;
  b.n = args.batch_size;
  // One serial scan on the CPU backend (a GPU shape, one output per index, is kept for tests).
  b.chunk = ops_detail::wide_launch(backend) ? args.batch_size + 1 : 1;
  KernelLaunch launch;
  launch.kernel = KernelId::kExclusiveScan;
  launch.params = &b;
  launch.params_size = sizeof(b);
  launch.num_items = (args.batch_size + 1 + b.chunk - 1) / b.chunk;
  return backend.launch(launch, stream);
}

}  // namespace pagedkv
