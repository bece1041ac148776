// device_data.hpp's CUDA side in a build without CUDA: there is no CUDA backend to ask for it.
#include "device_data_cuda.hpp"

namespace pagedkv::testing::device_data_detail {
namespace {
Status no_cuda() { return unavailable("device_data: this build has no CUDA backend"); }
}  // namespace

Status cuda_fill_pattern(void*, void*, int64_t, DType, uint64_t) { return no_cuda(); }
Status cuda_fill_model_rows(void*, uint16_t*, const ModelRows&) { return no_cuda(); }
StatusOr<int64_t> cuda_mismatch_index(void*, const void*, const void*, size_t) { return no_cuda(); }
StatusOr<uint64_t> cuda_checksum(void*, const void*, size_t) { return no_cuda(); }

}  // namespace pagedkv::testing::device_data_detail
