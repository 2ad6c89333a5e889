/*
** matmul.cu — CUDA kernels of the matmul family (kernels/matmul.h) through cuBLASLt, and
** the general cuBLASLt entry point (tt_cuda_lt_gemm, engine/cuda/tt_cuda_ops.h) that the
** bf16 / fp16 paths (fp32 accumulation, bias epilogue) and FP8 (per-tensor scales) use.
**
** The engine's matrices are row-major, cuBLASLt's column-major. A row-major (m, n) matrix
** is the column-major (n, m) matrix with the same leading dimension, so
**   C = op(A) op(B)  (row-major)   is   C^T = op(B)^T op(A)^T  (column-major):
** the operands swap places, keep their trans flags, and m and n swap.
*/
#include "kernel_cuda.h"
#include "tt_cuda_ops.h"
#include <unordered_map>
extern "C" {
#include "matmul.h"
}

static cudaDataType_t lt_type(int dtype) {
  switch (dtype) {
    case TT_ELEM_BF16: return CUDA_R_16BF;
    case TT_ELEM_F16: return CUDA_R_16F;
    case TT_ELEM_E4M3: return CUDA_R_8F_E4M3;
    case TT_ELEM_E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

/* Column-major D (rows, cols) = alpha op(X) op(Y) + beta C, batched; see the header. */
typedef struct lt_call {
  cublasOperation_t op_x, op_y;
  int64_t rows, cols, k;
  const void *x; int64_t ldx, stride_x; int x_dtype;
  const void *y; int64_t ldy, stride_y; int y_dtype;
  void *c; int64_t ldc, stride_c; int c_dtype;
  int64_t batch;
  float alpha, beta;
  const void *bias;                   /* (rows), c's dtype or f32; NULL: no epilogue */
  const float *x_scale, *y_scale;     /* device scalars for fp8 operands, or NULL */
  int tf32;                           /* allow tf32 for f32 operands */
  int fast_accum;                     /* fp8: CUBLASLT_MATMUL_DESC_FAST_ACCUM */
} lt_call;

static int lt_layout(cublasLtMatrixLayout_t *l, int dtype, int64_t r, int64_t c, int64_t ld,
                     int64_t batch, int64_t stride) {
  TT_CU(cublasLtMatrixLayoutCreate(l, lt_type(dtype), (uint64_t)r, (uint64_t)c, ld));
  if (batch > 1) {
    int32_t b = (int32_t)batch;
    TT_CU(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
    TT_CU(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof stride));
  }
  return 0;
}

/* The largest power of two (at most 256) dividing the address of every matrix of a
** batch. */
static uint32_t lt_alignment(const void *p, int64_t stride, int dtype, int64_t batch) {
  uintptr_t bits = (uintptr_t)p;
  if (batch > 1) bits |= (uintptr_t)(stride * (int64_t)tt_dtype_size(dtype));
  uint32_t a = 256;
  while (a > 1 && (bits & (a - 1))) a >>= 1;
  return a;
}

/* -- The plan cache ---------------------------------------------------------------------
** A GEMM needs a matmul descriptor, three matrix layouts and an algorithm from cuBLASLt's
** heuristic; the heuristic query costs more host time than the descriptors it reads, and
** a training step asks the same few dozen questions every step. All of it depends only
** on the call's shape: the device, every field of the call but the data pointers (the
** scale pointers only by presence, the bias pointer by presence and alignment: the
** heuristic reads the bias pointer's value for the alignment it may assume, cublasLt.h on
** CUBLASLT_MATMUL_DESC_BIAS_POINTER), the operands' alignments and the workspace size. So each question's descriptors and algorithm are kept (a plan), and a call that
** finds its plan sets only the pointers that are descriptor attributes (bias, scales)
** before the matmul. One cache per host thread, so no lock; its plans are destroyed when
** it is full (a model has far fewer shapes). */
struct lt_key {
  int device, op_x, op_y, x_dtype, y_dtype, c_dtype, bias, bias_dtype, scaled, tf32,
      fast_accum, bias_align;   /* 12 ints: the int64s start 8-aligned, no padding */
  int64_t rows, cols, k, ldx, ldy, ldc, stride_x, stride_y, stride_c, batch;
  uint32_t align[4];
  size_t ws_bytes;
  bool operator==(const lt_key &o) const { return memcmp(this, &o, sizeof o) == 0; }
};
/* No padding anywhere, so equal fields are equal bytes however a key was copied. */
static_assert(sizeof(lt_key) == 12 * sizeof(int) + 10 * sizeof(int64_t) +
                                    4 * sizeof(uint32_t) + sizeof(size_t),
              "lt_key has padding");

struct lt_key_hash {
  size_t operator()(const lt_key &key) const {   /* FNV-1a over the key's bytes */
    const unsigned char *p = (const unsigned char *)&key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof key; i++) h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)h;
  }
};

struct lt_plan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lx, ly, lc;
  cublasLtMatmulAlgo_t algo;
};

static void plan_destroy(lt_plan *p) {
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->ly) cublasLtMatrixLayoutDestroy(p->ly);
  if (p->lx) cublasLtMatrixLayoutDestroy(p->lx);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof *p);
}

enum { LT_CACHE_MAX = 4096 };
/* The plans live until the thread ends (descriptors are host memory; nothing to release
** on the device). */
static thread_local std::unordered_map<lt_key, lt_plan, lt_key_hash> g_plans;
static thread_local int64_t g_plans_made, g_plans_reused;

extern "C" void tt_cuda_gemm_plan_counts(int64_t *made, int64_t *reused) {
  if (made) *made = g_plans_made;
  if (reused) *reused = g_plans_reused;
}

static lt_key key_of(const lt_call *q, int device, const uint32_t align[4], size_t ws_bytes) {
  lt_key key;
  memset(&key, 0, sizeof key);   /* padding too: keys compare as bytes */
  key.device = device;
  key.op_x = (int)q->op_x;
  key.op_y = (int)q->op_y;
  key.x_dtype = q->x_dtype;
  key.y_dtype = q->y_dtype;
  key.c_dtype = q->c_dtype;
  key.bias = q->bias != NULL;
  key.bias_dtype = q->bias ? q->c_dtype : -1;
  key.bias_align = q->bias ? (int)lt_alignment(q->bias, 0, q->c_dtype, 1) : 0;
  key.scaled = (q->x_scale != NULL) | (q->y_scale != NULL) << 1;
  key.tf32 = q->tf32;
  key.fast_accum = q->fast_accum;
  key.rows = q->rows;
  key.cols = q->cols;
  key.k = q->k;
  key.ldx = q->ldx;
  key.ldy = q->ldy;
  key.ldc = q->ldc;
  key.batch = q->batch;
  key.stride_x = q->batch > 1 ? q->stride_x : 0;
  key.stride_y = q->batch > 1 ? q->stride_y : 0;
  key.stride_c = q->batch > 1 ? q->stride_c : 0;
  memcpy(key.align, align, sizeof key.align);
  key.ws_bytes = ws_bytes;
  return key;
}

/* The call's pointers that are descriptor attributes: set on every call, cached plan or
** new. */
static int set_pointers(cublasLtMatmulDesc_t desc, const lt_call *q) {
  if (q->bias)
    TT_CU(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &q->bias,
                                         sizeof q->bias));
  if (q->x_scale)
    TT_CU(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                         &q->x_scale, sizeof q->x_scale));
  if (q->y_scale)
    TT_CU(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                         &q->y_scale, sizeof q->y_scale));
  return 0;
}

/* A new plan for q: its descriptors, and the heuristic's first algorithm under a
** preference (freed here) that states the workspace and the operands' alignments. */
static int plan_make(const lt_call *q, cublasLtHandle_t h, size_t ws_bytes,
                     const uint32_t align[4], lt_plan *p) {
  int fp32_in = q->x_dtype == TT_ELEM_F32 && q->y_dtype == TT_ELEM_F32;
  cublasComputeType_t compute = fp32_in && q->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                   : CUBLAS_COMPUTE_32F;
  TT_CU(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  TT_CU(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &q->op_x,
                                       sizeof q->op_x));
  TT_CU(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &q->op_y,
                                       sizeof q->op_y));
  if (q->bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bt = q->c_dtype == TT_ELEM_F32 ? CUDA_R_32F : lt_type(q->c_dtype);
    TT_CU(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                         sizeof epi));
    TT_CU(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                         sizeof bt));
  }
  TT_TRY(set_pointers(p->desc, q));
  if (q->fast_accum) {
    const int8_t on = 1;
    TT_CU(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on,
                                         sizeof on));
  }
  int tx = q->op_x == CUBLAS_OP_T, ty = q->op_y == CUBLAS_OP_T;
  TT_TRY(lt_layout(&p->lx, q->x_dtype, tx ? q->k : q->rows, tx ? q->rows : q->k, q->ldx,
                   q->batch, q->stride_x));
  TT_TRY(lt_layout(&p->ly, q->y_dtype, ty ? q->cols : q->k, ty ? q->k : q->cols, q->ldy,
                   q->batch, q->stride_y));
  TT_TRY(lt_layout(&p->lc, q->c_dtype, q->rows, q->cols, q->ldc, q->batch, q->stride_c));
  cublasLtMatmulPreference_t pref = NULL;
  TT_CU(cublasLtMatmulPreferenceCreate(&pref));
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]);
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->lx, p->ly, p->lc, p->lc, pref, 1,
                                        &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return tt_cu_fail(st, "cuBLASLt heuristic", __FILE__, __LINE__);
  TT_CHECK(found > 0, "cuBLASLt: no algorithm for a %lldx%lldx%lld GEMM (%s x %s -> %s)",
           (long long)q->rows, (long long)q->cols, (long long)q->k, tt_dtype_name(q->x_dtype),
           tt_dtype_name(q->y_dtype), tt_dtype_name(q->c_dtype));
  p->algo = heur.algo;
  return 0;
}

static int lt_run(const lt_call *q) {
  cublasLtHandle_t h;
  void *ws;
  size_t ws_bytes;
  TT_TRY(tt_cuda_blaslt(&h, &ws, &ws_bytes));
  /* The heuristic assumes 256-byte aligned matrices unless told otherwise, and may then
  ** pick a kernel that faults on a view's data (a narrow, a batch offset, a row of an
  ** odd-sized matrix): each operand's real alignment is part of the question. */
  const uint32_t align[4] = {lt_alignment(q->x, q->stride_x, q->x_dtype, q->batch),
                             lt_alignment(q->y, q->stride_y, q->y_dtype, q->batch),
                             lt_alignment(q->c, q->stride_c, q->c_dtype, q->batch),
                             lt_alignment(q->c, q->stride_c, q->c_dtype, q->batch)};
  int device = -1;
  TT_CU(cudaGetDevice(&device));
  const lt_key key = key_of(q, device, align, ws_bytes);
  auto hit = g_plans.find(key);
  const lt_plan *plan;
  if (hit != g_plans.end()) {
    plan = &hit->second;
    TT_TRY(set_pointers(plan->desc, q));
    g_plans_reused++;
  } else {
    lt_plan fresh;
    memset(&fresh, 0, sizeof fresh);
    if (plan_make(q, h, ws_bytes, align, &fresh)) {
      plan_destroy(&fresh);
      return -1;
    }
    if (g_plans.size() >= LT_CACHE_MAX) {
      for (auto &kv : g_plans) plan_destroy(&kv.second);
      g_plans.clear();
    }
    plan = &g_plans.emplace(key, fresh).first->second;
    g_plans_made++;
  }
  TT_CU(cublasLtMatmul(h, plan->desc, &q->alpha, q->x, plan->lx, q->y, plan->ly, &q->beta,
                       q->c, plan->lc, q->c, plan->lc, &plan->algo, ws, ws_bytes,
                       tt_cuda_cur_stream()));
  TT_CU_LAUNCHED("cublasLtMatmul");
  return 0;
}

/* Row-major C (m, n) = alpha op(A) op(B) + beta C, the row-major -> column-major swap. */
extern "C" int tt_cuda_lt_gemm(const tt_cuda_gemm_args *g) {
  if (g->m == 0 || g->n == 0 || g->batch == 0) return 0;
  lt_call q;
  memset(&q, 0, sizeof q);
  q.op_x = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  q.op_y = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  q.rows = g->n;
  q.cols = g->m;
  q.k = g->k;
  q.x = g->b; q.ldx = g->ldb; q.stride_x = g->stride_b; q.x_dtype = g->b_dtype;
  q.y = g->a; q.ldy = g->lda; q.stride_y = g->stride_a; q.y_dtype = g->a_dtype;
  q.c = g->c; q.ldc = g->ldc; q.stride_c = g->stride_c; q.c_dtype = g->c_dtype;
  q.batch = g->batch;
  q.alpha = g->alpha;
  q.beta = g->beta;
  q.bias = g->bias;
  q.x_scale = g->b_scale;
  q.y_scale = g->a_scale;
  q.tf32 = g->allow_tf32;
  q.fast_accum = g->fast_accum;
  return lt_run(&q);
}

static int gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                int64_t batch) {
  if (k == 0) {
    /* An empty sum: C = beta C (beta 0 clears, whatever C held). */
    TT_CHECK(beta == 0 || beta == 1, "gemm: k = 0 with beta %g is not supported", beta);
    if (beta == 0)
      for (int64_t i = 0; i < batch; i++)
        TT_CU(cudaMemset2DAsync(c + i * stride_c, (size_t)ldc * sizeof(float), 0,
                                (size_t)n * sizeof(float), (size_t)m, tt_cuda_cur_stream()));
    return 0;
  }
  tt_cuda_gemm_args g;
  memset(&g, 0, sizeof g);
  g.trans_a = trans_a; g.trans_b = trans_b;
  g.m = m; g.n = n; g.k = k;
  g.a = a; g.lda = lda; g.stride_a = stride_a; g.a_dtype = TT_ELEM_F32;
  g.b = b; g.ldb = ldb; g.stride_b = stride_b; g.b_dtype = TT_ELEM_F32;
  g.c = c; g.ldc = ldc; g.stride_c = stride_c; g.c_dtype = TT_ELEM_F32;
  g.batch = batch;
  g.alpha = alpha;
  g.beta = beta;
  return tt_cuda_lt_gemm(&g);
}

__global__ void bias_fill_kernel(float *c, const float *bias, int64_t rows, int64_t n,
                                 int64_t ldc) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < rows * n;
       k += (int64_t)gridDim.x * blockDim.x)
    c[(k / n) * ldc + k % n] = bias[k % n];
}

static int bias_fill(float *c, const float *bias, int64_t rows, int64_t n, int64_t ldc) {
  if (rows * n == 0) return 0;
  bias_fill_kernel<<<tt_cuda_blocks(rows * n, 256), 256, 0, tt_cuda_cur_stream()>>>(c, bias, rows,
                                                                                n, ldc);
  TT_CU_LAUNCHED("bias_fill_kernel");
  return 0;
}

/* Column sums, each thread one column, rows in order: deterministic. */
__global__ void bias_grad_kernel(float *gbias, const float *g, int64_t rows, int64_t n) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= n) return;
  float s = 0;
  for (int64_t i = 0; i < rows; i++) s += g[i * n + j];
  gbias[j] = s;
}

static int bias_backward(float *gbias, const float *g, int64_t rows, int64_t n) {
  if (n == 0) return 0;
  bias_grad_kernel<<<(unsigned)((n + 127) / 128), 128, 0, tt_cuda_cur_stream()>>>(gbias, g, rows, n);
  TT_CU_LAUNCHED("bias_grad_kernel");
  return 0;
}

extern "C" const tt_matmul_kernels tt_matmul_cuda = {
  gemm, bias_fill, bias_backward, NULL,   /* bf16: an op of its own (matmul_lowp.cu) */
};

TT_CUDA_FAMILY(matmul)
