// CUDA-graph capture for the CUDA twins of the capture tests. The Backend interface has no
// capture API (a server captures with its own framework); the tests need only these four calls
// on a native stream (Backend::native_stream). Built from cuda_graph.cu where the build has
// CUDA (PAGEDKV_TEST_CUDA_GRAPH=1), from cuda_graph_stub.cpp elsewhere, where every call
// answers kUnavailable.
#pragma once

#include "pagedkv/status.hpp"

#ifndef PAGEDKV_TEST_CUDA_GRAPH
#define PAGEDKV_TEST_CUDA_GRAPH 0
#endif

namespace pagedkv::testing {

/// Whether this build captures graphs (false: the stub, every call kUnavailable).
inline constexpr bool kCudaGraphBuilt = PAGEDKV_TEST_CUDA_GRAPH != 0;

/// An instantiated graph (a cudaGraphExec_t); empty when `exec` is null.
struct GraphExec {
  void* exec = nullptr;
};

/// Begins a capture on `native_stream` (a cudaStream_t) in global mode, so that a call of any
/// thread that a capture forbids (an allocation, an event query, a synchronization) invalidates
/// it and end_capture fails. kInternal with the CUDA error's name, kUnavailable in the stub.
Status begin_capture(void* native_stream);

/// Ends the capture begun on `native_stream` and instantiates its graph. kInternal when the
/// capture was invalidated or the graph cannot be instantiated (nothing to destroy then).
StatusOr<GraphExec> end_capture(void* native_stream);

/// Queues one replay of `graph` on `native_stream`; kInternal with the CUDA error's name.
Status replay(GraphExec graph, void* native_stream);

/// Destroys an instantiated graph; an empty one is ignored.
void destroy(GraphExec graph);

}  // namespace pagedkv::testing
