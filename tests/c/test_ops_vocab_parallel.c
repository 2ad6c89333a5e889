/*
** test_ops_vocab_parallel.c — the CPU kernels of the vocab-parallel cross-entropy
** (kernels/vocab_parallel.h) against a float64 loop over the full logits. A group of S
** ranks is played in one process: the full (N, V) logits are cut into S column shards
** (uneven when S does not divide V), each piece runs on every shard, and the "all-reduce"
** between pieces is a plain loop (max, then sum). Covers f32 and bf16 logits, i32 and i64
** targets, ignored rows, targets inside and outside each shard, shards wider than one
** partial-sum block, bad targets, and the op itself on the one-process world.
*/
#include "tt_test.h"
#include "core/tt_internal.h"
#include "kernel.h"
#include "tetra_vocab_parallel.h"
#include "vocab_parallel.h"

enum { IGNORE = -100, MAX_S = 4 };

typedef struct {
  int64_t N, V, S;
  int dtype, tgt_i64;
  float *x;          /* (N, V) f32, already rounded to bf16 when dtype is bf16 */
  int64_t *t;        /* (N) */
  void *tg;          /* (N) i32 or i64 */
  int64_t start[MAX_S + 1];
} vp_case;

static const tt_vocab_parallel_kernels *K = &tt_vocab_parallel_cpu;

static vp_case make_case(int64_t N, int64_t V, int64_t S, int dtype, int tgt_i64,
                         double scale, uint64_t seed) {
  vp_case c = {N, V, S, dtype, tgt_i64, NULL, NULL, NULL, {0}};
  c.x = malloc(sizeof(float) * (size_t)(N * V));
  c.t = malloc(sizeof(int64_t) * (size_t)N);
  c.tg = malloc((tgt_i64 ? 8 : 4) * (size_t)N);
  cr_assert(c.x && c.t && c.tg);
  for (int64_t i = 0; i < N * V; i++) {
    float v = (float)(scale * tt_test_uniform(&seed));
    c.x[i] = dtype == TT_BF16 ? tt_elem_bf16_to_float(tt_elem_float_to_bf16(v)) : v;
  }
  for (int64_t n = 0; n < N; n++) {
    c.t[n] = n % 4 == 3 ? IGNORE : (int64_t)(tt_test_next(&seed) % (uint64_t)V);
    if (tgt_i64) ((int64_t *)c.tg)[n] = c.t[n];
    else ((int32_t *)c.tg)[n] = (int32_t)c.t[n];
  }
  int64_t part = (V + S - 1) / S;   /* the last shard is the short one, as in the layouts */
  for (int64_t s = 0; s <= S; s++) c.start[s] = s * part < V ? s * part : V;
  return c;
}

static void free_case(vp_case *c) {
  free(c->x);
  free(c->t);
  free(c->tg);
}

/* Shard s of the logits as a buffer in the case's dtype (caller frees). */
static void *shard_logits(const vp_case *c, int64_t s) {
  int64_t a = c->start[s], vl = c->start[s + 1] - a;
  size_t es = c->dtype == TT_BF16 ? 2 : 4;
  void *buf = malloc(es * (size_t)(c->N * vl));
  cr_assert(buf);
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t j = 0; j < vl; j++) {
      float v = c->x[n * c->V + a + j];
      if (c->dtype == TT_BF16) ((uint16_t *)buf)[n * vl + j] = tt_elem_float_to_bf16(v);
      else ((float *)buf)[n * vl + j] = v;
    }
  return buf;
}

/* float64 reference: loss, and the full gradient (N, V) for dloss. */
static double ref_loss(const vp_case *c, double dloss, double *grad) {
  double total = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < c->N; n++) count += c->t[n] != IGNORE;
  for (int64_t n = 0; n < c->N; n++) {
    const float *x = c->x + n * c->V;
    double *g = grad + n * c->V;
    for (int64_t j = 0; j < c->V; j++) g[j] = 0.0;
    if (c->t[n] == IGNORE) continue;
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < c->V; j++) mx = x[j] > mx ? x[j] : mx;
    for (int64_t j = 0; j < c->V; j++) s += exp(x[j] - mx);
    double lse = mx + log(s);
    total += lse - x[c->t[n]];
    for (int64_t j = 0; j < c->V; j++)
      g[j] = dloss / (double)count * (exp(x[j] - lse) - (j == c->t[n] ? 1.0 : 0.0));
  }
  return count ? total / (double)count : 0.0;
}

/* Runs the four pieces on every shard with the reductions in between; checks each piece
** and the result against the reference. */
static void check_case(vp_case *c, double tol, double gtol) {
  int64_t N = c->N, V = c->V, S = c->S;
  float *mx = calloc((size_t)N, sizeof(float)), *mx_s = malloc(sizeof(float) * (size_t)N);
  float *red = calloc((size_t)(3 * N), sizeof(float));
  float *red_s = malloc(sizeof(float) * (size_t)(3 * N));
  float *lse = malloc(sizeof(float) * (size_t)N);
  double *want = malloc(sizeof(double) * (size_t)(N * V));
  void *shard[MAX_S];
  cr_assert(mx && mx_s && red && red_s && lse && want);
  float dloss = 0.75f;
  double want_loss = ref_loss(c, dloss, want);
  for (int64_t n = 0; n < N; n++) mx[n] = -INFINITY;
  for (int64_t s = 0; s < S; s++) {
    int64_t a = c->start[s], vl = c->start[s + 1] - a;
    shard[s] = shard_logits(c, s);
    cr_assert_eq(K->row_max(mx_s, shard[s], c->tg, c->tgt_i64, IGNORE, N, vl, c->dtype), 0,
                 "%s", tt_last_error());
    for (int64_t n = 0; n < N; n++) {
      float m = -INFINITY;
      for (int64_t j = 0; j < vl; j++) m = fmaxf(m, c->x[n * V + a + j]);
      cr_assert_eq(mx_s[n], c->t[n] == IGNORE ? 0.0f : m, "row_max shard %lld row %lld",
                   (long long)s, (long long)n);
      mx[n] = fmaxf(mx[n], mx_s[n]);   /* the all-reduce MAX */
    }
  }
  for (int64_t s = 0; s < S; s++) {
    int64_t a = c->start[s], vl = c->start[s + 1] - a;
    cr_assert_eq(K->row_partials(red_s, shard[s], mx, c->tg, c->tgt_i64, IGNORE, a, N, vl,
                                 c->dtype), 0, "%s", tt_last_error());
    for (int64_t n = 0; n < N; n++) {
      int64_t t = c->t[n];
      int own = t != IGNORE && t >= a && t < a + vl;
      double se = 0.0;
      for (int64_t j = 0; j < vl && t != IGNORE; j++)
        se += exp((double)c->x[n * V + a + j] - mx[n]);
      cr_assert(fabs(red_s[n] - se) <= 1e-5 * (se + 1e-30), "sum of exp shard %lld row %lld: "
                "%g, want %g", (long long)s, (long long)n, red_s[n], se);
      cr_assert_eq(red_s[N + n], own ? c->x[n * V + t] : 0.0f, "target logit shard %lld row "
                   "%lld (target %lld, shard [%lld, %lld))", (long long)s, (long long)n,
                   (long long)t, (long long)a, (long long)(a + vl));
      cr_assert_eq(red_s[2 * N + n], own ? 1.0f : 0.0f, "owned flag shard %lld row %lld",
                   (long long)s, (long long)n);
      for (int k = 0; k < 3; k++) red[k * N + n] += red_s[k * N + n];   /* the all-reduce SUM */
    }
  }
  float loss = NAN;
  cr_assert_eq(K->finish(&loss, lse, mx, red, c->tg, c->tgt_i64, IGNORE, 0, N, c->start[1]),
               0, "%s", tt_last_error());
  cr_assert(fabs(loss - want_loss) <= tol * fabs(want_loss), "loss %.9g, reference %.9g",
            loss, want_loss);
  for (int64_t n = 0; n < N; n++)
    if (c->t[n] == IGNORE) cr_assert_eq(lse[n], 0.0f, "lse of ignored row %lld", (long long)n);
  for (int64_t s = 0; s < S; s++) {
    int64_t a = c->start[s], vl = c->start[s + 1] - a;
    size_t es = c->dtype == TT_BF16 ? 2 : 4;
    void *dx = malloc(es * (size_t)(N * vl));
    cr_assert(dx);
    cr_assert_eq(K->backward(dx, &dloss, shard[s], lse, c->tg, c->tgt_i64, IGNORE, a, N, vl,
                             c->dtype), 0, "%s", tt_last_error());
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = 0; j < vl; j++) {
        double got = c->dtype == TT_BF16 ? tt_elem_bf16_to_float(((uint16_t *)dx)[n * vl + j])
                                         : ((float *)dx)[n * vl + j];
        double w = want[n * V + a + j];
        cr_assert(fabs(got - w) <= gtol * (fabs(w) + 1e-3), "grad shard %lld [%lld][%lld] = "
                  "%.9g, reference %.9g", (long long)s, (long long)n, (long long)j, got, w);
      }
    free(dx);
    free(shard[s]);
  }
  free(mx);
  free(mx_s);
  free(red);
  free(red_s);
  free(lse);
  free(want);
}

Test(vocab_parallel, f32_shards) {
  const int64_t shapes[][3] = {{9, 37, 1}, {9, 37, 2}, {12, 37, 3}, {8, 64, 4}};
  for (int i = 0; i < 4; i++)
    for (int i64 = 0; i64 < 2; i64++) {
      vp_case c = make_case(shapes[i][0], shapes[i][1], shapes[i][2], TT_F32, i64, 4.0,
                            11 + (uint64_t)i);
      check_case(&c, 2e-6, 2e-5);
      free_case(&c);
    }
}

Test(vocab_parallel, bf16_shards) {
  for (int64_t S = 1; S <= 3; S++) {
    vp_case c = make_case(10, 41, S, TT_BF16, (int)(S & 1), 4.0, 20 + (uint64_t)S);
    /* The arithmetic is f32 on the bf16 values; only the gradient is rounded to bf16. */
    check_case(&c, 2e-6, 8e-3);
    free_case(&c);
  }
}

/* Shards wider than the 1024-column partial-sum block, and logits of a few hundred. */
Test(vocab_parallel, wide_shards_large_logits) {
  vp_case c = make_case(6, 2600, 2, TT_F32, 1, 300.0, 5);
  check_case(&c, 2e-6, 2e-4);
  free_case(&c);
}

/* Every row ignored: loss 0 and a zero gradient, not NaN. */
Test(vocab_parallel, all_ignored) {
  vp_case c = make_case(4, 10, 2, TT_F32, 0, 1.0, 3);
  for (int64_t n = 0; n < c.N; n++) c.t[n] = ((int32_t *)c.tg)[n] = IGNORE;
  check_case(&c, 0.0, 0.0);
  free_case(&c);
}

/* A counted target that no shard owns (>= V, or negative) fails in finish, naming it. */
Test(vocab_parallel, bad_targets) {
  const int64_t bad[2] = {10, -3};
  for (int k = 0; k < 2; k++) {
    vp_case c = make_case(3, 10, 2, TT_F32, 1, 1.0, 7);
    c.t[1] = ((int64_t *)c.tg)[1] = bad[k];
    float mx[3], red[9] = {0}, red_s[9], lse[3], loss;
    for (int n = 0; n < 3; n++) mx[n] = -INFINITY;
    void *sh[2] = {shard_logits(&c, 0), shard_logits(&c, 1)};
    for (int s = 0; s < 2; s++) {
      float m[3];
      cr_assert_eq(K->row_max(m, sh[s], c.tg, 1, IGNORE, 3, 5, TT_F32), 0);
      for (int n = 0; n < 3; n++) mx[n] = fmaxf(mx[n], m[n]);
    }
    for (int s = 0; s < 2; s++) {
      cr_assert_eq(K->row_partials(red_s, sh[s], mx, c.tg, 1, IGNORE, 5 * s, 3, 5, TT_F32), 0);
      for (int i = 0; i < 9; i++) red[i] += red_s[i];
    }
    cr_assert_eq(red[3 + 1], 0.0f, "no shard owns target %lld", (long long)bad[k]);
    cr_assert_neq(K->finish(&loss, lse, mx, red, c.tg, 1, IGNORE, 0, 3, 5), 0);
    char want[64];
    snprintf(want, sizeof want, "target %lld at row 1", (long long)bad[k]);
    cr_assert(strstr(tt_last_error(), want), "%s", tt_last_error());
    free(sh[0]);
    free(sh[1]);
    free_case(&c);
  }
}

/* The op on the one-process world: its loss follows the plain cross-entropy, and bf16
** logits give the loss of their f32 widening and its gradient rounded to bf16. */
Test(vocab_parallel, op_one_process) {
  int64_t ls[2] = {7, 29}, ts[1] = {7};
  tt_tensor *x = tt_test_rand(ls, 2, 31), *t = tt_test_index(ts, 1, 29, TT_I64, 32);
  tt_tensor_set(t, 2, IGNORE);
  tt_tensor *xb = NULL, *xw = NULL, *lp = NULL, *lf = NULL, *lb = NULL;
  cr_assert_eq(tt_cast(x, TT_BF16, &xb), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cast(xb, TT_F32, &xw), 0, "%s", tt_last_error());
  cr_assert_eq(tt_set_requires_grad(xw, 1), 0);
  cr_assert_eq(tt_set_requires_grad(xb, 1), 0);
  cr_assert_eq(tt_cross_entropy(xw, t, IGNORE, &lp), 0, "%s", tt_last_error());
  cr_assert_eq(tt_vocab_parallel_cross_entropy(tt_comm_world(), xw, t, 0, IGNORE, &lf), 0,
               "%s", tt_last_error());
  cr_assert_eq(tt_vocab_parallel_cross_entropy(tt_comm_world(), xb, t, 0, IGNORE, &lb), 0,
               "%s", tt_last_error());
  double p = tt_tensor_get(lp, 0), f = tt_tensor_get(lf, 0), b = tt_tensor_get(lb, 0);
  cr_assert(fabs(f - p) <= 1e-6 * fabs(p), "f32 loss %.9g, plain cross_entropy %.9g", f, p);
  cr_assert(fabs(b - f) <= 1e-7 * fabs(f), "bf16 loss %.9g, f32 widening %.9g", b, f);
  cr_assert_eq(tt_backward(lf), 0, "%s", tt_last_error());
  cr_assert_eq(tt_backward(lb), 0, "%s", tt_last_error());
  cr_assert_eq(xb->grad->dtype, TT_BF16);
  for (int64_t i = 0; i < tt_tensor_numel(x); i++) {
    double gf = tt_tensor_get(xw->grad, i), gb = tt_tensor_get(xb->grad, i);
    cr_assert(fabs(gb - gf) <= 4e-3 * fabs(gf) + 1e-9, "grad %lld: bf16 %.9g, f32 %.9g",
              (long long)i, gb, gf);
  }
  tt_tensor *lc = NULL;
  cr_assert_eq(tt_tensor_empty(ls, 2, TT_F16, TT_CPU, &lc), 0);
  cr_assert_neq(tt_vocab_parallel_cross_entropy(tt_comm_world(), lc, t, 0, IGNORE, &lp), 0);
  cr_assert(strstr(tt_last_error(), "expected f32 or bf16"), "%s", tt_last_error());
  tt_tensor *ptrs[] = {x, t, xb, xw, lp, lf, lb, lc};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) tt_tensor_release(ptrs[i]);
}
