/*
** comm_check.c — checks every collective, the mesh, the differentiable collectives and
** the data-parallel reducer against closed-form results, on any number of ranks.
** Run under mpirun (tests/dist/tests.cmake runs it on 1, 2 and 4 ranks). Every rank
** fills its inputs from its rank, so the expected value of each element is a formula.
** Prints each failure with the rank and exits 1 when any check failed.
*/
#include "tetra_dist.h"
#include "dist/dist_internal.h"   /* a handle's start time (the watchdog's clock) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank, g_size, g_failures;

#define CHECK(cond, ...) \
  do { if (!(cond)) { g_failures++; fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
       fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define OK(call) \
  do { if ((call) != 0) { fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", g_rank, __FILE__, \
       __LINE__, #call, tt_last_error()); exit(1); } } while (0)

typedef double (*value_fn)(int rank, int64_t i);

/* A tensor of `dtype` whose element i (row-major) is f(rank, i). */
static tt_tensor *filled(const int64_t *shape, int ndim, int dtype, int rank, value_fn f) {
  tt_tensor *t = NULL;
  OK(tt_tensor_empty(shape, ndim, dtype, TT_CPU, &t));
  for (int64_t i = 0; i < tt_tensor_numel(t); i++) OK(tt_tensor_set(t, i, f(rank, i)));
  return t;
}

/* Checks t[i] == f(i) for every i (within tol). */
static void expect(const char *what, const tt_tensor *t, double (*f)(int64_t), double tol) {
  int64_t n = tt_tensor_numel(t);
  int shown = 0;
  for (int64_t i = 0; i < n; i++) {
    double got = tt_tensor_get(t, i), want = f(i);
    if (fabs(got - want) > tol && shown++ < 3) CHECK(0, "%s: [%lld] = %g, want %g", what,
                                                      (long long)i, got, want);
  }
}

/* -- all_reduce ----------------------------------------------------------------------- */

static double v_small(int r, int64_t i) { return r + (double)i; }
static double sum_small(int64_t i) { return g_size * (double)i + g_size * (g_size - 1) / 2.0; }
static double avg_small(int64_t i) { return sum_small(i) / g_size; }
static double max_small(int64_t i) { return (double)i + g_size - 1; }
static double min_small(int64_t i) { return (double)i; }

/* Every rank's host, gathered at start-up: here every rank runs on this one. */
static void check_hosts(void) {
  char me[64] = "";
  gethostname(me, sizeof me - 1);
  for (int r = 0; r < g_size; r++) {
    const char *h = tt_dist_rank_host(r);
    CHECK(h && strcmp(h, me) == 0, "rank %d's host is %s, want %s", r, h ? h : "NULL", me);
  }
  CHECK(tt_dist_rank_host(g_size) == NULL && tt_dist_rank_host(-1) == NULL,
        "a host for a rank out of range");
}

static void check_all_reduce(void) {
  tt_comm *w = tt_comm_world();
  int64_t shape[2] = {3, 5};
  int dtypes[] = {TT_F32, TT_I32, TT_I64, TT_BF16, TT_F16};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    int ops[] = {TT_REDUCE_SUM, TT_REDUCE_MAX, TT_REDUCE_MIN, TT_REDUCE_AVG};
    double (*want[])(int64_t) = {sum_small, max_small, min_small, avg_small};
    int n_ops = tt_dtype_is_float(dtypes[d]) ? 4 : 3;
    for (int k = 0; k < n_ops; k++) {
      tt_tensor *t = filled(shape, 2, dtypes[d], g_rank, v_small);
      OK(tt_comm_all_reduce(w, t, ops[k]));
      char what[64];
      snprintf(what, sizeof what, "all_reduce %s op %d", tt_dtype_name(dtypes[d]), ops[k]);
      /* avg of small integers in bf16 rounds to 8 significant bits */
      expect(what, t, want[k], dtypes[d] == TT_BF16 ? 0.07 : 1e-6);
      tt_tensor_release(t);
    }
  }
  /* A strided view is reduced in place: the transpose of a (3, 5) tensor. */
  tt_tensor *t = filled(shape, 2, TT_F32, g_rank, v_small), *tr = NULL;
  OK(tt_transpose(t, 0, 1, &tr));
  OK(tt_comm_all_reduce(w, tr, TT_REDUCE_SUM));
  expect("all_reduce of a transposed view", t, sum_small, 1e-6);
  tt_tensor_release(tr);
  tt_tensor_release(t);
  /* avg on integers is refused with a message */
  tt_tensor *it = filled(shape, 2, TT_I32, g_rank, v_small);
  CHECK(tt_comm_all_reduce(w, it, TT_REDUCE_AVG) != 0 && strstr(tt_last_error(), "avg"),
        "avg on i32 should fail, got '%s'", tt_last_error());
  tt_tensor_release(it);
}

/* -- all_gather / reduce_scatter / all_to_all ------------------------------------------- */

/* x (2, 3): x[a][b] = 100 r + 10 a + b */
static double v_ab(int r, int64_t i) { return 100.0 * r + 10.0 * (double)(i / 3) + (double)(i % 3); }
/* gathered along dim 0: (2n, 3), row R = 2 r + a */
static double gather0(int64_t i) {
  int64_t row = i / 3, b = i % 3;
  return 100.0 * (double)(row / 2) + 10.0 * (double)(row % 2) + (double)b;
}
/* gathered along dim 1: (2, 3n), column C = 3 r + b */
static double gather1(int64_t i) {
  int64_t cols = 3 * g_size, a = i / cols, col = i % cols;
  return 100.0 * (double)(col / 3) + 10.0 * (double)a + (double)(col % 3);
}

static void check_all_gather(void) {
  tt_comm *w = tt_comm_world();
  int64_t shape[2] = {2, 3};
  tt_tensor *x = filled(shape, 2, TT_F32, g_rank, v_ab), *out = NULL;
  OK(tt_comm_all_gather(w, x, 0, &out));
  CHECK(out->shape[0] == 2 * g_size && out->shape[1] == 3, "all_gather dim 0 shape");
  expect("all_gather dim 0", out, gather0, 0);
  tt_tensor_release(out);
  OK(tt_comm_all_gather(w, x, -1, &out));
  CHECK(out->shape[0] == 2 && out->shape[1] == 3 * g_size, "all_gather dim 1 shape");
  expect("all_gather dim 1", out, gather1, 0);
  tt_tensor_release(out);
  tt_tensor_release(x);
}

/* x (2n, 3) for dim 0 or (3, 2n) for dim 1: element i = 1000 r + i */
static double v_big(int r, int64_t i) { return 1000.0 * r + (double)i; }
static int g_rs_dim;
/* Block `rank` of sum_r x_r: flat index of (p, q) in x is recomputed per layout. */
static double rs_sum(int64_t i) {
  int64_t flat;
  if (g_rs_dim == 0) {
    flat = 2 * 3 * g_rank + i;   /* rows 2 rank .. 2 rank + 1, contiguous */
  } else {
    int64_t p = i / 2, q = i % 2;   /* out (3, 2) */
    flat = p * 2 * g_size + 2 * g_rank + q;
  }
  return 1000.0 * g_size * (g_size - 1) / 2.0 + g_size * (double)flat;
}
static double rs_avg(int64_t i) { return rs_sum(i) / g_size; }

static void check_reduce_scatter(void) {
  tt_comm *w = tt_comm_world();
  for (g_rs_dim = 0; g_rs_dim < 2; g_rs_dim++) {
    int64_t shape[2] = {g_rs_dim == 0 ? 2 * g_size : 3, g_rs_dim == 0 ? 3 : 2 * g_size};
    tt_tensor *x = filled(shape, 2, TT_F32, g_rank, v_big), *out = NULL;
    OK(tt_comm_reduce_scatter(w, x, g_rs_dim, TT_REDUCE_SUM, &out));
    expect(g_rs_dim ? "reduce_scatter dim 1" : "reduce_scatter dim 0", out, rs_sum, 0);
    tt_tensor_release(out);
    OK(tt_comm_reduce_scatter(w, x, g_rs_dim, TT_REDUCE_AVG, &out));
    expect("reduce_scatter avg", out, rs_avg, 1e-3);
    tt_tensor_release(out);
    tt_tensor_release(x);
  }
  int64_t odd[1] = {g_size * 2 + 1};
  if (g_size > 1) {
    tt_tensor *x = filled(odd, 1, TT_F32, g_rank, v_big), *out = NULL;
    CHECK(tt_comm_reduce_scatter(w, x, 0, TT_REDUCE_SUM, &out) != 0 &&
              strstr(tt_last_error(), "divide"), "indivisible reduce_scatter should fail");
    tt_tensor_release(x);
  }
}

/* all_to_all of x (2n, 3), x[j][k] = 1000 r + 10 j + k, split 0:
**   concat 0 -> out (2n, 3), out[2 s + a][k] = x_s[2 rank + a][k]
**   concat 1 -> out (2, 3n), out[a][3 s + k] = x_s[2 rank + a][k] */
static double v_a2a(int r, int64_t i) { return 1000.0 * r + 10.0 * (double)(i / 3) + (double)(i % 3); }
static double a2a_0(int64_t i) {
  int64_t row = i / 3, k = i % 3, s = row / 2, a = row % 2;
  return 1000.0 * (double)s + 10.0 * (double)(2 * g_rank + a) + (double)k;
}
static double a2a_1(int64_t i) {
  int64_t cols = 3 * g_size, a = i / cols, col = i % cols, s = col / 3, k = col % 3;
  return 1000.0 * (double)s + 10.0 * (double)(2 * g_rank + a) + (double)k;
}

static void check_all_to_all(void) {
  tt_comm *w = tt_comm_world();
  int64_t shape[2] = {2 * g_size, 3};
  tt_tensor *x = filled(shape, 2, TT_F32, g_rank, v_a2a), *out = NULL;
  OK(tt_comm_all_to_all(w, x, 0, 0, &out));
  expect("all_to_all split 0 concat 0", out, a2a_0, 0);
  tt_tensor_release(out);
  OK(tt_comm_all_to_all(w, x, 0, 1, &out));
  CHECK(out->shape[0] == 2 && out->shape[1] == 3 * g_size, "all_to_all concat 1 shape");
  expect("all_to_all split 0 concat 1", out, a2a_1, 0);
  tt_tensor_release(out);
  /* split along dim 1 of the transpose gives the same blocks as split 0 of x */
  tt_tensor *xt = NULL, *back = NULL;
  OK(tt_transpose(x, 0, 1, &xt));
  OK(tt_comm_all_to_all(w, xt, 1, 1, &out));
  OK(tt_transpose(out, 0, 1, &back));
  tt_tensor *flat = NULL;
  OK(tt_contiguous(back, &flat));
  expect("all_to_all split 1 concat 1 of a view", flat, a2a_0, 0);
  tt_tensor_release(flat);
  tt_tensor_release(back);
  tt_tensor_release(out);
  tt_tensor_release(xt);
  tt_tensor_release(x);
}

/* -- broadcast, send/recv, barrier, async ------------------------------------------------ */

static int g_root;
static double v_root(int64_t i) { return 100.0 * g_root + (double)i; }
static double v_hundred(int r, int64_t i) { return 100.0 * r + (double)i; }
static int g_from;
static double v_from(int64_t i) { return 100.0 * g_from + (double)i; }

static void check_point_to_point(void) {
  tt_comm *w = tt_comm_world();
  int64_t shape[1] = {7};
  g_root = g_size - 1;
  tt_tensor *t = filled(shape, 1, TT_F32, g_rank, v_hundred);
  OK(tt_comm_broadcast(w, t, g_root));
  expect("broadcast", t, v_root, 0);
  tt_tensor_release(t);
  if (g_size > 1) {
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    tt_tensor *mine = filled(shape, 1, TT_F32, g_rank, v_hundred), *got = NULL;
    OK(tt_tensor_zeros(shape, 1, TT_F32, TT_CPU, &got));
    tt_comm_handle *h = NULL;
    OK(tt_comm_send_async(w, mine, next, 5, &h));
    OK(tt_comm_recv(w, got, prev, 5));
    OK(tt_comm_wait(h));
    tt_comm_handle_free(h);
    g_from = prev;
    expect("ring send/recv", got, v_from, 0);
    CHECK(tt_comm_send(w, got, g_rank, 0) != 0, "send to self should fail");
    tt_tensor_release(mine);
    tt_tensor_release(got);
  }
  OK(tt_comm_barrier(w));
  /* Three reductions in flight, waited in reverse order. */
  tt_tensor *ts[3];
  tt_comm_handle *hs[3];
  for (int k = 0; k < 3; k++) {
    ts[k] = filled(shape, 1, TT_F32, g_rank, v_small);
    const double before = tt_dist_now();
    OK(tt_comm_all_reduce_async(w, ts[k], TT_REDUCE_SUM, &hs[k]));
    /* Stamped at its start whether telemetry is on or not (it is off here): the NCCL
    ** watchdog measures a pending collective's age from it. */
    CHECK(hs[k]->started >= before && hs[k]->started <= tt_dist_now(),
          "async all_reduce %d: started %.3f, not between %.3f and now", k, hs[k]->started,
          before);
  }
  for (int k = 2; k >= 0; k--) {
    OK(tt_comm_wait(hs[k]));
    OK(tt_comm_wait(hs[k]));   /* idempotent */
    expect("async all_reduce", ts[k], sum_small, 0);
    tt_comm_handle_free(hs[k]);
    tt_tensor_release(ts[k]);
  }
  tt_tensor *x = filled(shape, 1, TT_F32, g_rank, v_hundred), *out = NULL;
  tt_comm_handle *h = NULL;
  OK(tt_comm_all_gather_async(w, x, 0, &out, &h));
  int done = 0;
  while (!done) OK(tt_comm_test(h, &done));
  CHECK(out->shape[0] == 7 * g_size, "async all_gather shape");
  CHECK(tt_tensor_get(out, 7 * (g_size - 1)) == 100.0 * (g_size - 1), "async all_gather value");
  tt_comm_handle_free(h);
  tt_tensor_release(out);
  tt_tensor_release(x);
}

/* -- groups and the mesh ------------------------------------------------------------------ */

static double v_rank(int r, int64_t i) { (void)i; return r; }

static void check_mesh(void) {
  tt_comm *w = tt_comm_world(), *half = NULL;
  OK(tt_comm_split(w, g_rank % 2, g_rank, "parity", &half));
  int64_t one[1] = {1};
  tt_tensor *t = filled(one, 1, TT_F32, g_rank, v_rank);
  OK(tt_comm_all_reduce(half, t, TT_REDUCE_SUM));
  double want = 0;
  for (int r = g_rank % 2; r < g_size; r += 2) want += r;
  CHECK(tt_tensor_get(t, 0) == want, "split all_reduce: %g, want %g", tt_tensor_get(t, 0), want);
  CHECK(strcmp(tt_comm_name(half), "parity") == 0, "group name");
  tt_tensor_release(t);
  tt_comm_free(half);

  tt_mesh *m = NULL;
  CHECK(tt_mesh_new(1, 1, g_size + 1, 1, NULL, &m) != 0 &&
            strstr(tt_last_error(), "needs") && strstr(tt_last_error(), "launch"),
        "wrong layout should fail with a launch hint: '%s'", tt_last_error());
  CHECK(tt_mesh_new(1, 1, g_size, 1, "tp-dp-dp-pp", &m) != 0, "bad order should fail");
  int tp = g_size % 2 == 0 ? 2 : 1, dp = g_size / tp;
  OK(tt_mesh_new(tp, 1, dp, 1, NULL, &m));
  CHECK(tt_mesh_coord(m, "tp") == g_rank % tp && tt_mesh_coord(m, "dp") == g_rank / tp,
        "default order: tp fastest");
  tt_comm *gtp = tt_mesh_group(m, "tp"), *gdp = tt_mesh_group(m, "dp");
  CHECK(tt_comm_size(gtp) == tp && tt_comm_size(gdp) == dp, "group sizes");
  CHECK(tt_comm_rank(gdp) == g_rank / tp, "dp group rank");
  CHECK(tt_comm_world_rank_of(gtp, 0) == g_rank / tp * tp, "tp group members consecutive");
  CHECK(tt_mesh_rank_at(m, g_rank % tp, 0, g_rank / tp, 0) == g_rank, "rank_at");
  CHECK(tt_comm_size(tt_mesh_group(m, "dpcp")) == dp, "dpcp size");
  CHECK(tt_mesh_group(m, "ep") == NULL, "unknown group");
  tt_mesh_free(m);
  /* dp fastest: the dp group holds consecutive ranks */
  OK(tt_mesh_new(tp, 1, dp, 1, "dp-tp-cp-pp", &m));
  CHECK(tt_mesh_coord(m, "dp") == g_rank % dp, "order dp-tp-cp-pp: dp fastest");
  CHECK(tt_comm_world_rank_of(tt_mesh_group(m, "dp"), 0) == g_rank / dp * dp,
        "dp group consecutive");
  tt_mesh_free(m);
}

/* -- differentiable collectives --------------------------------------------------------- */

enum { L = 3 };
static double v_lin(int r, int64_t i) { return 0.5 * r + (double)i; }
static double c_rank(int r, int64_t i) { return (double)(r + 1) + 0.0 * (double)i; }
static double g_copy(int64_t i) { (void)i; return g_size * (g_size + 1) / 2.0; }
static double g_own_rank(int64_t i) { (void)i; return g_rank + 1.0; }
/* upstream gradient of a gathered (n L) tensor on rank r: r + j */
static double c_pos(int r, int64_t j) { return r + (double)j; }
static double g_sp_gather(int64_t i) {
  return g_size * (g_size - 1) / 2.0 + g_size * (double)(g_rank * L + i);
}
static double g_gather_block(int64_t i) { return g_rank + (double)(g_rank * L + i); }
/* sp_reduce_scatter: upstream on rank r for its block: 10 r + i; dx[j] = 10 (j / L) + j % L */
static double c_rs(int r, int64_t i) { return 10.0 * r + (double)i; }
static double g_rs(int64_t j) { return 10.0 * (double)(j / L) + (double)(j % L); }
/* scatter_to_group: upstream for block r: 1 + i + 0.5 r -> dx[j] = 1 + j % L + 0.5 (j / L) */
static double c_sc(int r, int64_t i) { return 1.0 + (double)i + 0.5 * r; }
static double g_sc(int64_t j) { return 1.0 + (double)(j % L) + 0.5 * (double)(j / L); }

typedef int (*diff_fn)(tt_comm *, tt_tensor *, int, tt_tensor **);
static int copy_to(tt_comm *c, tt_tensor *x, int d, tt_tensor **o) { (void)d; return tt_dist_copy_to_group(c, x, o); }
static int reduce_from(tt_comm *c, tt_tensor *x, int d, tt_tensor **o) { (void)d; return tt_dist_reduce_from_group(c, x, o); }

static void diff_case(const char *what, diff_fn f, int64_t x_len, value_fn upstream,
                      double (*want)(int64_t)) {
  tt_comm *w = tt_comm_world();
  tt_tensor *x = filled(&x_len, 1, TT_F32, g_rank, v_lin), *y = NULL;
  OK(tt_set_requires_grad(x, 1));
  OK(f(w, x, 0, &y));
  tt_tensor *up = filled(y->shape, y->ndim, TT_F32, g_rank, upstream);
  OK(tt_backward_with(y, up));
  CHECK(x->grad != NULL, "%s: no gradient", what);
  if (x->grad) expect(what, x->grad, want, 1e-5);
  tt_tensor_release(up);
  tt_tensor_release(y);
  tt_tensor_release(x);
}

static void check_autograd(void) {
  diff_case("copy_to_group backward", copy_to, L, c_rank, g_copy);
  diff_case("reduce_from_group backward", reduce_from, L, c_rank, g_own_rank);
  diff_case("sp_gather backward", tt_dist_sp_gather, L, c_pos, g_sp_gather);
  diff_case("gather_from_group backward", tt_dist_gather_from_group, L, c_pos, g_gather_block);
  diff_case("sp_reduce_scatter backward", tt_dist_sp_reduce_scatter, (int64_t)L * g_size, c_rs, g_rs);
  diff_case("scatter_to_group backward", tt_dist_scatter_to_group, (int64_t)L * g_size, c_sc, g_sc);
  /* forward of reduce_from_group: the sum of every rank's x */
  int64_t n = L;
  tt_tensor *x = filled(&n, 1, TT_F32, g_rank, v_lin), *y = NULL;
  OK(tt_dist_reduce_from_group(tt_comm_world(), x, &y));
  CHECK(fabs(tt_tensor_get(y, 1) - (g_size * 1.0 + 0.5 * g_size * (g_size - 1) / 2.0)) < 1e-5,
        "reduce_from_group forward");
  tt_tensor_release(y);
  tt_tensor_release(x);
}

/* -- data-parallel reducer ---------------------------------------------------------------- */

/* Rank r's gradient for element i of param k: r + 0.25 i + k; the average over ranks is
** (n - 1) / 2 + 0.25 i + k. */
static int g_param;
static double grad_of(int r, int64_t i) { return r + 0.25 * (double)i + g_param; }
static double avg_grad(int64_t i) { return (g_size - 1) / 2.0 + 0.25 * (double)i + g_param; }
static double p_init(int r, int64_t i) { (void)r; return 1.0 + (double)i; }
static double p_twice(int64_t i) { return 2.0 * (1.0 + (double)i); }

/* tail_order: NULL, or the order backward finishes the gradients (the last first), the
** first n_deferred of them deferred (their backward runs after the others'). */
static void check_reducer(int zero_stage, const int *tail_order, int n_deferred) {
  tt_comm *w = tt_comm_world();
  enum { NP = 4 };
  int64_t shapes[NP][2] = {{3, 4}, {5, 1}, {2, 2}, {7, 1}};
  tt_tensor *params[NP];
  for (int k = 0; k < NP; k++) {
    params[k] = filled(shapes[k], shapes[k][1] == 1 ? 1 : 2, TT_F32, 0, p_init);
    OK(tt_set_requires_grad(params[k], 1));
  }
  tt_dist_reducer *r = NULL;
  /* 40 bytes per bucket: several buckets, some holding more than one parameter */
  tt_dist_reducer_opts o = {.bucket_mb = 40.0 / (1024 * 1024), .zero_stage = zero_stage,
                            .tail_order = tail_order, .n_deferred = n_deferred};
  OK(tt_dist_reducer_new(w, params, NP, &o, &r));
  CHECK(tt_dist_reducer_num_buckets(r) >= 3, "bucket count %d", tt_dist_reducer_num_buckets(r));
  /* Two steps: ZeRO-2 makes its bucket buffers again in the second. */
  for (int step = 0; step < 2; step++) {
    for (int k = 0; k < NP; k++) OK(tt_zero_grad(params[k]));
    for (int accum = 0; accum < 2; accum++) {
      /* Two micro-batches: the hook is armed only for the last; each contributes half. */
      OK(tt_dist_reducer_arm(r, accum == 1));
      for (int k = 0; k < NP - 1; k++) {   /* param 3 never gets a gradient */
        tt_tensor *y = NULL;
        OK(tt_scale(params[k], 1.0, &y));
        g_param = k;
        tt_tensor *up = filled(y->shape, y->ndim, TT_F32, g_rank, grad_of), *half = NULL;
        OK(tt_scale(up, 0.5, &half));
        OK(tt_backward_with(y, half));
        tt_tensor_release(half);
        tt_tensor_release(up);
        tt_tensor_release(y);
      }
    }
    OK(tt_dist_reducer_finish(r));
  }
  /* ZeRO-2 keeps only the shards' gradients: the whole ones are released. */
  for (int k = 0; k < NP && zero_stage == 2; k++)
    CHECK(params[k]->grad == NULL, "ZeRO-2: param %d kept its whole gradient", k);
  if (zero_stage == 0) {
    for (int k = 0; k < NP - 1; k++) {
      g_param = k;
      expect("reducer average", params[k]->grad, avg_grad, 1e-5);
    }
    CHECK(params[NP - 1]->grad == NULL, "unused param got a gradient");
  } else {
    /* Every shard's grad is the average over its piece; the shares tile every param. */
    double sq = 0.0, want_sq = 0.0;
    for (int k = 0; k < NP - 1; k++) {
      g_param = k;
      for (int64_t i = 0; i < tt_tensor_numel(params[k]); i++) want_sq += pow(avg_grad(i), 2);
    }
    OK(tt_dist_reducer_grad_sq_norm(r, &sq));
    CHECK(fabs(sq - want_sq) < 1e-5 * want_sq, "grad_sq_norm %g, want %g", sq, want_sq);
    for (int i = 0; i < tt_dist_reducer_num_shards(r); i++) {
      tt_tensor *s = tt_dist_reducer_shard(r, i);
      CHECK(s->grad && tt_tensor_numel(s->grad) == tt_tensor_numel(s), "shard %d grad", i);
      tt_tensor *twice = NULL;
      OK(tt_scale(s, 2.0, &twice));
      OK(tt_copy_(s, twice));
      tt_tensor_release(twice);
    }
    OK(tt_dist_reducer_gather_params(r));
    for (int k = 0; k < NP; k++) expect("ZeRO gathered params", params[k], p_twice, 0);
  }
  tt_dist_reducer_free(r);
  for (int k = 0; k < NP; k++) tt_tensor_release(params[k]);
}

/* A tail order that repeats a parameter is refused with the entry named. */
static void check_reducer_bad_order(void) {
  int64_t shape[1] = {4};
  tt_tensor *params[2] = {filled(shape, 1, TT_F32, 0, p_init), filled(shape, 1, TT_F32, 0, p_init)};
  const int twice[2] = {1, 1};
  tt_dist_reducer_opts o = {.bucket_mb = 1.0, .tail_order = twice, .n_deferred = 1};
  tt_dist_reducer *r = NULL;
  CHECK(tt_dist_reducer_new(tt_comm_world(), params, 2, &o, &r) != 0 && r == NULL &&
            strstr(tt_last_error(), "tail order entry 1 (1)") != NULL,
        "repeated tail order entry: %s", tt_last_error());
  for (int k = 0; k < 2; k++) tt_tensor_release(params[k]);
}

/* Row-sparse tables (embeddings): rank r touches rows touched(r, v) of a table (V, D);
** row v's element d is then r + 0.5 v + 0.25 d + 1 (zero elsewhere). Table 0 (V 24) is
** touched by each rank at two rows, so on up to 6 ranks only some rows travel; table 1
** (V 6) is touched everywhere, so its bucket falls back to the dense collective. Table
** 0 is the first parameter (its bucket is the last to start), table 1 the last (its
** bucket is the first, and a dense parameter's follows it). */
enum { SP_NP = 3, SP_D = 3 };
static const int64_t sp_rows[SP_NP] = {24, 4, 6};
static int g_table;
static int touched(int r, int64_t v) {
  return g_table == 1 || v == (r * 5) % 24 || v == (r * 5 + 1) % 24;
}
static double sp_grad(int r, int64_t i) {
  int64_t v = i / SP_D, d = i % SP_D;
  if (g_table == 2) return r + 0.5 * (double)i;           /* the dense parameter */
  return touched(r, v) ? r + 0.5 * (double)v + 0.25 * (double)d + 1.0 : 0.0;
}
static double sp_avg(int64_t i) {
  double sum = 0.0;
  for (int r = 0; r < g_size; r++) sum += sp_grad(r, i);
  return sum / g_size;
}

/* A table's gradient, averaged through a reducer with (sparse = 1) or without the row
** exchange: the two must agree (exactly on up to 2 ranks, where a sum of two is the same
** in any order), and both equal the closed form. */
static void sparse_backward(tt_tensor *const *params) {
  for (int k = 0; k < SP_NP; k++) {
    tt_tensor *y = NULL;
    OK(tt_scale(params[k], 1.0, &y));
    g_table = k == 0 ? 0 : k == 1 ? 2 : 1;
    tt_tensor *up = filled(y->shape, y->ndim, TT_F32, g_rank, sp_grad);
    OK(tt_backward_with(y, up));
    tt_tensor_release(up);
    tt_tensor_release(y);
  }
}

/* Table 0 (sp_rows[0], D), a dense vector (sp_rows[1] * D), table 1 (sp_rows[2], D). */
static void sparse_params(tt_tensor **params) {
  for (int k = 0; k < SP_NP; k++) {
    int64_t shape[2] = {sp_rows[k], SP_D}, flat = sp_rows[k] * SP_D;
    params[k] = k == 1 ? filled(&flat, 1, TT_F32, 0, p_init) : filled(shape, 2, TT_F32, 0, p_init);
    OK(tt_set_requires_grad(params[k], 1));
  }
}

static void check_reducer_sparse(int zero_stage) {
  tt_comm *w = tt_comm_world();
  tt_tensor *sparse[SP_NP], *dense[SP_NP];
  sparse_params(sparse);
  sparse_params(dense);
  const int flags[SP_NP] = {1, 0, 1};
  tt_dist_reducer *rs = NULL, *rd = NULL;
  tt_dist_reducer_opts os = {.bucket_mb = 25.0, .zero_stage = zero_stage, .row_sparse = flags};
  tt_dist_reducer_opts od = {.bucket_mb = 25.0, .zero_stage = zero_stage};
  OK(tt_dist_reducer_new(w, sparse, SP_NP, &os, &rs));
  OK(tt_dist_reducer_new(w, dense, SP_NP, &od, &rd));
  CHECK(tt_dist_reducer_num_buckets(rs) == 3, "sparse tables in buckets of their own: %d "
        "buckets, want 3", tt_dist_reducer_num_buckets(rs));
  OK(tt_dist_reducer_arm(rs, 1));
  sparse_backward(sparse);
  OK(tt_dist_reducer_finish(rs));
  OK(tt_dist_reducer_arm(rd, 1));
  sparse_backward(dense);
  OK(tt_dist_reducer_finish(rd));
  if (zero_stage == 0) {
    for (int k = 0; k < SP_NP; k++) {
      g_table = k == 0 ? 0 : k == 1 ? 2 : 1;
      expect("sparse reducer average", sparse[k]->grad, sp_avg, 1e-6);
      expect("dense reducer average", dense[k]->grad, sp_avg, 1e-6);
      int64_t n = tt_tensor_numel(sparse[k]);
      for (int64_t i = 0; i < n; i++) {
        double a = tt_tensor_get(sparse[k]->grad, i), b = tt_tensor_get(dense[k]->grad, i);
        if (g_size <= 2 ? a != b : fabs(a - b) > 1e-6) {
          CHECK(0, "param %d [%lld]: sparse exchange %.9g, dense %.9g", k, (long long)i, a, b);
          break;
        }
      }
    }
  } else {
    /* Every shard's gradient is the closed-form average over its piece. */
    for (int i = 0; i < tt_dist_reducer_num_shards(rs); i++) {
      tt_tensor *s = tt_dist_reducer_shard(rs, i);
      int k = tt_dist_reducer_shard_param(rs, i);
      int64_t off = tt_dist_reducer_shard_offset(rs, i);
      g_table = k == 0 ? 0 : k == 1 ? 2 : 1;
      CHECK(s->grad && tt_tensor_numel(s->grad) == tt_tensor_numel(s), "sparse shard %d grad", i);
      for (int64_t j = 0; s->grad && j < tt_tensor_numel(s); j++) {
        double got = tt_tensor_get(s->grad, j), want = sp_avg(off + j);
        if (fabs(got - want) > 1e-6) {
          CHECK(0, "ZeRO-%d sparse shard %d (param %d) [%lld] = %g, want %g", zero_stage, i, k,
                (long long)j, got, want);
          break;
        }
      }
    }
  }
  tt_dist_reducer_free(rs);
  tt_dist_reducer_free(rd);
  for (int k = 0; k < SP_NP; k++) {
    tt_tensor_release(sparse[k]);
    tt_tensor_release(dense[k]);
  }
}

int main(void) {
  OK(tt_dist_init(0));
  g_rank = tt_dist_rank();
  g_size = tt_dist_world_size();
  tt_dist_set_timeout(60);
  check_hosts();
  check_all_reduce();
  check_all_gather();
  check_reduce_scatter();
  check_all_to_all();
  check_point_to_point();
  check_mesh();
  check_autograd();
  const int tail[4] = {2, 1, 3, 0};
  for (int zero = 0; zero <= 2; zero++) {
    check_reducer(zero, NULL, 0);
    check_reducer(zero, tail, 2);
  }
  check_reducer_bad_order();
  check_reducer_sparse(0);
  check_reducer_sparse(1);
  check_reducer_sparse(2);
  int failures = g_failures;
  tt_tensor *t = NULL;
  int64_t one = 1;
  double f = failures;
  OK(tt_tensor_from_f64(&f, &one, 1, TT_F32, &t));
  OK(tt_comm_all_reduce(tt_comm_world(), t, TT_REDUCE_SUM));
  int total = (int)tt_tensor_get(t, 0);
  tt_tensor_release(t);
  if (g_rank == 0) printf("comm_check: %d ranks, %d failed checks\n", g_size, total);
  return total == 0 ? 0 : 1;
}
