/*
** Autograd: view backward against finite differences, a two-layer network end to end
** through the tape against a float64 reference, gradient accumulation, no-grad mode,
** detach, the grad-ready hook, the tape being freed after backward, and interleaved
** graphs (pipeline micro-batches) backpropagated one at a time, and activation recompute
** (tt_checkpoint: bit-identical gradients, nested backward, the stash, a failing re-run).
*/
#include "tt_test.h"
#include "core/tt_internal.h"   /* the recompute stash (tt_checkpoint_stash, _replay) */

/* -- View ops ------------------------------------------------------------------------ */

static int op_views(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  /* x (3, 4, 5) -> transpose(0, 2) (5, 4, 3) -> narrow(1, 1, 2) (5, 2, 3)
  **   -> permute(2, 0, 1) (3, 5, 2) -> view (-1) (30) */
  tt_tensor *a = NULL, *b = NULL, *c = NULL;
  int dims[3] = {2, 0, 1};
  int64_t flat[1] = {-1};
  int rc = tt_transpose(in[0], 0, 2, &a);
  if (!rc) rc = tt_narrow(a, 1, 1, 2, &b);
  if (!rc) rc = tt_permute(b, dims, 3, &c);
  if (!rc) rc = tt_view(c, flat, 1, out);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(c);
  return rc;
}

static void ref_views(double *const *in, double *out, void *ctx) {
  (void)ctx;
  /* out[(c * 5 + a) * 2 + b] = x[c][1 + b][a] */
  for (int c = 0; c < 3; c++)
    for (int a = 0; a < 5; a++)
      for (int b = 0; b < 2; b++) out[(c * 5 + a) * 2 + b] = in[0][(c * 4 + 1 + b) * 5 + a];
}

Test(autograd, view_chain) {
  int64_t shape[3] = {3, 4, 5};
  tt_tensor *x = tt_test_rand(shape, 3, 1);
  int check[1] = {1};
  tt_test_check_forward(op_views, ref_views, &x, 1, NULL, 0, 0);
  tt_test_check_backward(op_views, ref_views, &x, 1, check, NULL, 1e-6, 1e-6);
  tt_tensor_release(x);
}

static int op_expand(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  int64_t shape[3] = {2, 3, 4};   /* x (3, 1) -> (2, 3, 4) */
  return tt_expand(in[0], shape, 3, out);
}

static void ref_expand(double *const *in, double *out, void *ctx) {
  (void)ctx;
  for (int i = 0; i < 24; i++) out[i] = in[0][(i / 4) % 3];
}

Test(autograd, expand_sums_broadcast_dims) {
  int64_t shape[2] = {3, 1};
  tt_tensor *x = tt_test_rand(shape, 2, 2);
  int check[1] = {1};
  tt_test_check_forward(op_expand, ref_expand, &x, 1, NULL, 0, 0);
  tt_test_check_backward(op_expand, ref_expand, &x, 1, check, NULL, 1e-6, 1e-6);
  tt_tensor_release(x);
}

/* -- Two-layer network --------------------------------------------------------------- */
/* x (5, 7); W1 (6, 7); b1 (6); W2 (3, 6).
** loss = mean( (silu(x W1^T + b1) W2^T)^2 ), a scalar. */

enum { N = 5, D_IN = 7, D_H = 6, D_OUT = 3 };

static int op_net(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  tt_tensor *h = NULL, *a = NULL, *o = NULL, *sq = NULL;
  int rc = tt_linear(in[0], in[1], in[2], &h);
  if (!rc) rc = tt_silu(h, &a);
  if (!rc) rc = tt_linear(a, in[3], NULL, &o);
  if (!rc) rc = tt_mul(o, o, &sq);
  if (!rc) rc = tt_mean(sq, NULL, 0, 0, out);
  tt_tensor_release(h);
  tt_tensor_release(a);
  tt_tensor_release(o);
  tt_tensor_release(sq);
  return rc;
}

static void ref_net(double *const *in, double *out, void *ctx) {
  (void)ctx;
  const double *x = in[0], *w1 = in[1], *b1 = in[2], *w2 = in[3];
  double total = 0.0;
  for (int n = 0; n < N; n++) {
    double a[D_H];
    for (int j = 0; j < D_H; j++) {
      double h = b1[j];
      for (int k = 0; k < D_IN; k++) h += x[n * D_IN + k] * w1[j * D_IN + k];
      a[j] = h / (1.0 + exp(-h));
    }
    for (int m = 0; m < D_OUT; m++) {
      double o = 0.0;
      for (int j = 0; j < D_H; j++) o += a[j] * w2[m * D_H + j];
      total += o * o;
    }
  }
  out[0] = total / (N * D_OUT);
}

Test(autograd, two_layer_network_end_to_end) {
  int64_t sx[2] = {N, D_IN}, s1[2] = {D_H, D_IN}, sb[1] = {D_H}, s2[2] = {D_OUT, D_H};
  tt_tensor *in[4] = {tt_test_rand(sx, 2, 3), tt_test_rand_strided(s1, 2, 4),
                      tt_test_rand(sb, 1, 5), tt_test_rand(s2, 2, 6)};
  int check[4] = {1, 1, 1, 1};
  tt_test_check_forward(op_net, ref_net, in, 4, NULL, 1e-5, 1e-7);
  tt_test_check_backward(op_net, ref_net, in, 4, check, NULL, 1e-4, 1e-6);
  cr_assert_eq(tt_tape_size(), 0, "backward left %lld nodes on the tape", (long long)tt_tape_size());
  for (int i = 0; i < 4; i++) tt_tensor_release(in[i]);
}

/* Sum-of-squares loss over a batch: accumulating the gradients of two half batches
** equals the gradient of the whole batch in one call. */
static double loss_and_backward(tt_tensor *x, tt_tensor *w) {
  tt_tensor *o = NULL, *sq = NULL, *loss = NULL;
  cr_assert(tt_linear(x, w, NULL, &o) == 0, "%s", tt_last_error());
  cr_assert(tt_mul(o, o, &sq) == 0);
  cr_assert(tt_sum(sq, NULL, 0, 0, &loss) == 0);
  cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
  double v = tt_tensor_get(loss, 0);
  tt_tensor_release(o);
  tt_tensor_release(sq);
  tt_tensor_release(loss);
  return v;
}

Test(autograd, gradient_accumulation) {
  int64_t sx[2] = {8, 5}, sw[2] = {4, 5};
  tt_tensor *x = tt_test_rand(sx, 2, 10), *w = tt_test_rand(sw, 2, 11);
  tt_tensor *x1 = NULL, *x2 = NULL;
  cr_assert(tt_narrow(x, 0, 0, 4, &x1) == 0);
  cr_assert(tt_narrow(x, 0, 4, 4, &x2) == 0);
  tt_set_requires_grad(w, 1);
  double whole = loss_and_backward(x, w);
  double full_grad[20];
  cr_assert(tt_tensor_to_f64(w->grad, full_grad) == 0);
  tt_zero_grad(w);
  double half = loss_and_backward(x1, w) + loss_and_backward(x2, w);
  cr_assert(fabs(whole - half) <= 1e-5 * fabs(whole));
  tt_test_assert_close(w->grad, full_grad, 20, 1e-5, 1e-6, "accumulated gradient");
  tt_tensor *all[] = {x, w, x1, x2};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
}

Test(autograd, no_grad_and_detach) {
  int64_t s[2] = {3, 4};
  tt_tensor *x = tt_test_rand(s, 2, 20), *y = NULL, *d = NULL, *z = NULL, *l = NULL;
  tt_set_requires_grad(x, 1);
  tt_set_grad_enabled(0);
  cr_assert(tt_mul(x, x, &y) == 0);
  tt_set_grad_enabled(1);
  cr_assert_eq(tt_tape_size(), 0);
  cr_assert(!y->requires_grad);
  tt_test_assert_error(tt_backward(y), "backward");
  /* d = detach(x): z = x * d has gradient d (not 2x). */
  cr_assert(tt_detach(x, &d) == 0);
  cr_assert(!d->requires_grad);
  cr_assert(tt_mul(x, d, &z) == 0);
  cr_assert(tt_sum(z, NULL, 0, 0, &l) == 0);
  cr_assert(tt_backward(l) == 0);
  for (int i = 0; i < 12; i++)
    cr_assert_float_eq(tt_tensor_get(x->grad, i), tt_tensor_get(x, i), 1e-7);
  tt_test_assert_error(tt_set_requires_grad(z, 0), "only leaf tensors");
  tt_tensor *all[] = {x, y, d, z, l};
  for (int i = 0; i < 5; i++) tt_tensor_release(all[i]);
}

typedef struct hook_log {
  int calls;
  double grad_sum_at_hook[4];
  tt_tensor *leaves[4];
} hook_log;

static void on_ready(tt_tensor *leaf, void *ud) {
  hook_log *log = ud;
  for (int i = 0; i < 4; i++)
    if (log->leaves[i] == leaf) {
      double s = 0;
      for (int64_t k = 0; k < tt_tensor_numel(leaf->grad); k++) s += tt_tensor_get(leaf->grad, k);
      log->grad_sum_at_hook[i] = s;
    }
  log->calls++;
}

Test(autograd, grad_ready_hook_fires_once_per_leaf_when_complete) {
  int64_t sx[2] = {N, D_IN}, s1[2] = {D_H, D_IN}, sb[1] = {D_H}, s2[2] = {D_OUT, D_H};
  tt_tensor *in[4] = {tt_test_rand(sx, 2, 3), tt_test_rand(s1, 2, 4), tt_test_rand(sb, 1, 5),
                      tt_test_rand(s2, 2, 6)};
  hook_log log = {0};
  for (int i = 1; i < 4; i++) {
    tt_set_requires_grad(in[i], 1);
    log.leaves[i] = in[i];
  }
  /* W2 is used twice: the hook must wait for both contributions. */
  tt_tensor *loss = NULL, *extra = NULL, *total = NULL, *s = NULL;
  cr_assert(op_net(in, &loss, NULL) == 0);
  cr_assert(tt_sum(in[3], NULL, 0, 0, &s) == 0);
  cr_assert(tt_scale(s, 0.5, &extra) == 0);
  cr_assert(tt_add(loss, extra, &total) == 0);
  tt_set_grad_ready_hook(on_ready, &log);
  cr_assert(tt_backward(total) == 0, "%s", tt_last_error());
  tt_set_grad_ready_hook(NULL, NULL);
  cr_assert_eq(log.calls, 3);
  for (int i = 1; i < 4; i++) {
    double final = 0;
    for (int64_t k = 0; k < tt_tensor_numel(in[i]); k++) final += tt_tensor_get(in[i]->grad, k);
    cr_assert_float_eq(log.grad_sum_at_hook[i], final, 1e-12);
  }
  tt_tensor *all[] = {in[0], in[1], in[2], in[3], loss, extra, total, s};
  for (int i = 0; i < 8; i++) tt_tensor_release(all[i]);
}

/* Two graphs recorded interleaved on one tape, as pipeline micro-batches are (every
** forward, then every backward): the backward of the second runs its own nodes only and
** leaves the first's on the tape, and each gives the gradients it gives when run alone;
** the grad-ready hook fires once per leaf per backward. */
static void interleaved_nets(tt_tensor *const *x, tt_tensor *const *p, tt_tensor **loss) {
  tt_tensor *h[2], *a[2], *o[2], *sq[2];
  for (int g = 0; g < 2; g++) cr_assert(tt_linear(x[g], p[0], p[1], &h[g]) == 0);
  for (int g = 0; g < 2; g++) cr_assert(tt_silu(h[g], &a[g]) == 0);
  for (int g = 0; g < 2; g++) cr_assert(tt_linear(a[g], p[2], NULL, &o[g]) == 0);
  for (int g = 0; g < 2; g++) cr_assert(tt_mul(o[g], o[g], &sq[g]) == 0);
  for (int g = 0; g < 2; g++) cr_assert(tt_mean(sq[g], NULL, 0, 0, &loss[g]) == 0);
  for (int g = 0; g < 2; g++) {
    tt_tensor_release(h[g]);
    tt_tensor_release(a[g]);
    tt_tensor_release(o[g]);
    tt_tensor_release(sq[g]);
  }
}

Test(autograd, interleaved_graphs_backward_separately) {
  int64_t sx[2] = {N, D_IN}, s1[2] = {D_H, D_IN}, sb[1] = {D_H}, s2[2] = {D_OUT, D_H};
  tt_tensor *x[2] = {tt_test_rand(sx, 2, 30), tt_test_rand(sx, 2, 31)};
  tt_tensor *p[3] = {tt_test_rand(s1, 2, 32), tt_test_rand(sb, 1, 33), tt_test_rand(s2, 2, 34)};
  int64_t np[3] = {D_H * D_IN, D_H, D_OUT * D_H};
  double alone[2][3][D_H * D_IN];
  for (int i = 0; i < 3; i++) tt_set_requires_grad(p[i], 1);
  for (int g = 0; g < 2; g++) {   /* each graph on its own */
    tt_tensor *in[4] = {x[g], p[0], p[1], p[2]}, *loss = NULL;
    cr_assert(op_net(in, &loss, NULL) == 0);
    cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
    for (int i = 0; i < 3; i++) {
      cr_assert(tt_tensor_to_f64(p[i]->grad, alone[g][i]) == 0);
      tt_zero_grad(p[i]);
    }
    tt_tensor_release(loss);
  }
  tt_tensor *loss[2];
  interleaved_nets(x, p, loss);
  cr_assert_eq(tt_tape_size(), 10);
  hook_log log = {0};
  for (int i = 0; i < 3; i++) log.leaves[i] = p[i];
  tt_set_grad_ready_hook(on_ready, &log);
  for (int g = 1; g >= 0; g--) {
    log.calls = 0;
    cr_assert(tt_backward(loss[g]) == 0, "%s", tt_last_error());
    cr_assert_eq(tt_tape_size(), 5 * g, "graph %d: %lld nodes left on the tape", g,
                 (long long)tt_tape_size());
    cr_assert_eq(log.calls, 3);
    for (int i = 0; i < 3; i++) {
      tt_test_assert_close(p[i]->grad, alone[g][i], np[i], 1e-6, 1e-7, "interleaved gradient");
      cr_assert_eq(p[i]->tape_uses, 0);
      tt_zero_grad(p[i]);
    }
  }
  tt_set_grad_ready_hook(NULL, NULL);
  tt_tensor *all[] = {x[0], x[1], p[0], p[1], p[2], loss[0], loss[1]};
  for (int i = 0; i < 7; i++) tt_tensor_release(all[i]);
}

/* Deferred gradients (tt_set_deferred_grads): a table looked up first, then a layer whose
** weights are deferred; w1 reaches the linear through a scale (a node toward deferred
** tensors only), w2 is used twice, and c is added to h by tt_add_rms_norm, whose add
** hands its gradient on as it is, while silu adds to h's afterwards (the add's kept
** gradient must not be that memory). Backward gives bit-identical gradients either way, but with w1, b1, w2, c
** deferred the table's gradient is complete before any of theirs, and each leaf's hook
** still fires once, at its final value. */
enum { DV = 6, DN = 5 };
typedef struct order_log {
  int n;
  tt_tensor *order[8];
  double sum_at_hook[8];
} order_log;

static void log_order(tt_tensor *leaf, void *ud) {
  order_log *log = ud;
  double s = 0;
  for (int64_t k = 0; k < tt_tensor_numel(leaf->grad); k++) s += tt_tensor_get(leaf->grad, k);
  log->sum_at_hook[log->n] = s;
  log->order[log->n++] = leaf;
}

static void table_net(tt_tensor *const *p, tt_tensor *ids, order_log *log) {
  tt_tensor *x = NULL, *w1s = NULL, *h = NULL, *a = NULL, *o = NULL, *sq = NULL, *l = NULL;
  tt_tensor *s = NULL, *half = NULL, *loss = NULL, *z = NULL, *m = NULL, *hc = NULL, *t = NULL;
  cr_assert(tt_embedding(p[0], ids, &x) == 0, "%s", tt_last_error());
  cr_assert(tt_scale(p[1], 1.5, &w1s) == 0);
  cr_assert(tt_linear(x, w1s, p[2], &h) == 0);
  cr_assert(tt_silu(h, &a) == 0);
  cr_assert(tt_add_rms_norm(h, p[4], NULL, 1e-5, TT_F32, &hc, &z) == 0, "%s", tt_last_error());
  cr_assert(tt_mul(a, hc, &t) == 0);
  cr_assert(tt_mul(t, z, &m) == 0);
  cr_assert(tt_linear(m, p[3], NULL, &o) == 0);
  cr_assert(tt_mul(o, o, &sq) == 0);
  cr_assert(tt_mean(sq, NULL, 0, 0, &l) == 0);
  cr_assert(tt_sum(p[3], NULL, 0, 0, &s) == 0);
  cr_assert(tt_scale(s, 0.5, &half) == 0);
  cr_assert(tt_add(l, half, &loss) == 0);
  tt_set_grad_ready_hook(log_order, log);
  cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
  tt_set_grad_ready_hook(NULL, NULL);
  tt_tensor *all[] = {x, w1s, h, a, o, sq, l, s, half, loss, z, m, hc, t};
  for (int i = 0; i < 14; i++) tt_tensor_release(all[i]);
}

Test(autograd, deferred_grads_come_last_and_equal) {
  int64_t se[2] = {DV, D_IN}, s1[2] = {D_H, D_IN}, sb[1] = {D_H}, s2[2] = {D_OUT, D_H};
  int64_t sid[1] = {DN}, sh[2] = {DN, D_H};
  double idv[DN] = {1, 4, 1, 0, 5};
  tt_tensor *p[5] = {tt_test_rand(se, 2, 21), tt_test_rand(s1, 2, 22), tt_test_rand(sb, 1, 23),
                     tt_test_rand(s2, 2, 24), tt_test_rand(sh, 2, 25)};
  tt_tensor *ids = NULL, *plain[5];
  cr_assert(tt_tensor_from_f64(idv, sid, 1, TT_I64, &ids) == 0);
  for (int i = 0; i < 5; i++) tt_set_requires_grad(p[i], 1);
  order_log before = {0}, after = {0};
  table_net(p, ids, &before);
  cr_assert_eq(before.n, 5);
  cr_assert_eq(before.order[4], p[0], "without deferral the table's gradient comes last");
  for (int i = 0; i < 5; i++) {
    plain[i] = p[i]->grad;
    p[i]->grad = NULL;
  }
  cr_assert(tt_set_deferred_grads(p + 1, 4) == 0);
  table_net(p, ids, &after);
  cr_assert(tt_set_deferred_grads(NULL, 0) == 0);
  cr_assert_eq(tt_tape_size(), 0);
  cr_assert_eq(after.n, 5, "each leaf's hook fires once (%d calls)", after.n);
  cr_assert_eq(after.order[0], p[0], "the table's gradient comes first when the rest waits");
  for (int i = 0; i < 5; i++) {
    cr_assert(memcmp(p[i]->grad->storage->data, plain[i]->storage->data,
                     (size_t)tt_tensor_numel(p[i]) * sizeof(float)) == 0,
              "parameter %d: deferred gradient differs", i);
    cr_assert_eq(p[i]->tape_uses, 0);
    cr_assert_eq(p[i]->grad_deferred, 0);
  }
  for (int k = 0; k < 5; k++) {
    double s = 0;
    for (int64_t e = 0; e < tt_tensor_numel(after.order[k]); e++)
      s += tt_tensor_get(after.order[k]->grad, e);
    cr_assert_float_eq(after.sum_at_hook[k], s, 1e-12, "hook %d fired before its gradient "
                       "was complete", k);
  }
  for (int i = 0; i < 5; i++) {
    tt_tensor_release(plain[i]);
    tt_tensor_release(p[i]);
  }
  tt_tensor_release(ids);
}

/* -- Activation recompute (tt_checkpoint) -------------------------------------------- */

/* Two residual blocks y = x + linear(silu(linear(x, w, b)), v) (x: (N, D_IN), w: (D_H,
** D_IN), v: (D_IN, D_H)) after an input projection, run plainly or checkpointed: each
** block's first run records nothing, its re-run comes from recompute_block (the hook),
** which also checks the stash hands back what the first run kept (values and a tensor). */
typedef struct ckpt_case {
  tt_tensor *p[5];    /* w0 (D_IN, D_IN), w, b, v, then c (D_IN, D_IN) for the second block */
  int reruns, fail;
  tt_tensor *stashed[4];   /* the two tensors each block's first run stashes */
} ckpt_case;

static int block(const ckpt_case *c, int k, tt_tensor *x, tt_tensor **y) {
  tt_tensor *h = NULL, *a = NULL, *o = NULL, *w = NULL;
  int rc = 0;
  if (k == 1) rc = tt_matmul(c->p[1], c->p[4], NULL, 0, 0, &w);   /* the second block's w */
  else w = c->p[1], tt_tensor_retain(w);
  if (!rc) rc = tt_linear(x, w, c->p[2], &h);
  if (!rc) rc = tt_silu(h, &a);
  if (!rc) rc = tt_linear(a, c->p[3], NULL, &o);
  if (!rc) rc = tt_add(x, o, y);
  tt_tensor *all[] = {h, a, o, w};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
  return rc;
}

static int recompute_block(int64_t key, tt_tensor *leaf, tt_tensor *grad_out, void *ud) {
  ckpt_case *c = ud;
  c->reruns++;
  if (c->fail) return tt_fail("block failed on purpose");
  double s[2];
  if (tt_checkpoint_replay(s, 2) || s[0] != (double)key || s[1] != 0.5 * (double)key)
    return tt_fail("stash: not what the first run kept");
  if (tt_checkpoint_replay(s, 1) == 0) return tt_fail("stash: more values than kept");
  tt_tensor *kept = NULL, *more = NULL;
  for (int i = 0; i < 2; i++) {
    if (tt_checkpoint_replay_tensor(&kept)) return -1;
    const int same = kept == c->stashed[2 * (key - 1) + i] && kept->refcount >= 3;
    tt_tensor_release(kept);
    if (!same) return tt_fail("stash: not the tensor the first run kept");
  }
  if (tt_checkpoint_replay_tensor(&more) == 0 || more)
    return tt_fail("stash: more tensors than kept");
  tt_tensor *y = NULL;
  int rc = block(c, (int)key - 1, leaf, &y);
  if (!rc) rc = tt_backward_with(y, grad_out);
  tt_tensor_release(y);
  return rc;
}

/* The loss of the net; with `checkpointed`, both blocks run through tt_checkpoint. */
static int ckpt_net(ckpt_case *c, tt_tensor *in, int checkpointed, tt_tensor **loss) {
  tt_tensor *x[3] = {NULL, NULL, NULL}, *sq = NULL;
  int rc = tt_linear(in, c->p[0], NULL, &x[0]);
  for (int k = 0; k < 2 && !rc; k++) {
    if (!checkpointed) {
      rc = block(c, k, x[k], &x[k + 1]);
      continue;
    }
    tt_set_grad_enabled(0);
    tt_checkpoint_begin();
    double s[2] = {k + 1, 0.5 * (k + 1)};
    rc = tt_checkpoint_stash(s, 2);
    if (!rc) rc = tt_checkpoint_stash_tensor(c->stashed[2 * k]);
    if (!rc) rc = tt_checkpoint_stash_tensor(c->stashed[2 * k + 1]);
    if (!rc) rc = block(c, k, x[k], &x[k + 1]);
    tt_set_grad_enabled(1);
    if (!rc) rc = tt_checkpoint(x[k], x[k + 1], k + 1);
    else tt_checkpoint_cancel();
  }
  if (!rc) rc = tt_mul(x[2], x[2], &sq);
  if (!rc) rc = tt_mean(sq, NULL, 0, 0, loss);
  tt_tensor *all[] = {x[0], x[1], x[2], sq};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
  return rc;
}

Test(autograd, checkpoint_is_bit_identical_and_nests) {
  int64_t sx[2] = {N, D_IN}, s0[2] = {D_IN, D_IN}, s1[2] = {D_H, D_IN}, sb[1] = {D_H};
  int64_t s2[2] = {D_IN, D_H}, sc[2] = {D_IN, D_IN};
  ckpt_case c = {{tt_test_rand(s0, 2, 41), tt_test_rand(s1, 2, 42), tt_test_rand(sb, 1, 43),
                  tt_test_rand(s2, 2, 44), tt_test_rand(sc, 2, 45)}, 0, 0,
                 {tt_test_rand(sb, 1, 46), tt_test_rand(sb, 1, 47), tt_test_rand(sb, 1, 48),
                  tt_test_rand(sb, 1, 49)}};
  tt_tensor *in = tt_test_rand(sx, 2, 40), *plain[5], *loss = NULL;
  for (int i = 0; i < 5; i++) tt_set_requires_grad(c.p[i], 1);
  tt_set_recompute_hook(recompute_block, &c);
  cr_assert(ckpt_net(&c, in, 0, &loss) == 0, "%s", tt_last_error());
  int64_t plain_nodes = tt_tape_size();
  cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
  tt_tensor_release(loss);
  for (int i = 0; i < 5; i++) {
    plain[i] = c.p[i]->grad;
    c.p[i]->grad = NULL;
  }
  /* Checkpointed, with the blocks' weights deferred as data parallelism defers the first
  ** blocks': the nested backward runs whole and the gradients are the same bits. */
  for (int deferred = 0; deferred < 2; deferred++) {
    c.reruns = 0;
    if (deferred) cr_assert(tt_set_deferred_grads(c.p + 1, 4) == 0);
    cr_assert(ckpt_net(&c, in, 1, &loss) == 0, "%s", tt_last_error());
    cr_assert_eq(tt_tape_size(), 1 + 2 + 2, "input linear, 2 checkpoints, mul, mean");
    cr_assert(tt_tape_size() < plain_nodes);
    cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
    cr_assert(tt_set_deferred_grads(NULL, 0) == 0);
    tt_tensor_release(loss);
    cr_assert_eq(c.reruns, 2);
    cr_assert_eq(tt_tape_size(), 0);
    for (int k = 0; k < 4; k++)
      cr_assert_eq(c.stashed[k]->refcount, 1, "tensor %d: the stash still holds it", k);
    for (int i = 0; i < 5; i++) {
      cr_assert(memcmp(c.p[i]->grad->storage->data, plain[i]->storage->data,
                       (size_t)tt_tensor_numel(c.p[i]) * sizeof(float)) == 0,
                "parameter %d: recomputed gradient differs (deferred %d)", i, deferred);
      cr_assert_eq(c.p[i]->tape_uses, 0);
      cr_assert_eq(c.p[i]->grad_deferred, 0);
      tt_zero_grad(c.p[i]);
    }
  }
  /* A failing re-run fails the backward with its message and leaves an empty tape. */
  c.fail = 1;
  cr_assert(ckpt_net(&c, in, 1, &loss) == 0, "%s", tt_last_error());
  cr_assert(tt_backward(loss) != 0);
  cr_assert(strstr(tt_last_error(), "block failed on purpose") != NULL, "%s", tt_last_error());
  cr_assert_eq(tt_tape_size(), 0);
  tt_tensor_release(loss);
  tt_set_recompute_hook(NULL, NULL);
  for (int i = 0; i < 5; i++) {
    tt_tensor_release(plain[i]);
    tt_tensor_release(c.p[i]);
  }
  for (int k = 0; k < 4; k++) tt_tensor_release(c.stashed[k]);
  tt_tensor_release(in);
}
