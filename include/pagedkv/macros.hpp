// Host/device portability macros: plain `inline` under a host compiler, so that the same
// layout math and kernel bodies compile (and are tested) with g++ alone.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PAGEDKV_HOST_DEVICE __host__ __device__ __forceinline__
#define PAGEDKV_DEVICE_COMPILE 1
#else
#define PAGEDKV_HOST_DEVICE inline
#define PAGEDKV_DEVICE_COMPILE 0
#endif

#if defined(__CUDACC__)
#define PAGEDKV_RESTRICT __restrict__
#else
#define PAGEDKV_RESTRICT __restrict
#endif
