// The CUDA runtime's stream capture behind tests/support/cuda_graph.hpp.
#include <cuda_runtime.h>

#include <string>

#include "support/cuda_graph.hpp"

namespace pagedkv::testing {
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  (void)cudaGetLastError();  // clear it: a later, unrelated CUDA call would report it again
  return internal_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                        cudaGetErrorString(e) + ")");
}

}  // namespace

Status begin_capture(void* native_stream) {
  return cuda_status(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(native_stream), cudaStreamCaptureModeGlobal),
      "cudaStreamBeginCapture");
}

StatusOr<GraphExec> end_capture(void* native_stream) {
  cudaGraph_t graph = nullptr;
  const Status ended =
      cuda_status(cudaStreamEndCapture(static_cast<cudaStream_t>(native_stream), &graph),
                  "cudaStreamEndCapture");
  if (!ended.ok()) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    return ended;
  }
  cudaGraphExec_t exec = nullptr;
  const Status made = cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  (void)cudaGraphDestroy(graph);  // the instantiated graph does not need it
  if (!made.ok()) return made;
  return GraphExec{exec};
}

Status replay(GraphExec graph, void* native_stream) {
  if (graph.exec == nullptr) return invalid_argument("replay of an empty graph");
  return cuda_status(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.exec),
                                     static_cast<cudaStream_t>(native_stream)),
                     "cudaGraphLaunch");
}

void destroy(GraphExec graph) {
  if (graph.exec != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph.exec));
}

}  // namespace pagedkv::testing
