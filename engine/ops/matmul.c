/*
** ops_matmul.c — batched matmul with optional transposes and bias, and linear.
**
** Every operand is described as a logical matrix with two strides (mat below) plus one
** stride per leading (batch) dim. A matrix whose column stride is 1 goes to BLAS as is;
** one whose row stride is 1 (a transposed view) goes as the stored matrix with the
** trans flag flipped; only a matrix with neither is copied. Batches are folded into a
** single GEMM when the layout allows:
**   - B shared by every batch (linear, or matmul with a 2-D b): the batch dims join the
**     rows of A and C, so x (B, T, K) @ w^T is one (B*T, K) x (K, N) product;
**   - a shared result (the gradient of a shared B): the batch dims join the contracted
**     dim, so dW = sum_b G_b^T X_b is one (N, B*T) x (B*T, K) product;
** otherwise the leading dims are merged where possible and run as a strided batch.
*/
#include "matmul.h"
#include "blas.h"
#include "core/tt_internal.h"
#include "tetra_amp.h"

/* -- Matrix views -------------------------------------------------------------------- */

/* Element (i, j) of the matrix at batch index (l_0, ..) is
** data[sum_l l_d * ls[d] + i * sr + j * sc], of f32 or (bf16 set) of bf16; ls[d] == 0 on
** every dim: shared. */
typedef struct mat {
  char *data;
  int bf16;
  int64_t rows, cols, sr, sc;
  int64_t ls[TT_MAX_DIMS];
} mat;

/* The leading (batch) dims common to every operand of one product. */
typedef struct lead_dims {
  int n;
  int64_t shape[TT_MAX_DIMS];
} lead_dims;

/* The matrix in the last two dims of t (the last dim alone, as one row, when t is 1-D),
** transposed when `trans`. Leading strides come from t when it has `nlead` leading dims,
** else they are 0 (a 2-D operand shared by every batch). */
static mat mat_of(tt_tensor *t, int trans, int nlead) {
  mat m;
  const int nd = t->ndim;
  m.data = tt_tensor_data(t);
  m.bf16 = t->dtype == TT_BF16;
  if (nd == 1) {
    m.rows = 1;
    m.cols = t->shape[0];
    m.sr = t->shape[0];
    m.sc = t->stride[0];
  } else {
    m.rows = t->shape[nd - 2];
    m.cols = t->shape[nd - 1];
    m.sr = t->stride[nd - 2];
    m.sc = t->stride[nd - 1];
  }
  if (trans) {
    int64_t v = m.rows;
    m.rows = m.cols;
    m.cols = v;
    v = m.sr;
    m.sr = m.sc;
    m.sc = v;
  }
  for (int l = 0; l < nlead; l++) m.ls[l] = nd - 2 >= nlead ? t->stride[l] : 0;
  return m;
}

static mat mat_t(mat m) {
  int64_t v = m.rows;
  m.rows = m.cols;
  m.cols = v;
  v = m.sr;
  m.sr = m.sc;
  m.sc = v;
  return m;
}

/* How BLAS reads m: row-major with leading dim *ld, transposed when *trans. 0 when the
** strides fit neither form (the caller copies). */
static int blas_form(const mat *m, int *trans, int64_t *ld) {
  const int64_t r1 = m->rows > 1 ? m->rows : 1, c1 = m->cols > 1 ? m->cols : 1;
  if (m->rows == 0 || m->cols == 0) {
    *trans = 0;
    *ld = c1;
    return 1;
  }
  if ((m->sc == 1 || m->cols == 1) && (m->rows == 1 || m->sr >= c1)) {
    *trans = 0;
    *ld = m->rows == 1 ? c1 : m->sr;
    return 1;
  }
  if ((m->sr == 1 || m->rows == 1) && (m->cols == 1 || m->sc >= r1)) {
    *trans = 1;
    *ld = m->cols == 1 ? r1 : m->sc;
    return 1;
  }
  return 0;
}

static int blas_ok(const mat *m) {
  int t;
  int64_t ld;
  return blas_form(m, &t, &ld);
}

/* True when the leading dims of L followed by one matrix dim (size n, stride s) are a
** single uniformly strided dim, so the batch can be folded into that matrix dim. */
static int folds(const lead_dims *L, const int64_t *ls, int64_t n, int64_t s) {
  int64_t size = n, stride = s;
  for (int l = L->n - 1; l >= 0; l--) {
    if (ls[l] != size * stride) return 0;
    size = L->shape[l];
    stride = ls[l];
  }
  return 1;
}

static int is_shared(const lead_dims *L, const mat *m) {
  for (int l = 0; l < L->n; l++)
    if (m->ls[l] != 0) return 0;
  return 1;
}

/* -- Running a product --------------------------------------------------------------- */

/* `batch` products C_i = alpha x_i y_i + beta C_i, operand i at element offset
** o + i * bs from each base. */
static int gemm_one(const tt_matmul_kernels *k, const mat *c, const mat *x, const mat *y,
                    int64_t oc, int64_t ox, int64_t oy, int64_t batch, int64_t bc, int64_t bx,
                    int64_t by, float alpha, float beta) {
  int tx = 0, ty = 0, tc = 0;
  int64_t ldx = 0, ldy = 0, ldc = 0;
  if (!blas_form(x, &tx, &ldx) || !blas_form(y, &ty, &ldy) || !blas_form(c, &tc, &ldc) || tc)
    return tt_set_error("matmul: internal error: an operand is not in a BLAS layout");
  if (c->bf16 || x->bf16 != y->bf16 || (x->bf16 && !k->gemm_bf16))
    return tt_set_error("matmul: internal error: %s operands with %s output",
                        x->bf16 == y->bf16 ? (x->bf16 ? "bf16" : "f32") : "mixed",
                        c->bf16 ? "a bf16" : "an f32");
  float *cd = (float *)c->data + oc;
  if (x->bf16)
    return k->gemm_bf16(tx, ty, x->rows, y->cols, x->cols, alpha,
                        (const uint16_t *)x->data + ox, ldx, bx,
                        (const uint16_t *)y->data + oy, ldy, by, beta, cd, ldc, bc, batch);
  return k->gemm(tx, ty, x->rows, y->cols, x->cols, alpha, (const float *)x->data + ox, ldx,
                 bx, (const float *)y->data + oy, ldy, by, beta, cd, ldc, bc, batch);
}

/* Offsets of batch index `flat` (row-major over the first n dims of L) in each operand. */
static void batch_offsets(const lead_dims *L, int n, int64_t flat, const mat *c,
                          const mat *x, const mat *y, int64_t *oc, int64_t *ox, int64_t *oy) {
  *oc = *ox = *oy = 0;
  for (int l = n - 1; l >= 0; l--) {
    const int64_t i = flat % L->shape[l];
    flat /= L->shape[l];
    *oc += i * c->ls[l];
    *ox += i * x->ls[l];
    *oy += i * y->ls[l];
  }
}

/* C = alpha * x y + beta * C over the leading dims L, where x is (m, k), y (k, n) and
** C (m, n) per batch. A shared C (all leading strides 0) receives the sum over batches.
** x and y must already be BLAS-readable; C must be row-major. */
static int run_product(const tt_matmul_kernels *k, const lead_dims *Lin, mat c, mat x, mat y,
                       float alpha, float beta) {
  /* Size-1 leading dims carry no information: drop them. */
  lead_dims L = {0, {0}};
  int64_t nb = 1;
  for (int l = 0; l < Lin->n; l++) {
    nb *= Lin->shape[l];
    if (Lin->shape[l] == 1) continue;
    c.ls[L.n] = c.ls[l];
    x.ls[L.n] = x.ls[l];
    y.ls[L.n] = y.ls[l];
    L.shape[L.n++] = Lin->shape[l];
  }
  if (c.rows == 0 || c.cols == 0) return 0;
  if (L.n == 0 || nb == 0) {
    if (nb == 0 && !is_shared(&L, &c)) return 0;
    /* nb == 0 with a shared C: an empty sum, which the kernel writes for k = 0. */
    if (nb == 0) x.cols = y.rows = 0;
    return gemm_one(k, &c, &x, &y, 0, 0, 0, 1, 0, 0, 0, alpha, beta);
  }

  if (is_shared(&L, &c)) {
    /* Sum over batches: fold them into the contracted dim when both operands allow. */
    if (folds(&L, x.ls, x.cols, x.sc) && folds(&L, y.ls, y.rows, y.sr)) {
      mat x2 = x, y2 = y;
      x2.cols *= nb;
      y2.rows *= nb;
      if (blas_ok(&x2) && blas_ok(&y2))
        return gemm_one(k, &c, &x2, &y2, 0, 0, 0, 1, 0, 0, 0, alpha, beta);
    }
    for (int64_t b = 0; b < nb; b++) {
      int64_t oc, ox, oy;
      batch_offsets(&L, L.n, b, &c, &x, &y, &oc, &ox, &oy);
      TT_TRY(gemm_one(k, &c, &x, &y, oc, ox, oy, 1, 0, 0, 0, alpha, b == 0 ? beta : 1.0f));
    }
    return 0;
  }

  if (is_shared(&L, &y) && folds(&L, x.ls, x.rows, x.sr) && folds(&L, c.ls, c.rows, c.sr)) {
    mat x2 = x, c2 = c;
    x2.rows *= nb;
    c2.rows *= nb;
    if (blas_ok(&x2) && blas_ok(&c2))
      return gemm_one(k, &c2, &x2, &y, 0, 0, 0, 1, 0, 0, 0, alpha, beta);
  }

  /* Strided batch: merge neighbouring leading dims that stay uniform in all three
  ** operands; the innermost becomes the kernel's batch, the rest are looped here. */
  lead_dims M = {1, {L.shape[0]}};
  mat cm = c, xm = x, ym = y;
  for (int l = 1; l < L.n; l++) {
    const int j = M.n - 1;
    if (cm.ls[j] == L.shape[l] * c.ls[l] && xm.ls[j] == L.shape[l] * x.ls[l] &&
        ym.ls[j] == L.shape[l] * y.ls[l]) {
      M.shape[j] *= L.shape[l];
    } else {
      M.shape[M.n++] = L.shape[l];
    }
    cm.ls[M.n - 1] = c.ls[l];
    xm.ls[M.n - 1] = x.ls[l];
    ym.ls[M.n - 1] = y.ls[l];
  }
  const int last = M.n - 1;
  const int64_t inner = M.shape[last];
  for (int64_t b = 0; b < nb / inner; b++) {
    int64_t oc, ox, oy;
    batch_offsets(&M, last, b, &cm, &xm, &ym, &oc, &ox, &oy);
    TT_TRY(gemm_one(k, &cm, &xm, &ym, oc, ox, oy, inner, cm.ls[last], xm.ls[last],
                    ym.ls[last], alpha, beta));
  }
  return 0;
}

/* -- Forward and backward ------------------------------------------------------------ */

/* bf16 / fp16 operands on a GPU: tensor-core GEMMs with fp32 sums, rounded copies kept
** for backward (engine/cuda/matmul_lowp.cu). Weak: NULL in a build without CUDA. */
int tt_cuda_matmul_lowp(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a,
                        int trans_b, int compute_dtype, tt_tensor **out) __attribute__((weak));
int tt_cuda_linear_lowp(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int compute_dtype,
                        tt_tensor **out) __attribute__((weak));

static int is_half(int dtype) { return dtype == TT_BF16 || dtype == TT_F16; }

/* a or b in bf16 / fp16: the low-precision CUDA op, computing in that dtype. */
static int matmul_lowp(const char *op, int allow_row, tt_tensor *a, tt_tensor *b,
                       tt_tensor *bias, int ta, int tb, tt_tensor **out) {
  const int dt = is_half(a->dtype) ? a->dtype : b->dtype;
  TT_CHECK(tt_device_is_cuda(a->device) && tt_cuda_matmul_lowp && tt_cuda_linear_lowp,
           "%s: %s operands need a CUDA device (cast them to f32 on the cpu)", op,
           tt_dtype_name(dt));
  if (allow_row) return tt_cuda_linear_lowp(a, b, bias, dt, out);
  return tt_cuda_matmul_lowp(a, b, bias, ta, tb, dt, out);
}

static int matmul_table(const char *op, int device, const tt_matmul_kernels **pk) {
  const tt_matmul_kernels *k = TT_KERNELS(tt_matmul, device);
  if (!k || !k->gemm || !k->bias_fill || !k->bias_backward) return tt_no_kernel(op, device);
  *pk = k;
  return 0;
}

/* t retained when BLAS can read its matrices as they are, else a contiguous copy. */
static int blas_operand(tt_tensor *t, int nlead, tt_tensor **out) {
  mat m = mat_of(t, 0, nlead);
  if (blas_ok(&m)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  return tt_contiguous_nograd(t, out);
}

static lead_dims lead_of(const tt_tensor *t, int nlead) {
  lead_dims L = {nlead, {0}};
  for (int l = 0; l < nlead; l++) L.shape[l] = t->shape[l];
  return L;
}

/* inputs: a, b, bias (may be NULL); saved[0], saved[1]: the BLAS-readable a and b the
** forward used (copies only when a or b was not readable). i[0], i[1]: trans_a, trans_b;
** i[2]: the number of leading dims. */
static int backward_parts(tt_node *node, tt_tensor *g, tt_tensor *g_bias);

static int matmul_backward(tt_node *node, tt_tensor *g) { return backward_parts(node, g, g); }

/* The gradients of a and b from g, the bias's from g_bias (the output gradient before the
** low-precision emulation rounds it, as the CUDA op sums it). */
static int backward_parts(tt_node *node, tt_tensor *g, tt_tensor *g_bias) {
  tt_tensor *a = node->inputs[0], *b = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *as = node->saved[0], *bs = node->saved[1];
  const int ta = (int)node->i[0], tb = (int)node->i[1], nlead = (int)node->i[2];
  const tt_matmul_kernels *k = NULL;
  TT_TRY(matmul_table(node->name, g->device, &k));
  tt_tensor *gu = NULL, *ga = NULL, *gb = NULL, *gbias = NULL;
  TT_TRY(blas_operand(g, nlead, &gu));
  int st = 0;
  const lead_dims L = lead_of(g, nlead);
  const mat G = mat_of(gu, 0, nlead);
  const mat A = mat_of(as, ta, nlead), B = mat_of(bs, tb, nlead);

  if (st == 0 && tt_needs_grad(a)) {
    /* dA = G B^T (M, K); stored transposed, dA^T = B G^T (K, M). */
    st = tt_tensor_empty(a->shape, a->ndim, TT_F32, a->device, &ga);
    if (st == 0) {
      const mat C = mat_of(ga, 0, nlead);
      st = ta ? run_product(k, &L, C, B, mat_t(G), 1.0f, 0.0f)
              : run_product(k, &L, C, G, mat_t(B), 1.0f, 0.0f);
    }
    if (st == 0 && a->dtype != TT_F32) {
      /* a bf16 / f16 activation (the emulation): its gradient rounded, as the CUDA GEMM
      ** writes it, before it meets the others */
      tt_tensor *low = NULL;
      st = tt_tensor_empty(a->shape, a->ndim, a->dtype, a->device, &low);
      if (st == 0) st = tt_copy_(low, ga);
      tt_tensor_release(ga);
      ga = low;
    }
    if (st == 0) st = tt_accumulate_grad(a, ga);
  }
  if (st == 0 && tt_needs_grad(b)) {
    /* dB = A^T G (K, N); stored transposed, dB^T = G^T A (N, K). A 2-D b is shared, so
    ** its C has zero leading strides and receives the sum over batches. When b already
    ** has a gradient buffer the GEMM adds into it (beta = 1) instead of into a temporary
    ** that tt_accumulate_grad would add. */
    const int in_place = tt_grad_accumulates_in_place(b);
    if (!in_place) st = tt_tensor_empty(b->shape, b->ndim, TT_F32, b->device, &gb);
    if (st == 0) {
      const mat C = mat_of(in_place ? b->grad : gb, 0, nlead);
      const float beta = in_place ? 1.0f : 0.0f;
      st = tb ? run_product(k, &L, C, mat_t(G), A, 1.0f, beta)
              : run_product(k, &L, C, mat_t(A), G, 1.0f, beta);
    }
    if (st == 0 && !in_place) st = tt_accumulate_grad(b, gb);
  }
  if (st == 0 && tt_needs_grad(bias)) {
    tt_tensor *gc = NULL;
    if (g_bias->dtype == TT_F32) {
      st = tt_contiguous_nograd(g_bias == g ? gu : g_bias, &gc);
    } else {   /* the emulation's bf16 / f16 output gradient, widened (exactly) */
      st = tt_tensor_empty(g_bias->shape, g_bias->ndim, TT_F32, g_bias->device, &gc);
      if (st == 0) st = tt_copy_(gc, g_bias);
    }
    if (st == 0) st = tt_tensor_empty(bias->shape, 1, TT_F32, bias->device, &gbias);
    if (st == 0) {
      const int64_t n = bias->shape[0];
      const int64_t rows = n ? tt_tensor_numel(gc) / n : 0;
      st = k->bias_backward(tt_tensor_data(gbias), tt_tensor_data(gc), rows, n);
    }
    if (st == 0) st = tt_accumulate_grad(bias, gbias);
    tt_tensor_release(gc);
  }
  tt_tensor_release(gbias);
  tt_tensor_release(gb);
  tt_tensor_release(ga);
  tt_tensor_release(gu);
  return st;
}

/* out (lead..., M, N) = op(a_use) op(b_use) + bias, recorded as an op of a, b and bias
** with `backward` (a_use, b_use saved): a and b themselves, or f32 stand-ins of
** their shapes that the product reads instead (the low-precision emulation, where a may
** itself be in the compute dtype). With allow_row, a may be 1-D: one row. `compute`
** (saved as i[3]): the dtype the stand-ins were rounded to, for their backward. The sums
** are f32; out_dtype other than f32 (the emulation's bf16 / f16 output) rounds them once. */
static int matmul_core(const char *op, int allow_row, tt_tensor *a, tt_tensor *b,
                       tt_tensor *bias, int ta, int tb, tt_tensor *a_use, tt_tensor *b_use,
                       tt_backward_fn backward, int compute, int out_dtype, tt_tensor **out) {
  char sa[160], sb[160], sc[160];
  /* f32, but for operands that are their own stand-ins in bf16 (off the tape, gemm_lowp
  ** with TETRA_BF16_GEMM=dot) */
  if (a_use == a && !(a->dtype == TT_BF16 && tt_bf16_gemm_dot()))
    TT_TRY(tt_check_dtype(op, "a", a, TT_F32));
  if (b_use != b || !(b->dtype == TT_BF16 && tt_bf16_gemm_dot()))
    TT_TRY(tt_check_dtype(op, "b", b, TT_F32));
  if (bias) TT_TRY(tt_check_dtype(op, "bias", bias, TT_F32));
  tt_tensor *in[3] = {a, b, bias};
  TT_TRY(tt_check_same_device(op, in, 3));
  tt_shape_str(a->shape, a->ndim, sa, sizeof sa);
  tt_shape_str(b->shape, b->ndim, sb, sizeof sb);
  TT_CHECK(a->ndim >= 2 || (a->ndim == 1 && allow_row),
           "%s: a is %s; expected at least 2 dims", op, sa);
  const int nlead = a->ndim >= 2 ? a->ndim - 2 : 0;
  TT_CHECK(b->ndim == 2 || (b->ndim == a->ndim && a->ndim > 2),
           "%s: b is %s; expected 2 dims, or the %d dims of a %s", op, sb, a->ndim, sa);
  for (int l = 0; l < nlead && b->ndim > 2; l++)
    TT_CHECK(a->shape[l] == b->shape[l],
             "%s: batch dims differ: a is %s, b is %s (dim %d: %lld vs %lld)", op, sa, sb, l,
             (long long)a->shape[l], (long long)b->shape[l]);
  const int64_t ar = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1, ac = a->shape[a->ndim - 1];
  const int64_t m = ta ? ac : ar, ka = ta ? ar : ac;
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  const int64_t kb = tb ? bc : br, n = tb ? br : bc;
  TT_CHECK(ka == kb, "%s: inner dims differ: a is %s%s, b is %s%s (%lld vs %lld)", op, sa,
           ta ? " transposed" : "", sb, tb ? " transposed" : "", (long long)ka, (long long)kb);
  if (bias) {
    tt_shape_str(bias->shape, bias->ndim, sc, sizeof sc);
    TT_CHECK(bias->ndim == 1 && bias->shape[0] == n, "%s: bias is %s; expected [%lld]", op,
             sc, (long long)n);
  }
  const tt_matmul_kernels *k = NULL;
  TT_TRY(matmul_table(op, a->device, &k));

  int64_t shape[TT_MAX_DIMS];
  int ndim = 0;
  for (int l = 0; l < nlead; l++) shape[ndim++] = a->shape[l];
  if (a->ndim >= 2) shape[ndim++] = m;
  shape[ndim++] = n;

  tt_tensor *o = NULL, *au = NULL, *bu = NULL, *biasc = NULL;
  /* Selective recompute's re-run takes the output its first run kept. */
  int st = tt_checkpoint_take_output(shape, ndim, out_dtype, a->device, &o);
  const int kept = o != NULL;
  if (st == 0 && !kept) st = tt_tensor_empty(shape, ndim, TT_F32, a->device, &o);
  if (st == 0) st = blas_operand(a_use, nlead, &au);
  if (st == 0) st = blas_operand(b_use, nlead, &bu);
  float beta = 0.0f;
  if (st == 0 && !kept && bias && tt_tensor_numel(o) > 0) {
    st = tt_contiguous_nograd(bias, &biasc);
    if (st == 0)
      st = k->bias_fill(tt_tensor_data(o), tt_tensor_data(biasc), tt_tensor_numel(o) / n, n,
                        n);
    beta = 1.0f;
  }
  if (st == 0 && !kept) {
    const lead_dims L = lead_of(a, nlead);
    st = run_product(k, &L, mat_of(o, 0, nlead), mat_of(au, ta, nlead), mat_of(bu, tb, nlead),
                     1.0f, beta);
  }
  if (st == 0 && !kept && out_dtype != TT_F32) {
    tt_tensor *low = NULL;
    st = tt_tensor_empty(shape, ndim, out_dtype, a->device, &low);
    if (st == 0) st = tt_copy_(low, o);   /* the one rounding of the output */
    tt_tensor_release(o);
    o = low;
  }
  if (st == 0 && !kept) st = tt_checkpoint_keep_copy(o);
  if (st == 0 && tt_should_record(in, 3)) {
    tt_node *node = tt_record(op, backward, o, in, 3);
    if (!node) {
      st = -1;
    } else {
      tt_node_save(node, au);
      tt_node_save(node, bu);
      node->i[0] = ta;
      node->i[1] = tb;
      node->i[2] = nlead;
      node->i[3] = compute;
    }
  }
  tt_tensor_release(biasc);
  tt_tensor_release(bu);
  tt_tensor_release(au);
  if (st != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

static int matmul_impl(const char *op, int allow_row, tt_tensor *a, tt_tensor *b,
                       tt_tensor *bias, int ta, int tb, tt_tensor **out) {
  if (!out) return tt_set_error("%s: out is NULL", op);
  *out = NULL;
  TT_CHECK(a && b, "%s: %s is NULL", op, a ? "b" : "a");
  if (is_half(a->dtype) || is_half(b->dtype))
    return matmul_lowp(op, allow_row, a, b, bias, ta, tb, out);
  return matmul_core(op, allow_row, a, b, bias, ta, tb, a, b, matmul_backward, TT_F32, TT_F32,
                     out);
}

int tt_matmul(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a, int trans_b,
              tt_tensor **out) {
  return matmul_impl("tt_matmul", 0, a, b, bias, trans_a != 0, trans_b != 0, out);
}

int tt_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias, tt_tensor **out) {
  char sx[160], sw[160];
  TT_CHECK(x && w, "tt_linear: %s is NULL", x ? "w" : "x");
  TT_CHECK(x->ndim >= 1 && w->ndim == 2 && x->shape[x->ndim - 1] == w->shape[1],
           "tt_linear: x is %s and w is %s; expected x (..., in) and w (out, in)",
           tt_shape_str(x->shape, x->ndim, sx, sizeof sx),
           tt_shape_str(w->shape, w->ndim, sw, sizeof sw));
  return matmul_impl("tt_linear", 1, x, w, bias, 0, 1, out);
}

/* -- Linear with a cached low-precision weight ------------------------------------------ */

/* CUDA: the tensor-core GEMM reading w_low in place of a cast of w (matmul_lowp.cu). */
int tt_cuda_linear_lowp_cached(tt_tensor *x, tt_tensor *w, tt_tensor *w_low, tt_tensor *bias,
                               int compute_dtype, int out_dtype, tt_tensor **out)
    __attribute__((weak));

/* A new f32 tensor (contiguous, no grad) holding t's values rounded to dtype. */
static int rounded_f32(tt_tensor *t, int dtype, tt_tensor **out) {
  tt_tensor *low = NULL, *r = NULL;
  *out = NULL;
  if (t->dtype == TT_F32 && tt_tensor_is_contiguous(t)) {   /* one pass, no dtype copy */
    TT_TRY(tt_tensor_empty(t->shape, t->ndim, TT_F32, t->device, &r));
    if (tt_round_f32_(r, t, dtype) != 0) goto fail;
    *out = r;
    return 0;
  }
  if (t->dtype != dtype) {
    TT_TRY(tt_tensor_empty(t->shape, t->ndim, dtype, t->device, &low));
    if (tt_copy_(low, t) != 0) goto fail;
  }
  if (tt_tensor_empty(t->shape, t->ndim, TT_F32, t->device, &r) != 0) goto fail;
  if (tt_copy_(r, low ? low : t) != 0) goto fail;
  tt_tensor_release(low);
  *out = r;
  return 0;
fail:
  tt_tensor_release(low);
  tt_tensor_release(r);
  return -1;
}

/* t in dtype, contiguous (t itself when it already is). */
static int lowp_contiguous(tt_tensor *t, int dtype, tt_tensor **out) {
  if (t->dtype == dtype && tt_tensor_is_contiguous(t)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, dtype, t->device, out));
  if (tt_copy_(*out, t) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

/* t as an operand of the GEMMs at dtype, rounded once: on CUDA, and on the cpu for bf16
** with TETRA_BF16_GEMM=dot (oneDNN's bf16 GEMM), t in dtype, contiguous; otherwise on the
** cpu an f32 tensor holding t's values rounded to dtype (what the emulation multiplies).
** Both sum the same exact products in f32, in each library's order. */
static int operand_lowp(tt_tensor *t, int dtype, tt_tensor **out) {
  if (tt_device_is_cuda(t->device) || (dtype == TT_BF16 && tt_bf16_gemm_dot()))
    return lowp_contiguous(t, dtype, out);
  return rounded_f32(t, dtype, out);
}

/* The cpu op's backward: the output gradient rounded to the compute dtype (i[3]), as the
** CUDA op rounds it, then matmul_backward's GEMMs on that and the rounded operands the
** forward saved (operand_lowp's). x and w get f32 gradients, w's straight from the f32
** sums; the bias gradient sums the unrounded g, as the CUDA op's does. */
static int linear_lowp_cpu_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *gr = NULL;
  TT_TRY(operand_lowp(g, (int)node->i[3], &gr));
  const int st = backward_parts(node, gr, g);
  tt_tensor_release(gr);
  return st;
}

/* The cpu's tt_cuda_linear_lowp_cached: x rounded to dtype and w_low, as operand_lowp
** gives them (widened to f32 for the emulation), one GEMM with f32 sums, the output
** rounded to out_dtype. */
static int linear_lowp_cpu(tt_tensor *x, tt_tensor *w, tt_tensor *w_low, tt_tensor *bias,
                           int dtype, int out_dtype, tt_tensor **out) {
  tt_tensor *xr = NULL, *wr = NULL;
  int st = operand_lowp(x, dtype, &xr);
  if (st == 0) st = operand_lowp(w_low, dtype, &wr);
  if (st == 0)
    st = matmul_core("tt_linear_lowp", 1, x, w, bias, 0, 1, xr, wr, linear_lowp_cpu_backward,
                     dtype, out_dtype, out);
  tt_tensor_release(wr);
  tt_tensor_release(xr);
  return st;
}

int tt_linear_lowp_ex(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int dtype, int out_dtype,
                      tt_tensor **out) {
  char sx[160], sw[160];
  TT_CHECK(out, "tt_linear_lowp: out is NULL");
  *out = NULL;
  TT_CHECK(x && w, "tt_linear_lowp: %s is NULL", x ? "w" : "x");
  TT_CHECK(dtype == TT_BF16 || dtype == TT_F16,
           "tt_linear_lowp: compute dtype %s; expected bf16 or f16", tt_dtype_name(dtype));
  TT_CHECK(out_dtype == TT_F32 || out_dtype == dtype,
           "tt_linear_lowp: output dtype %s; expected f32 or the compute dtype %s",
           tt_dtype_name(out_dtype), tt_dtype_name(dtype));
  TT_CHECK(x->ndim >= 1 && w->ndim == 2 && x->shape[x->ndim - 1] == w->shape[1],
           "tt_linear_lowp: x is %s and w is %s; expected x (..., in) and w (out, in)",
           tt_shape_str(x->shape, x->ndim, sx, sizeof sx),
           tt_shape_str(w->shape, w->ndim, sw, sizeof sw));
  TT_CHECK(x->device == w->device, "tt_linear_lowp: x is on device %d but w on device %d",
           x->device, w->device);
  if (tt_device_is_cuda(x->device))
    TT_CHECK(tt_cuda_linear_lowp_cached, "tt_linear_lowp: this build has no CUDA GEMMs");
  else
    TT_CHECK(x->dtype == TT_F32 || x->dtype == dtype,
             "tt_linear_lowp: x is %s on the cpu; expected f32 or %s", tt_dtype_name(x->dtype),
             tt_dtype_name(dtype));
  tt_tensor *wl = NULL;
  TT_TRY(tt_lowp_weight(w, dtype, &wl));
  const int st = tt_device_is_cuda(x->device)
                     ? tt_cuda_linear_lowp_cached(x, w, wl, bias, dtype, out_dtype, out)
                     : linear_lowp_cpu(x, w, wl, bias, dtype, out_dtype, out);
  tt_tensor_release(wl);
  return st;
}

int tt_linear_lowp(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int dtype, tt_tensor **out) {
  TT_CHECK(x, "tt_linear_lowp: x is NULL");
  return tt_linear_lowp_ex(x, w, bias, dtype, x->dtype == TT_F32 ? TT_F32 : dtype, out);
}

/* -- Several Linear layers on one input: one GEMM ---------------------------------------- */

/* The CUDA tensor-core GEMM with the output's dtype chosen (matmul_lowp.cu). */
int tt_cuda_matmul_lowp_ex(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a,
                           int trans_b, int compute_dtype, int out_dtype, tt_tensor **out)
    __attribute__((weak));

/* out = op(a) op(b) of 2-D operands (operand_lowp's, or views of them) at dtype, fp32
** sums, in out_dtype, off the tape: the CUDA GEMM, or on the cpu oneDNN's bf16 GEMM or the
** emulation (an f32 GEMM of the rounded values), the output rounded. */
static int gemm_lowp(tt_tensor *a, tt_tensor *b, int ta, int tb, int dtype, int out_dtype,
                     tt_tensor **out) {
  const int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int st;
  if (tt_device_is_cuda(a->device))
    st = tt_cuda_matmul_lowp_ex
             ? tt_cuda_matmul_lowp_ex(a, b, NULL, ta, tb, dtype, out_dtype, out)
             : tt_set_error("tt_linear_lowp_group: this build has no CUDA GEMMs");
  else
    st = matmul_core("tt_linear_lowp_group", 0, a, b, NULL, ta, tb, a, b, matmul_backward,
                     dtype, out_dtype, out);
  tt_set_grad_enabled(grad);
  return st;
}

int tt_cuda_matmul_lowp_into(tt_tensor *a, tt_tensor *b, int trans_a, int trans_b,
                             int compute_dtype, tt_tensor *c, float beta) __attribute__((weak));

/* c (f32, contiguous) += op(a) op(b) of 2-D operands as gemm_lowp's: the weight-gradient
** GEMM adding into a gradient buffer (beta = 1), on the GPU or in the cpu emulation. */
static int gemm_lowp_into(tt_tensor *a, tt_tensor *b, int ta, int tb, int dtype, tt_tensor *c) {
  if (tt_device_is_cuda(a->device))
    return tt_cuda_matmul_lowp_into
               ? tt_cuda_matmul_lowp_into(a, b, ta, tb, dtype, c, 1.0f)
               : tt_set_error("tt_linear_lowp_group: this build has no CUDA GEMMs");
  const tt_matmul_kernels *k = NULL;
  TT_TRY(matmul_table("tt_linear_lowp_group", a->device, &k));
  const lead_dims L = {0, {0}};
  const mat A = mat_of(a, ta, 0), B = mat_of(b, tb, 0);
  TT_CHECK(blas_ok(&A) && blas_ok(&B), "tt_linear_lowp_group: internal error: an operand "
           "is not in a BLAS layout");
  return run_product(k, &L, mat_of(c, 0, 0), A, B, 1.0f, 1.0f);
}

/* t (..., n) as a 2-D (rows, n) tensor off the tape (a view when t is contiguous). */
static int as_rows(tt_tensor *t, tt_tensor **out) {
  const int64_t n = t->shape[t->ndim - 1];
  const int64_t shape[2] = {n ? tt_tensor_numel(t) / n : 0, n};
  const int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  const int st = tt_view(t, shape, 2, out);
  tt_set_grad_enabled(grad);
  return st;
}

/* inputs: x, w_0 .. w_{n-1}, then their biases (or none); saved: x as 2-D rows and the
** group's weights side by side, both as operand_lowp made them. i[0]: n, i[1]: compute
** dtype, i[2]: 1 with biases, i[3 + j]: w_j's output features. */
static int group_backward(tt_node *node, tt_tensor *g) {
  const int n = (int)node->i[0], dtype = (int)node->i[1], has_bias = (int)node->i[2];
  tt_tensor *x = node->inputs[0], *xo = node->saved[0], *wo = node->saved[1];
  tt_tensor *g2 = NULL, *go = NULL, *gw = NULL, *dx = NULL, *dx_full = NULL;
  int st = as_rows(g, &g2);
  /* the output gradient rounded to dtype once, for dX and every dW */
  if (st == 0) st = operand_lowp(g2, dtype, &go);
  if (st == 0 && tt_needs_grad(x)) {
    /* dX = G W, in x's dtype */
    st = gemm_lowp(go, wo, 0, 0, dtype, x->dtype == TT_F32 ? TT_F32 : dtype, &dx);
    if (st == 0) {
      const int grad = tt_is_grad_enabled();
      tt_set_grad_enabled(0);
      st = tt_view(dx, x->shape, x->ndim, &dx_full);
      tt_set_grad_enabled(grad);
    }
    if (st == 0) st = tt_accumulate_grad(x, dx_full);
  }
  if (st == 0 && has_bias) {   /* the bias gradients sum the unrounded gradient, in f32 */
    st = tt_tensor_empty(g2->shape, 2, TT_F32, g2->device, &gw);
    if (st == 0) st = tt_copy_(gw, g2);
  }
  const tt_matmul_kernels *k = NULL;
  if (st == 0 && has_bias) st = matmul_table("tt_linear_lowp_group", g->device, &k);
  int64_t at = 0;
  for (int j = 0; st == 0 && j < n; j++) {
    tt_tensor *w = node->inputs[1 + j], *b = has_bias ? node->inputs[1 + n + j] : NULL;
    const int64_t nj = node->i[3 + j];
    tt_tensor *gj = NULL, *dw = NULL, *gbj = NULL, *db = NULL;
    if (tt_needs_grad(w)) {
      /* dW_j = G_j^T X, f32 sums for the f32 master; added by the GEMM itself into a
      ** gradient that exists (beta = 1), as tt_linear_lowp does */
      st = tt_narrow(go, 1, at, nj, &gj);
      if (st == 0 && tt_grad_accumulates_in_place(w)) {
        st = gemm_lowp_into(gj, xo, 1, 0, dtype, w->grad);
      } else {
        if (st == 0) st = gemm_lowp(gj, xo, 1, 0, dtype, TT_F32, &dw);
        if (st == 0) st = tt_accumulate_grad(w, dw);
      }
    }
    if (st == 0 && b && tt_needs_grad(b)) {
      tt_tensor *view = NULL;
      st = tt_narrow(gw, 1, at, nj, &view);
      if (st == 0) st = tt_contiguous_nograd(view, &gbj);
      if (st == 0) st = tt_tensor_empty(b->shape, 1, TT_F32, b->device, &db);
      if (st == 0)
        st = k->bias_backward(tt_tensor_data(db), tt_tensor_data(gbj), g2->shape[0], nj);
      if (st == 0) st = tt_accumulate_grad(b, db);
      tt_tensor_release(view);
    }
    tt_tensor_release(db);
    tt_tensor_release(gbj);
    tt_tensor_release(dw);
    tt_tensor_release(gj);
    at += nj;
  }
  tt_tensor_release(dx_full);
  tt_tensor_release(dx);
  tt_tensor_release(gw);
  tt_tensor_release(go);
  tt_tensor_release(g2);
  return st;
}

int tt_linear_lowp_group(tt_tensor *x, tt_tensor *const *ws, tt_tensor *const *biases, int n,
                         int dtype, int out_dtype, tt_tensor **outs) {
  static const char *const op = "tt_linear_lowp_group";
  char sx[160], sw[160];
  TT_CHECK(outs, "%s: outs is NULL", op);
  TT_CHECK(n >= 1 && n <= 3, "%s: %d weights; expected 1 to 3", op, n);
  for (int j = 0; j < n; j++) outs[j] = NULL;
  TT_CHECK(x && ws, "%s: %s is NULL", op, x ? "ws" : "x");
  TT_CHECK(dtype == TT_BF16 || dtype == TT_F16, "%s: compute dtype %s; expected bf16 or f16",
           op, tt_dtype_name(dtype));
  TT_CHECK(out_dtype == TT_F32 || out_dtype == dtype,
           "%s: output dtype %s; expected f32 or the compute dtype %s", op,
           tt_dtype_name(out_dtype), tt_dtype_name(dtype));
  TT_CHECK(x->ndim >= 1 && (x->dtype == TT_F32 || x->dtype == dtype),
           "%s: x is %s of %d dims; expected f32 or %s with at least one dim", op,
           tt_dtype_name(x->dtype), x->ndim, tt_dtype_name(dtype));
  const int64_t k_in = x->shape[x->ndim - 1];
  int64_t total = 0;
  for (int j = 0; j < n; j++) {
    TT_CHECK(ws[j], "%s: weight %d is NULL", op, j);
    TT_CHECK(ws[j]->ndim == 2 && ws[j]->shape[1] == k_in && ws[j]->dtype == TT_F32 &&
                 ws[j]->device == x->device,
             "%s: x is %s and weight %d is %s %s; expected f32 weights (out, %lld) on x's "
             "device", op, tt_shape_str(x->shape, x->ndim, sx, sizeof sx), j,
             tt_dtype_name(ws[j]->dtype), tt_shape_str(ws[j]->shape, ws[j]->ndim, sw, sizeof sw),
             (long long)k_in);
    if (biases)
      TT_CHECK(biases[j] && biases[j]->ndim == 1 && biases[j]->shape[0] == ws[j]->shape[0] &&
                   biases[j]->dtype == TT_F32 && biases[j]->device == x->device,
               "%s: bias %d must be f32 [%lld] on x's device (give every weight a bias, or "
               "none)", op, j, (long long)ws[j]->shape[0]);
    total += ws[j]->shape[0];
  }

  tt_tensor *wcat = NULL, *x2 = NULL, *xo = NULL, *wo = NULL, *y2 = NULL, *y = NULL;
  tt_tensor *bcat = NULL, *wide = NULL;
  TT_TRY(tt_lowp_weight_group(ws, n, dtype, &wcat));
  int st = as_rows(x, &x2);
  const int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  /* the operands as the GEMMs read them, kept for backward */
  if (st == 0) st = operand_lowp(x2, dtype, &xo);
  if (st == 0) st = operand_lowp(wcat, dtype, &wo);
  if (st == 0 && !biases) st = gemm_lowp(xo, wo, 0, 1, dtype, out_dtype, &y2);
  if (st == 0 && biases) {
    /* the bias joins the fp32 sums before the one rounding, as in tt_linear_lowp */
    st = gemm_lowp(xo, wo, 0, 1, dtype, TT_F32, &wide);
    if (st == 0) st = tt_tensor_empty(&total, 1, TT_F32, x->device, &bcat);
    int64_t at = 0;
    for (int j = 0; st == 0 && j < n; j++) {
      tt_tensor *part = NULL;
      st = tt_narrow(bcat, 0, at, ws[j]->shape[0], &part);
      if (st == 0) st = tt_copy_(part, biases[j]);
      tt_tensor_release(part);
      at += ws[j]->shape[0];
    }
    tt_tensor *sum = NULL;
    if (st == 0) st = tt_add(wide, bcat, &sum);
    if (st == 0 && out_dtype != TT_F32) {
      st = tt_tensor_empty(sum->shape, 2, out_dtype, x->device, &y2);
      if (st == 0) st = tt_copy_(y2, sum);
      tt_tensor_release(sum);
    } else if (st == 0) {
      y2 = sum;
    }
  }
  if (st == 0) {
    int64_t shape[TT_MAX_DIMS];
    for (int d = 0; d < x->ndim - 1; d++) shape[d] = x->shape[d];
    shape[x->ndim - 1] = total;
    st = tt_view(y2, shape, x->ndim, &y);
  }
  tt_set_grad_enabled(grad);

  tt_tensor *in[1 + 2 * 3] = {x};
  for (int j = 0; j < n; j++) {
    in[1 + j] = ws[j];
    in[1 + n + j] = biases ? biases[j] : NULL;
  }
  const int n_in = 1 + (biases ? 2 : 1) * n;
  if (st == 0 && tt_should_record(in, n_in)) {
    tt_node *node = tt_record(op, group_backward, y, in, n_in);
    if (!node) {
      st = -1;
    } else {
      tt_node_save(node, xo);
      tt_node_save(node, wo);
      node->i[0] = n;
      node->i[1] = dtype;
      node->i[2] = biases != NULL;
      for (int j = 0; j < n; j++) node->i[3 + j] = ws[j]->shape[0];
    }
  }
  int64_t at = 0;
  for (int j = 0; st == 0 && j < n; j++) {
    st = tt_narrow(y, x->ndim - 1, at, ws[j]->shape[0], &outs[j]);
    at += ws[j]->shape[0];
  }
  if (st != 0)
    for (int j = 0; j < n; j++) {
      tt_tensor_release(outs[j]);
      outs[j] = NULL;
    }
  tt_tensor_release(y);
  tt_tensor_release(y2);
  tt_tensor_release(wide);
  tt_tensor_release(bcat);
  tt_tensor_release(wo);
  tt_tensor_release(xo);
  tt_tensor_release(x2);
  tt_tensor_release(wcat);
  return st;
}
