// TM_HD marks math written once for the CPU reference and the CUDA kernels.
#pragma once
#if defined(__CUDACC__)
#define TM_HD __host__ __device__ __forceinline__
#else
#define TM_HD inline
#endif
