// Backend selection: explicit, or auto (CUDA when built in and a device is present, else CPU).
#include <mutex>
#include <string>

#include "common/logging.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/null_backend.hpp"

#if defined(PAGEDKV_WITH_CUDA)
#include "backend/cuda/cuda_factory.hpp"
#endif

namespace pagedkv {
namespace {

void log_choice_once(const Backend& backend, BackendKind requested) {
  static std::once_flag once;
  std::call_once(once, [&] {
    detail::logger().info("backend {} (requested {}): {}", backend_kind_name(backend.kind()),
                          backend_kind_name(requested), backend.description());
  });
}

}  // namespace

bool cuda_backend_built() {
#if defined(PAGEDKV_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool cuda_device_available() {
#if defined(PAGEDKV_WITH_CUDA)
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<Backend>> create_backend(BackendKind kind, int32_t device) {
  if (device < -1) {
    return invalid_argument("device must be >= 0 (or -1: the current one), got " +
                            std::to_string(device));
  }
  CpuBackendOptions cpu;
  cpu.device_ordinal = device < 0 ? 0 : device;
  std::unique_ptr<Backend> backend;
  switch (kind) {
    case BackendKind::kCpu:
      backend = create_cpu_backend(cpu);
      break;
    case BackendKind::kNull: {
      NullBackendOptions null_options;
      null_options.device_ordinal = cpu.device_ordinal;
      backend = create_null_backend(null_options);
      break;
    }
    case BackendKind::kCuda: {
#if defined(PAGEDKV_WITH_CUDA)
      PAGEDKV_ASSIGN_OR_RETURN(backend, cuda::create_cuda_backend(device));
#else
      return unavailable(
          "the CUDA backend is not built in (configured with PAGEDKV_ENABLE_CUDA=OFF)");
#endif
      break;
    }
    case BackendKind::kAuto: {
#if defined(PAGEDKV_WITH_CUDA)
      if (cuda::device_count() > 0) {
        PAGEDKV_ASSIGN_OR_RETURN(backend, cuda::create_cuda_backend(device));
        break;
      }
#endif
      backend = create_cpu_backend(cpu);
      break;
    }
    default:
      return invalid_argument("backend: unknown backend kind");
  }
  log_choice_once(*backend, kind);
  // Every backend's description, the once-logged first aside: on CUDA it names the copy-batch
  // path the creation probe chose and the stream priorities.
  detail::logger().debug("created backend: {}", backend->description());
  return backend;
}

}  // namespace pagedkv
