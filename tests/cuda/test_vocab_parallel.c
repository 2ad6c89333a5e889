/*
** test_vocab_parallel.c — the CUDA kernels of the vocab-parallel cross-entropy
** (kernels/cuda/vocab_parallel.cu) against their CPU twins (kernels/cpu/vocab_parallel.c)
** on the same inputs, piece by piece: a group of 3 ranks is played in one process (three
** uneven column shards of the full logits), the "all-reduce" between pieces is a host
** loop over the CPU twins' results, and each GPU piece gets exactly the inputs its CPU
** twin got. f32 and bf16 logits, i32 and i64 targets, ignored rows, targets in and out of
** each shard, a target no shard owns; then the op on the one-process world, CUDA tensors
** against CPU tensors, forward and backward.
**
** Without a GPU the program exits 77 before running anything: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "tetra_vocab_parallel.h"
#include "vocab_parallel.h"

enum { IGNORE = -100, S = 3, N = 37, V = 1003 };

static const tt_vocab_parallel_kernels *CPU_K = &tt_vocab_parallel_cpu;

static tt_tensor *empty(const int64_t *shape, int ndim, int dtype, int device) {
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_empty(shape, ndim, dtype, device, &t), 0, "%s", tt_last_error());
  return t;
}

/* Columns [a, a + vl) of x as a contiguous tensor on the CPU. */
static tt_tensor *columns(tt_tensor *x, int64_t a, int64_t vl) {
  tt_tensor *v = NULL, *c = NULL;
  cr_assert_eq(tt_narrow(x, 1, a, vl, &v), 0, "%s", tt_last_error());
  cr_assert_eq(tt_contiguous(v, &c), 0, "%s", tt_last_error());
  tt_tensor_release(v);
  return c;
}

/* max |gpu - cpu| / (|cpu| + floor) over all elements, gpu of any device; fails on NaN. */
static double worst(tt_tensor *gpu, tt_tensor *cpu, double floor) {
  tt_tensor *h = to_dev(gpu, TT_CPU);
  double w = 0.0;
  for (int64_t i = 0; i < tt_tensor_numel(cpu); i++) {
    double a = tt_tensor_get(h, i), b = tt_tensor_get(cpu, i);
    cr_assert(!isnan(a), "element %lld was not written (NaN)", (long long)i);
    double e = fabs(a - b) / (fabs(b) + floor);
    w = e > w ? e : w;
  }
  tt_tensor_release(h);
  return w;
}

static void check_pieces(int dtype, int tgt_i64) {
  const tt_vocab_parallel_kernels *G = &tt_vocab_parallel_cuda;
  cr_assert_not_null(G, "the CUDA table is not linked in");
  int64_t ls[2] = {N, V}, n1[1] = {N}, n3[2] = {3, N}, part = (V + S - 1) / S;
  tt_tensor *x32 = randn(ls, 2, 3.0), *x = NULL, *t = NULL;
  cr_assert_eq(tt_cast(x32, dtype, &x), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_randint(n1, 1, 0, V, tgt_i64 ? TT_I64 : TT_I32, &t), 0);
  tt_tensor_set(t, 3, IGNORE);
  tt_tensor_set(t, 4, 0);        /* the first column of the first shard */
  tt_tensor_set(t, 5, V - 1);    /* the last column of the short last shard */
  tt_tensor *tg = to_dev(t, GPU);
  const void *th = tt_tensor_data(t), *td = tt_tensor_data(tg);
  tt_tensor *mx = empty(n1, 1, TT_F32, TT_CPU), *red = empty(n3, 2, TT_F32, TT_CPU);
  for (int64_t n = 0; n < N; n++) tt_tensor_set(mx, n, -INFINITY);
  for (int64_t i = 0; i < 3 * N; i++) tt_tensor_set(red, i, 0.0);
  tt_tensor *shard[S], *shard_g[S];
  for (int s = 0; s < S; s++) {
    int64_t a = s * part, vl = (s + 1) * part < V ? part : V - a;
    shard[s] = columns(x, a, vl);
    shard_g[s] = to_dev(shard[s], GPU);
    tt_tensor *mc = empty(n1, 1, TT_F32, TT_CPU), *mg = empty(n1, 1, TT_F32, GPU);
    cr_assert_eq(CPU_K->row_max(tt_tensor_data(mc), tt_tensor_data(shard[s]), th, tgt_i64,
                                IGNORE, N, vl, dtype), 0, "%s", tt_last_error());
    cr_assert_eq(G->row_max(tt_tensor_data(mg), tt_tensor_data(shard_g[s]), td, tgt_i64,
                            IGNORE, N, vl, dtype), 0, "%s", tt_last_error());
    cr_assert_eq(worst(mg, mc, 0.0), 0.0, "row_max shard %d differs", s);
    for (int64_t n = 0; n < N; n++)   /* the all-reduce MAX */
      tt_tensor_set(mx, n, fmax(tt_tensor_get(mx, n), tt_tensor_get(mc, n)));
    tt_tensor_release(mc);
    tt_tensor_release(mg);
  }
  tt_tensor *mx_g = to_dev(mx, GPU);
  for (int s = 0; s < S; s++) {
    int64_t a = s * part, vl = shard[s]->shape[1];
    tt_tensor *rc = empty(n3, 2, TT_F32, TT_CPU), *rg = empty(n3, 2, TT_F32, GPU);
    cr_assert_eq(CPU_K->row_partials(tt_tensor_data(rc), tt_tensor_data(shard[s]),
                                     tt_tensor_data(mx), th, tgt_i64, IGNORE, a, N, vl, dtype),
                 0, "%s", tt_last_error());
    cr_assert_eq(G->row_partials(tt_tensor_data(rg), tt_tensor_data(shard_g[s]),
                                 tt_tensor_data(mx_g), td, tgt_i64, IGNORE, a, N, vl, dtype),
                 0, "%s", tt_last_error());
    tt_tensor *rh = to_dev(rg, TT_CPU);
    for (int64_t n = 0; n < N; n++) {
      double sc = tt_tensor_get(rc, n), sg = tt_tensor_get(rh, n);
      cr_assert(fabs(sg - sc) <= 1e-5 * sc, "sum of exp shard %d row %lld: cuda %.9g, cpu %.9g",
                s, (long long)n, sg, sc);
      for (int k = 1; k < 3; k++)   /* the target logit and the owned flag: exact */
        cr_assert_eq(tt_tensor_get(rh, k * N + n), tt_tensor_get(rc, k * N + n),
                     "partials[%d] shard %d row %lld", k, s, (long long)n);
    }
    for (int64_t i = 0; i < 3 * N; i++)   /* the all-reduce SUM */
      tt_tensor_set(red, i, tt_tensor_get(red, i) + tt_tensor_get(rc, i));
    tt_tensor_release(rc);
    tt_tensor_release(rg);
    tt_tensor_release(rh);
  }
  tt_tensor *red_g = to_dev(red, GPU), *lse = empty(n1, 1, TT_F32, TT_CPU);
  tt_tensor *lse_g = empty(n1, 1, TT_F32, GPU);
  tt_tensor *loss = empty(NULL, 0, TT_F32, TT_CPU), *loss_g = empty(NULL, 0, TT_F32, GPU);
  cr_assert_eq(CPU_K->finish(tt_tensor_data(loss), tt_tensor_data(lse), tt_tensor_data(mx),
                             tt_tensor_data(red), th, tgt_i64, IGNORE, 0, N, part), 0, "%s",
               tt_last_error());
  cr_assert_eq(G->finish(tt_tensor_data(loss_g), tt_tensor_data(lse_g), tt_tensor_data(mx_g),
                         tt_tensor_data(red_g), td, tgt_i64, IGNORE, 0, N, part), 0, "%s",
               tt_last_error());
  cr_assert(worst(loss_g, loss, 0.0) <= 1e-6, "finish: loss differs");
  cr_assert(worst(lse_g, lse, 1.0) <= 1e-6, "finish: lse differs");
  tt_tensor *dloss = NULL;
  cr_assert_eq(tt_tensor_full(NULL, 0, TT_F32, TT_CPU, 0.75, &dloss), 0);
  tt_tensor *dloss_g = to_dev(dloss, GPU);
  for (int s = 0; s < S; s++) {
    int64_t a = s * part, vl = shard[s]->shape[1], gs[2] = {N, vl};
    tt_tensor *dc = empty(gs, 2, dtype, TT_CPU), *dg = empty(gs, 2, dtype, GPU);
    cr_assert_eq(CPU_K->backward(tt_tensor_data(dc), tt_tensor_data(dloss),
                                 tt_tensor_data(shard[s]), tt_tensor_data(lse), th, tgt_i64,
                                 IGNORE, a, N, vl, dtype), 0, "%s", tt_last_error());
    cr_assert_eq(G->backward(tt_tensor_data(dg), tt_tensor_data(dloss_g),
                             tt_tensor_data(shard_g[s]), tt_tensor_data(lse_g), td, tgt_i64,
                             IGNORE, a, N, vl, dtype), 0, "%s", tt_last_error());
    /* bf16: one rounding of nearly equal f32 values may land one bf16 step apart */
    double tol = dtype == TT_BF16 ? 8e-3 : 1e-5;
    double e = worst(dg, dc, 1e-4);
    cr_assert(e <= tol, "backward shard %d: worst relative difference %g > %g", s, e, tol);
    tt_tensor_release(dc);
    tt_tensor_release(dg);
  }
  /* A target no shard owns: finish fails on the GPU as on the CPU, naming row 1. */
  tt_tensor_set(red, 2 * N + 1, 0.0);
  tt_tensor *red_bad = to_dev(red, GPU);
  cr_assert_neq(G->finish(tt_tensor_data(loss_g), tt_tensor_data(lse_g), tt_tensor_data(mx_g),
                          tt_tensor_data(red_bad), td, tgt_i64, IGNORE, 0, N, part), 0);
  cr_assert(strstr(tt_last_error(), "at row 1 is outside the vocabulary"), "%s",
            tt_last_error());
  tt_tensor *all[] = {x32, x, t, tg, mx, red, mx_g, red_g, lse, lse_g, loss, loss_g, dloss,
                      dloss_g, red_bad};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  for (int s = 0; s < S; s++) {
    tt_tensor_release(shard[s]);
    tt_tensor_release(shard_g[s]);
  }
}

Test(vocab_parallel, pieces_f32) {
  check_pieces(TT_F32, 0);
  check_pieces(TT_F32, 1);
}

Test(vocab_parallel, pieces_bf16) {
  check_pieces(TT_BF16, 0);
  check_pieces(TT_BF16, 1);
}

/* The op on CUDA tensors (one-process world): loss and gradient against the CPU op. */
Test(vocab_parallel, op_on_cuda) {
  int64_t ls[2] = {29, 517}, ts[1] = {29};
  for (int bf16 = 0; bf16 < 2; bf16++) {
    tt_tensor *x32 = randn(ls, 2, 3.0), *xc = NULL, *t = NULL, *lc = NULL, *lg = NULL;
    cr_assert_eq(tt_cast(x32, bf16 ? TT_BF16 : TT_F32, &xc), 0, "%s", tt_last_error());
    cr_assert_eq(tt_tensor_randint(ts, 1, 0, 517, TT_I64, &t), 0);
    tt_tensor_set(t, 2, IGNORE);
    tt_tensor *xg = to_dev(xc, GPU), *tg = to_dev(t, GPU);
    cr_assert_eq(tt_set_requires_grad(xc, 1), 0);
    cr_assert_eq(tt_set_requires_grad(xg, 1), 0);
    cr_assert_eq(tt_vocab_parallel_cross_entropy(tt_comm_world(), xc, t, 0, IGNORE, &lc), 0,
                 "%s", tt_last_error());
    poison(ls[0] * ls[1]);
    cr_assert_eq(tt_vocab_parallel_cross_entropy(tt_comm_world(), xg, tg, 0, IGNORE, &lg), 0,
                 "cuda: %s", tt_last_error());
    cr_assert_eq(lg->device, GPU, "the loss stays on the logits' device");
    cr_assert(rel_err(lg, lc) <= 1e-6, "loss differs");
    cr_assert_eq(tt_backward(lc), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward(lg), 0, "cuda backward: %s", tt_last_error());
    double e = rel_err(xg->grad, xc->grad);
    cr_assert(e <= (bf16 ? 4e-3 : 1e-5), "grad relative error %g", e);
    tt_tensor *all[] = {x32, xc, t, lc, lg, xg, tg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  }
}
