/*
** loss.cu — CUDA kernels of the fused cross-entropy (kernels/loss.h), f32 or bf16 logits
** (f32 arithmetic).
**
** One block per row streams over the vocabulary twice (max, then the sum of exponentials)
** and keeps only the row's logsumexp and loss: no softmax tensor is stored. The mean over
** counted rows is a single-block reduction in row order (deterministic). The backward
** recomputes the softmax row by row from the saved logsumexp. A target outside the
** vocabulary is reported at once, or with deferred checks on (a training step) recorded
** on the device for the step's one read (engine/runtime/cuda.cu).
*/
#include "cross_entropy.cuh"
extern "C" {
#include "loss.h"
}

enum { CE_THREADS = 512 };

/* row_stats[n] = lse, row_stats[N + n] = loss (0 when ignored); bad: first bad row. */
template <typename T>
__global__ void ce_rows(float *row_stats, const T *logits, const void *targets,
                        int tgt_i64, int64_t ignore_index, int64_t N, int64_t V,
                        unsigned long long *bad) {
  __shared__ float scratch[32];
  int64_t n = blockIdx.x;
  const T *row = logits + n * V;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, tt_ld(row, j));
  m = tt_block_max(m, scratch);
  float s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += __expf(tt_ld(row, j) - m);
  s = tt_block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  float lse = m + logf(s);
  int64_t t = tt_load_target(targets, tgt_i64, n);
  float loss = 0;
  if (t != ignore_index) {
    if (t < 0 || t >= V) atomicMin(bad, (unsigned long long)n);
    else loss = lse - tt_ld(row, t);
  }
  row_stats[n] = t == ignore_index ? 0.0f : lse;   /* as the CPU twin */
  row_stats[N + n] = loss;
}

/* loss = sum(row loss) / count, or 0 when count is 0; count_out (may be NULL) gets the
** count. One block: rows are summed in a fixed order. */
__global__ void ce_mean(float *loss, float *count_out, const float *row_loss,
                        const void *targets, int tgt_i64, int64_t ignore_index, int64_t N) {
  __shared__ float scratch[32];
  float s = 0, c = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (tt_load_target(targets, tgt_i64, n) == ignore_index) continue;
    if (row_loss) s += row_loss[n];
    c += 1;
  }
  s = tt_block_sum(s, scratch);
  c = tt_block_sum(c, scratch);
  if (threadIdx.x == 0) {
    if (loss) *loss = c > 0 ? s / c : 0.0f;
    if (count_out) *count_out = c;
  }
}

static int check_dtype(int dtype) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16,
           "cross_entropy: logits are %s; expected f32 or bf16", tt_dtype_name(dtype));
  return 0;
}

static int ce_forward(float *loss, float *row_stats, const void *logits, const void *targets,
                      int tgt_i64, int64_t ignore_index, int64_t N, int64_t V, int dtype) {
  TT_TRY(check_dtype(dtype));
  cudaStream_t st = tt_cuda_cur_stream();
  if (N == 0) {
    TT_CU(cudaMemsetAsync(loss, 0, sizeof(float), st));
    return 0;
  }
  TT_CHECK(N <= 0x7fffffff, "cross_entropy: %lld rows is too many for one launch",
           (long long)N);
  unsigned long long *bad_dev = NULL, bad = ~0ull;
  TT_CU(cudaMallocAsync((void **)&bad_dev, sizeof bad, st));
  cudaError_t e = cudaMemsetAsync(bad_dev, 0xff, sizeof bad, st);
  if (e == cudaSuccess) {
    if (dtype == TT_ELEM_BF16)
      ce_rows<<<(unsigned)N, CE_THREADS, 0, st>>>(row_stats, (const __nv_bfloat16 *)logits,
                                                  targets, tgt_i64, ignore_index, N, V, bad_dev);
    else
      ce_rows<<<(unsigned)N, CE_THREADS, 0, st>>>(row_stats, (const float *)logits, targets,
                                                  tgt_i64, ignore_index, N, V, bad_dev);
    ce_mean<<<1, 1024, 0, st>>>(loss, NULL, row_stats + N, targets, tgt_i64, ignore_index, N);
    e = tt_cuda_launch_status();
  }
  if (e == cudaSuccess && tt_cuda_checks_deferred()) {   /* the step reads it later */
    int rc = tt_cuda_check_defer(TT_CHECK_CE_TARGET, bad_dev, targets, tgt_i64, V);
    cudaFreeAsync(bad_dev, st);
    return rc;
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess) e = tt_cuda_host_wait(st);
  cudaFreeAsync(bad_dev, st);
  TT_CU(e);
  if (bad != ~0ull) {
    int64_t t = 0;
    size_t w = tgt_i64 ? 8 : 4;
    if (cudaMemcpy(&t, (const char *)targets + bad * w, w, cudaMemcpyDeviceToHost) ==
            cudaSuccess && !tgt_i64)
      t = (int64_t)(int32_t)t;
    return tt_set_error("cross_entropy: target %lld at row %llu is outside [0, %lld)",
                        (long long)t, bad, (long long)V);
  }
  return 0;
}

static int ce_backward(void *dlogits, const float *dloss, const void *logits,
                       const float *row_stats, const void *targets, int tgt_i64,
                       int64_t ignore_index, int64_t N, int64_t V, int dtype) {
  TT_TRY(check_dtype(dtype));
  if (N == 0) return 0;
  cudaStream_t st = tt_cuda_cur_stream();
  float *count = NULL;
  TT_CU(cudaMallocAsync((void **)&count, sizeof(float), st));
  ce_mean<<<1, 1024, 0, st>>>(NULL, count, NULL, targets, tgt_i64, ignore_index, N);
  if (dtype == TT_ELEM_BF16)
    tt_ce_grad<<<(unsigned)N, CE_THREADS, 0, st>>>((__nv_bfloat16 *)dlogits, dloss, count,
                                                   (const __nv_bfloat16 *)logits, row_stats,
                                                   targets, tgt_i64, ignore_index, 0, V);
  else
    tt_ce_grad<<<(unsigned)N, CE_THREADS, 0, st>>>((float *)dlogits, dloss, count,
                                                   (const float *)logits, row_stats, targets,
                                                   tgt_i64, ignore_index, 0, V);
  cudaError_t e = tt_cuda_launch_status();
  cudaFreeAsync(count, st);
  TT_CU(e);
  return 0;
}

extern "C" const tt_loss_kernels tt_loss_cuda = {
  ce_forward, ce_backward,
};

TT_CUDA_FAMILY(loss)
