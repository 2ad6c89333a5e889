/*
** test_kernels.c — every CUDA op against its CPU twin, forward and backward, on fresh
** random inputs of odd sizes. Before each GPU run the allocator's cache is filled with
** NaN blocks of the sizes the op will ask for, so an output element the kernel forgets to
** write shows up as NaN. Tolerances are relative L2 errors for f32 (1e-5, looser where
** the GPU sums in another order over long rows).
**
** Without a GPU the program exits 77 before running anything: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "tetra_amp.h"
#include "embedding.h"

enum { MAX_IN = 6 };

typedef int (*op_fn)(tt_tensor **in, tt_tensor **out, const void *ctx);

/* Runs fn on CPU inputs and on their GPU copies; compares the output, then the grads of
** the float inputs marked in grad_mask after a backward from the same random upstream. */
static void check_op(const char *name, op_fn fn, const void *ctx, tt_tensor **cpu_in,
                     int n_in, unsigned grad_mask, double tol) {
  tt_tensor *gpu_in[MAX_IN] = {0}, *out_c = NULL, *out_g = NULL;
  for (int i = 0; i < n_in; i++) {
    if (!cpu_in[i]) continue;
    gpu_in[i] = to_dev(cpu_in[i], GPU);
    if (grad_mask & (1u << i)) {
      /* An input checked by an earlier op holds that op's gradient, which a backward adds
      ** to: the CPU side would compare the sum of both against the GPU's one. */
      cr_assert_eq(tt_zero_grad(cpu_in[i]), 0);
      cr_assert_eq(tt_set_requires_grad(cpu_in[i], 1), 0);
      cr_assert_eq(tt_set_requires_grad(gpu_in[i], 1), 0);
    }
  }
  cr_assert_eq(fn(cpu_in, &out_c, ctx), 0, "%s cpu: %s", name, tt_last_error());
  int64_t n_out = tt_tensor_numel(out_c);
  for (int i = 0; i < 4; i++) poison(n_out);
  cr_assert_eq(fn(gpu_in, &out_g, ctx), 0, "%s cuda: %s", name, tt_last_error());
  double e = rel_err(out_g, out_c);
  cr_assert(e <= tol, "%s forward: relative error %g > %g", name, e, tol);
  if (grad_mask) {
    tt_tensor *g = randn(out_c->shape, out_c->ndim, 1.0), *gg = to_dev(g, GPU);
    cr_assert_eq(tt_backward_with(out_c, g), 0, "%s cpu backward: %s", name, tt_last_error());
    for (int i = 0; i < n_in; i++)
      if (cpu_in[i]) for (int k = 0; k < 2; k++) poison(tt_tensor_numel(cpu_in[i]));
    cr_assert_eq(tt_backward_with(out_g, gg), 0, "%s cuda backward: %s", name, tt_last_error());
    for (int i = 0; i < n_in; i++) {
      if (!(grad_mask & (1u << i))) continue;
      cr_assert_not_null(gpu_in[i]->grad, "%s: no grad for input %d on cuda", name, i);
      double eg = rel_err(gpu_in[i]->grad, cpu_in[i]->grad);
      cr_assert(eg <= tol, "%s backward, input %d: relative error %g > %g", name, i, eg, tol);
    }
    tt_tensor_release(g);
    tt_tensor_release(gg);
  }
  tt_tensor_release(out_c);
  tt_tensor_release(out_g);
  for (int i = 0; i < n_in; i++) tt_tensor_release(gpu_in[i]);
}

/* -- Ops under test ----------------------------------------------------------------- */

static int op_add(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_add(in[0], in[1], out); }
static int op_mul(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_mul(in[0], in[1], out); }
static int op_div(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_div(in[0], in[1], out); }
static int op_silu(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_silu(in[0], out); }
static int op_gelu(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_gelu(in[0], out); }
static int op_swiglu(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_swiglu(in[0], in[1], out); }
static int op_sum1(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; int d = 1; return tt_sum(in[0], &d, 1, 0, out); }
static int op_sum_last(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; int d = -1; return tt_sum(in[0], &d, 1, 1, out); }
static int op_max(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; int d = -1; return tt_max(in[0], &d, 1, 0, out); }
static int op_softmax(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_softmax(in[0], -1, out); }
static int op_softmax0(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_softmax(in[0], 0, out); }
static int op_linear(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_linear(in[0], in[1], in[2], out); }
static int op_matmul_tt(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_matmul(in[0], in[1], NULL, 1, 1, out); }
static int op_embedding(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_embedding(in[0], in[1], out); }
static int op_embedding_band(tt_tensor **in, tt_tensor **out, const void *c) {
  return tt_embedding_band(in[0], in[1], *(const int64_t *)c, TT_F32, out);
}
static int op_rmsnorm(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_rmsnorm(in[0], in[1], 1e-5, out); }
static int op_layernorm(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_layernorm(in[0], in[1], in[2], 1e-5, out); }
static int op_rope(tt_tensor **in, tt_tensor **out, const void *c) { return tt_rope(in[0], NULL, 10000.0, *(const int *)c, out); }
static int op_attention(tt_tensor **in, tt_tensor **out, const void *c) { return tt_attention(in[0], in[1], in[2], *(const int *)c, 0.0, out); }
static int op_ce(tt_tensor **in, tt_tensor **out, const void *c) { (void)c; return tt_cross_entropy(in[0], in[1], -100, out); }
static int op_cast_bf16(tt_tensor **in, tt_tensor **out, const void *c) {
  (void)c;
  tt_tensor *h = NULL;
  if (tt_cast(in[0], TT_BF16, &h)) return -1;
  int rc = tt_cast(h, TT_F32, out);
  tt_tensor_release(h);
  return rc;
}
static int op_transpose_contig(tt_tensor **in, tt_tensor **out, const void *c) {
  (void)c;
  tt_tensor *t = NULL;
  if (tt_transpose(in[0], 0, 2, &t)) return -1;
  int rc = tt_contiguous(t, out);
  tt_tensor_release(t);
  return rc;
}

/* -- Tests -------------------------------------------------------------------------- */

Test(cuda, elementwise) {
  int64_t sa[3] = {3, 37, 129}, sb[2] = {37, 1}, sc[3] = {3, 37, 129};
  tt_tensor *in[2] = {randn(sa, 3, 1.0), randn(sb, 2, 1.0)};
  check_op("add (broadcast)", op_add, NULL, in, 2, 3u, 1e-6);
  check_op("mul (broadcast)", op_mul, NULL, in, 2, 3u, 1e-6);
  tt_tensor *d[2] = {randn(sa, 3, 1.0), NULL};
  tt_tensor_rand(sc, 3, 0.5, 2.0, &d[1]);
  check_op("div", op_div, NULL, d, 2, 3u, 1e-6);
  for (int i = 0; i < 2; i++) { tt_tensor_release(in[i]); tt_tensor_release(d[i]); }
}

Test(cuda, activations) {
  int64_t s[2] = {33, 1001};
  tt_tensor *in[2] = {randn(s, 2, 2.0), randn(s, 2, 1.0)};
  check_op("silu", op_silu, NULL, in, 1, 1u, 1e-5);
  check_op("gelu", op_gelu, NULL, in, 1, 1u, 1e-5);
  check_op("swiglu", op_swiglu, NULL, in, 2, 3u, 1e-5);
  for (int i = 0; i < 2; i++) tt_tensor_release(in[i]);
}

Test(cuda, reductions) {
  int64_t s[3] = {5, 77, 301};
  tt_tensor *x = randn(s, 3, 1.0);
  check_op("sum dim 1", op_sum1, NULL, &x, 1, 1u, 1e-5);
  check_op("sum last keepdim", op_sum_last, NULL, &x, 1, 1u, 1e-5);
  check_op("max last", op_max, NULL, &x, 1, 1u, 0);
  check_op("softmax last", op_softmax, NULL, &x, 1, 1u, 1e-5);
  check_op("softmax dim 0", op_softmax0, NULL, &x, 1, 1u, 1e-5);
  tt_tensor_release(x);
}

Test(cuda, matmul) {
  int64_t xs[3] = {3, 41, 67}, ws[2] = {53, 67}, bs[1] = {53};
  tt_tensor *in[3] = {randn(xs, 3, 1.0), randn(ws, 2, 0.1), randn(bs, 1, 0.1)};
  check_op("linear + bias", op_linear, NULL, in, 3, 7u, 1e-5);
  int64_t as[2] = {67, 41}, b2[2] = {29, 67};
  tt_tensor *t[2] = {randn(as, 2, 1.0), randn(b2, 2, 1.0)};
  check_op("matmul a^T b^T", op_matmul_tt, NULL, t, 2, 3u, 1e-5);
  for (int i = 0; i < 3; i++) tt_tensor_release(in[i]);
  for (int i = 0; i < 2; i++) tt_tensor_release(t[i]);
}

Test(cuda, embedding) {
  int64_t ws[2] = {97, 67}, is[2] = {3, 45};
  tt_tensor *in[2] = {randn(ws, 2, 1.0), NULL};
  cr_assert_eq(tt_tensor_randint(is, 2, 0, 97, TT_I64, &in[1]), 0);
  check_op("embedding (i64 ids, repeats)", op_embedding, NULL, in, 2, 1u, 1e-6);
  tt_tensor_release(in[1]);
  cr_assert_eq(tt_tensor_randint(is, 2, 0, 10, TT_I32, &in[1]), 0);
  check_op("embedding (i32 ids, many repeats)", op_embedding, NULL, in, 2, 1u, 1e-6);
  /* A table of width 0 still checks its ids, as the CPU twin does (the forward once
  ** launched blocks of 0 threads for it and failed). */
  int64_t w0s[2] = {97, 0};
  tt_tensor *w0 = NULL, *y0 = NULL, *y1 = NULL, *far = NULL;
  cr_assert_eq(tt_tensor_zeros(w0s, 2, TT_F32, GPU, &w0), 0, "%s", tt_last_error());
  tt_tensor *gids = to_dev(in[1], GPU);
  cr_assert_eq(tt_embedding(w0, gids, &y0), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_numel(y0), 0);
  cr_assert_eq(tt_tensor_randint(is, 2, 97, 200, TT_I64, &far), 0);
  tt_tensor *gfar = to_dev(far, GPU);
  cr_assert_eq(tt_embedding(w0, gfar, &y1), -1, "an id outside the table was taken");
  cr_assert(strstr(tt_last_error(), "outside the vocabulary") != NULL, "%s", tt_last_error());
  tt_tensor *more[] = {w0, y0, y1, far, gids, gfar};
  for (size_t i = 0; i < sizeof more / sizeof *more; i++) tt_tensor_release(more[i]);
  /* A vocabulary-parallel share: rows of ids [40, 137) of 0..199, zero rows (no gradient)
  ** for the rest, and no error. */
  const int64_t start = 40;
  tt_tensor_release(in[1]);
  cr_assert_eq(tt_tensor_randint(is, 2, 0, 200, TT_I64, &in[1]), 0);
  check_op("embedding band (i64 ids)", op_embedding_band, &start, in, 2, 1u, 1e-6);
  for (int i = 0; i < 2; i++) tt_tensor_release(in[i]);
}

/* The backward kernel itself (kernels/cuda/embedding.cu, tokens sorted by id) against the
** CPU twin, bit for bit: each row of dweight gets its tokens' rows added in token order on
** both, onto a table that already holds values (the kernel accumulates). Ids are skewed
** (half the tokens share a handful of ids, as padding and common tokens do), some are
** outside [0, V) and must be skipped (the forward reports them), i32 and i64 ids, f32 and
** bf16 rows, and a D narrower than a warp. */
static void expect_backward_bits(int ids_i64, int dout_dtype, int64_t n, int64_t V,
                                 int64_t D) {
  const int64_t ns[1] = {n}, rows[2] = {n, D}, table[2] = {V, D};
  tt_tensor *ids = NULL, *dout = randn(rows, 2, 1.0), *dl = NULL, *w = randn(table, 2, 1.0);
  cr_assert_eq(tt_tensor_empty(ns, 1, ids_i64 ? TT_I64 : TT_I32, TT_CPU, &ids), 0);
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int64_t id = x % 2 ? (int64_t)(x >> 8) % 5 : (int64_t)(x >> 8) % V;
    if (x % 97 == 3) id = V + (int64_t)(x % 5);   /* outside the table */
    if (x % 89 == 4) id = -1;
    if (ids_i64) ((int64_t *)tt_tensor_data(ids))[i] = id;
    else ((int32_t *)tt_tensor_data(ids))[i] = (int32_t)id;
  }
  cr_assert_eq(tt_cast(dout, dout_dtype, &dl), 0);
  tt_tensor *gi = to_dev(ids, GPU), *gd = to_dev(dl, GPU), *gw = to_dev(w, GPU);
  cr_assert_eq(tt_embedding_cpu.backward(tt_tensor_data(w), tt_tensor_data(dl),
                                         tt_tensor_data(ids), ids_i64, n, V, D, dout_dtype, 0),
               0, "%s", tt_last_error());
  cr_assert_eq(tt_embedding_cuda.backward(tt_tensor_data(gw), tt_tensor_data(gd),
                                          tt_tensor_data(gi), ids_i64, n, V, D, dout_dtype, 0),
               0, "%s", tt_last_error());
  tt_tensor *back = to_dev(gw, TT_CPU);
  const float *a = tt_tensor_data(back), *b = tt_tensor_data(w);
  for (int64_t k = 0; k < V * D; k++)
    cr_assert(memcmp(&a[k], &b[k], sizeof(float)) == 0,
              "n %lld, V %lld, D %lld: dweight[%lld, %lld] is %.9g on the GPU, %.9g on the "
              "CPU", (long long)n, (long long)V, (long long)D, (long long)(k / D),
              (long long)(k % D), a[k], b[k]);
  tt_tensor *all[] = {ids, dout, dl, w, gi, gd, gw, back};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
}

Test(cuda, embedding_backward_bits) {
  cr_assert(&tt_embedding_cuda, "the CUDA embedding kernels are not linked in");
  expect_backward_bits(1, TT_F32, 4099, 1000, 67);
  expect_backward_bits(0, TT_F32, 777, 50257, 300);
  expect_backward_bits(0, TT_BF16, 2048, 333, 20);
  expect_backward_bits(1, TT_BF16, 1, 7, 129);
  expect_backward_bits(0, TT_F32, 0, 7, 16);
}

/* The touched rows of a gradient (the row-sparse reduction's mask) on the GPU against the
** CPU twin, word for word: rows of zeros, rows whose only nonzero is the last element (or
** the first), NaN, inf and -0.0 rows, a V that is no multiple of 32 and D narrower and
** wider than a warp. The GPU mask starts as garbage (every word must be written). */
static void expect_row_mask(int64_t V, int64_t D) {
  const int64_t shape[2] = {V, D}, words = (V + 31) / 32;
  tt_tensor *g = NULL, *m = NULL, *gm = NULL;
  cr_assert_eq(tt_tensor_zeros(shape, 2, TT_F32, TT_CPU, &g), 0);
  float *x = tt_tensor_data(g);
  for (int64_t v = 0; v < V; v++) {
    switch (v % 7) {
    case 1: x[v * D + D - 1] = 1e-30f; break;
    case 2: x[v * D] = -3.0f; break;
    case 3: if (v % 3 == 0) x[v * D + D / 2] = NAN; break;
    case 4: x[v * D + (v % D)] = INFINITY; break;
    case 5: x[v * D + (v % D)] = -0.0f; break;   /* equal to zero: untouched */
    default: break;
    }
  }
  cr_assert_eq(tt_tensor_empty(&words, 1, TT_I32, TT_CPU, &m), 0);
  cr_assert_eq(tt_tensor_empty(&words, 1, TT_I32, GPU, &gm), 0);
  cr_assert_eq(tt_fill_(gm, -1.0), 0);
  tt_tensor *gg = to_dev(g, GPU);
  cr_assert_eq(tt_embedding_cpu.row_mask(tt_tensor_data(m), x, V, D), 0);
  cr_assert_eq(tt_embedding_cuda.row_mask(tt_tensor_data(gm), tt_tensor_data(gg), V, D), 0,
               "%s", tt_last_error());
  tt_tensor *back = to_dev(gm, TT_CPU);
  const uint32_t *a = tt_tensor_data(back), *b = tt_tensor_data(m);
  for (int64_t w = 0; w < words; w++)
    cr_assert_eq(a[w], b[w], "V %lld, D %lld: word %lld is %08x on the GPU, %08x on the CPU",
                 (long long)V, (long long)D, (long long)w, a[w], b[w]);
  tt_tensor *all[] = {g, m, gm, gg, back};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
}

Test(cuda, embedding_row_mask) {
  expect_row_mask(1000, 67);
  expect_row_mask(50257, 20);
  expect_row_mask(33, 300);
  expect_row_mask(7, 1);
}

/* axpy into bf16 / f16 (a half activation's gradient receiving its second contribution)
** in one pass on the GPU, bit for bit the CPU twin's: widened, one fused multiply-add,
** rounded once. Through tt_axpy_, which picks the kernel for contiguous operands. */
Test(cuda, axpy_half_bits) {
  const int64_t s[1] = {100003};
  const int dts[2] = {TT_BF16, TT_F16};
  for (int d = 0; d < 2; d++)
    for (int b32 = 0; b32 < 2; b32++) {
      tt_tensor *af = randn(s, 1, 1.0), *bf = randn(s, 1, 3.0), *a = NULL, *b = NULL;
      cr_assert_eq(tt_cast(af, dts[d], &a), 0);
      cr_assert_eq(tt_cast(bf, b32 ? TT_F32 : dts[d], &b), 0);
      tt_tensor *ga = to_dev(a, GPU), *gb = to_dev(b, GPU);
      cr_assert_eq(tt_axpy_(a, -0.37, b), 0, "%s", tt_last_error());
      cr_assert_eq(tt_axpy_(ga, -0.37, gb), 0, "%s", tt_last_error());
      tt_tensor *back = to_dev(ga, TT_CPU);
      const uint16_t *x = tt_tensor_data(back), *y = tt_tensor_data(a);
      for (int64_t i = 0; i < s[0]; i++)
        cr_assert_eq(x[i], y[i], "%s += %s: element %lld is 0x%04x on the GPU, 0x%04x on the CPU",
                     tt_dtype_name(dts[d]), b32 ? "f32" : tt_dtype_name(dts[d]), (long long)i,
                     x[i], y[i]);
      tt_tensor *all[] = {af, bf, a, b, ga, gb, back};
      for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
    }
}

Test(cuda, norms) {
  int64_t xs[3] = {2, 19, 333}, ws[1] = {333};
  tt_tensor *in[3] = {randn(xs, 3, 2.0), randn(ws, 1, 1.0), randn(ws, 1, 1.0)};
  check_op("rmsnorm", op_rmsnorm, NULL, in, 2, 3u, 1e-5);
  check_op("layernorm", op_layernorm, NULL, in, 3, 7u, 1e-5);
  for (int i = 0; i < 3; i++) tt_tensor_release(in[i]);
}

Test(cuda, rope) {
  int64_t xs[4] = {2, 23, 3, 34};
  tt_tensor *x = randn(xs, 4, 1.0);
  for (int inter = 0; inter < 2; inter++) check_op("rope", op_rope, &inter, &x, 1, 1u, 1e-5);
  tt_tensor_release(x);
}

Test(cuda, attention_gqa) {
  int64_t qs[4] = {2, 37, 6, 40}, ks[4] = {2, 37, 2, 40};
  tt_tensor *in[3] = {randn(qs, 4, 1.0), randn(ks, 4, 1.0), randn(ks, 4, 1.0)};
  for (int causal = 0; causal < 2; causal++)
    check_op(causal ? "attention causal gqa" : "attention gqa", op_attention, &causal, in, 3, 7u,
             2e-5);
  for (int i = 0; i < 3; i++) tt_tensor_release(in[i]);
}

Test(cuda, cross_entropy) {
  int64_t ls[2] = {29, 1003}, ts[1] = {29};
  tt_tensor *in[2] = {randn(ls, 2, 3.0), NULL};
  cr_assert_eq(tt_tensor_randint(ts, 1, 0, 1003, TT_I64, &in[1]), 0);
  tt_tensor_set(in[1], 3, -100);   /* ignored row */
  check_op("cross_entropy", op_ce, NULL, in, 2, 1u, 1e-5);
  for (int i = 0; i < 2; i++) tt_tensor_release(in[i]);
}

Test(cuda, casts_and_copies) {
  int64_t s[3] = {7, 9, 11};
  tt_tensor *x = randn(s, 3, 10.0);
  check_op("cast f32 -> bf16 -> f32", op_cast_bf16, NULL, &x, 1, 1u, 0);
  check_op("transpose + contiguous", op_transpose_contig, NULL, &x, 1, 1u, 0);
  tt_tensor_release(x);
}

Test(cuda, adamw_and_grad_norm) {
  int64_t s[1] = {10007};
  tt_tensor *p[2], *m[2], *v[2], *g;
  for (int d = 0; d < 2; d++) {
    tt_manual_seed(11);
    tt_tensor *p0 = randn(s, 1, 1.0);
    g = randn(s, 1, 0.1);
    p[d] = to_dev(p0, d ? GPU : TT_CPU);
    tt_tensor *gd = to_dev(g, d ? GPU : TT_CPU);
    cr_assert_eq(tt_set_requires_grad(p[d], 1), 0);
    cr_assert_eq(tt_accumulate_grad(p[d], gd), 0, "%s", tt_last_error());
    cr_assert_eq(tt_tensor_zeros(s, 1, TT_F32, d ? GPU : TT_CPU, &m[d]), 0);
    cr_assert_eq(tt_tensor_zeros(s, 1, TT_F32, d ? GPU : TT_CPU, &v[d]), 0);
    tt_tensor_release(p0); tt_tensor_release(g); tt_tensor_release(gd);
  }
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  double norms[2];
  for (int d = 0; d < 2; d++) {
    cr_assert_eq(tt_grad_norm(&p[d], 1, &norms[d]), 0, "%s", tt_last_error());
    for (int step = 1; step <= 3; step++)
      cr_assert_eq(tt_adamw_step(&p[d], &m[d], &v[d], 1, &cfg, step), 0, "%s", tt_last_error());
  }
  cr_assert_float_eq(norms[1], norms[0], 1e-9 * norms[0]);
  cr_assert(rel_err(p[1], p[0]) < 1e-6);
  cr_assert(rel_err(v[1], v[0]) < 1e-6);
  for (int d = 0; d < 2; d++) { tt_tensor_release(p[d]); tt_tensor_release(m[d]); tt_tensor_release(v[d]); }
}

Test(cuda, fp8_and_loss_scaler) {
  int64_t s[2] = {61, 129};
  tt_tensor *x = randn(s, 2, 4.0), *xg = to_dev(x, GPU);
  tt_tensor *fc = NULL, *fg = NULL;
  double ac = 0, ag = 0;
  for (int k = 0; k < 2; k++) {
    int dt = k ? TT_E5M2 : TT_E4M3;
    poison(61 * 129);
    cr_assert_eq(tt_fp8_fake_quantize(x, dt, 20.0, &fc, &ac), 0, "%s", tt_last_error());
    cr_assert_eq(tt_fp8_fake_quantize(xg, dt, 20.0, &fg, &ag), 0, "%s", tt_last_error());
    cr_assert_float_eq(ag, ac, 1e-6 * ac);
    cr_assert(rel_err(fg, fc) == 0, "fp8 rounding differs between cpu and cuda");
    tt_tensor_release(fc); tt_tensor_release(fg);
  }
  /* Unscale on the GPU: same values as on the CPU, and the inf check. */
  tt_tensor *p = NULL;
  cr_assert_eq(tt_tensor_zeros(s, 2, TT_F32, GPU, &p), 0);
  cr_assert_eq(tt_set_requires_grad(p, 1), 0);
  cr_assert_eq(tt_accumulate_grad(p, xg), 0);
  int found = -1;
  cr_assert_eq(tt_grads_unscale_check(&p, 1, 0.25, &found), 0, "%s", tt_last_error());
  cr_assert_eq(found, 0);
  tt_tensor *want = NULL;
  cr_assert_eq(tt_scale(x, 0.25, &want), 0);
  cr_assert(rel_err(p->grad, want) == 0);
  tt_tensor *bad = NULL, *badg = NULL;
  cr_assert_eq(tt_tensor_full(s, 2, TT_F32, TT_CPU, INFINITY, &bad), 0);
  badg = to_dev(bad, GPU);
  cr_assert_eq(tt_accumulate_grad(p, badg), 0);
  cr_assert_eq(tt_grads_unscale_check(&p, 1, 1.0, &found), 0, "%s", tt_last_error());
  cr_assert_eq(found, 1);
  tt_tensor_release(x); tt_tensor_release(xg); tt_tensor_release(p); tt_tensor_release(want);
  tt_tensor_release(bad); tt_tensor_release(badg);
}
