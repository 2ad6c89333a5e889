/*
** matmul_lowp.cu — bf16 / fp16 GEMMs with fp32 accumulation on CUDA tensors, forward and
** backward (engine/cuda/tetra_cuda_lowp.h).
**
** The op takes its operands in whatever float dtype they come in (f32 master weights,
** f32 or bf16 activations), rounds each to the compute dtype once into a contiguous
** copy, and runs cuBLASLt on the copies: bf16 x bf16 products are exact in fp32, so the
** only differences from an f32 GEMM on the rounded values are the order of the sums.
** The rounded copies are what backward keeps (half the bytes of the f32 inputs) and
** reuses:
**   forward   C (m, n)  = op(A) op(B) [+ bias]            C in a's dtype
**   backward  dA        = G op(B)^T   (stored transposed when trans_a)
**             dB        = op(A)^T G   (stored transposed when trans_b)
**             dbias     = column sums of G, in f32
** with G the output gradient rounded to the compute dtype. Each gradient is written by
** the GEMM in its input's dtype (an f32 weight gets an f32 gradient straight from the
** fp32 accumulators). A 2-D b shared by every batch of a 3-D+ a — the Linear case — is
** one GEMM with the batch folded into the rows (forward, dA) or into the contracted dim
** (dB), so a (B, T, K) activation never becomes a batched call.
*/
#include "cuda/tt_cuda.h"
#include "tt_cuda_ops.h"
extern "C" {
#include "matmul.h"
#include "cuda/tetra_cuda_lowp.h"
}

/* -- Casts ---------------------------------------------------------------------------- */

template <typename S, typename D>
__global__ void cast_kernel(D *dst, const S *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    tt_st(dst, i, tt_ld(src, i));
}

static int cast_launch(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
  return tt_cuda_dispatch_float("cast", src_dtype, [&](auto *stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    return tt_cuda_dispatch_float("cast", dst_dtype, [&](auto *dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      cast_kernel<S, D><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
          (D *)dst, (const S *)src, n);
      TT_CU_LAUNCHED("cast_kernel");
      return 0;
    });
  });
}

extern "C" int tt_cuda_cast_contiguous(tt_tensor *t, int dtype, tt_tensor **out) {
  TT_CHECK(t && out, "tt_cuda_cast_contiguous: NULL argument");
  TT_CHECK(tt_device_is_cuda(t->device), "tt_cuda_cast_contiguous: tensor is on the cpu");
  if (t->dtype == dtype && tt_tensor_is_contiguous(t)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  tt_tensor *o = NULL;
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, dtype, t->device, &o));
  const int64_t n = tt_tensor_numel(t);
  int rc = 0;
  if (n > 0) {
    /* The strided copy handles any layout; the flat kernel is the common, faster case. */
    rc = tt_tensor_is_contiguous(t)
             ? cast_launch(tt_tensor_data(o), dtype, tt_tensor_data(t), t->dtype, n)
             : tt_cuda_copy_strided(o, t);
  }
  if (rc != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

/* -- One GEMM on contiguous operands -------------------------------------------------- */

/* A row-major operand: device pointer, dtype, leading dim, batch stride (elements). */
typedef struct operand {
  const void *p;
  int dtype;
  int64_t ld, stride;
} operand;

static operand opnd(const tt_tensor *t, int64_t ld, int64_t stride) {
  operand o = {tt_tensor_data(t), t->dtype, ld, stride};
  return o;
}

/* Element `i` of o, as an operand. */
static operand shifted(operand o, int64_t i) {
  o.p = (const char *)o.p + i * (int64_t)tt_dtype_size(o.dtype);
  return o;
}

/* C = op(X) op(Y) (+ beta C) (+ bias), `batch` times; see tt_cuda_lt_gemm. */
static int gemm(int tx, int ty, int64_t m, int64_t n, int64_t k, operand x, operand y,
                operand c, int64_t batch, float beta, const void *bias) {
  if (m == 0 || n == 0 || batch == 0) return 0;
  if (k == 0) {
    /* An empty sum (every operand has a zero-sized dim): C = beta C, no bias here. */
    TT_CHECK(beta == 0 || beta == 1, "matmul_lowp: k = 0 with beta %g", beta);
    TT_CHECK(!bias, "matmul_lowp: k = 0 with a bias is not supported");
    const size_t es = tt_dtype_size(c.dtype);
    if (beta == 0)
      for (int64_t i = 0; i < batch; i++)
        TT_CU(cudaMemset2DAsync((char *)c.p + i * c.stride * (int64_t)es, (size_t)c.ld * es, 0,
                                (size_t)n * es, (size_t)m, tt_cuda_cur_stream()));
    return 0;
  }
  tt_cuda_gemm_args g;
  memset(&g, 0, sizeof g);
  g.trans_a = tx;
  g.trans_b = ty;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = x.p; g.lda = x.ld; g.stride_a = x.stride; g.a_dtype = x.dtype;
  g.b = y.p; g.ldb = y.ld; g.stride_b = y.stride; g.b_dtype = y.dtype;
  g.c = (void *)c.p; g.ldc = c.ld; g.stride_c = c.stride; g.c_dtype = c.dtype;
  g.batch = batch;
  g.alpha = 1.0f;
  g.beta = beta;
  g.bias = bias;
  return tt_cuda_lt_gemm(&g);
}

/* -- The op --------------------------------------------------------------------------- */

/* The problem in matrix terms: L batches (the leading dims of a, flattened) of
** C (m, n) = op(A) (m, k) op(B) (k, n); b_shared when b is 2-D (one B for every batch). */
typedef struct problem {
  int ta, tb, b_shared, compute;
  int64_t L, m, n, k;
} problem;

/* A stored: (m, k), or (k, m) when ta; leading dim = its column count. */
static int64_t lda_of(const problem *p) { return p->ta ? p->m : p->k; }
static int64_t ldb_of(const problem *p) { return p->tb ? p->k : p->n; }

static int forward(const problem *p, tt_tensor *al, tt_tensor *bl, tt_tensor *o,
                   const void *bias) {
  const operand A = opnd(al, lda_of(p), p->m * p->k);
  const operand B = opnd(bl, ldb_of(p), p->b_shared ? 0 : p->k * p->n);
  const operand Cm = opnd(o, p->n, p->m * p->n);
  /* Linear: the batches of a are more rows of one product. */
  if (p->b_shared && !p->ta)
    return gemm(0, p->tb, p->L * p->m, p->n, p->k, A, B, Cm, 1, 0.0f, bias);
  return gemm(p->ta, p->tb, p->m, p->n, p->k, A, B, Cm, p->L, 0.0f, bias);
}

/* dA into ga (a's shape, contiguous): G (m, n), B as stored. */
static int backward_a(const problem *p, tt_tensor *gl, tt_tensor *bl, tt_tensor *ga) {
  const operand G = opnd(gl, p->n, p->m * p->n);
  const operand B = opnd(bl, ldb_of(p), p->b_shared ? 0 : p->k * p->n);
  if (!p->ta) {
    /* dA (m, k) = G op(B)^T, and op(B)^T is B stored (n, k) read plainly when tb. */
    const operand D = opnd(ga, p->k, p->m * p->k);
    if (p->b_shared) return gemm(0, !p->tb, p->L * p->m, p->k, p->n, G, B, D, 1, 0.0f, NULL);
    return gemm(0, !p->tb, p->m, p->k, p->n, G, B, D, p->L, 0.0f, NULL);
  }
  /* dA stored (k, m) = op(B) G^T. */
  const operand D = opnd(ga, p->m, p->k * p->m);
  return gemm(p->tb, 1, p->k, p->m, p->n, B, G, D, p->L, 0.0f, NULL);
}

/* dB into gb (b's shape, contiguous): op(A)^T G, summed over the batches when shared;
** beta 1 adds it to what gb holds (b's gradient buffer), 0 overwrites. */
static int backward_b(const problem *p, tt_tensor *gl, tt_tensor *al, tt_tensor *gb,
                      float beta) {
  operand G = opnd(gl, p->n, p->m * p->n);
  operand A = opnd(al, lda_of(p), p->m * p->k);
  const int64_t ldd = p->tb ? p->k : p->n;
  const operand D = opnd(gb, ldd, p->b_shared ? 0 : p->k * p->n);
  if (!p->b_shared) {
    if (!p->tb) return gemm(!p->ta, 0, p->k, p->n, p->m, A, G, D, p->L, beta, NULL);
    return gemm(1, p->ta, p->n, p->k, p->m, G, A, D, p->L, beta, NULL);
  }
  if (!p->ta) {
    /* A (L*m, k) and G (L*m, n) are contiguous: the batches join the contracted dim. */
    if (!p->tb) return gemm(1, 0, p->k, p->n, p->L * p->m, A, G, D, 1, beta, NULL);
    return gemm(1, 0, p->n, p->k, p->L * p->m, G, A, D, 1, beta, NULL);
  }
  /* A stored (k, m) per batch cannot fold; sum the batches with beta = 1. */
  for (int64_t l = 0; l < p->L; l++) {
    const operand Al = shifted(A, l * p->m * p->k), Gl = shifted(G, l * p->m * p->n);
    const float bl = l ? 1.0f : beta;
    if (!p->tb) TT_TRY(gemm(0, 0, p->k, p->n, p->m, Al, Gl, D, 1, bl, NULL));
    else TT_TRY(gemm(1, 1, p->n, p->k, p->m, Gl, Al, D, 1, bl, NULL));
  }
  return 0;
}

/* dbias (n) = column sums of g over every row, in f32, then bias's dtype. */
static int backward_bias(const problem *p, tt_tensor *g, tt_tensor *bias) {
  tt_tensor *g32 = NULL, *gb = NULL, *gcast = NULL;
  TT_TRY(tt_cuda_cast_contiguous(g, TT_F32, &g32));
  int st = tt_tensor_empty(bias->shape, 1, TT_F32, bias->device, &gb);
  if (st == 0) st = tt_matmul_cuda.bias_backward((float *)tt_tensor_data(gb),
                                                 (const float *)tt_tensor_data(g32),
                                                 p->L * p->m, p->n);
  if (st == 0) st = tt_cuda_cast_contiguous(gb, bias->dtype, &gcast);
  if (st == 0) st = tt_accumulate_grad(bias, gcast);
  tt_tensor_release(gcast);
  tt_tensor_release(gb);
  tt_tensor_release(g32);
  return st;
}

/* inputs: a, b, bias (may be NULL); saved: the rounded contiguous a and b. i[0..7]: ta,
** tb, b_shared, compute dtype, L, m, n, k. */
static int lowp_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *a = node->inputs[0], *b = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *al = node->saved[0], *bl = node->saved[1];
  problem p;
  p.ta = (int)node->i[0];
  p.tb = (int)node->i[1];
  p.b_shared = (int)node->i[2];
  p.compute = (int)node->i[3];
  p.L = node->i[4];
  p.m = node->i[5];
  p.n = node->i[6];
  p.k = node->i[7];
  tt_tensor *gl = NULL, *ga = NULL, *gb = NULL;
  TT_TRY(tt_cuda_cast_contiguous(g, p.compute, &gl));
  int st = 0;
  if (tt_needs_grad(a)) {
    st = tt_tensor_empty(a->shape, a->ndim, a->dtype, a->device, &ga);
    if (st == 0) st = backward_a(&p, gl, bl, ga);
    if (st == 0) st = tt_accumulate_grad(a, ga);
  }
  if (st == 0 && tt_needs_grad(b)) {
    if (tt_grad_accumulates_in_place(b)) {
      /* The weight gradient GEMM adds into b's gradient buffer (beta = 1): no temporary,
      ** no separate add. */
      st = backward_b(&p, gl, al, b->grad, 1.0f);
    } else {
      st = tt_tensor_empty(b->shape, b->ndim, b->dtype, b->device, &gb);
      if (st == 0) st = backward_b(&p, gl, al, gb, 0.0f);
      if (st == 0) st = tt_accumulate_grad(b, gb);
    }
  }
  if (st == 0 && bias && tt_needs_grad(bias)) st = backward_bias(&p, g, bias);
  tt_tensor_release(gb);
  tt_tensor_release(ga);
  tt_tensor_release(gl);
  return st;
}

static int check_float_cuda(const char *op, const char *arg, const tt_tensor *t) {
  TT_CHECK(tt_device_is_cuda(t->device), "%s: %s is on the cpu; this op runs on cuda", op, arg);
  TT_CHECK(t->dtype == TT_F32 || t->dtype == TT_BF16 || t->dtype == TT_F16,
           "%s: %s is %s; expected f32, bf16 or f16", op, arg, tt_dtype_name(t->dtype));
  return 0;
}

/* Shapes as in tt_matmul; allow_row lets a be 1-D (one row). b_low: b's cached
** low-precision copy (tt_lowp_weight) to read instead of casting b, or NULL. The output
** is written in out_dtype (-1: a's dtype). */
static int lowp_impl(const char *op, int allow_row, tt_tensor *a, tt_tensor *b,
                     tt_tensor *b_low, tt_tensor *bias, int ta, int tb, int compute,
                     int out_dtype, tt_tensor **out) {
  char sa[160], sb[160];
  TT_CHECK(out, "%s: out is NULL", op);
  *out = NULL;
  TT_CHECK(a && b, "%s: %s is NULL", op, a ? "b" : "a");
  TT_CHECK(compute == TT_BF16 || compute == TT_F16,
           "%s: compute dtype %s; expected bf16 or f16", op, tt_dtype_name(compute));
  TT_CHECK(out_dtype < 0 || out_dtype == TT_F32 || out_dtype == compute,
           "%s: output dtype %s; expected f32 or %s", op, tt_dtype_name(out_dtype),
           tt_dtype_name(compute));
  TT_TRY(check_float_cuda(op, "a", a));
  TT_TRY(check_float_cuda(op, "b", b));
  if (bias) TT_TRY(check_float_cuda(op, "bias", bias));
  tt_tensor *in[3] = {a, b, bias};
  TT_TRY(tt_check_same_device(op, in, 3));
  tt_shape_str(a->shape, a->ndim, sa, sizeof sa);
  tt_shape_str(b->shape, b->ndim, sb, sizeof sb);
  TT_CHECK(a->ndim >= 2 || (a->ndim == 1 && allow_row),
           "%s: a is %s; expected at least 2 dims", op, sa);
  TT_CHECK(b->ndim == 2 || (b->ndim == a->ndim && a->ndim > 2),
           "%s: b is %s; expected 2 dims, or the %d dims of a %s", op, sb, a->ndim, sa);
  const int nlead = a->ndim >= 2 ? a->ndim - 2 : 0;
  problem p;
  p.ta = ta;
  p.tb = tb;
  p.b_shared = b->ndim == 2;
  p.compute = compute;
  p.L = 1;
  for (int l = 0; l < nlead; l++) {
    TT_CHECK(p.b_shared || a->shape[l] == b->shape[l], "%s: batch dims differ: a is %s, b is %s",
             op, sa, sb);
    p.L *= a->shape[l];
  }
  const int64_t ar = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1, ac = a->shape[a->ndim - 1];
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  p.m = ta ? ac : ar;
  p.k = ta ? ar : ac;
  p.n = tb ? br : bc;
  TT_CHECK(p.k == (tb ? bc : br), "%s: inner dims differ: a is %s%s, b is %s%s", op, sa,
           ta ? " transposed" : "", sb, tb ? " transposed" : "");
  TT_CHECK(!bias || (bias->ndim == 1 && bias->shape[0] == p.n),
           "%s: bias must be [%lld]", op, (long long)p.n);
  TT_CHECK(p.k > 0 || !bias, "%s: an empty inner dim with a bias is not supported", op);
  TT_CU(cudaSetDevice(a->device));

  int64_t shape[TT_MAX_DIMS];
  int ndim = 0;
  for (int l = 0; l < nlead; l++) shape[ndim++] = a->shape[l];
  if (a->ndim >= 2) shape[ndim++] = p.m;
  shape[ndim++] = p.n;

  tt_tensor *o = NULL, *al = NULL, *bl = NULL, *biasc = NULL;
  const int o_dtype = out_dtype < 0 ? a->dtype : out_dtype;
  /* Selective recompute's re-run takes the output its first run kept (engine/core/autograd.c);
  ** the operands are still cast: backward saves them. */
  int st = tt_checkpoint_take_output(shape, ndim, o_dtype, a->device, &o);
  const int kept = o != NULL;
  if (st == 0 && !kept) st = tt_tensor_empty(shape, ndim, o_dtype, a->device, &o);
  if (st == 0) st = tt_cuda_cast_contiguous(a, compute, &al);
  if (st == 0) st = tt_cuda_cast_contiguous(b_low ? b_low : b, compute, &bl);
  /* cuBLASLt's bias epilogue reads the bias in the output's dtype. */
  if (st == 0 && !kept && bias) st = tt_cuda_cast_contiguous(bias, o->dtype, &biasc);
  if (st == 0 && !kept) st = forward(&p, al, bl, o, biasc ? tt_tensor_data(biasc) : NULL);
  if (st == 0 && !kept) st = tt_checkpoint_keep_copy(o);
  if (st == 0 && tt_should_record(in, 3)) {
    tt_node *node = tt_record(op, lowp_backward, o, in, 3);
    if (!node) {
      st = -1;
    } else {
      tt_node_save(node, al);
      tt_node_save(node, bl);
      node->i[0] = p.ta;
      node->i[1] = p.tb;
      node->i[2] = p.b_shared;
      node->i[3] = p.compute;
      node->i[4] = p.L;
      node->i[5] = p.m;
      node->i[6] = p.n;
      node->i[7] = p.k;
    }
  }
  tt_tensor_release(biasc);
  tt_tensor_release(bl);
  tt_tensor_release(al);
  if (st != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

extern "C" int tt_cuda_matmul_lowp(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a,
                                   int trans_b, int compute_dtype, tt_tensor **out) {
  return lowp_impl("tt_cuda_matmul_lowp", 0, a, b, NULL, bias, trans_a != 0, trans_b != 0,
                   compute_dtype, -1, out);
}

extern "C" int tt_cuda_matmul_lowp_ex(tt_tensor *a, tt_tensor *b, tt_tensor *bias,
                                      int trans_a, int trans_b, int compute_dtype,
                                      int out_dtype, tt_tensor **out) {
  return lowp_impl("tt_cuda_matmul_lowp", 0, a, b, NULL, bias, trans_a != 0, trans_b != 0,
                   compute_dtype, out_dtype, out);
}

extern "C" int tt_cuda_matmul_lowp_into(tt_tensor *a, tt_tensor *b, int trans_a, int trans_b,
                                        int compute_dtype, tt_tensor *c, float beta) {
  static const char *const op = "tt_cuda_matmul_lowp_into";
  TT_CHECK(a && b && c, "%s: %s is NULL", op, !a ? "a" : !b ? "b" : "c");
  TT_TRY(check_float_cuda(op, "a", a));
  TT_TRY(check_float_cuda(op, "b", b));
  TT_CHECK(compute_dtype == TT_BF16 || compute_dtype == TT_F16,
           "%s: compute dtype %s; expected bf16 or f16", op, tt_dtype_name(compute_dtype));
  TT_CHECK(a->ndim == 2 && b->ndim == 2, "%s: a and b must be matrices", op);
  const int64_t m = trans_a ? a->shape[1] : a->shape[0], k = trans_a ? a->shape[0] : a->shape[1];
  const int64_t n = trans_b ? b->shape[0] : b->shape[1];
  TT_CHECK((trans_b ? b->shape[1] : b->shape[0]) == k, "%s: inner dims differ", op);
  TT_CHECK(c->ndim == 2 && c->shape[0] == m && c->shape[1] == n && c->dtype == TT_F32 &&
               tt_tensor_is_contiguous(c) && c->device == a->device && b->device == a->device,
           "%s: c must be a contiguous f32 [%lld, %lld] on a's device", op, (long long)m,
           (long long)n);
  TT_CU(cudaSetDevice(a->device));
  tt_tensor *al = NULL, *bl = NULL;
  int st = tt_cuda_cast_contiguous(a, compute_dtype, &al);
  if (st == 0) st = tt_cuda_cast_contiguous(b, compute_dtype, &bl);
  if (st == 0)
    st = gemm(trans_a != 0, trans_b != 0, m, n, k, opnd(al, a->shape[1], 0),
              opnd(bl, b->shape[1], 0), opnd(c, n, 0), 1, beta, NULL);
  tt_tensor_release(bl);
  tt_tensor_release(al);
  return st;
}

extern "C" int tt_cuda_linear_lowp(tt_tensor *x, tt_tensor *w, tt_tensor *bias,
                                   int compute_dtype, tt_tensor **out) {
  char sx[160], sw[160];
  TT_CHECK(x && w, "tt_cuda_linear_lowp: %s is NULL", x ? "w" : "x");
  TT_CHECK(x->ndim >= 1 && w->ndim == 2 && x->shape[x->ndim - 1] == w->shape[1],
           "tt_cuda_linear_lowp: x is %s and w is %s; expected x (..., in) and w (out, in)",
           tt_shape_str(x->shape, x->ndim, sx, sizeof sx),
           tt_shape_str(w->shape, w->ndim, sw, sizeof sw));
  return lowp_impl("tt_cuda_linear_lowp", 1, x, w, NULL, bias, 0, 1, compute_dtype, -1, out);
}

extern "C" int tt_cuda_linear_lowp_cached(tt_tensor *x, tt_tensor *w, tt_tensor *w_low,
                                          tt_tensor *bias, int compute_dtype, int out_dtype,
                                          tt_tensor **out) {
  char sx[160], sw[160];
  TT_CHECK(x && w && w_low, "tt_cuda_linear_lowp_cached: %s is NULL",
           !x ? "x" : !w ? "w" : "w_low");
  TT_CHECK(x->ndim >= 1 && w->ndim == 2 && x->shape[x->ndim - 1] == w->shape[1],
           "tt_cuda_linear_lowp_cached: x is %s and w is %s; expected x (..., in) and w "
           "(out, in)",
           tt_shape_str(x->shape, x->ndim, sx, sizeof sx),
           tt_shape_str(w->shape, w->ndim, sw, sizeof sw));
  TT_CHECK(w_low->ndim == 2 && w_low->shape[0] == w->shape[0] &&
               w_low->shape[1] == w->shape[1] && w_low->device == w->device,
           "tt_cuda_linear_lowp_cached: w_low is not a copy of w");
  return lowp_impl("tt_cuda_linear_lowp_cached", 1, x, w, w_low, bias, 0, 1, compute_dtype,
                   out_dtype, out);
}

TT_CUDA_FAMILY(matmul_lowp)
