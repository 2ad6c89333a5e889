/*
** kernel_cuda.h — what every CUDA kernel (kernels/cuda/) needs, and nothing from engine/:
** the status check for CUDA / cuBLAS / NCCL calls, the launch check, the current stream,
** the cuBLASLt handle, deferred input checks, grid sizing, widening loads and stores, and
** warp / block reductions. C++ (nvcc) only. The engine's CUDA sources include it through
** engine/cuda/tt_cuda.h.
*/
#ifndef TT_KERNEL_CUDA_H
#define TT_KERNEL_CUDA_H
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cublasLt.h>
#ifdef TETRA_HAVE_NCCL
#include <nccl.h>
#endif
extern "C" {
#include "kernel.h"
}

/* -- cuBLASLt, opened on first use -------------------------------------------------- */
/* libcublasLt is not linked but opened (dlopen) by the first call that needs it: linked,
** its 540 MB cost every process 25,000 page faults (about 0.12 s of system time) at
** start, a GPU in use or not, where a CPU run, a tool or a rank of a test never calls it.
** Every cublasLt function the engine calls is listed here; its name is a macro for the
** entry point tt_blaslt() found (engine/runtime/cuda.cu: the loader's path, then beside
** the process's libcudart and in the nvidia-cublas wheel beside its wheel). When the
** library cannot be opened, each entry point returns CUBLAS_STATUS_NOT_INITIALIZED and
** cublasLtGetStatusString says why (the file, every place tried, dlerror, the fix). */
#define TT_BLASLT_FUNCTIONS(X)                                                           \
  X(Create) X(GetStatusString) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate)    \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatmulPreferenceCreate)                \
  X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate)        \
  X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)
struct tt_blaslt_api {
#define TT_BLASLT_MEMBER(f) decltype(&cublasLt##f) f;
  TT_BLASLT_FUNCTIONS(TT_BLASLT_MEMBER)
#undef TT_BLASLT_MEMBER
};
/* The entry points, the library opened on the first call (thread-safe). */
const tt_blaslt_api *tt_blaslt(void);
/* 1 when the library opened and every entry point was found, else 0 and the message set
** (tetra_cuda.h declares it for C and the Lua FFI). */
extern "C" int tt_blaslt_loaded(void);
#define cublasLtCreate (tt_blaslt()->Create)
#define cublasLtGetStatusString (tt_blaslt()->GetStatusString)
#define cublasLtMatmul (tt_blaslt()->Matmul)
#define cublasLtMatmulAlgoGetHeuristic (tt_blaslt()->MatmulAlgoGetHeuristic)
#define cublasLtMatmulDescCreate (tt_blaslt()->MatmulDescCreate)
#define cublasLtMatmulDescDestroy (tt_blaslt()->MatmulDescDestroy)
#define cublasLtMatmulDescSetAttribute (tt_blaslt()->MatmulDescSetAttribute)
#define cublasLtMatmulPreferenceCreate (tt_blaslt()->MatmulPreferenceCreate)
#define cublasLtMatmulPreferenceDestroy (tt_blaslt()->MatmulPreferenceDestroy)
#define cublasLtMatmulPreferenceSetAttribute (tt_blaslt()->MatmulPreferenceSetAttribute)
#define cublasLtMatrixLayoutCreate (tt_blaslt()->MatrixLayoutCreate)
#define cublasLtMatrixLayoutDestroy (tt_blaslt()->MatrixLayoutDestroy)
#define cublasLtMatrixLayoutSetAttribute (tt_blaslt()->MatrixLayoutSetAttribute)

/* -- Status checks ------------------------------------------------------------------ */
/* TT_CU(call) evaluates a CUDA runtime, cuBLAS(Lt) or NCCL call; on failure it sets the
** message "file:line: call: reason" and returns -1 from the enclosing function. The three
** status types are told apart by overloading, so every library goes through one macro. */
int tt_cu_fail(cudaError_t e, const char *call, const char *file, int line);
int tt_cu_fail(cublasStatus_t e, const char *call, const char *file, int line);
#ifdef TETRA_HAVE_NCCL
int tt_cu_fail(ncclResult_t e, const char *call, const char *file, int line);
static inline bool tt_cu_ok(ncclResult_t e) { return e == ncclSuccess; }
#endif
static inline bool tt_cu_ok(cudaError_t e) { return e == cudaSuccess; }
static inline bool tt_cu_ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

#define TT_CU(call)                                                   \
  do {                                                                \
    auto tt_status_ = (call);                                         \
    if (!tt_cu_ok(tt_status_))                                        \
      return tt_cu_fail(tt_status_, #call, __FILE__, __LINE__);       \
  } while (0)

/* After a kernel launch (or a library call that launches): a bad configuration shows up
** in cudaGetLastError. With TETRA_CUDA_SYNC=1 in the environment it also waits for the
** device, so a fault inside the kernel is reported at this launch, not at a later call. */
cudaError_t tt_cuda_launch_status(void);
#define TT_CU_LAUNCHED(kernel_name)                                          \
  do {                                                                       \
    cudaError_t tt_launch_ = tt_cuda_launch_status();                        \
    if (tt_launch_ != cudaSuccess)                                           \
      return tt_cu_fail(tt_launch_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

/* -- Runtime state ------------------------------------------------------------------ */
/* Defined by the CUDA runtime (engine/runtime/cuda.cu), the one layer below the kernels
** besides common/: the kernels link against it as against tt_set_error. */

/* The stream every kernel launches on (tt_cuda_set_stream; the legacy default stream
** until set). */
cudaStream_t tt_cuda_cur_stream(void);
/* The cuBLASLt handle and a workspace of tt_cuda_workspace_bytes on the current device.
** Created on first use; -1 with the message set on failure. */
int tt_cuda_blaslt(cublasLtHandle_t *handle, void **workspace, size_t *workspace_bytes);
/* Each kernels/cuda file names its family once (TT_CUDA_FAMILY(norm)): a symbol that
** kernels_linked.cu references strongly. */
#define TT_CUDA_FAMILY(fam) extern "C" const char tt_cuda_family_##fam[] = #fam;
/* The one way a CUDA source waits for stream s from the host: cudaStreamSynchronize,
** counted (tt_cuda_host_sync_count), and refused while the stream is being captured into a
** graph (cudaErrorStreamCaptureUnsupported). */
cudaError_t tt_cuda_host_wait(cudaStream_t s);
/* The host waits for event e as tt_cuda_host_wait waits for a stream: counted, and
** polling (with the hook) when a wait hook is set. */
cudaError_t tt_cuda_host_wait_event(cudaEvent_t e);
/* Deferred input checks (tt_cuda_set_deferred_checks). A kernel that validates its
** inputs writes the smallest bad position into *bad_pos (device memory, ~0 when none);
** instead of reading it back, the op calls tt_cuda_check_defer, which records (on the
** device, in stream order) the first failure of that kind with the offending value
** values[pos] and the limit; tt_cuda_checks_take reads the records later. */
enum { TT_CHECK_EMBEDDING_ID = 0, TT_CHECK_CE_TARGET = 1, TT_CHECK_VP_TARGET = 2,
       TT_CHECK_KINDS = 3 };
int tt_cuda_checks_deferred(void);
int tt_cuda_check_defer(int kind, const unsigned long long *bad_pos, const void *values,
                        int values_i64, int64_t limit);
/* Multiprocessor count of the current device (for grid sizing). */
int tt_cuda_sm_count(void);

/* -- Launch helpers ----------------------------------------------------------------- */

/* Blocks of `threads` covering n items, capped so a grid-stride loop covers the rest. */
static inline unsigned tt_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  int64_t cap = (int64_t)tt_cuda_sm_count() * 32;
  if (b > cap) b = cap;
  return (unsigned)(b < 1 ? 1 : b);
}

/* Loads and stores that widen every float dtype to f32 in registers. */
__device__ __forceinline__ float tt_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float tt_ld(const __nv_bfloat16 *p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float tt_ld(const __half *p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void tt_st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void tt_st(__nv_bfloat16 *p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void tt_st(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

/* Calls fn.template operator()<T>() with T the C++ type of a float dtype; -1 (message
** naming op) for other dtypes. */
template <typename Fn>
static int tt_cuda_dispatch_float(const char *op, int dtype, Fn &&fn) {
  switch (dtype) {
    case TT_ELEM_F32: return fn(static_cast<float *>(nullptr));
    case TT_ELEM_BF16: return fn(static_cast<__nv_bfloat16 *>(nullptr));
    case TT_ELEM_F16: return fn(static_cast<__half *>(nullptr));
    default:
      return tt_set_error("%s: dtype %s is not supported on cuda (want f32, bf16 or f16)", op,
                          tt_dtype_name(dtype));
  }
}

/* Warp and block reductions (blockDim.x a multiple of 32, at most 1024). */
__device__ __forceinline__ float tt_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float tt_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Every thread gets the block's sum; `scratch` holds 32 floats of shared memory. */
__device__ __forceinline__ float tt_block_sum(float v, float *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = tt_warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return tt_warp_sum(v);
}
__device__ __forceinline__ float tt_block_max(float v, float *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = tt_warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return tt_warp_max(v);
}

#endif
