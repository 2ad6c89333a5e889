/*
** vocab_parallel.cu — CUDA kernels of the vocab-parallel cross-entropy's per-rank pieces
** (kernels/vocab_parallel.h), f32 or bf16 logits (f32 arithmetic).
**
** row_max and row_partials: one block per row streams over this rank's shard. finish: one
** block walks the rows in a fixed order (a deterministic mean) and writes each row's
** logsumexp; a counted target that the group does not own exactly once is reported at
** once, or with deferred checks on (a training step) recorded on the device for the
** step's one read (engine/runtime/cuda.cu), as the plain cross-entropy does
** (kernels/cuda/loss.cu). backward: one block per row, the softmax rebuilt from the saved
** logsumexp. Nothing is read back to the host except that check.
*/
#include "cross_entropy.cuh"
extern "C" {
#include "vocab_parallel.h"
}

enum { VP_THREADS = 512 };

static const char OP[] = "vocab_parallel_cross_entropy";

static int check_launch(int dtype, int64_t N) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16,
           "%s: logits are %s; expected f32 or bf16", OP, tt_dtype_name(dtype));
  TT_CHECK(N <= 0x7fffffff, "%s: %lld rows is too many for one launch", OP, (long long)N);
  return 0;
}

/* mx[n] = max of row n, 0 for ignored rows. */
template <typename T>
__global__ void vp_row_max(float *mx, const T *logits, const void *targets, int tgt_i64,
                           int64_t ignore_index, int64_t vl) {
  __shared__ float scratch[32];
  int64_t n = blockIdx.x;
  if (tt_load_target(targets, tgt_i64, n) == ignore_index) {
    if (threadIdx.x == 0) mx[n] = 0.0f;
    return;
  }
  const T *row = logits + n * vl;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) m = fmaxf(m, tt_ld(row, j));
  m = tt_block_max(m, scratch);
  if (threadIdx.x == 0) mx[n] = m;
}

/* red[n] = sum of exp(x - mx), red[N + n] = target logit, red[2N + n] = owned flag. */
template <typename T>
__global__ void vp_row_partials(float *red, const T *logits, const float *mx,
                                const void *targets, int tgt_i64, int64_t ignore_index,
                                int64_t start, int64_t N, int64_t vl) {
  __shared__ float scratch[32];
  int64_t n = blockIdx.x;
  int64_t t = tt_load_target(targets, tgt_i64, n);
  if (t == ignore_index) {
    if (threadIdx.x == 0) red[n] = red[N + n] = red[2 * N + n] = 0.0f;
    return;
  }
  const T *row = logits + n * vl;
  float m = mx[n], s = 0.0f;
  for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) s += __expf(tt_ld(row, j) - m);
  s = tt_block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  int owned = t >= start && t < start + vl;
  red[n] = s;
  red[N + n] = owned ? tt_ld(row, t - start) : 0.0f;
  red[2 * N + n] = owned ? 1.0f : 0.0f;
}

/* One block: lse (N), loss = mean over counted rows, count_out (may be NULL) the count;
** bad: the first counted row whose target the group does not own exactly once. */
__global__ void vp_finish(float *loss, float *lse, const float *mx, const float *red,
                          const void *targets, int tgt_i64, int64_t ignore_index, int64_t N,
                          unsigned long long *bad) {
  __shared__ float scratch[32];
  float s = 0.0f, c = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    lse[n] = 0.0f;
    if (tt_load_target(targets, tgt_i64, n) == ignore_index) continue;
    if (red[2 * N + n] != 1.0f) {
      atomicMin(bad, (unsigned long long)n);
      continue;
    }
    float l = mx[n] + logf(red[n]);
    lse[n] = l;
    s += l - red[N + n];
    c += 1.0f;
  }
  s = tt_block_sum(s, scratch);
  c = tt_block_sum(c, scratch);
  if (threadIdx.x == 0) *loss = c > 0 ? s / c : 0.0f;
}

/* count = rows not ignored (one block, a fixed order). */
__global__ void vp_count(float *count, const void *targets, int tgt_i64, int64_t ignore_index,
                         int64_t N) {
  __shared__ float scratch[32];
  float c = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
    c += tt_load_target(targets, tgt_i64, n) != ignore_index ? 1.0f : 0.0f;
  c = tt_block_sum(c, scratch);
  if (threadIdx.x == 0) *count = c;
}

static int row_max(float *mx, const void *logits, const void *targets, int tgt_i64,
                   int64_t ignore_index, int64_t N, int64_t vl, int dtype) {
  TT_TRY(check_launch(dtype, N));
  if (N == 0) return 0;
  cudaStream_t st = tt_cuda_cur_stream();
  if (dtype == TT_ELEM_BF16)
    vp_row_max<<<(unsigned)N, VP_THREADS, 0, st>>>(mx, (const __nv_bfloat16 *)logits, targets,
                                                   tgt_i64, ignore_index, vl);
  else
    vp_row_max<<<(unsigned)N, VP_THREADS, 0, st>>>(mx, (const float *)logits, targets,
                                                   tgt_i64, ignore_index, vl);
  TT_CU_LAUNCHED("vp_row_max");
  return 0;
}

static int row_partials(float *red, const void *logits, const float *mx, const void *targets,
                        int tgt_i64, int64_t ignore_index, int64_t start, int64_t N,
                        int64_t vl, int dtype) {
  TT_TRY(check_launch(dtype, N));
  if (N == 0) return 0;
  cudaStream_t st = tt_cuda_cur_stream();
  if (dtype == TT_ELEM_BF16)
    vp_row_partials<<<(unsigned)N, VP_THREADS, 0, st>>>(
        red, (const __nv_bfloat16 *)logits, mx, targets, tgt_i64, ignore_index, start, N, vl);
  else
    vp_row_partials<<<(unsigned)N, VP_THREADS, 0, st>>>(
        red, (const float *)logits, mx, targets, tgt_i64, ignore_index, start, N, vl);
  TT_CU_LAUNCHED("vp_row_partials");
  return 0;
}

static int finish(float *loss, float *lse, const float *mx, const float *red,
                  const void *targets, int tgt_i64, int64_t ignore_index, int64_t start,
                  int64_t N, int64_t vl) {
  cudaStream_t st = tt_cuda_cur_stream();
  if (N == 0) {
    TT_CU(cudaMemsetAsync(loss, 0, sizeof(float), st));
    return 0;
  }
  unsigned long long *bad_dev = NULL, bad = ~0ull;
  TT_CU(cudaMallocAsync((void **)&bad_dev, sizeof bad, st));
  cudaError_t e = cudaMemsetAsync(bad_dev, 0xff, sizeof bad, st);
  if (e == cudaSuccess) {
    vp_finish<<<1, 1024, 0, st>>>(loss, lse, mx, red, targets, tgt_i64, ignore_index, N,
                                  bad_dev);
    e = tt_cuda_launch_status();
  }
  if (e == cudaSuccess && tt_cuda_checks_deferred()) {   /* the step reads it later */
    int rc = tt_cuda_check_defer(TT_CHECK_VP_TARGET, bad_dev, targets, tgt_i64, start + vl);
    cudaFreeAsync(bad_dev, st);
    return rc;
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess) e = tt_cuda_host_wait(st);
  cudaFreeAsync(bad_dev, st);
  TT_CU(e);
  if (bad != ~0ull) {
    int64_t t = 0;
    float owners = 0.0f;
    size_t w = tgt_i64 ? 8 : 4;
    if (cudaMemcpy(&t, (const char *)targets + bad * w, w, cudaMemcpyDeviceToHost) ==
            cudaSuccess && !tgt_i64)
      t = (int64_t)(int32_t)t;
    if (cudaMemcpy(&owners, red + 2 * N + (int64_t)bad, sizeof owners,
                   cudaMemcpyDeviceToHost) != cudaSuccess)
      owners = NAN;
    return tt_set_error("%s: target %lld at row %llu is outside the vocabulary of the group "
                        "(owned by %g ranks)", OP, (long long)t, bad, (double)owners);
  }
  return 0;
}

static int backward(void *dlogits, const float *dloss, const void *logits, const float *lse,
                    const void *targets, int tgt_i64, int64_t ignore_index, int64_t start,
                    int64_t N, int64_t vl, int dtype) {
  TT_TRY(check_launch(dtype, N));
  if (N == 0) return 0;
  cudaStream_t st = tt_cuda_cur_stream();
  float *count = NULL;
  TT_CU(cudaMallocAsync((void **)&count, sizeof(float), st));
  vp_count<<<1, 1024, 0, st>>>(count, targets, tgt_i64, ignore_index, N);
  if (dtype == TT_ELEM_BF16)
    tt_ce_grad<<<(unsigned)N, VP_THREADS, 0, st>>>((__nv_bfloat16 *)dlogits, dloss, count,
                                                   (const __nv_bfloat16 *)logits, lse, targets,
                                                   tgt_i64, ignore_index, start, vl);
  else
    tt_ce_grad<<<(unsigned)N, VP_THREADS, 0, st>>>((float *)dlogits, dloss, count,
                                                   (const float *)logits, lse, targets, tgt_i64,
                                                   ignore_index, start, vl);
  cudaError_t e = tt_cuda_launch_status();
  cudaFreeAsync(count, st);
  TT_CU(e);
  return 0;
}

extern "C" const tt_vocab_parallel_kernels tt_vocab_parallel_cuda = {
  row_max, row_partials, finish, backward,
};

TT_CUDA_FAMILY(vocab_parallel)
