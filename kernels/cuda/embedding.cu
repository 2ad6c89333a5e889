/*
** embedding.cu — CUDA kernels of the embedding family (kernels/embedding.h): row gather
** forward, scatter-add backward, f32 or bf16 rows (f32 table and sums), i32/i64 ids.
**
** The forward validates ids on the device and reports the first bad position through a
** flag read back after the launch (one small copy per call, which is also where the
** error message needs the offending id), or, with deferred checks on (a training step),
** records it on the device for the step's one read (engine/runtime/cuda.cu). The backward is deterministic like the CPU
** twin: each thread owns one column of dweight and walks the tokens in order, so a row
** shared by several tokens is summed in token order and no atomics are needed.
*/
#include "kernel_cuda.h"
extern "C" {
#include "embedding.h"
}

__device__ __forceinline__ int64_t load_id(const void *ids, int ids_i64, int64_t i) {
  return ids_i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

/* One block row per token; threads stride over D. bad: the smallest bad position. */
template <typename T>
__global__ void embedding_fwd(T *out, const float *weight, const void *ids, int ids_i64,
                              int64_t n, int64_t V, int64_t D,
                              unsigned long long *bad) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    int64_t id = load_id(ids, ids_i64, i);
    if (id < 0 || id >= V) {
      if (threadIdx.x == 0) atomicMin(bad, (unsigned long long)i);
      continue;
    }
    const float *src = weight + id * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) tt_st(out, i * D + j, src[j]);
  }
}

static int embedding_forward(void *out, const float *weight, const void *ids, int ids_i64,
                             int64_t n, int64_t V, int64_t D, int out_dtype) {
  TT_CHECK(out_dtype == TT_ELEM_F32 || out_dtype == TT_ELEM_BF16,
           "embedding: rows in %s; expected f32 or bf16", tt_dtype_name(out_dtype));
  if (n == 0) return 0;
  unsigned long long *bad_dev = NULL, bad = ~0ull;
  TT_CU(cudaMallocAsync((void **)&bad_dev, sizeof bad, tt_cuda_cur_stream()));
  int rc = -1;
  int64_t blocks = n < 65535 ? n : 65535;
  int threads = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
  cudaError_t e = cudaMemsetAsync(bad_dev, 0xff, sizeof bad, tt_cuda_cur_stream());
  if (e == cudaSuccess) {
    if (out_dtype == TT_ELEM_BF16)
      embedding_fwd<<<(unsigned)blocks, threads, 0, tt_cuda_cur_stream()>>>(
          (__nv_bfloat16 *)out, weight, ids, ids_i64, n, V, D, bad_dev);
    else
      embedding_fwd<<<(unsigned)blocks, threads, 0, tt_cuda_cur_stream()>>>(
          (float *)out, weight, ids, ids_i64, n, V, D, bad_dev);
    e = tt_cuda_launch_status();
  }
  if (e == cudaSuccess && tt_cuda_checks_deferred()) {   /* the step reads it later */
    rc = tt_cuda_check_defer(TT_CHECK_EMBEDDING_ID, bad_dev, ids, ids_i64, V);
    cudaFreeAsync(bad_dev, tt_cuda_cur_stream());
    return rc;
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost, tt_cuda_cur_stream());
  if (e == cudaSuccess) e = tt_cuda_host_wait(tt_cuda_cur_stream());
  if (e != cudaSuccess) {
    tt_cu_fail(e, "embedding_fwd", __FILE__, __LINE__);
  } else if (bad != ~0ull) {
    int64_t id = 0;
    size_t w = ids_i64 ? 8 : 4;
    if (cudaMemcpy(&id, (const char *)ids + bad * w, w, cudaMemcpyDeviceToHost) == cudaSuccess &&
        !ids_i64)
      id = (int64_t)(int32_t)id;
    tt_set_error("embedding: id %lld at position %llu is outside the vocabulary [0, %lld)",
                 (long long)id, bad, (long long)V);
  } else {
    rc = 0;
  }
  cudaFreeAsync(bad_dev, tt_cuda_cur_stream());
  return rc;
}

template <typename T>
__global__ void embedding_bwd(float *dweight, const T *dout, const void *ids, int ids_i64,
                              int64_t n, int64_t V, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = load_id(ids, ids_i64, i);
    /* An id outside the table: the forward has reported it (or recorded it for the
    ** step's deferred check); its row is not written, least of all outside dweight. */
    if (id < 0 || id >= V) continue;
    dweight[id * D + j] += tt_ld(dout, i * D + j);
  }
}

static int embedding_backward(float *dweight, const void *dout, const void *ids,
                              int ids_i64, int64_t n, int64_t V, int64_t D, int dout_dtype) {
  TT_CHECK(dout_dtype == TT_ELEM_F32 || dout_dtype == TT_ELEM_BF16,
           "embedding_backward: rows in %s; expected f32 or bf16", tt_dtype_name(dout_dtype));
  if (n == 0 || D == 0) return 0;
  const unsigned blocks = (unsigned)((D + 127) / 128);
  if (dout_dtype == TT_ELEM_BF16)
    embedding_bwd<<<blocks, 128, 0, tt_cuda_cur_stream()>>>(
        dweight, (const __nv_bfloat16 *)dout, ids, ids_i64, n, V, D);
  else
    embedding_bwd<<<blocks, 128, 0, tt_cuda_cur_stream()>>>(
        dweight, (const float *)dout, ids, ids_i64, n, V, D);
  TT_CU_LAUNCHED("embedding_bwd");
  return 0;
}

extern "C" const tt_embedding_kernels tt_embedding_cuda = {
  embedding_forward, embedding_backward,
};

TT_CUDA_FAMILY(embedding)
