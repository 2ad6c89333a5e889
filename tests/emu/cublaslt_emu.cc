/*
** cublaslt_emu.cc — libcublasLt.so.<major> for the emulated device (TETRA_CUDA_EMU): the
** thirteen entry points kernels/kernel_cuda.h lists, found by the engine's loader
** (engine/runtime/cuda.cu) on LD_LIBRARY_PATH as it would find NVIDIA's. "Device" memory
** is host memory here, so a matmul is a loop over it: column-major, as cuBLASLt's API is,
** D = alpha * a_scale * b_scale * op(A) op(B) + beta * C (+ bias per row of D), each
** operand of f32, bf16, f16, e4m3 or e5m2 widened to f32 first, the product by OpenBLAS,
** D rounded once to its type; batched through the layouts' batch count and stride. On a stream being captured
** the product is recorded (tt_emu_submit) and computed at each replay.
**
** What it does not do: any descriptor attribute the engine does not set (it says so and
** fails), pointer-mode device scalars, other epilogues, and the speed or the rounding of
** NVIDIA's kernels (tensor cores sum in other orders; comparisons allow for it).
*/
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cblas.h>

extern "C" int tt_emu_submit(cudaStream_t s, void (*fn)(void *), void *ctx,
                             void (*free_ctx)(void *)) __attribute__((weak));

namespace {

struct Desc {
  cublasComputeType_t compute;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t bias_type = CUDA_R_32F;
  const void *bias = nullptr;
  const float *a_scale = nullptr, *b_scale = nullptr;
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Pref {
  int unused;
};

const char *g_why = "";

cublasStatus_t refuse(const char *why) {
  g_why = why;
  fprintf(stderr, "cublaslt_emu: %s\n", why);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

double load(const void *p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)p)[i],
                                             t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
      return __half2float(__half(h));
    }
    default: abort();
  }
}

void store(void *p, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn((float)v); break;
    default: abort();
  }
}

bool known(cudaDataType_t t) {
  return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F || t == CUDA_R_8F_E4M3 ||
         t == CUDA_R_8F_E5M2;
}

struct Call {
  Desc d;
  Layout la, lb, lc, ld;
  float alpha, beta;
  const void *a, *b, *c;
  void *out;
};

/* Per batch: op(A) and op(B) widened to f32 column-major copies, their product by
** OpenBLAS (f32 sums: the emulated tensor cores' order), then the epilogue in f64. */
void matmul(void *p) {
  const Call &q = *(const Call *)p;
  const uint64_t m = q.ld.rows, n = q.ld.cols;
  const uint64_t k = q.d.ta == CUBLAS_OP_N ? q.la.cols : q.la.rows;
  const double scale = (double)q.alpha * (q.d.a_scale ? *q.d.a_scale : 1.0f) *
                       (q.d.b_scale ? *q.d.b_scale : 1.0f);
  std::vector<float> a(m * k), b(k * n), t(m * n);
  for (int32_t bt = 0; bt < q.ld.batch; bt++) {
    const int64_t oa = bt * q.la.stride, ob = bt * q.lb.stride, oc = bt * q.lc.stride,
                  od = bt * q.ld.stride;
    for (uint64_t l = 0; l < k; l++)
      for (uint64_t i = 0; i < m; i++)
        a[i + l * m] = (float)load(q.a, q.la.type,
                                   oa + (q.d.ta == CUBLAS_OP_N ? (int64_t)(i + l * q.la.ld)
                                                               : (int64_t)(l + i * q.la.ld)));
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t l = 0; l < k; l++)
        b[l + j * k] = (float)load(q.b, q.lb.type,
                                   ob + (q.d.tb == CUBLAS_OP_N ? (int64_t)(l + j * q.lb.ld)
                                                               : (int64_t)(j + l * q.lb.ld)));
    if (k > 0)
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                  a.data(), (int)(m ? m : 1), b.data(), (int)(k ? k : 1), 0.0f, t.data(),
                  (int)(m ? m : 1));
    else
      std::fill(t.begin(), t.end(), 0.0f);
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t i = 0; i < m; i++) {
        double v = scale * t[i + j * m];
        if (q.beta != 0.0f) v += (double)q.beta * load(q.c, q.lc.type, oc + i + j * q.lc.ld);
        if (q.d.epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(q.d.bias, q.d.bias_type, (int64_t)i);
        store(q.out, q.ld.type, od + (int64_t)(i + j * q.ld.ld), v);
      }
  }
}

template <typename T>
cublasStatus_t set(T *dst, const void *buf, size_t n) {
  if (n != sizeof(T)) return refuse("an attribute of the wrong size");
  memcpy(dst, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  static int handle;
  *h = (cublasLtHandle_t)&handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success (emulated)" : g_why;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return refuse("a scale type other than f32");
  Desc *x = new Desc;
  x->compute = compute;
  *d = (cublasLtMatmulDesc_t)x;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete (Desc *)d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a,
                                              const void *buf, size_t n) {
  Desc *x = (Desc *)d;
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&x->ta, buf, n);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&x->tb, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (set(&x->epilogue, buf, n) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
      return x->epilogue == CUBLASLT_EPILOGUE_DEFAULT || x->epilogue == CUBLASLT_EPILOGUE_BIAS
                 ? CUBLAS_STATUS_SUCCESS
                 : refuse("an epilogue other than BIAS");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&x->bias_type, buf, n);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&x->bias, buf, n);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set(&x->a_scale, buf, n);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set(&x->b_scale, buf, n);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return CUBLAS_STATUS_SUCCESS;   /* f32 sums here */
    default: return refuse("a matmul descriptor attribute the engine does not set");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!known(type)) return refuse("a matrix type other than f32, bf16, f16 or fp8");
  Layout *x = new Layout;
  x->type = type, x->rows = rows, x->cols = cols, x->ld = ld;
  *l = (cublasLtMatrixLayout_t)x;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete (Layout *)l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n) {
  Layout *x = (Layout *)l;
  switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(&x->batch, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set(&x->stride, buf, n);
    default: return refuse("a layout attribute the engine does not set");
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = (cublasLtMatmulPreference_t) new Pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete (Pref *)p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n) {
  (void)p, (void)a, (void)buf, (void)n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *out,
                                              int *found) {
  (void)h, (void)d, (void)a, (void)b, (void)c, (void)dl, (void)p;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  memset(out, 0, sizeof *out);
  out->state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t la, const void *B,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                              cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t stream) {
  (void)h, (void)algo, (void)ws, (void)ws_bytes;
  Call *q = new Call;
  q->d = *(const Desc *)d;
  q->la = *(const Layout *)la, q->lb = *(const Layout *)lb;
  q->lc = *(const Layout *)lc, q->ld = *(const Layout *)ld;
  q->alpha = *(const float *)alpha;
  q->beta = *(const float *)beta;
  q->a = A, q->b = B, q->c = C, q->out = D;
  const uint64_t k = q->d.ta == CUBLAS_OP_N ? q->la.cols : q->la.rows;
  const uint64_t kb = q->d.tb == CUBLAS_OP_N ? q->lb.rows : q->lb.cols;
  const uint64_t ma = q->d.ta == CUBLAS_OP_N ? q->la.rows : q->la.cols;
  const uint64_t nb = q->d.tb == CUBLAS_OP_N ? q->lb.cols : q->lb.rows;
  if (k != kb || ma != q->ld.rows || nb != q->ld.cols || q->lc.rows != q->ld.rows ||
      q->lc.cols != q->ld.cols) {
    delete q;
    return refuse("matmul shapes that do not agree");
  }
  if (tt_emu_submit)
    tt_emu_submit(stream, matmul, q, [](void *p) { delete (Call *)p; });
  else {
    matmul(q);
    delete q;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
