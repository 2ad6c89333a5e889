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
** What it checks, as NVIDIA's does or as a GPU would show (cublasLtMatmul's documentation):
**  - FP8 operands only as Hopper takes them: A transposed and B not ("TN"), both FP8 and
**    not both e5m2, f32 compute, and every leading dimension, batch stride and pointer a
**    multiple of 16 bytes; the heuristic finds no algorithm otherwise;
**  - the alignment an algorithm was chosen for: the heuristic's answer assumes each
**    operand at least as aligned as the preference said (256 bytes unless told), and a
**    matmul given a less aligned operand fails (on a GPU: a misaligned access, or a
**    silently wrong kernel);
**  - every matrix, the bias, the scales and the workspace inside live device memory (the
**    emulator's buffers), the whole extent each layout covers.
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
/* The emulator's (cuda_emu.cc): whether [p, p + bytes] lies in one live device buffer. */
extern "C" int tt_emu_on_device(const void *p, size_t bytes) __attribute__((weak));
/* Fails the work running now (cudaErrorIllegalAddress for cudaGetLastError), as a fault. */
extern "C" void tt_emu_fault(const char *why) __attribute__((weak));

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

/* The preference's minimum alignments of A, B, C and D, in bytes (cuBLASLt's default:
** 256), and its workspace bound. */
struct Pref {
  uint32_t align[4] = {256, 256, 256, 256};
  uint64_t workspace = 0;
};

/* What the emulated heuristic puts in cublasLtMatmulAlgo_t's opaque words. */
constexpr uint64_t kAlgoMagic = 0x7474656d75616c67ull;   /* "ttemualg" */
enum { ALGO_MAGIC = 0, ALGO_ALIGN = 1 };   /* words 1-4: the alignments assumed */

const char *g_why = "";

cublasStatus_t refuse(const char *why, cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED) {
  g_why = why;
  fprintf(stderr, "cublaslt_emu: %s\n", why);
  return st;
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

size_t elem_bytes(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 1;
}

bool fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

/* The largest power of two up to 256 that divides the address and, when batched, the
** batch stride in bytes: every batch's matrix must be as aligned as the first. (The
** engine's own rule, lt_alignment in kernels/cuda/matmul.cu, is the same, so a mistake
** in that rule does not show here; the plan cache's use of it does.) */
uint32_t alignment_of(const void *p, const Layout &l) {
  uintptr_t bits = (uintptr_t)p;
  if (l.batch > 1) bits |= (uintptr_t)(l.stride * (int64_t)elem_bytes(l.type));
  uint32_t a = 256;
  while (a > 1 && (bits & (a - 1))) a >>= 1;
  return a;
}

/* Bytes from a layout's first element to just past its last, every batch. */
size_t extent(const Layout &l) {
  if (!l.rows || !l.cols || l.batch < 1) return 0;
  const uint64_t last = (l.cols - 1) * (uint64_t)l.ld + l.rows +
                        (uint64_t)(l.batch - 1) * (uint64_t)l.stride;
  return (size_t)last * elem_bytes(l.type);
}

/* Why cuBLASLt has no algorithm for this FP8 question, or nullptr when it has one (or it
** is not FP8). */
const char *fp8_refusal(const Desc &d, const Layout &a, const Layout &b, const Layout &c,
                        const Layout &dl) {
  if (!fp8(a.type) && !fp8(b.type)) return nullptr;
  if (!fp8(a.type) || !fp8(b.type)) return "FP8 with a wider operand";
  if (a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2) return "FP8 e5m2 x e5m2";
  if (d.ta != CUBLAS_OP_T || d.tb != CUBLAS_OP_N)
    return "FP8 not in the TN layout (A transposed, B not)";
  if (d.compute != CUBLAS_COMPUTE_32F) return "FP8 with a compute type other than f32";
  for (const Layout *l : {&a, &b, &c, &dl})
    if ((l->ld * (int64_t)elem_bytes(l->type)) % 16 ||
        (l->batch > 1 && (l->stride * (int64_t)elem_bytes(l->type)) % 16))
      return "FP8 with a leading dimension or batch stride not a multiple of 16 bytes";
  return nullptr;
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
  const void *ws;
  size_t ws_bytes;
};

/* Why an operand (its whole extent), the bias, a scale or the workspace is not inside
** live device memory, or nullptr. Asked when the matmul is issued and again when it runs
** (a captured one at each replay: a buffer may be gone by then). */
const char *outside_device(const Call &q, const void *ws, size_t ws_bytes) {
  if (!tt_emu_on_device) return nullptr;
  static char why[200];
  const void *ptr[4] = {q.a, q.b, q.beta != 0.0f ? q.c : nullptr, q.out};
  const Layout *lay[4] = {&q.la, &q.lb, &q.lc, &q.ld};
  const char *names[4] = {"matrix A", "matrix B", "matrix C", "matrix D"};
  const char *bad = nullptr;
  const void *at = nullptr;
  for (int i = 0; i < 4 && !bad; i++)
    if (ptr[i] && !tt_emu_on_device(ptr[i], extent(*lay[i]))) bad = names[i], at = ptr[i];
  if (!bad && q.d.epilogue == CUBLASLT_EPILOGUE_BIAS &&
      !tt_emu_on_device(q.d.bias, q.ld.rows * elem_bytes(q.d.bias_type)))
    bad = "the bias", at = q.d.bias;
  if (!bad && q.d.a_scale && !tt_emu_on_device(q.d.a_scale, sizeof(float)))
    bad = "A's scale", at = q.d.a_scale;
  if (!bad && q.d.b_scale && !tt_emu_on_device(q.d.b_scale, sizeof(float)))
    bad = "B's scale", at = q.d.b_scale;
  if (!bad && ws_bytes && !tt_emu_on_device(ws, ws_bytes)) bad = "the workspace", at = ws;
  if (!bad) return nullptr;
  snprintf(why, sizeof why, "%s (%p) is not inside one live device buffer", bad, at);
  return why;
}

/* Per batch: op(A) and op(B) widened to f32 column-major copies, their product by
** OpenBLAS (f32 sums: the emulated tensor cores' order), then the epilogue in f64. */
void matmul(void *p) {
  const Call &q = *(const Call *)p;
  if (const char *bad = outside_device(q, q.ws, q.ws_bytes)) {
    if (tt_emu_fault) tt_emu_fault(bad);
    return;
  }
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

/* OpenBLAS on one thread: the emulated device's work runs on one host thread, and between
** its GEMMs OpenBLAS's idle workers spin (sched_yield) for a while before they sleep. In a
** 10-step emulated run of recipes/tiny.lua that spin was a third of the process's CPU
** time, taken from the tests beside it (the engine's train.threads, when set, still sets
** its own count). */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  static int handle;
  openblas_set_num_threads(1);
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
  Pref *x = (Pref *)p;
  switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&x->workspace, buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(&x->align[0], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(&x->align[1], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(&x->align[2], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(&x->align[3], buf, n);
    default: return refuse("a preference attribute the engine does not set");
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *out,
                                              int *found) {
  (void)h;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  if (fp8(((const Layout *)dl)->type)) return refuse("an FP8 output (not emulated)");
  for (const void *l : {(const void *)a, (const void *)b, (const void *)c, (const void *)dl})
    if (((const Layout *)l)->ld < (int64_t)((const Layout *)l)->rows)
      return refuse("a leading dimension smaller than the rows", CUBLAS_STATUS_INVALID_VALUE);
  if (const char *why = fp8_refusal(*(const Desc *)d, *(const Layout *)a, *(const Layout *)b,
                                    *(const Layout *)c, *(const Layout *)dl)) {
    g_why = why;
    fprintf(stderr, "cublaslt_emu: no algorithm: %s\n", why);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const Pref *x = (const Pref *)p;
  const Layout *lay[4] = {(const Layout *)a, (const Layout *)b, (const Layout *)c,
                          (const Layout *)dl};
  const bool is_fp8 = fp8(lay[0]->type) || fp8(lay[1]->type);
  for (int i = 0; i < 4; i++)
    if (is_fp8 && x->align[i] < 16) {
      g_why = "FP8 with an operand aligned to less than 16 bytes";
      fprintf(stderr, "cublaslt_emu: no algorithm: %s\n", g_why);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  memset(out, 0, sizeof *out);
  out->algo.data[ALGO_MAGIC] = kAlgoMagic;
  for (int i = 0; i < 4; i++) out->algo.data[ALGO_ALIGN + i] = x->align[i];
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
  (void)h;
  Call *q = new Call;
  q->d = *(const Desc *)d;
  q->la = *(const Layout *)la, q->lb = *(const Layout *)lb;
  q->lc = *(const Layout *)lc, q->ld = *(const Layout *)ld;
  q->alpha = *(const float *)alpha;
  q->beta = *(const float *)beta;
  q->a = A, q->b = B, q->c = C, q->out = D;
  q->ws = ws, q->ws_bytes = ws_bytes;
  const uint64_t k = q->d.ta == CUBLAS_OP_N ? q->la.cols : q->la.rows;
  const uint64_t kb = q->d.tb == CUBLAS_OP_N ? q->lb.rows : q->lb.cols;
  const uint64_t ma = q->d.ta == CUBLAS_OP_N ? q->la.rows : q->la.cols;
  const uint64_t nb = q->d.tb == CUBLAS_OP_N ? q->lb.cols : q->lb.rows;
  if (k != kb || ma != q->ld.rows || nb != q->ld.cols || q->lc.rows != q->ld.rows ||
      q->lc.cols != q->ld.cols) {
    delete q;
    return refuse("matmul shapes that do not agree");
  }
  static char why[240];
  if (const char *r = fp8_refusal(q->d, q->la, q->lb, q->lc, q->ld)) {
    delete q;
    return refuse(r);
  }
  /* the alignment the algorithm was chosen for */
  if (algo && algo->data[ALGO_MAGIC] == kAlgoMagic) {
    const void *ptr[4] = {A, B, C, D};
    const Layout *lay[4] = {&q->la, &q->lb, &q->lc, &q->ld};
    for (int i = 0; i < 4; i++)
      if (alignment_of(ptr[i], *lay[i]) < algo->data[ALGO_ALIGN + i]) {
        snprintf(why, sizeof why, "matrix %c at %p (batch stride %lld) is aligned to %u "
                 "bytes; its algorithm was chosen for %llu", "ABCD"[i], ptr[i],
                 (long long)lay[i]->stride, alignment_of(ptr[i], *lay[i]),
                 (unsigned long long)algo->data[ALGO_ALIGN + i]);
        delete q;
        return refuse(why, CUBLAS_STATUS_INVALID_VALUE);
      }
  }
  if (const char *bad = outside_device(*q, ws, ws_bytes)) {
    delete q;
    return refuse(bad, CUBLAS_STATUS_INVALID_VALUE);
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
