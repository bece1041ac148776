// tests/support/cuda_graph.hpp in a build without CUDA: nothing can be captured.
#include "support/cuda_graph.hpp"

namespace pagedkv::testing {
namespace {

Status no_cuda() { return unavailable("this build has no CUDA runtime: no graph capture"); }

}  // namespace

Status begin_capture(void*) { return no_cuda(); }
StatusOr<GraphExec> end_capture(void*) { return no_cuda(); }
Status replay(GraphExec, void*) { return no_cuda(); }
void destroy(GraphExec) {}

}  // namespace pagedkv::testing
