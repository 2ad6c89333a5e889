/*
** test_ops_matmul.c — matmul (batched, transposed operands, bias, shared or batched b)
** and linear against a float64 loop; backward against finite differences; transposed
** views and linear layers must run without copies; errors.
*/
#include "tt_test.h"

/* -- Reference ----------------------------------------------------------------------- */

typedef struct mm_ctx {
  int linear;          /* call tt_linear(a, b, bias) instead of tt_matmul */
  int ta, tb;
  int64_t batch;       /* product of a's leading dims */
  int64_t ar, ac;      /* a's stored matrix dims (ar = 1 for a 1-D a) */
  int64_t br, bc;      /* b's stored matrix dims */
  int b_batched;
} mm_ctx;

static mm_ctx mm_setup(int linear, const tt_tensor *a, const tt_tensor *b, int ta, int tb) {
  mm_ctx c = {.linear = linear, .ta = ta, .tb = tb, .batch = 1};
  const int nlead = a->ndim >= 2 ? a->ndim - 2 : 0;
  for (int l = 0; l < nlead; l++) c.batch *= a->shape[l];
  c.ar = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1;
  c.ac = a->shape[a->ndim - 1];
  c.br = b->shape[b->ndim - 2];
  c.bc = b->shape[b->ndim - 1];
  c.b_batched = b->ndim > 2;
  return c;
}

static void mm_ref(double *const *in, double *out, void *vctx) {
  const mm_ctx *c = vctx;
  const int64_t m = c->ta ? c->ac : c->ar, k = c->ta ? c->ar : c->ac;
  const int64_t n = c->tb ? c->br : c->bc;
  for (int64_t l = 0; l < c->batch; l++) {
    const double *a = in[0] + l * c->ar * c->ac;
    const double *b = in[1] + (c->b_batched ? l * c->br * c->bc : 0);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = in[2] ? in[2][j] : 0.0;
        for (int64_t p = 0; p < k; p++) {
          const double x = c->ta ? a[p * c->ac + i] : a[i * c->ac + p];
          const double y = c->tb ? b[j * c->bc + p] : b[p * c->bc + j];
          s += x * y;
        }
        out[(l * m + i) * n + j] = s;
      }
  }
}

static int mm_op(tt_tensor **in, tt_tensor **out, void *vctx) {
  const mm_ctx *c = vctx;
  if (c->linear) return tt_linear(in[0], in[1], in[2], out);
  return tt_matmul(in[0], in[1], in[2], c->ta, c->tb, out);
}

/* Forward and backward of one configuration (bias may be NULL). */
static void check_mm(int linear, tt_tensor *a, tt_tensor *b, tt_tensor *bias, int ta, int tb) {
  static const int all[3] = {1, 1, 1};
  mm_ctx c = mm_setup(linear, a, b, ta, tb);
  tt_tensor *in[3] = {a, b, bias};
  tt_test_check_forward(mm_op, mm_ref, in, 3, &c, 1e-5, 1e-5);
  tt_test_check_backward(mm_op, mm_ref, in, 3, all, &c, 1e-4, 1e-4);
}

/* Random a (lead..., M, K) / b (K, N) stored as the trans flags say. */
static tt_tensor *rand_mat(const int64_t *lead, int nlead, int64_t r, int64_t c, int trans,
                           int strided, uint64_t seed) {
  int64_t s[TT_MAX_DIMS];
  for (int l = 0; l < nlead; l++) s[l] = lead[l];
  s[nlead] = trans ? c : r;
  s[nlead + 1] = trans ? r : c;
  return strided ? tt_test_rand_strided(s, nlead + 2, seed) : tt_test_rand(s, nlead + 2, seed);
}

Test(matmul, plain_all_transposes_and_bias) {
  const int64_t m = 5, k = 7, n = 3, sn[1] = {3};
  tt_tensor *bias = tt_test_rand(sn, 1, 99);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      tt_tensor *a = rand_mat(NULL, 0, m, k, ta, 0, 1 + ta);
      tt_tensor *b = rand_mat(NULL, 0, k, n, tb, 0, 3 + tb);
      check_mm(0, a, b, NULL, ta, tb);
      check_mm(0, a, b, bias, ta, tb);
      tt_tensor_release(a);
      tt_tensor_release(b);
    }
  tt_tensor_release(bias);
}

Test(matmul, strided_and_transposed_views) {
  /* tt_test_rand_strided gives transposed, padded views: BLAS reads them in place. */
  const int64_t m = 5, k = 7, n = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      tt_tensor *a = rand_mat(NULL, 0, m, k, ta, 1, 5 + ta);
      tt_tensor *b = rand_mat(NULL, 0, k, n, tb, 1, 7 + tb);
      tt_tensor *bc = rand_mat(NULL, 0, k, n, tb, 0, 9);
      check_mm(0, a, b, NULL, ta, tb);
      check_mm(0, a, bc, NULL, ta, tb);
      tt_tensor_release(a);
      tt_tensor_release(b);
      tt_tensor_release(bc);
    }
}

Test(matmul, operand_needing_a_copy) {
  /* Neither stride is 1: (5, 7) with strides (14, 2) over a (5, 14) base. */
  const int64_t sbase[2] = {5, 14}, sb[2] = {7, 3};
  tt_tensor *base = tt_test_rand(sbase, 2, 11), *a = NULL;
  cr_assert(tt_narrow(base, 1, 0, 7, &a) == 0);
  a->stride[1] = 2;
  tt_tensor *b = tt_test_rand(sb, 2, 12);
  check_mm(0, a, b, NULL, 0, 0);
  check_mm(0, b, a, NULL, 1, 1);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(base);
}

Test(matmul, batched_a_shared_b) {
  const int64_t lead[2] = {2, 3}, sn[1] = {5};
  tt_tensor *bias = tt_test_rand(sn, 1, 98);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      tt_tensor *a = rand_mat(lead, 2, 3, 7, ta, ta, 13 + ta);
      tt_tensor *b = rand_mat(NULL, 0, 7, 5, tb, 0, 15);
      check_mm(0, a, b, bias, ta, tb);
      tt_tensor_release(a);
      tt_tensor_release(b);
    }
  tt_tensor_release(bias);
}

Test(matmul, batched_both) {
  const int64_t lead[2] = {3, 2};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      tt_tensor *a = rand_mat(lead, 2, 5, 3, ta, tb, 17), *b = rand_mat(lead, 2, 3, 7, tb, ta, 19);
      check_mm(0, a, b, NULL, ta, tb);
      tt_tensor_release(a);
      tt_tensor_release(b);
    }
}

Test(matmul, permuted_batch_dims) {
  /* Attention-style (B, H, T, D) views of (B, T, H, D) tensors: batch strides that do
  ** not merge, so the product runs as a strided batch inside a loop. */
  const int64_t sq[4] = {2, 5, 3, 7};
  const int perm[4] = {0, 2, 1, 3};
  tt_tensor *q = tt_test_rand(sq, 4, 21), *kk = tt_test_rand(sq, 4, 22), *qp = NULL, *kp = NULL;
  cr_assert(tt_permute(q, perm, 4, &qp) == 0 && tt_permute(kk, perm, 4, &kp) == 0);
  check_mm(0, qp, kp, NULL, 0, 1);   /* scores q k^T: (2, 3, 5, 5) */
  check_mm(0, qp, kp, NULL, 1, 0);   /* q^T k: (2, 3, 7, 7) */
  tt_tensor_release(qp);
  tt_tensor_release(kp);
  tt_tensor_release(q);
  tt_tensor_release(kk);
}

Test(matmul, larger_threaded_shapes) {
  const int64_t lead[1] = {3}, sn[1] = {33};
  tt_tensor *a = rand_mat(lead, 1, 67, 129, 0, 0, 23), *b = rand_mat(NULL, 0, 129, 33, 1, 0, 24);
  tt_tensor *bias = tt_test_rand(sn, 1, 25);
  mm_ctx c = mm_setup(0, a, b, 0, 1);
  tt_tensor *in[3] = {a, b, bias};
  tt_test_check_forward(mm_op, mm_ref, in, 3, &c, 1e-5, 1e-5);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(bias);
}

Test(matmul, linear) {
  const int64_t sx[3] = {2, 3, 7}, sw[2] = {5, 7}, sb[1] = {5}, sv[1] = {7};
  tt_tensor *x = tt_test_rand(sx, 3, 30), *xs = tt_test_rand_strided(sx, 3, 31);
  tt_tensor *w = tt_test_rand(sw, 2, 32), *ws = tt_test_rand_strided(sw, 2, 33);
  tt_tensor *bias = tt_test_rand(sb, 1, 34), *v = tt_test_rand(sv, 1, 35);
  check_mm(1, x, w, bias, 0, 1);
  check_mm(1, x, w, NULL, 0, 1);
  check_mm(1, xs, ws, bias, 0, 1);
  check_mm(1, v, w, bias, 0, 1);
  tt_tensor *o = NULL;
  cr_assert(tt_linear(v, w, NULL, &o) == 0 && o->ndim == 1 && o->shape[0] == 5);
  tt_tensor_release(o);
  tt_tensor *rs[] = {x, xs, w, ws, bias, v};
  for (int i = 0; i < 6; i++) tt_tensor_release(rs[i]);
}

static int64_t allocs_now(void) {
  tt_alloc_stats st;
  cr_assert(tt_alloc_stats_get(TT_CPU, &st) == 0);
  return st.num_allocs;
}

Test(matmul, no_copies_for_linear_and_transposed_views) {
  const int64_t sx[3] = {4, 9, 16}, sw[2] = {24, 16}, sb[1] = {24};
  tt_tensor *x = tt_test_rand(sx, 3, 40), *w = tt_test_rand(sw, 2, 41);
  tt_tensor *bias = tt_test_rand(sb, 1, 42), *o = NULL, *wt = NULL;
  cr_assert(tt_set_requires_grad(x, 1) == 0 && tt_set_requires_grad(w, 1) == 0 &&
            tt_set_requires_grad(bias, 1) == 0);
  /* Forward: only the output is allocated. */
  int64_t before = allocs_now();
  cr_assert(tt_linear(x, w, bias, &o) == 0, "%s", tt_last_error());
  cr_assert_eq(allocs_now() - before, 1, "tt_linear allocated %lld buffers",
               (long long)(allocs_now() - before));
  /* Backward: dX, dW and db, nothing else. */
  tt_tensor *g = tt_test_rand(o->shape, o->ndim, 43);
  before = allocs_now();
  cr_assert(tt_backward_with(o, g) == 0, "%s", tt_last_error());
  cr_assert_eq(allocs_now() - before, 3, "backward allocated %lld buffers",
               (long long)(allocs_now() - before));
  tt_tensor_release(o);
  /* A transposed view of w is read in place: matmul(x, w^T) allocates the output only. */
  cr_assert(tt_transpose(w, 0, 1, &wt) == 0);
  tt_set_grad_enabled(0);
  before = allocs_now();
  cr_assert(tt_matmul(x, wt, NULL, 0, 0, &o) == 0, "%s", tt_last_error());
  cr_assert_eq(allocs_now() - before, 1);
  tt_set_grad_enabled(1);
  tt_tensor_release(o);
  tt_tensor_release(wt);
  tt_tensor_release(g);
  tt_tensor_release(x);
  tt_tensor_release(w);
  tt_tensor_release(bias);
}

Test(matmul, gradient_of_shared_b_sums_batches) {
  /* y = sum over batches of x_b w: dW must be the sum of x_b^T g_b, checked here
  ** against a batch-by-batch loop of 2-D products. */
  const int64_t sx[3] = {3, 4, 5}, sw[2] = {5, 2};
  tt_tensor *x = tt_test_rand(sx, 3, 50), *w = tt_test_rand(sw, 2, 51), *y = NULL;
  cr_assert(tt_set_requires_grad(w, 1) == 0);
  cr_assert(tt_matmul(x, w, NULL, 0, 0, &y) == 0);
  tt_tensor *g = tt_test_rand(y->shape, 3, 52);
  cr_assert(tt_backward_with(y, g) == 0, "%s", tt_last_error());
  double want[10] = {0};
  for (int b = 0; b < 3; b++)
    for (int i = 0; i < 4; i++)
      for (int p = 0; p < 5; p++)
        for (int j = 0; j < 2; j++)
          want[p * 2 + j] +=
              tt_tensor_get(x, (b * 4 + i) * 5 + p) * tt_tensor_get(g, (b * 4 + i) * 2 + j);
  tt_test_assert_close(w->grad, want, 10, 1e-5, 1e-5, "dW");
  tt_tensor_release(y);
  tt_tensor_release(g);
  tt_tensor_release(x);
  tt_tensor_release(w);
}

Test(matmul, empty_inner_dim) {
  const int64_t sa[2] = {3, 0}, sb[2] = {0, 4}, sn[1] = {4};
  tt_tensor *a = NULL, *b = NULL, *o = NULL, *bias = tt_test_rand(sn, 1, 60);
  cr_assert(tt_tensor_empty(sa, 2, TT_F32, TT_CPU, &a) == 0);
  cr_assert(tt_tensor_empty(sb, 2, TT_F32, TT_CPU, &b) == 0);
  cr_assert(tt_matmul(a, b, bias, 0, 0, &o) == 0, "%s", tt_last_error());
  double want[12];
  for (int i = 0; i < 12; i++) want[i] = tt_tensor_get(bias, i % 4);
  tt_test_assert_close(o, want, 12, 0, 0, "bias only");
  tt_tensor_release(o);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(bias);
}

Test(matmul, errors) {
  const int64_t s57[2] = {5, 7}, s63[2] = {6, 3}, s3[1] = {3}, s4[1] = {4};
  const int64_t s257[3] = {2, 5, 7}, s373[3] = {3, 7, 3};
  tt_tensor *a = tt_test_rand(s57, 2, 70), *b = tt_test_rand(s63, 2, 71), *o = NULL;
  tt_tensor *v = tt_test_rand(s3, 1, 72), *bias4 = tt_test_rand(s4, 1, 73);
  tt_tensor *a3 = tt_test_rand(s257, 3, 74), *b3 = tt_test_rand(s373, 3, 75), *i = NULL;
  tt_test_assert_error(tt_matmul(a, b, NULL, 0, 0, &o), "inner dims differ");
  tt_test_assert_error(tt_matmul(a, b, NULL, 0, 0, &o), "[6, 3]");
  tt_test_assert_error(tt_matmul(v, b, NULL, 0, 0, &o), "at least 2 dims");
  tt_test_assert_error(tt_matmul(a3, b3, NULL, 0, 0, &o), "batch dims differ");
  tt_test_assert_error(tt_matmul(a, b3, NULL, 0, 0, &o), "expected 2 dims");
  tt_test_assert_error(tt_matmul(b, b, bias4, 1, 0, &o), "bias");
  tt_test_assert_error(tt_linear(a, b, NULL, &o), "tt_linear");
  cr_assert(tt_tensor_zeros(s57, 2, TT_I32, TT_CPU, &i) == 0);
  tt_test_assert_error(tt_matmul(i, a, NULL, 0, 1, &o), "tt_matmul");
  tt_test_assert_error(tt_matmul(NULL, a, NULL, 0, 1, &o), "NULL");
  cr_assert_null(o);
  tt_tensor *rs[] = {a, b, v, bias4, a3, b3, i};
  for (int k = 0; k < 7; k++) tt_tensor_release(rs[k]);
}
