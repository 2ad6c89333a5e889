/*
** fp8_linear.cu — tt_fp8_linear on CUDA tensors (engine/tetra_amp.h): FP8 GEMMs through
** cuBLASLt with per-tensor delayed scaling kept on the device.
**
**   forward   Y  (rows, out) = q_x (rows, in) . q_w (out, in)^T      e4m3 x e4m3 -> bf16
**   backward  dX (rows, in)  = q_g (rows, out) . q_w^T (in, out)^T   e5m2 x e4m3 -> bf16
**             dW (out, in)   = q_g^T (out, rows) . q_x^T (in, rows)^T e5m2 x e4m3 -> f32
** Hopper's FP8 GEMMs take only the "TN" layout: both operands contiguous along the
** contracted dim (row-major A (m, k) and B (n, k), C = A B^T). The three products above
** are all written that way; the transposed copies they need (q_w^T, q_g^T, q_x^T) come
** from one fused kernel that reads a tensor once and writes its fp8 codes in both
** layouts while recording its amax, so no GEMM is ever asked for a layout cuBLASLt
** rejects. cuBLASLt multiplies the fp32 sums by the two operands' inverse scales (device
** pointers: A_SCALE / B_SCALE), adds the bias (bf16) in the epilogue and rounds to bf16.
** engine/ops/fp8.c emulates exactly this on the CPU; tests/cuda/test_fp8_linear.c compares.
**
** Delayed scaling without host syncs: the metas (scale, inverse scale, amax history)
** live in device memory. A cast kernel reads the scale there and records the tensor's
** amax with an atomic max; the inverse scale it used is copied into a per-call slot the
** GEMMs (and the backward) read; then a one-thread kernel pushes the amax into the
** history and computes the next scale, exactly as tt_fp8_meta_update does on the CPU
** (float arithmetic, same order, IEEE division). With an amax group the amaxes are
** all-reduced (MAX) over the state's group in place on the device (NCCL) before that
** update. The host learns nothing until a checkpoint asks (tt_fp8_linear_state_sync).
**
** Not verified on a GPU: this file compiles here (sm_90a, -Werror) but has not run.
*/
#include "cuda/tt_cuda.h"
#include "tt_cuda_ops.h"
extern "C" {
#include "tetra_amp.h"
#include "cuda/tetra_cuda_lowp.h"
#include "tetra_dist.h"
}

/* Weak, like the engine's references to this library: a test program that links the
** static libraries without the collectives still links (it never sets an amax group),
** while the tetra binary takes the whole engine. */
extern "C" int tt_comm_size(const tt_comm *c) __attribute__((weak));
extern "C" int tt_comm_all_reduce(tt_comm *c, tt_tensor *t, int op) __attribute__((weak));

enum { ROLE_X = 0, ROLE_W = 1, ROLE_G = 2, ROLES = 3 };
/* The inverse scales a call used sit SLOT floats (256 bytes) apart: cuBLASLt is given each
** as a scale pointer, and every FP8 GEMM known to work passes separately allocated
** scalars (the first H200 run, with the three 4 bytes apart, got "not supported"). */
enum { SLOT = 64 };

/* One tensor's scaling state on the device (tt_fp8_meta's fields, in float). */
typedef struct dev_meta {
  float scale, scale_inv, fp8_max;
  int margin, history_len, pos, filled, pad;
  float history[TT_FP8_MAX_HISTORY];
} dev_meta;

/* The device side of a tt_fp8_linear_state (its `device` pointer). */
typedef struct fp8_device {
  int device;
  dev_meta *metas;   /* ROLES metas, device memory */
  tt_tensor *amax;   /* (ROLES) f32 on the device: this call's amaxes, zero between calls */
  int quantised[ROLES];  /* tt_fp8_meta's quantised, kept here: the first quantisation
                         ** scales from its own amax, a later one at the delayed scale */
} fp8_device;

/* -- Kernels ------------------------------------------------------------------------ */

/* max |x| folded into *amax as float bits (non-negative floats order like their bits);
** NaN recorded as +inf, which the update ignores. */
__device__ __forceinline__ void record_amax(float *amax, float v) {
  atomicMax((unsigned int *)amax, __float_as_uint(v));
}

template <typename T>
__global__ void amax_kernel(const T *x, int64_t n, float *amax) {
  __shared__ float scratch[32];
  float a = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = fabsf(tt_ld(x, i));
    a = isnan(v) ? INFINITY : fmaxf(a, v);
  }
  a = tt_block_max(a, scratch);
  if (threadIdx.x == 0) record_amax(amax, a);
}

enum { TILE = 32, TILE_ROWS = 8 };

/* q (rows, cols) = fp8(x * *scale) and, when qt is not NULL, qt (cols, rows) = q^T, from
** one read of x; records max |x| into *amax and, from block 0, the inverse scale and the
** scale used into used[0] and used[1] (each unless NULL: a recompute re-run records
** nothing). Blocks of TILE x TILE_ROWS threads, one TILE x TILE tile each. */
template <typename T>
__global__ void cast_transpose_kernel(const T *x, int64_t rows, int64_t cols,
                                      const float *scale_in, const float *scale_inv_in,
                                      int fp8_dtype, uint8_t *q, uint8_t *qt, float *amax,
                                      float *used) {
  __shared__ uint8_t tile[TILE][TILE + 4];
  __shared__ float scratch[32];
  const __nv_fp8_interpretation_t kind = fp8_dtype == TT_E4M3 ? __NV_E4M3 : __NV_E5M2;
  const float scale = *scale_in;
  const int64_t r0 = (int64_t)blockIdx.y * TILE, c0 = (int64_t)blockIdx.x * TILE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  float a = 0;
  for (int dy = ty; dy < TILE; dy += TILE_ROWS) {
    const int64_t r = r0 + dy, c = c0 + tx;
    if (r < rows && c < cols) {
      const float v = tt_ld(x, r * cols + c);
      a = isnan(v) ? INFINITY : fmaxf(a, fabsf(v));
      const uint8_t code = __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, kind);
      q[r * cols + c] = code;
      tile[dy][tx] = code;
    }
  }
  if (qt) {
    __syncthreads();
    for (int dx = ty; dx < TILE; dx += TILE_ROWS) {
      const int64_t c = c0 + dx, r = r0 + tx;
      if (r < rows && c < cols) qt[c * rows + r] = tile[tx][dx];
    }
  }
  /* tt_block_max wants a flat block: this one is TILE x TILE_ROWS = 256 threads. */
  const int flat = ty * TILE + tx;
  __syncthreads();
  if (flat < 32) scratch[flat] = 0;
  __syncthreads();
  a = tt_warp_max(a);
  if ((flat & 31) == 0) scratch[flat >> 5] = a;
  __syncthreads();
  if (flat == 0) {
    float b = 0;
    for (int i = 0; i < (TILE * TILE_ROWS) / 32; i++) b = fmaxf(b, scratch[i]);
    if (amax) record_amax(amax, b);
    if (used && blockIdx.x == 0 && blockIdx.y == 0) {
      used[0] = *scale_inv_in;
      used[1] = scale;
    }
  }
}

/* For each role in `push`: the amax joins the history and the scale follows, as
** tt_fp8_meta_update; every role in `clear` gets its amax slot zeroed. One thread. */
__global__ void update_kernel(dev_meta *metas, float *amax, int push, int clear) {
  for (int r = 0; r < ROLES; r++) {
    const float a = amax[r];
    if (clear & (1 << r)) amax[r] = 0;
    if (!(push & (1 << r)) || !(a > 0) || isinf(a)) continue;
    dev_meta *m = &metas[r];
    m->history[m->pos] = a;
    m->pos = (m->pos + 1) % m->history_len;
    if (m->filled < m->history_len) m->filled++;
    float h = 0;
    for (int i = 0; i < m->filled; i++) h = fmaxf(h, m->history[i]);
    const float s = __fmul_rn(__fdiv_rn(m->fp8_max, h), ldexpf(1.0f, -m->margin));
    if (isfinite(s) && s > 0) {
      m->scale = s;
      m->scale_inv = __fdiv_rn(1.0f, s);
    }
  }
}

/* Inference (tt_fp8_inference): each role in `roles` gets its slot of `scales` (SLOT
** floats apart: the inverse scale, then the scale) filled from its meta, or, for a role
** in `fresh` (an empty history), with the scale its own amax gives as tt_fp8_meta_update
** would make it; nothing in the metas moves, and the amax slots are zeroed. One thread. */
__global__ void freeze_kernel(const dev_meta *metas, float *amax, int roles, int fresh,
                              float *scales) {
  for (int r = 0; r < ROLES; r++) {
    if (!(roles & (1 << r))) continue;
    const dev_meta *m = &metas[r];
    float s = m->scale, si = m->scale_inv;
    if (fresh & (1 << r)) {
      const float a = amax[r];
      amax[r] = 0;
      const float f = __fmul_rn(__fdiv_rn(m->fp8_max, a), ldexpf(1.0f, -m->margin));
      if (a > 0 && !isinf(a) && isfinite(f) && f > 0) {
        s = f;
        si = __fdiv_rn(1.0f, f);
      }
    }
    scales[r * SLOT] = si;
    scales[r * SLOT + 1] = s;
  }
}

/* -- Device state ------------------------------------------------------------------- */

static void meta_to_dev(const tt_fp8_meta *h, dev_meta *d) {
  memset(d, 0, sizeof *d);
  d->scale = (float)h->scale;
  d->scale_inv = 1.0f / d->scale;
  d->fp8_max = h->dtype == TT_E4M3 ? 448.0f : 57344.0f;   /* tt_fp8_max */
  d->margin = h->margin;
  d->history_len = h->history_len;
  d->pos = h->pos;
  d->filled = h->filled;
  memcpy(d->history, h->amax_history, sizeof d->history);
}

static void meta_from_dev(const dev_meta *d, tt_fp8_meta *h) {
  h->scale = d->scale;
  h->pos = d->pos;
  h->filled = d->filled;
  memcpy(h->amax_history, d->history, sizeof h->amax_history);
}

extern "C" void tt_cuda_fp8_linear_state_free(void *device) {
  fp8_device *d = (fp8_device *)device;
  if (!d) return;
  if (d->metas) cudaFree(d->metas);
  tt_tensor_release(d->amax);
  free(d);
}

extern "C" int tt_cuda_fp8_linear_state_sync(void *device, tt_fp8_linear_state *st,
                                             int to_device) {
  fp8_device *d = (fp8_device *)device;
  tt_fp8_meta *h[ROLES] = {&st->x, &st->w, &st->g};
  dev_meta buf[ROLES];
  TT_CU(cudaSetDevice(d->device));
  if (to_device) {
    for (int r = 0; r < ROLES; r++) {
      meta_to_dev(h[r], &buf[r]);
      d->quantised[r] = h[r]->quantised;
    }
    TT_CU(cudaMemcpy(d->metas, buf, sizeof buf, cudaMemcpyHostToDevice));
    return 0;
  }
  TT_CU(cudaMemcpy(buf, d->metas, sizeof buf, cudaMemcpyDeviceToHost));
  for (int r = 0; r < ROLES; r++) {
    meta_from_dev(&buf[r], h[r]);
    h[r]->quantised = d->quantised[r];
  }
  return 0;
}

/* The state's device copy on `device`, made from the host metas on first use. */
static int device_state(tt_fp8_linear_state *st, int device, fp8_device **out) {
  fp8_device *d = (fp8_device *)st->device;
  if (d) {
    TT_CHECK(d->device == device, "fp8_linear: the layer's scaling state is on cuda:%d, "
             "its tensors on cuda:%d", d->device, device);
    *out = d;
    return 0;
  }
  d = (fp8_device *)calloc(1, sizeof *d);
  TT_CHECK(d != NULL, "fp8_linear: out of host memory");
  d->device = device;
  int64_t n = ROLES;
  int rc = tt_tensor_zeros(&n, 1, TT_F32, device, &d->amax);
  if (rc == 0 && cudaMalloc((void **)&d->metas, sizeof(dev_meta) * ROLES) != cudaSuccess)
    rc = tt_set_error("fp8_linear: cannot allocate the scaling state on cuda:%d", device);
  if (rc == 0) rc = tt_cuda_fp8_linear_state_sync(d, st, 1);
  if (rc != 0) {
    tt_cuda_fp8_linear_state_free(d);
    return -1;
  }
  st->device = d;
  *out = d;
  return 0;
}

/* -- Casting with delayed scales ---------------------------------------------------- */

typedef struct cast_job {
  tt_tensor *x;          /* contiguous, (rows, cols) */
  int64_t rows, cols;
  int role, fp8_dtype;
  tt_tensor *q, *qt;     /* out: codes (rows, cols) and, when want_t, (cols, rows) */
  int want_q, want_t;
} cast_job;

static int launch_amax(const cast_job *j, float *amax) {
  const int64_t n = j->rows * j->cols;
  return tt_cuda_dispatch_float("fp8_linear", j->x->dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    amax_kernel<T><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
        (const T *)tt_tensor_data(j->x), n, amax);
    TT_CU_LAUNCHED("amax_kernel");
    return 0;
  });
}

/* The job's cast at its meta's scale, recording its amax and the scales used in the
** role's slot of `scales`; with `replay`, at the scale already in that slot (a recompute
** re-run: the first run's), recording nothing. */
static int launch_cast(const cast_job *j, fp8_device *d, float *scales, int replay) {
  const dim3 grid((unsigned)((j->cols + TILE - 1) / TILE), (unsigned)((j->rows + TILE - 1) / TILE));
  const dim3 block(TILE, TILE_ROWS);
  float *slot = scales + j->role * SLOT;
  const dev_meta *m = &d->metas[j->role];
  const float *scale = replay ? slot + 1 : &m->scale, *scale_inv = replay ? slot : &m->scale_inv;
  float *amax = replay ? NULL : (float *)tt_tensor_data(d->amax) + j->role;
  return tt_cuda_dispatch_float("fp8_linear", j->x->dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cast_transpose_kernel<T><<<grid, block, 0, tt_cuda_cur_stream()>>>(
        (const T *)tt_tensor_data(j->x), j->rows, j->cols, scale, scale_inv, j->fp8_dtype,
        (uint8_t *)tt_tensor_data(j->q), j->qt ? (uint8_t *)tt_tensor_data(j->qt) : NULL,
        amax, replay ? NULL : slot);
    TT_CU_LAUNCHED("cast_transpose_kernel");
    return 0;
  });
}

/* The amaxes agreed over the group (in place, on the device). */
static int agree(void *group, fp8_device *d) {
  if (!group) return 0;
  TT_CHECK(tt_comm_size && tt_comm_all_reduce,
           "fp8_linear: an amax group in a program linked without the collectives");
  if (tt_comm_size((tt_comm *)group) == 1) return 0;
  if (tt_comm_all_reduce((tt_comm *)group, d->amax, TT_REDUCE_MAX))
    return tt_error_context("fp8_linear: agreeing amax over the amax group");
  return 0;
}

/* How quantise_jobs takes its scales: RECORD (training) at the metas' delayed scales,
** recording the amaxes; REPLAY (a recompute re-run) at those already in the slots (the
** first run's); FROZEN (inference) at the metas' scales, recording nothing. */
enum { Q_RECORD, Q_REPLAY, Q_FROZEN };

/* Quantises the n jobs at their delayed scales (a role's first quantisation from its own
** agreed amax), writing the inverse scale and the scale used into each role's slot of
** `scales` (ROLES slots of SLOT floats, device), then updates the histories; or as `mode`
** says. Everything is queued on the stream: no host sync. */
static int quantise_jobs(cast_job *jobs, int n, fp8_device *d, void *group, float *scales,
                         int mode) {
  int fresh = 0, all = 0;
  for (int i = 0; i < n; i++) {
    cast_job *j = &jobs[i];
    all |= 1 << j->role;
    if (d->quantised[j->role] == 0) fresh |= 1 << j->role;
    int64_t shape[2] = {j->rows, j->cols}, tshape[2] = {j->cols, j->rows};
    TT_TRY(tt_tensor_empty(shape, 2, j->fp8_dtype, d->device, &j->q));
    if (j->want_t) TT_TRY(tt_tensor_empty(tshape, 2, j->fp8_dtype, d->device, &j->qt));
  }
  if (mode == Q_FROZEN) {
    /* The slots filled from the metas (a fresh role's from its own amax, not agreed:
    ** inference never communicates, since a sample may be drawn on one rank of the group
    ** only), then cast as a re-run is: at the slots' scales, recording nothing. */
    float *amax = (float *)tt_tensor_data(d->amax);
    for (int i = 0; i < n; i++)
      if (fresh & (1 << jobs[i].role)) TT_TRY(launch_amax(&jobs[i], amax + jobs[i].role));
    freeze_kernel<<<1, 1, 0, tt_cuda_cur_stream()>>>(d->metas, amax, all, fresh, scales);
    TT_CU_LAUNCHED("freeze_kernel");
  }
  if (mode != Q_RECORD) {
    for (int i = 0; i < n; i++) TT_TRY(launch_cast(&jobs[i], d, scales, 1));
    return 0;
  }
  if (fresh) {
    for (int i = 0; i < n; i++)
      if (fresh & (1 << jobs[i].role)) TT_TRY(launch_amax(&jobs[i], (float *)tt_tensor_data(d->amax) + jobs[i].role));
    TT_TRY(agree(group, d));
    update_kernel<<<1, 1, 0, tt_cuda_cur_stream()>>>(d->metas, (float *)tt_tensor_data(d->amax),
                                                     fresh, fresh);
    TT_CU_LAUNCHED("update_kernel");
  }
  for (int i = 0; i < n; i++) TT_TRY(launch_cast(&jobs[i], d, scales, 0));
  TT_TRY(agree(group, d));
  update_kernel<<<1, 1, 0, tt_cuda_cur_stream()>>>(d->metas, (float *)tt_tensor_data(d->amax),
                                                   all & ~fresh, all);
  TT_CU_LAUNCHED("update_kernel");
  for (int i = 0; i < n; i++) d->quantised[jobs[i].role]++;
  return 0;
}

/* -- GEMMs ---------------------------------------------------------------------------- */

/* Row-major C (m, n) = descale_a descale_b . A (m, k) B (n, k)^T [+ bias], the TN FP8
** GEMM; fast_accum as in tt_cuda_gemm_args. */
static int fp8_gemm(int64_t m, int64_t n, int64_t k, tt_tensor *a, tt_tensor *b, tt_tensor *c,
                    const float *descale_a, const float *descale_b, const void *bias,
                    int fast_accum) {
  tt_cuda_gemm_args g;
  memset(&g, 0, sizeof g);
  g.trans_a = 0;
  g.trans_b = 1;
  g.m = m; g.n = n; g.k = k;
  g.a = tt_tensor_data(a); g.lda = k; g.a_dtype = a->dtype;
  g.b = tt_tensor_data(b); g.ldb = k; g.b_dtype = b->dtype;
  g.c = tt_tensor_data(c); g.ldc = n; g.c_dtype = c->dtype;
  g.batch = 1;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.bias = bias;
  g.a_scale = descale_a;
  g.b_scale = descale_b;
  g.fast_accum = fast_accum;
  return tt_cuda_lt_gemm(&g);
}

/* t as `dtype` (t itself, retained, when it already is), the same shape. */
static int as_dtype(tt_tensor *t, int dtype, tt_tensor **out) {
  return tt_cuda_cast_contiguous(t, dtype, out);
}

/* -- The op --------------------------------------------------------------------------- */

/* inputs: x, w, bias; saved[0] = q_x^T (in, rows), saved[1] = q_w^T (in, out),
** saved[2] = the inverse scales (ROLES slots of SLOT f32; slot ROLE_G written by backward).
** i[0..2] = rows, in, out. */
static int fp8_linear_backward(tt_node *node, tt_tensor *grad_out) {
  tt_fp8_linear_state *st = (tt_fp8_linear_state *)node->ctx;
  tt_tensor *x = node->inputs[0], *w = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *qxt = node->saved[0], *qwt = node->saved[1], *sinv = node->saved[2];
  const int64_t rows = node->i[0], in = node->i[1], outf = node->i[2];
  fp8_device *d = (fp8_device *)st->device;
  float *si = (float *)tt_tensor_data(sinv);
  tt_tensor *g = NULL, *dx = NULL, *dx2 = NULL, *dxv = NULL, *dw = NULL, *dw2 = NULL;
  tt_tensor *g32 = NULL, *g2d = NULL, *db = NULL;
  cast_job job;
  memset(&job, 0, sizeof job);
  int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = tt_contiguous_nograd(grad_out, &g);
  if (rc == 0) {
    job.x = g; job.rows = rows; job.cols = outf; job.role = ROLE_G;
    job.fp8_dtype = TT_E5M2; job.want_t = tt_needs_grad(w);
    rc = quantise_jobs(&job, 1, d, st->amax_group, si, Q_RECORD);
  }
  if (rc == 0 && tt_needs_grad(x)) {
    /* dX (rows, in) = q_g (rows, out) . (q_w^T (in, out))^T, bf16 */
    int64_t shape[2] = {rows, in};
    rc = tt_tensor_empty(shape, 2, TT_BF16, d->device, &dx);
    if (rc == 0)
      rc = fp8_gemm(rows, in, outf, job.q, qwt, dx, si + ROLE_G * SLOT, si + ROLE_W * SLOT,
                    NULL, 0);
    if (rc == 0) rc = as_dtype(dx, x->dtype, &dx2);
    if (rc == 0) rc = tt_view(dx2, x->shape, x->ndim, &dxv);
    if (rc == 0) rc = tt_accumulate_grad(x, dxv);
  }
  if (rc == 0 && tt_needs_grad(w)) {
    /* dW (out, in) = q_g^T (out, rows) . (q_x^T (in, rows))^T, f32 */
    int64_t shape[2] = {outf, in};
    rc = tt_tensor_empty(shape, 2, TT_F32, d->device, &dw);
    if (rc == 0)
      rc = fp8_gemm(outf, in, rows, job.qt, qxt, dw, si + ROLE_G * SLOT, si + ROLE_X * SLOT,
                    NULL, 0);
    if (rc == 0) rc = as_dtype(dw, w->dtype, &dw2);
    if (rc == 0) rc = tt_accumulate_grad(w, dw2);
  }
  if (rc == 0 && bias && tt_needs_grad(bias)) {
    /* The bias gradient needs no GEMM: the unquantised gradient's column sums, in f32,
    ** over every row of a gradient of any rank (viewed as rows x out). */
    int dims[1] = {0};
    int64_t g_shape[2] = {rows, outf};
    rc = as_dtype(g, TT_F32, &g32);
    if (rc == 0) rc = tt_view(g32, g_shape, 2, &g2d);
    if (rc == 0) rc = tt_sum(g2d, dims, 1, 0, &db);
    if (rc == 0) rc = tt_accumulate_grad(bias, db);
  }
  tt_set_grad_enabled(grad);
  tt_tensor *all[] = {g, job.q, job.qt, dx, dx2, dxv, dw, dw2, g32, g2d, db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  return rc ? tt_error_context("fp8_linear backward") : 0;
}

extern "C" int tt_cuda_fp8_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias,
                                  tt_fp8_linear_state *st, tt_tensor **out) {
  const int64_t in = w->shape[1], outf = w->shape[0];
  int64_t rows = 1;
  for (int dd = 0; dd < x->ndim - 1; dd++) rows *= x->shape[dd];
  /* cuBLASLt's FP8 GEMMs need every leading dimension a multiple of 16 bytes: in and out
  ** (forward, dX) and the row count (dW contracts over the rows). */
  TT_CHECK(in % 16 == 0 && outf % 16 == 0 && rows % 16 == 0,
           "fp8_linear on cuda: in features (%lld), out features (%lld) and rows (%lld, the "
           "product of x's leading dims) must be multiples of 16 for cuBLASLt's FP8 GEMMs",
           (long long)in, (long long)outf, (long long)rows);
  /* The casts tile each operand in 32 x 32 blocks over a grid whose second dimension
  ** holds at most 65535: no operand may have more than 65535 x 32 rows (the gradient's
  ** are x's rows, the weight's its out features), and an empty one launches no grid. */
  const int64_t most = 65535 * (int64_t)TILE, longest = rows > outf ? rows : outf;
  TT_CHECK(in > 0 && outf > 0 && rows > 0 && longest <= most,
           "fp8_linear on cuda: %lld rows, %lld in and %lld out features; each must be "
           "between 1 and %lld (the casts' grid): split the micro-batch "
           "(train.gradient_accumulation_steps) or the layer (tensor parallelism)",
           (long long)rows, (long long)in, (long long)outf, (long long)most);
  TT_CU(cudaSetDevice(x->device));
  fp8_device *d = NULL;
  TT_TRY(device_state(st, x->device, &d));
  tt_tensor *ins[3] = {x, w, bias};
  tt_tensor *xc = NULL, *wc = NULL, *bc = NULL, *sinv = NULL, *y = NULL, *y2 = NULL, *yv = NULL;
  cast_job jobs[2];
  memset(jobs, 0, sizeof jobs);
  int64_t nroles = ROLES * SLOT;
  int64_t y_shape[TT_MAX_DIMS];
  for (int dd = 0; dd < x->ndim - 1; dd++) y_shape[dd] = x->shape[dd];
  y_shape[x->ndim - 1] = outf;
  const int record = tt_should_record(ins, 3);
  /* Read before recording is turned off below: a re-run, inference, or training. */
  const int mode = tt_checkpoint_mode() == TT_CKPT_REPLAYING ? Q_REPLAY
                   : tt_fp8_inference() ? Q_FROZEN : Q_RECORD;
  int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = tt_contiguous_nograd(x, &xc);
  if (rc == 0) rc = tt_contiguous_nograd(w, &wc);
  if (rc == 0 && bias) rc = as_dtype(bias, TT_BF16, &bc);
  /* Activation recompute (tt_checkpoint): a checkpointed block's first run stashes the
  ** scales it used (this tensor, on the device: no host read) and its re-run in backward
  ** quantises with them, recording no amax, so the histories move once per forward and
  ** the re-run's codes and product are the first run's (engine/ops/fp8.c does the same
  ** with host values). */
  const int replay = mode == Q_REPLAY;
  if (rc == 0 && replay) {
    rc = tt_checkpoint_replay_tensor(&sinv);
    if (rc == 0 && (sinv->device != x->device || tt_tensor_numel(sinv) != nroles))
      rc = tt_set_error("fp8_linear: the re-run's stashed scales are not this layer's (the "
                        "block's forward took another path)");
  } else if (rc == 0) {
    rc = tt_tensor_zeros(&nroles, 1, TT_F32, x->device, &sinv);
    if (rc == 0) rc = tt_checkpoint_stash_tensor(sinv);
  }
  if (rc == 0) {
    jobs[0].x = xc; jobs[0].rows = rows; jobs[0].cols = in; jobs[0].role = ROLE_X;
    jobs[0].fp8_dtype = TT_E4M3; jobs[0].want_t = record && tt_needs_grad(w);
    jobs[1].x = wc; jobs[1].rows = outf; jobs[1].cols = in; jobs[1].role = ROLE_W;
    jobs[1].fp8_dtype = TT_E4M3; jobs[1].want_t = record && tt_needs_grad(x);
    rc = quantise_jobs(jobs, 2, d, st->amax_group, (float *)tt_tensor_data(sinv), mode);
  }
  /* Selective recompute's re-run takes the product its first run kept (the codes are
  ** still made above: backward saves them), and the first run keeps a copy. */
  if (rc == 0) rc = tt_checkpoint_take_output(y_shape, x->ndim, x->dtype, x->device, &yv);
  const int kept = yv != NULL;
  if (rc == 0 && !kept) {
    /* Y (rows, out) = q_x (rows, in) . q_w (out, in)^T + bias, bf16 */
    int64_t shape[2] = {rows, outf};
    const float *si = (const float *)tt_tensor_data(sinv);
    rc = tt_tensor_empty(shape, 2, TT_BF16, x->device, &y);
    if (rc == 0) rc = fp8_gemm(rows, outf, in, jobs[0].q, jobs[1].q, y, si + ROLE_X * SLOT,
                               si + ROLE_W * SLOT, bc ? tt_tensor_data(bc) : NULL, st->fast_accum);
    if (rc == 0) rc = as_dtype(y, x->dtype, &y2);
    if (rc == 0) rc = tt_view(y2, y_shape, x->ndim, &yv);
    if (rc == 0) rc = tt_checkpoint_keep_copy(yv);
  }
  tt_set_grad_enabled(grad);
  if (rc == 0 && record) {
    tt_node *node = tt_record("fp8_linear", fp8_linear_backward, yv, ins, 3);
    if (!node) {
      rc = -1;
    } else {
      node->ctx = st;
      node->whole = 1;   /* backward records the gradient's amax: one run only */
      /* Backward needs q_x^T only for dW and q_w^T only for dX; an empty placeholder
      ** keeps the slots fixed when one is not needed. */
      tt_node_save(node, jobs[0].qt ? jobs[0].qt : jobs[0].q);
      tt_node_save(node, jobs[1].qt ? jobs[1].qt : jobs[1].q);
      tt_node_save(node, sinv);
      node->i[0] = rows;
      node->i[1] = in;
      node->i[2] = outf;
    }
  }
  tt_tensor *all[] = {xc, wc, bc, sinv, y, y2, jobs[0].q, jobs[0].qt, jobs[1].q, jobs[1].qt};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  if (rc != 0) {
    tt_tensor_release(yv);
    return -1;
  }
  *out = yv;
  return 0;
}

TT_CUDA_FAMILY(fp8_linear)
