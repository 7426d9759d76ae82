// The CUDA handle types the ops' headers (kernels/<op>/<op>.hpp) name in their CUDA entry
// points, declared exactly as cuda_runtime_api.h (driver_types.h) and cublas_api.h declare
// them, so that a header holding the CPU and CUDA entry points side by side compiles in a build
// without CUDA. Repeating a typedef of the same type is valid C++, so this header and the CUDA
// headers may be included in either order. The CUDA entry points are defined only in CUDA
// builds (kernels/<op>/<op>.cu): code that calls them is CUDA-built code.
#pragma once

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;
