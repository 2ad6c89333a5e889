/*
** cudnn_sdpa.cu — flash attention on tensor cores through cuDNN's backend API, loaded at
** run time (engine/cuda/cudnn_load.c); see tt_cudnn_sdpa.h.
**
** cuDNN has no single "attention" call in its C API that every cuDNN 9 offers: its fused
** flash-attention engines recognise a graph of plain operations, the one cudnn-frontend
** builds for its SDPA node. This file builds that graph with the backend descriptors
** (matmul, pointwise, reduction, reshape), in cuDNN's (b, h, s, d) dim order, the
** strides mapping our (B, T, H, Dh) memory:
**
**   forward   S = (Q K^T) * scale;  [causal: S = (row + offset >= col) ? S : -inf]
**             M = rowmax(S);  E = exp(S - M);  Z = rowsum(E)
**             stats = M + log(Z)  (our lse);  O = (E / Z) V
**   backward  Dsum = rowsum(dO * O);  E = exp(S - stats) (masked as above)
**             dV = E^T dO;  dS = E * (dO V^T - Dsum) * scale
**             dK = dS^T Q;  dQ = dS K  (through an f32 accumulator, then cast)
**
** GQA needs nothing special: the matmuls broadcast Hkv heads over Hq; for dK and dV the
** per-query-head products are summed over each group by a reduction. The mask's offset,
** the scale and -inf are scalars passed by value.
**
** An execution plan is built once per shape key (sizes, strides, dtype, mask, whether the
** diagonal is shifted; the scale and the offset itself are by-value scalars of each call,
** so context parallelism's block pairs at many offsets share one plan and one compile)
** and cached with every descriptor it was made from; heuristics (mode A) order the
** engines and the first that finalizes wins. A graph that cuDNN refuses is remembered as
** refused: the caller falls back to the built-in kernel, with one line on stderr per
** process. Work space comes from the engine's stream-aware caching allocator.
**
** Not verified on a GPU in this repository's CI (no GPU there): tests/cuda/test_cudnn_sdpa.c
** checks it against the CPU twin where one is present (tools/gpu-check runs it).
*/
#include "cuda/tt_cuda.h"
#include "tt_cudnn_sdpa.h"
extern "C" {
#include "cuda/tt_cudnn.h"
}
#ifndef TETRA_HAVE_CUDNN_HEADERS
/* Built where CMake found no cudnn_graph.h: cuDNN cannot be described, so it is never
** used, and the first bf16/f16 attention says so. */
static const char no_headers[] = "this build found no cuDNN headers (cudnn_graph.h; set "
                                 "CUDNN_PATH when configuring)";

int tt_cudnn_sdpa_supported(const tt_sdpa_shape *s) {
  (void)s;
  tt_cudnn_fallback_note(no_headers);
  return 0;
}
int tt_cudnn_sdpa_check_ops(const tt_sdpa_shape *s, int backward, char *why, size_t why_n) {
  (void)s;
  (void)backward;
  snprintf(why, why_n, "%s", no_headers);
  return 0;
}
int tt_cudnn_sdpa_forward(const tt_sdpa_shape *s, const void *q, const void *k,
                          const void *v, void *out, float *lse) {
  (void)q, (void)k, (void)v, (void)out, (void)lse;
  return tt_cudnn_sdpa_supported(s);
}
int tt_cudnn_sdpa_backward(const tt_sdpa_shape *s, const void *q, const void *k,
                           const void *v, const void *out, const float *lse,
                           const void *dout, void *dq, void *dk, void *dv) {
  (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv;
  return tt_cudnn_sdpa_supported(s);
}
int64_t tt_cudnn_sdpa_runs(void) { return 0; }
#else
#include <cudnn_graph.h>
#include <pthread.h>
#include <string>
#include <unordered_map>
#include <vector>

/* -- The entry points, resolved from the loaded library ------------------------------ */

static struct {
  decltype(&cudnnCreate) create_handle;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnBackendCreateDescriptor) create;
  decltype(&cudnnBackendDestroyDescriptor) destroy;
  decltype(&cudnnBackendSetAttribute) set;
  decltype(&cudnnBackendGetAttribute) get;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
  int ok;
} api;

static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void resolve_api(void) {
  if (!tt_cudnn_available()) return;
  *(void **)&api.create_handle = tt_cudnn_symbol("cudnnCreate");
  *(void **)&api.set_stream = tt_cudnn_symbol("cudnnSetStream");
  *(void **)&api.error_string = tt_cudnn_symbol("cudnnGetErrorString");
  *(void **)&api.create = tt_cudnn_symbol("cudnnBackendCreateDescriptor");
  *(void **)&api.destroy = tt_cudnn_symbol("cudnnBackendDestroyDescriptor");
  *(void **)&api.set = tt_cudnn_symbol("cudnnBackendSetAttribute");
  *(void **)&api.get = tt_cudnn_symbol("cudnnBackendGetAttribute");
  *(void **)&api.finalize = tt_cudnn_symbol("cudnnBackendFinalize");
  *(void **)&api.execute = tt_cudnn_symbol("cudnnBackendExecute");
  api.ok = api.create_handle && api.set_stream && api.error_string && api.create &&
           api.destroy && api.set && api.get && api.finalize && api.execute;
  if (!api.ok) tt_cudnn_fallback_note("the library lacks a backend API entry point");
}

static const char *status_str(cudnnStatus_t s) {
  return api.error_string ? api.error_string(s) : "unknown status";
}

/* -- Graph building ----------------------------------------------------------------- */

/* Owns every descriptor of one graph and its plan; records the first failure. */
struct graph_builder {
  std::vector<cudnnBackendDescriptor_t> descs;
  std::string error;
  int64_t next_virtual_uid = 1000;

  bool check(cudnnStatus_t s, const char *what) {
    if (s != CUDNN_STATUS_SUCCESS && error.empty())
      error = std::string(what) + ": " + status_str(s);
    return s == CUDNN_STATUS_SUCCESS;
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (!error.empty() || !check(api.create(type, &d), "cudnnBackendCreateDescriptor"))
      return NULL;
    descs.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t n, const void *value) {
    if (d && error.empty()) check(api.set(d, name, type, n, value), "cudnnBackendSetAttribute");
  }
  void finalize(cudnnBackendDescriptor_t d, const char *what) {
    if (d && error.empty()) check(api.finalize(d), what);
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  ~graph_builder() {
    for (size_t i = descs.size(); i-- > 0;) api.destroy(descs[i]);
  }
};

/* A 4-dim tensor (b, h, s, d order). uid 0: a new virtual tensor. */
static cudnnBackendDescriptor_t tensor(graph_builder &g, int64_t uid, cudnnDataType_t dtype,
                                       const int64_t dims[4], const int64_t strides[4],
                                       bool by_value = false) {
  bool is_virtual = uid == 0;
  if (is_virtual) uid = g.next_virtual_uid++;
  int64_t alignment = 16;
  cudnnBackendDescriptor_t t = g.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  g.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
  g.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  g.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  g.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  g.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  g.set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) g.set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  g.finalize(t, "tensor descriptor");
  return t;
}

/* A scalar passed by value (its host value goes in the variant pack). */
static cudnnBackendDescriptor_t scalar(graph_builder &g, int64_t uid, cudnnDataType_t dtype) {
  const int64_t one[4] = {1, 1, 1, 1};
  return tensor(g, uid, dtype, one, one, true);
}

/* A virtual tensor shaped like `dims` with packed strides. */
static cudnnBackendDescriptor_t packed(graph_builder &g, cudnnDataType_t dtype,
                                       const int64_t dims[4]) {
  const int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  return tensor(g, 0, dtype, dims, strides);
}

/* y = mode(x[, b[, t]]): an operation, appended to ops. */
static void pointwise(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                      cudnnPointwiseMode_t mode, cudnnDataType_t math,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                      int64_t axis = -1) {
  cudnnBackendDescriptor_t pw = g.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  g.set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  g.set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) g.set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  g.finalize(pw, "pointwise descriptor");
  cudnnBackendDescriptor_t op = g.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  g.set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  g.set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) g.set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (t) g.set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
  g.set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  g.finalize(op, "pointwise operation");
  ops.push_back(op);
}

static void reduction(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                      cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = g.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  g.set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  g.set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  g.finalize(r, "reduction descriptor");
  cudnnBackendDescriptor_t op = g.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  g.set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
  g.set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
  g.set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
  g.finalize(op, "reduction operation");
  ops.push_back(op);
}

static void matmul(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                   cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = g.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  g.set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  g.finalize(mm, "matmul descriptor");
  cudnnBackendDescriptor_t op = g.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  g.set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
  g.set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
  g.set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
  g.set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
  g.finalize(op, "matmul operation");
  ops.push_back(op);
}

/* y: x seen with other dims / strides (a transpose), as the fused engines expect it. */
static void reshape(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = g.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  g.set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
  g.set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
  g.finalize(op, "reshape operation");
  ops.push_back(op);
}

/* Unique ids of the tensors the variant pack binds. */
enum {
  UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
  UID_SCALE, UID_NEG_INF, UID_OFFSET, UID_ONE, UID_DSUM, UID_DQ_ACCUM,
};

/* Host values of the by-value scalars of one call (cuDNN reads them when it launches). */
struct scalars {
  float scale, neg_inf, one;
  int32_t offset;
};

static scalars scalars_of(const tt_sdpa_shape *s) {
  return scalars{s->scale, -INFINITY, 1.0f, (int32_t)s->offset};
}

/* s = [causal mask of] s: row + offset >= col keeps the score, else -inf.
** cudnn-frontend fills with the lowest float instead before cuDNN 9.10; the two differ
** only in a row whose every score is masked (-inf gives 0/0 = NaN there, the lowest
** float a uniform row). No such row reaches this graph: offset >= 0 (tt_cudnn_sdpa.h),
** so column 0 is kept in every row, the row's max is finite and exp(-inf - max) is 0
** exactly, in the forward and in the backward's P. Block pairs of context parallelism
** that would hide a whole row are skipped before they get here (kernels/cuda/attention.cu). */
static cudnnBackendDescriptor_t causal_mask(graph_builder &g,
                                            std::vector<cudnnBackendDescriptor_t> &ops,
                                            const tt_sdpa_shape *s, cudnnBackendDescriptor_t x,
                                            const int64_t sdims[4]) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  cudnnBackendDescriptor_t row = packed(g, i32, sdims), col = packed(g, i32, sdims);
  pointwise(g, ops, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, row, 2);
  pointwise(g, ops, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, col, 3);
  if (s->offset != 0) {
    cudnnBackendDescriptor_t shifted = packed(g, i32, sdims);
    pointwise(g, ops, CUDNN_POINTWISE_ADD, i32, row, scalar(g, UID_OFFSET, i32), NULL, shifted);
    row = shifted;
  }
  cudnnBackendDescriptor_t keep = packed(g, b8, sdims), y = packed(g, f32, sdims);
  pointwise(g, ops, CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, keep);
  pointwise(g, ops, CUDNN_POINTWISE_BINARY_SELECT, f32, x, scalar(g, UID_NEG_INF, f32), keep, y);
  return y;
}

/* The (b, h, s, d) dims and strides of a (B, T, H, Dh) tensor with strides (batch, time,
** head); transposed: (b, h, d, s). */
static void bhsd(const tt_sdpa_shape *s, int64_t h, int64_t t, const int64_t st[3],
                 bool transposed, int64_t dims[4], int64_t strides[4]) {
  dims[0] = s->b;
  dims[1] = h;
  strides[0] = st[0];
  strides[1] = st[2];
  dims[2] = transposed ? s->dh : t;
  dims[3] = transposed ? t : s->dh;
  strides[2] = transposed ? 1 : st[1];
  strides[3] = transposed ? st[1] : 1;
}

static cudnnDataType_t io_type(const tt_sdpa_shape *s) {
  return s->dtype == TT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

/* Operations of the forward graph. */
static void forward_ops(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                        const tt_sdpa_shape *s) {
  cudnnDataType_t io = io_type(s), f32 = CUDNN_DATA_FLOAT;
  int64_t d[4], st[4];
  bhsd(s, s->hq, s->tq, s->q_stride, false, d, st);
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, d, st);
  bhsd(s, s->hkv, s->tk, s->k_stride, true, d, st);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, io, d, st);
  bhsd(s, s->hkv, s->tk, s->v_stride, false, d, st);
  cudnnBackendDescriptor_t v = tensor(g, UID_V, io, d, st);
  bhsd(s, s->hq, s->tq, s->o_stride, false, d, st);
  cudnnBackendDescriptor_t o = tensor(g, UID_O, io, d, st);
  const int64_t row_dims[4] = {s->b, s->hq, s->tq, 1};
  const int64_t lse_st[4] = {s->lse_stride[0], s->lse_stride[1], 1, 1};
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, row_dims, lse_st);

  const int64_t sdims[4] = {s->b, s->hq, s->tq, s->tk};
  cudnnBackendDescriptor_t qk = packed(g, f32, sdims), scaled = packed(g, f32, sdims);
  matmul(g, ops, q, kt, qk);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, qk, scalar(g, UID_SCALE, f32), NULL, scaled);
  cudnnBackendDescriptor_t x = s->masked ? causal_mask(g, ops, s, scaled, sdims) : scaled;

  cudnnBackendDescriptor_t mx = packed(g, f32, row_dims), sub = packed(g, f32, sdims);
  cudnnBackendDescriptor_t e = packed(g, f32, sdims), z = packed(g, f32, row_dims);
  cudnnBackendDescriptor_t logz = packed(g, f32, row_dims), p = packed(g, io, sdims);
  reduction(g, ops, CUDNN_REDUCE_TENSOR_MAX, x, mx);
  pointwise(g, ops, CUDNN_POINTWISE_SUB, f32, x, mx, NULL, sub);
  pointwise(g, ops, CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, e);
  reduction(g, ops, CUDNN_REDUCE_TENSOR_ADD, e, z);
  pointwise(g, ops, CUDNN_POINTWISE_LOG, f32, z, NULL, NULL, logz);
  pointwise(g, ops, CUDNN_POINTWISE_ADD, f32, mx, logz, NULL, stats);
  pointwise(g, ops, CUDNN_POINTWISE_DIV, f32, e, z, NULL, p);
  matmul(g, ops, p, v, o);
}

/* A product per query head summed over each group of Hq / Hkv heads into y (GQA), or
** written to y directly (MHA). */
static void matmul_group_sum(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                             const tt_sdpa_shape *s, cudnnBackendDescriptor_t a,
                             cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  if (s->hq == s->hkv) {
    matmul(g, ops, a, b, y);
    return;
  }
  const int64_t full[4] = {s->b, s->hq, s->tk, s->dh};
  cudnnBackendDescriptor_t per_head = packed(g, io_type(s), full);
  matmul(g, ops, a, b, per_head);
  reduction(g, ops, CUDNN_REDUCE_TENSOR_ADD, per_head, y);
}

/* Operations of the backward graph. */
static void backward_ops(graph_builder &g, std::vector<cudnnBackendDescriptor_t> &ops,
                         const tt_sdpa_shape *s) {
  cudnnDataType_t io = io_type(s), f32 = CUDNN_DATA_FLOAT;
  int64_t d[4], st[4];
  bhsd(s, s->hq, s->tq, s->q_stride, false, d, st);
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, d, st);
  bhsd(s, s->hkv, s->tk, s->k_stride, true, d, st);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, io, d, st);
  int64_t kd[4], kst[4];
  bhsd(s, s->hkv, s->tk, s->k_stride, false, kd, kst);
  cudnnBackendDescriptor_t k = tensor(g, 0, io, kd, kst);
  bhsd(s, s->hkv, s->tk, s->v_stride, true, d, st);
  cudnnBackendDescriptor_t vt = tensor(g, UID_V, io, d, st);
  bhsd(s, s->hq, s->tq, s->o_stride, false, d, st);
  cudnnBackendDescriptor_t o = tensor(g, UID_O, io, d, st);
  cudnnBackendDescriptor_t dout = tensor(g, UID_DO, io, d, st);
  cudnnBackendDescriptor_t dq = tensor(g, UID_DQ, io, d, st);
  bhsd(s, s->hkv, s->tk, s->kv_grad_stride, false, d, st);
  cudnnBackendDescriptor_t dk = tensor(g, UID_DK, io, d, st);
  cudnnBackendDescriptor_t dv = tensor(g, UID_DV, io, d, st);
  const int64_t row_dims[4] = {s->b, s->hq, s->tq, 1};
  const int64_t lse_st[4] = {s->lse_stride[0], s->lse_stride[1], 1, 1};
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, row_dims, lse_st);
  const int64_t row_st[4] = {s->hq * s->tq, s->tq, 1, 1};
  cudnnBackendDescriptor_t dsum = tensor(g, UID_DSUM, f32, row_dims, row_st);
  const int64_t qdims[4] = {s->b, s->hq, s->tq, s->dh};
  const int64_t qst[4] = {s->hq * s->tq * s->dh, s->tq * s->dh, s->dh, 1};
  cudnnBackendDescriptor_t dq_accum = tensor(g, UID_DQ_ACCUM, f32, qdims, qst);
  cudnnBackendDescriptor_t scale = scalar(g, UID_SCALE, f32);

  /* Dsum = rowsum(dO * O) */
  cudnnBackendDescriptor_t prod = packed(g, f32, qdims), rowsum = packed(g, f32, row_dims);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, dout, o, NULL, prod);
  reduction(g, ops, CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, rowsum, scalar(g, UID_ONE, f32), NULL, dsum);

  /* E = exp(scale Q K^T - stats), masked */
  const int64_t sdims[4] = {s->b, s->hq, s->tq, s->tk};
  cudnnBackendDescriptor_t qk = packed(g, f32, sdims), scaled = packed(g, f32, sdims);
  cudnnBackendDescriptor_t shifted = packed(g, f32, sdims), e = packed(g, f32, sdims);
  matmul(g, ops, q, kt, qk);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, qk, scale, NULL, scaled);
  pointwise(g, ops, CUDNN_POINTWISE_SUB, f32, scaled, stats, NULL, shifted);
  cudnnBackendDescriptor_t x = s->masked ? causal_mask(g, ops, s, shifted, sdims) : shifted;
  pointwise(g, ops, CUDNN_POINTWISE_EXP, f32, x, NULL, NULL, e);

  /* dV = E^T dO */
  const int64_t tdims[4] = {s->b, s->hq, s->tk, s->tq};
  const int64_t tst[4] = {s->hq * s->tq * s->tk, s->tq * s->tk, 1, s->tk};
  cudnnBackendDescriptor_t et = tensor(g, 0, io, tdims, tst);
  reshape(g, ops, e, et);
  matmul_group_sum(g, ops, s, et, dout, dv);

  /* dS = E * (dO V^T - Dsum) * scale */
  cudnnBackendDescriptor_t dp = packed(g, f32, sdims), centred = packed(g, f32, sdims);
  cudnnBackendDescriptor_t ds_unscaled = packed(g, f32, sdims), ds = packed(g, f32, sdims);
  matmul(g, ops, dout, vt, dp);
  pointwise(g, ops, CUDNN_POINTWISE_SUB, f32, dp, dsum, NULL, centred);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, centred, e, NULL, ds_unscaled);
  pointwise(g, ops, CUDNN_POINTWISE_MUL, f32, ds_unscaled, scale, NULL, ds);

  /* dK = dS^T Q */
  cudnnBackendDescriptor_t dst = tensor(g, 0, io, tdims, tst);
  reshape(g, ops, ds, dst);
  matmul_group_sum(g, ops, s, dst, q, dk);

  /* dQ = dS K, accumulated in f32 */
  reshape(g, ops, kt, k);
  matmul(g, ops, ds, k, dq_accum);
  pointwise(g, ops, CUDNN_POINTWISE_IDENTITY, f32, dq_accum, NULL, NULL, dq);
}

int tt_cudnn_sdpa_check_ops(const tt_sdpa_shape *s, int backward, char *why, size_t why_n) {
  pthread_once(&api_once, resolve_api);
  if (!api.ok) {
    snprintf(why, why_n, "cuDNN is not loaded");
    return 0;
  }
  graph_builder g;
  std::vector<cudnnBackendDescriptor_t> ops;
  if (backward) backward_ops(g, ops, s);
  else forward_ops(g, ops, s);
  snprintf(why, why_n, "%s", g.error.c_str());
  return g.error.empty() ? (int)ops.size() : 0;
}

/* -- Plans ---------------------------------------------------------------------------- */

struct sdpa_plan {
  graph_builder g;            /* every descriptor the plan was made from */
  cudnnBackendDescriptor_t plan = NULL;
  int64_t workspace = 0;
  std::string refused;        /* non-empty: cuDNN would not build it */
};

static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static std::unordered_map<std::string, sdpa_plan *> plans;
static cudnnHandle_t handles[64];

/* The current device's cuDNN handle. Lock held. */
static int handle_locked(cudnnHandle_t *out) {
  int dev = tt_cuda_current_device();
  TT_CHECK(dev >= 0 && dev < 64, "cudnn: no current CUDA device");
  if (!handles[dev]) {
    cudnnStatus_t st = api.create_handle(&handles[dev]);
    if (st != CUDNN_STATUS_SUCCESS) {
      handles[dev] = NULL;
      return tt_set_error("cudnnCreate: %s", status_str(st));
    }
  }
  *out = handles[dev];
  return 0;
}

static std::string plan_key(const tt_sdpa_shape *s, int backward) {
  char buf[512];
  snprintf(buf, sizeof buf,
           "%d|%d|%lld,%lld,%lld,%lld,%lld,%lld|%lld,%lld,%lld|%lld,%lld,%lld|%lld,%lld,%lld|"
           "%lld,%lld,%lld|%lld,%lld,%lld|%lld,%lld|%d|%d|%lld",
           tt_cuda_current_device(), backward, (long long)s->b, (long long)s->hq,
           (long long)s->hkv, (long long)s->tq, (long long)s->tk, (long long)s->dh,
           (long long)s->q_stride[0], (long long)s->q_stride[1], (long long)s->q_stride[2],
           (long long)s->k_stride[0], (long long)s->k_stride[1], (long long)s->k_stride[2],
           (long long)s->v_stride[0], (long long)s->v_stride[1], (long long)s->v_stride[2],
           (long long)s->o_stride[0], (long long)s->o_stride[1], (long long)s->o_stride[2],
           (long long)s->kv_grad_stride[0], (long long)s->kv_grad_stride[1],
           (long long)s->kv_grad_stride[2], (long long)s->lse_stride[0],
           (long long)s->lse_stride[1], s->dtype, s->masked, (long long)(s->offset != 0));
  return buf;
}

/* Operation graph -> heuristics -> the first engine configuration that finalizes. */
static void build_plan(sdpa_plan *p, const tt_sdpa_shape *s, int backward,
                       cudnnHandle_t handle) {
  graph_builder &g = p->g;
  std::vector<cudnnBackendDescriptor_t> ops;
  if (backward) backward_ops(g, ops, s);
  else forward_ops(g, ops, s);
  cudnnBackendDescriptor_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        (int64_t)ops.size(), ops.data());
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  g.finalize(graph, "operation graph");

  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  g.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  g.finalize(heur, "engine heuristics");
  enum { MAX_CONFIGS = 8 };
  cudnnBackendDescriptor_t cfgs[MAX_CONFIGS];
  for (int i = 0; i < MAX_CONFIGS; i++) cfgs[i] = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t n = 0;
  if (g.error.empty())
    g.check(api.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                    MAX_CONFIGS, &n, cfgs), "heuristics results");
  std::string last = g.error.empty() ? "no engine supports this graph" : g.error;
  if (n > MAX_CONFIGS) n = MAX_CONFIGS;   /* the count of all engines, not of those returned */
  for (int64_t i = 0; i < n && g.error.empty() && !p->plan; i++) {
    cudnnBackendDescriptor_t plan = NULL;
    if (api.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
      break;
    cudnnStatus_t st = api.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                               &handle);
    if (st == CUDNN_STATUS_SUCCESS)
      st = api.set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
    if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(plan);
    if (st == CUDNN_STATUS_SUCCESS) {
      g.descs.push_back(plan);
      p->plan = plan;
    } else {
      last = std::string("execution plan: ") + status_str(st);
      api.destroy(plan);
    }
  }
  if (!p->plan) {
    p->refused = g.error.empty() ? last : g.error;
    return;
  }
  int64_t count = 0;
  if (!g.check(api.get(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                       &count, &p->workspace), "workspace size"))
    p->refused = g.error;
}

/* The cached plan for s (built on first use), or NULL with the message set. */
static sdpa_plan *get_plan(const tt_sdpa_shape *s, int backward, cudnnHandle_t *handle) {
  std::string key = plan_key(s, backward);
  pthread_mutex_lock(&plans_lock);
  sdpa_plan *p = NULL;
  if (handle_locked(handle) == 0) {
    auto it = plans.find(key);
    if (it != plans.end()) {
      p = it->second;
    } else {
      p = new sdpa_plan();
      build_plan(p, s, backward, *handle);
      plans[key] = p;
    }
  }
  pthread_mutex_unlock(&plans_lock);
  return p;
}

/* -- Running -------------------------------------------------------------------------- */

int tt_cudnn_sdpa_supported(const tt_sdpa_shape *s) {
  if (s->dtype != TT_BF16 && s->dtype != TT_F16) return 0;
  if (s->dh != 64 && s->dh != 128) return 0;
  if (s->masked && s->offset < 0) return 0;
  if (s->b < 1 || s->tq < 1 || s->tk < 1 || s->hkv < 1 || s->hq % s->hkv != 0) return 0;
  const int64_t *st[6] = {s->q_stride, s->k_stride, s->v_stride, s->o_stride,
                          s->kv_grad_stride, NULL};
  for (int i = 0; st[i]; i++)
    for (int j = 0; j < 3; j++)
      if (st[i][j] % 8 != 0) return 0;
  pthread_once(&api_once, resolve_api);
  return api.ok;
}

static int64_t g_runs;

int64_t tt_cudnn_sdpa_runs(void) { return __atomic_load_n(&g_runs, __ATOMIC_RELAXED); }

/* The tensors are declared 16-byte aligned (the fused engines load 16 bytes at a time). */
static int aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Binds uids to pointers and runs plan p with a workspace from the allocator. */
static int execute(sdpa_plan *p, cudnnHandle_t handle, int n, const int64_t *uids,
                   void *const *ptrs) {
  tt_tensor *ws = NULL;
  int64_t words = (p->workspace + 3) / 4;
  words = words > 0 ? words : 1;
  TT_TRY(tt_tensor_empty(&words, 1, TT_F32, tt_cuda_current_device(), &ws));
  void *wsp = tt_tensor_data(ws);
  int rc = -1;
  cudnnBackendDescriptor_t pack = NULL;
  cudnnStatus_t st = api.set_stream(handle, tt_cuda_cur_stream());
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
  if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = api.execute(handle, p->plan, pack);
  if (st == CUDNN_STATUS_SUCCESS) {
    rc = 0;
    __atomic_add_fetch(&g_runs, 1, __ATOMIC_RELAXED);
  } else {
    tt_set_error("cudnn attention: cudnnBackendExecute: %s", status_str(st));
  }
  if (pack) api.destroy(pack);
  tt_tensor_release(ws);   /* stream-ordered: reused only by later work on this stream */
  if (rc == 0) TT_CU_LAUNCHED("cudnn attention");
  return rc;
}

/* The plan for s, or 0 (refused: the fallback note is printed once) / -1. */
static int plan_for(const tt_sdpa_shape *s, int backward, sdpa_plan **out,
                    cudnnHandle_t *handle) {
  if (!tt_cudnn_sdpa_supported(s)) return 0;
  sdpa_plan *p = get_plan(s, backward, handle);
  if (!p) return -1;
  if (!p->refused.empty()) {
    std::string why = std::string(backward ? "backward" : "forward") + " graph refused: " +
                      p->refused;
    tt_cudnn_fallback_note(why.c_str());
    return 0;
  }
  *out = p;
  return 1;
}

int tt_cudnn_sdpa_forward(const tt_sdpa_shape *s, const void *q, const void *k,
                          const void *v, void *out, float *lse) {
  if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(out) || !aligned(lse)) return 0;
  sdpa_plan *p = NULL;
  cudnnHandle_t handle = NULL;
  int rc = plan_for(s, 0, &p, &handle);
  if (rc <= 0) return rc;
  scalars c = scalars_of(s);
  const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF,
                          UID_OFFSET};
  void *const ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &c.scale, &c.neg_inf,
                        &c.offset};
  int n = s->masked ? (s->offset != 0 ? 8 : 7) : 6;
  TT_TRY(execute(p, handle, n, uids, ptrs));
  return 1;
}

int tt_cudnn_sdpa_backward(const tt_sdpa_shape *s, const void *q, const void *k,
                           const void *v, const void *out, const float *lse,
                           const void *dout, void *dq, void *dk, void *dv) {
  const void *all[] = {q, k, v, out, lse, dout, dq, dk, dv};
  for (const void *ptr : all)
    if (!aligned(ptr)) return 0;
  sdpa_plan *p = NULL;
  cudnnHandle_t handle = NULL;
  int rc = plan_for(s, 1, &p, &handle);
  if (rc <= 0) return rc;
  /* f32 scratch the graph writes: Dsum (B, Hq, Tq) and the dQ accumulator */
  int64_t nsum = s->b * s->hq * s->tq, nacc = nsum * s->dh;
  tt_tensor *sum = NULL, *acc = NULL;
  int dev = tt_cuda_current_device();
  if (tt_tensor_empty(&nsum, 1, TT_F32, dev, &sum) != 0 ||
      tt_tensor_empty(&nacc, 1, TT_F32, dev, &acc) != 0) {
    tt_tensor_release(sum);
    return -1;
  }
  /* The graph adds into the dQ accumulator. cuDNN before 9.6 leaves zeroing it to the
  ** caller (cudnn-frontend zeroes it for those versions), and the wheels PyTorch ships
  ** carry 9.1 to 9.5: without this, dQ is the sum of this step's and whatever the block
  ** held before. Zeroing costs one memset on every version. */
  cudaError_t z = cudaMemsetAsync(tt_tensor_data(acc), 0, (size_t)nacc * sizeof(float),
                                  tt_cuda_cur_stream());
  if (z != cudaSuccess) {
    tt_tensor_release(sum);
    tt_tensor_release(acc);
    return tt_cu_fail(z, "cudaMemsetAsync (dQ accumulator)", __FILE__, __LINE__);
  }
  scalars c = scalars_of(s);
  int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
                    UID_DSUM, UID_DQ_ACCUM, UID_SCALE, UID_ONE, UID_NEG_INF, UID_OFFSET};
  void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)lse, (void *)dout,
                  dq, dk, dv, tt_tensor_data(sum), tt_tensor_data(acc), &c.scale, &c.one,
                  &c.neg_inf, &c.offset};
  int n = s->masked ? (s->offset != 0 ? 15 : 14) : 13;
  rc = execute(p, handle, n, uids, ptrs);
  tt_tensor_release(sum);
  tt_tensor_release(acc);
  return rc == 0 ? 1 : -1;
}
#endif
