/*
** test_ops_attention.c — tt_attention / tt_attention_ex against a float64 softmax
** attention loop: odd lengths, grouped-query heads, strided views (copied and read in
** place), custom positions (context-parallel chunks, unsorted keys, queries that see no
** key), many blocks; gradients against central finite differences and, for sequences long
** enough to span many blocks, against the analytic float64 gradients.
*/
#include "tt_test.h"
#include "core/tt_internal.h"

typedef struct attn_case {
  int64_t b, tq, tk, hq, hkv, dh;
  int causal;
  double scale;              /* 0: 1/sqrt(Dh) */
  const int64_t *q_pos;      /* (tq) or NULL for 0..tq-1 */
  const int64_t *k_pos;      /* (tk) or NULL */
  int pos_dtype;             /* dtype of the position tensors handed to the op */
} attn_case;

static int64_t pos_of(const int64_t *pos, int64_t i) { return pos ? pos[i] : i; }

static double case_scale(const attn_case *c) {
  return c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->dh);
}

static int visible(const attn_case *c, int64_t i, int64_t j) {
  return !c->causal || pos_of(c->k_pos, j) <= pos_of(c->q_pos, i);
}

/* Softmax probabilities of query (b, i, h) over every key, 0 where hidden. p: (tk).
** Returns 0 when no key is visible. */
static int ref_probs(const attn_case *c, const double *q, const double *k, int64_t b,
                     int64_t i, int64_t h, double *p) {
  const int64_t hk = h / (c->hq / c->hkv);
  const double *qi = q + ((b * c->tq + i) * c->hq + h) * c->dh;
  double mx = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < c->tk; j++) {
    p[j] = -INFINITY;
    if (!visible(c, i, j)) continue;
    const double *kj = k + ((b * c->tk + j) * c->hkv + hk) * c->dh;
    double s = 0.0;
    for (int64_t d = 0; d < c->dh; d++) s += qi[d] * kj[d];
    p[j] = s * case_scale(c);
    mx = p[j] > mx ? p[j] : mx;
  }
  if (mx == -INFINITY) {
    for (int64_t j = 0; j < c->tk; j++) p[j] = 0.0;
    return 0;
  }
  for (int64_t j = 0; j < c->tk; j++) {
    p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - mx);
    sum += p[j];
  }
  for (int64_t j = 0; j < c->tk; j++) p[j] /= sum;
  return 1;
}

/* in: q (B, Tq, Hq, Dh), k, v (B, Tk, Hkv, Dh); out (B, Tq, Hq, Dh). */
static void ref_attention(double *const *in, double *out, void *ctx) {
  const attn_case *c = ctx;
  double *p = malloc(sizeof(double) * (size_t)(c->tk + 1));
  for (int64_t b = 0; b < c->b; b++)
    for (int64_t i = 0; i < c->tq; i++)
      for (int64_t h = 0; h < c->hq; h++) {
        const int64_t hk = h / (c->hq / c->hkv);
        double *o = out + ((b * c->tq + i) * c->hq + h) * c->dh;
        for (int64_t d = 0; d < c->dh; d++) o[d] = 0.0;
        ref_probs(c, in[0], in[1], b, i, h, p);
        for (int64_t j = 0; j < c->tk; j++) {
          const double *vj = in[2] + ((b * c->tk + j) * c->hkv + hk) * c->dh;
          for (int64_t d = 0; d < c->dh; d++) o[d] += p[j] * vj[d];
        }
      }
  free(p);
}

/* Analytic float64 gradients of sum(out * w): dq, dk, dv shaped like q, k, v. */
static void ref_attention_grad(const attn_case *c, const double *q, const double *k,
                               const double *v, const double *w, double *dq, double *dk,
                               double *dv) {
  const double scale = case_scale(c);
  double *p = malloc(sizeof(double) * (size_t)c->tk);
  double *dp = malloc(sizeof(double) * (size_t)c->tk);
  memset(dq, 0, sizeof(double) * (size_t)(c->b * c->tq * c->hq * c->dh));
  memset(dk, 0, sizeof(double) * (size_t)(c->b * c->tk * c->hkv * c->dh));
  memset(dv, 0, sizeof(double) * (size_t)(c->b * c->tk * c->hkv * c->dh));
  for (int64_t b = 0; b < c->b; b++)
    for (int64_t i = 0; i < c->tq; i++)
      for (int64_t h = 0; h < c->hq; h++) {
        const int64_t hk = h / (c->hq / c->hkv), row = (b * c->tq + i) * c->hq + h;
        const double *wi = w + row * c->dh, *qi = q + row * c->dh;
        ref_probs(c, q, k, b, i, h, p);
        double dsum = 0.0;
        for (int64_t j = 0; j < c->tk; j++) {
          const int64_t kv = ((b * c->tk + j) * c->hkv + hk) * c->dh;
          dp[j] = 0.0;
          for (int64_t d = 0; d < c->dh; d++) {
            dp[j] += wi[d] * v[kv + d];
            dv[kv + d] += p[j] * wi[d];
          }
          dsum += p[j] * dp[j];
        }
        for (int64_t j = 0; j < c->tk; j++) {
          const int64_t kv = ((b * c->tk + j) * c->hkv + hk) * c->dh;
          double ds = p[j] * (dp[j] - dsum) * scale;
          for (int64_t d = 0; d < c->dh; d++) {
            dq[row * c->dh + d] += ds * k[kv + d];
            dk[kv + d] += ds * qi[d];
          }
        }
      }
  free(p);
  free(dp);
}

static tt_tensor *position_tensor(const int64_t *pos, int64_t n, int dtype) {
  tt_tensor *t = NULL;
  cr_assert(tt_tensor_empty(&n, 1, dtype, TT_CPU, &t) == 0, "%s", tt_last_error());
  for (int64_t i = 0; i < n; i++) {
    if (dtype == TT_I32) ((int32_t *)tt_tensor_data(t))[i] = (int32_t)pos[i];
    else ((int64_t *)tt_tensor_data(t))[i] = pos[i];
  }
  return t;
}

static int op_attention(tt_tensor **in, tt_tensor **out, void *ctx) {
  const attn_case *c = ctx;
  if (!c->q_pos && !c->k_pos)
    return tt_attention(in[0], in[1], in[2], c->causal, c->scale, out);
  tt_tensor *qp = c->q_pos ? position_tensor(c->q_pos, c->tq, c->pos_dtype) : NULL;
  tt_tensor *kp = c->k_pos ? position_tensor(c->k_pos, c->tk, c->pos_dtype) : NULL;
  int rc = tt_attention_ex(in[0], in[1], in[2], qp, kp, c->causal, c->scale, out);
  tt_tensor_release(qp);
  tt_tensor_release(kp);
  return rc;
}

static void make_inputs(const attn_case *c, int strided, uint64_t seed, tt_tensor **in) {
  int64_t qs[4] = {c->b, c->tq, c->hq, c->dh}, ks[4] = {c->b, c->tk, c->hkv, c->dh};
  in[0] = strided ? tt_test_rand_strided(qs, 4, seed) : tt_test_rand(qs, 4, seed);
  in[1] = strided ? tt_test_rand_strided(ks, 4, seed + 1) : tt_test_rand(ks, 4, seed + 1);
  in[2] = strided ? tt_test_rand_strided(ks, 4, seed + 2) : tt_test_rand(ks, 4, seed + 2);
}

/* q, k, v as head slices of one fused (B, T, Hq + 2 Hkv, Dh) projection: strided views
** whose last dim is contiguous, which the kernel reads in place. Needs tq == tk. */
static void make_fused_inputs(const attn_case *c, uint64_t seed, tt_tensor **in) {
  int64_t shape[4] = {c->b, c->tq, c->hq + 2 * c->hkv, c->dh};
  tt_tensor *qkv = tt_test_rand(shape, 4, seed);
  cr_assert(tt_narrow(qkv, 2, 0, c->hq, &in[0]) == 0, "%s", tt_last_error());
  cr_assert(tt_narrow(qkv, 2, c->hq, c->hkv, &in[1]) == 0, "%s", tt_last_error());
  cr_assert(tt_narrow(qkv, 2, c->hq + c->hkv, c->hkv, &in[2]) == 0, "%s", tt_last_error());
  cr_assert(!tt_tensor_is_contiguous(in[0]) && !tt_tensor_is_contiguous(in[1]));
  tt_tensor_release(qkv);
}

static void release_inputs(tt_tensor **in) {
  for (int i = 0; i < 3; i++) tt_tensor_release(in[i]);
}

static void check_forward(const attn_case *c, tt_tensor **in) {
  tt_test_check_forward(op_attention, ref_attention, in, 3, (void *)c, 2e-5, 2e-6);
}

static void check_backward(const attn_case *c, tt_tensor **in) {
  const int all[3] = {1, 1, 1};
  tt_test_check_backward(op_attention, ref_attention, in, 3, all, (void *)c, 1e-4, 1e-5);
}

/* Our backward of sum(out * w) against ref_attention_grad, for cases too big for finite
** differences. */
static void check_backward_analytic(const attn_case *c, tt_tensor **in) {
  tt_tensor *out = NULL;
  for (int i = 0; i < 3; i++) cr_assert(tt_set_requires_grad(in[i], 1) == 0);
  cr_assert(op_attention(in, &out, (void *)c) == 0, "%s", tt_last_error());
  tt_tensor *w = tt_test_rand(out->shape, out->ndim, 777);
  cr_assert(tt_backward_with(out, w) == 0, "%s", tt_last_error());
  double *x[3], *wd = tt_test_to_f64(w), *g[3];
  for (int i = 0; i < 3; i++) {
    x[i] = tt_test_to_f64(in[i]);
    g[i] = malloc(sizeof(double) * (size_t)tt_tensor_numel(in[i]));
  }
  ref_attention_grad(c, x[0], x[1], x[2], wd, g[0], g[1], g[2]);
  const char *names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    cr_assert(in[i]->grad != NULL, "%s missing", names[i]);
    tt_test_assert_close(in[i]->grad, g[i], tt_tensor_numel(in[i]), 1e-4, 1e-6, names[i]);
    free(x[i]);
    free(g[i]);
    tt_zero_grad(in[i]);
    tt_set_requires_grad(in[i], 0);
  }
  free(wd);
  tt_tensor_release(w);
  tt_tensor_release(out);
}

/* -- Forward ------------------------------------------------------------------------ */

Test(attention, forward_causal_gqa_t13) {
  attn_case c = {.b = 2, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 8, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 1, in);
  check_forward(&c, in);
  release_inputs(in);
}

Test(attention, forward_causal_t37_dh16) {
  attn_case c = {.b = 1, .tq = 37, .tk = 37, .hq = 4, .hkv = 2, .dh = 16, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 2, in);
  check_forward(&c, in);
  release_inputs(in);
}

Test(attention, forward_noncausal_cross_lengths) {
  attn_case c = {.b = 2, .tq = 13, .tk = 37, .hq = 3, .hkv = 1, .dh = 8, .causal = 0,
                 .scale = 0.3};
  tt_tensor *in[3];
  make_inputs(&c, 0, 3, in);
  check_forward(&c, in);
  release_inputs(in);
}

Test(attention, forward_strided_copied) {
  attn_case c = {.b = 2, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 8, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 1, 4, in);
  check_forward(&c, in);
  release_inputs(in);
}

Test(attention, forward_fused_qkv_views) {
  attn_case c = {.b = 2, .tq = 37, .tk = 37, .hq = 4, .hkv = 2, .dh = 16, .causal = 1};
  tt_tensor *in[3];
  make_fused_inputs(&c, 5, in);
  check_forward(&c, in);
  release_inputs(in);
}

/* Rank 1 of a context-parallel group: its query chunk sits at positions 13..25 and
** attends to the gathered keys 0..25 (i32 positions). */
Test(attention, forward_context_parallel_chunk) {
  int64_t qp[13], kp[26];
  for (int i = 0; i < 13; i++) qp[i] = 13 + i;
  for (int i = 0; i < 26; i++) kp[i] = i;
  attn_case c = {.b = 2, .tq = 13, .tk = 26, .hq = 4, .hkv = 2, .dh = 8, .causal = 1,
                 .q_pos = qp, .k_pos = kp, .pos_dtype = TT_I32};
  tt_tensor *in[3];
  make_inputs(&c, 0, 6, in);
  check_forward(&c, in);
  release_inputs(in);
}

/* The last key (position 14) is hidden from the first query (13) only: the key block is
** one position short of being visible to the whole query block. */
Test(attention, forward_block_one_key_short_of_visible) {
  int64_t qp[13], kp[15];
  for (int i = 0; i < 13; i++) qp[i] = 13 + i;
  for (int i = 0; i < 15; i++) kp[i] = i;
  attn_case c = {.b = 1, .tq = 13, .tk = 15, .hq = 2, .hkv = 1, .dh = 8, .causal = 1,
                 .q_pos = qp, .k_pos = kp, .pos_dtype = TT_I64};
  tt_tensor *in[3];
  make_inputs(&c, 0, 10, in);
  check_forward(&c, in);
  release_inputs(in);
}

/* Unsorted key positions (i64), and a first query that sees no key at all: its output
** must be exactly zero. */
Test(attention, forward_unsorted_positions_and_empty_rows) {
  int64_t qp[13], kp[13];
  for (int i = 0; i < 13; i++) {
    qp[i] = i + 2;
    kp[i] = (i * 7) % 13 + 3;   /* a permutation of 3..15 */
  }
  attn_case c = {.b = 1, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 8, .causal = 1,
                 .q_pos = qp, .k_pos = kp, .pos_dtype = TT_I64};
  tt_tensor *in[3], *out = NULL;
  make_inputs(&c, 0, 7, in);
  check_forward(&c, in);
  cr_assert(op_attention(in, &out, &c) == 0, "%s", tt_last_error());
  for (int64_t d = 0; d < 4 * 8; d++) cr_assert_eq(tt_tensor_get(out, d), 0.0);
  tt_tensor_release(out);
  release_inputs(in);
}

/* Many query and key blocks, partial last blocks, both block shapes (Dh 32: 64-row query
** blocks; Dh 128: 32-row ones). */
Test(attention, forward_t300_many_blocks) {
  attn_case c = {.b = 1, .tq = 300, .tk = 300, .hq = 4, .hkv = 2, .dh = 32, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 8, in);
  check_forward(&c, in);
  release_inputs(in);
}

Test(attention, forward_t101_dh128) {
  attn_case c = {.b = 1, .tq = 101, .tk = 101, .hq = 2, .hkv = 1, .dh = 128, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 9, in);
  check_forward(&c, in);
  release_inputs(in);
}

/* -- Backward ----------------------------------------------------------------------- */

Test(attention, backward_causal_gqa_t13) {
  attn_case c = {.b = 2, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 8, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 11, in);
  check_backward(&c, in);
  release_inputs(in);
}

Test(attention, backward_causal_t37_dh16) {
  attn_case c = {.b = 1, .tq = 37, .tk = 37, .hq = 4, .hkv = 2, .dh = 16, .causal = 1};
  tt_tensor *in[3];
  make_inputs(&c, 0, 12, in);
  check_backward(&c, in);
  release_inputs(in);
}

Test(attention, backward_noncausal_strided) {
  attn_case c = {.b = 2, .tq = 13, .tk = 11, .hq = 4, .hkv = 2, .dh = 8, .causal = 0,
                 .scale = 0.45};
  tt_tensor *in[3];
  make_inputs(&c, 1, 13, in);
  check_backward(&c, in);
  release_inputs(in);
}

Test(attention, backward_fused_qkv_views) {
  attn_case c = {.b = 2, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 8, .causal = 1};
  tt_tensor *in[3];
  make_fused_inputs(&c, 14, in);
  check_backward(&c, in);
  release_inputs(in);
}

Test(attention, backward_positions_and_empty_rows) {
  int64_t qp[13], kp[15];
  for (int i = 0; i < 13; i++) qp[i] = i + 2;
  for (int i = 0; i < 15; i++) kp[i] = (i * 4) % 15 + 3;   /* a permutation of 3..17 */
  attn_case c = {.b = 2, .tq = 13, .tk = 15, .hq = 4, .hkv = 2, .dh = 8, .causal = 1,
                 .q_pos = qp, .k_pos = kp, .pos_dtype = TT_I32};
  tt_tensor *in[3];
  make_inputs(&c, 0, 15, in);
  check_backward(&c, in);
  release_inputs(in);
}

/* Many blocks with two threads: batch * Hkv = 2 takes the fused (batch, kv head) path,
** batch * Hkv = 1 the two-pass path (dk/dv by key block, then dq by query block). */
Test(attention, backward_many_blocks_both_paths) {
  int keep = tt_get_num_threads();
  tt_set_num_threads(2);
  attn_case fused = {.b = 2, .tq = 150, .tk = 150, .hq = 2, .hkv = 1, .dh = 8, .causal = 1};
  attn_case split = {.b = 1, .tq = 150, .tk = 150, .hq = 3, .hkv = 1, .dh = 16, .causal = 1};
  attn_case cross = {.b = 1, .tq = 70, .tk = 140, .hq = 2, .hkv = 1, .dh = 8, .causal = 0};
  attn_case *cases[3] = {&fused, &split, &cross};
  for (int i = 0; i < 3; i++) {
    tt_tensor *in[3];
    make_inputs(cases[i], 0, 16 + (uint64_t)i, in);
    check_backward_analytic(cases[i], in);
    release_inputs(in);
  }
  tt_set_num_threads(keep);
}

/* One node per call, copies of strided inputs included; none without grad mode. */
Test(attention, records_one_node) {
  attn_case c = {.b = 1, .tq = 5, .tk = 5, .hq = 2, .hkv = 1, .dh = 8, .causal = 1};
  tt_tensor *in[3], *out = NULL;
  make_inputs(&c, 1, 20, in);
  for (int i = 0; i < 3; i++) cr_assert(tt_set_requires_grad(in[i], 1) == 0);
  tt_tape_clear();
  cr_assert(op_attention(in, &out, &c) == 0, "%s", tt_last_error());
  cr_assert_eq(tt_tape_size(), 1);
  tt_tape_clear();
  tt_tensor_release(out);
  tt_set_grad_enabled(0);
  cr_assert(op_attention(in, &out, &c) == 0, "%s", tt_last_error());
  tt_set_grad_enabled(1);
  cr_assert_eq(tt_tape_size(), 0);
  tt_tensor_release(out);
  release_inputs(in);
}

/* -- Errors ------------------------------------------------------------------------- */

Test(attention, rejects_bad_arguments) {
  int64_t qs[4] = {2, 5, 4, 8}, ks[4] = {2, 5, 3, 8}, good_ks[4] = {2, 5, 2, 8};
  int64_t vs[4] = {2, 6, 2, 8}, s3[3] = {2, 5, 32};
  tt_tensor *q = tt_test_rand(qs, 4, 1), *k3 = tt_test_rand(ks, 4, 2);
  tt_tensor *k = tt_test_rand(good_ks, 4, 3), *vbad = tt_test_rand(vs, 4, 4);
  tt_tensor *flat = tt_test_rand(s3, 3, 5), *out = NULL;
  tt_tensor *qi = NULL, *pos = NULL;
  int64_t n4 = 4;
  cr_assert(tt_tensor_zeros(qs, 4, TT_I32, TT_CPU, &qi) == 0);
  cr_assert(tt_tensor_zeros(&n4, 1, TT_I64, TT_CPU, &pos) == 0);

  tt_test_assert_error(tt_attention(q, k3, k3, 1, 0.0, &out), "Hkv dividing 4");
  tt_test_assert_error(tt_attention(q, k, vbad, 1, 0.0, &out), "must have the shape of k");
  tt_test_assert_error(tt_attention(flat, k, k, 1, 0.0, &out), "expected 4 dims");
  tt_test_assert_error(tt_attention(qi, k, k, 1, 0.0, &out), "attention");
  tt_test_assert_error(tt_attention(q, k, k, 1, 0.0, NULL), "must not be NULL");
  tt_test_assert_error(tt_attention_ex(q, k, k, pos, NULL, 1, 0.0, &out), "q_pos");
  tt_test_assert_error(tt_attention_ex(q, k, k, NULL, q, 1, 0.0, &out), "k_pos");
  cr_assert_null(out);

  tt_tensor *ts[7] = {q, k3, k, vbad, flat, qi, pos};
  for (int i = 0; i < 7; i++) tt_tensor_release(ts[i]);
}

/* -- bf16 / f16: the CPU twin of the fused (cuDNN) path ----------------------------- */

static tt_tensor *cast_to(tt_tensor *t, int dtype) {
  tt_tensor *c = NULL;
  cr_assert(tt_cast(t, dtype, &c) == 0, "%s", tt_last_error());
  return c;
}

/* ||a - b|| / ||b|| over all elements, any float dtypes. */
static double rel_l2(tt_tensor *a, tt_tensor *b) {
  int64_t n = tt_tensor_numel(b);
  cr_assert_eq(tt_tensor_numel(a), n);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = tt_tensor_get(a, i), y = tt_tensor_get(b, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* Forward and backward of the low-precision op against the f32 op on the same (unrounded)
** inputs. bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); inputs, output
** and gradients are each rounded once, so 1% relative L2 for bf16 and 0.2% for f16 (11
** bits) leave room for the error to add up, and fail on any real mistake (a wrong
** element or head is >10%). The outputs must also be exactly the f32 op on the rounded
** inputs, rounded: that is what the twin promises the cuDNN test. */
static void check_low_precision(const attn_case *c, int dtype, int fused_views) {
  tt_tensor *in[3], *lp[3], *back[3];
  if (fused_views) make_fused_inputs(c, 91, in);
  else make_inputs(c, 0, 91, in);
  for (int i = 0; i < 3; i++) {
    lp[i] = cast_to(in[i], dtype);
    back[i] = cast_to(lp[i], TT_F32);
  }
  if (fused_views) {
    /* strided low-precision views, as a fused bf16 QKV projection gives them: the same
    ** values as make_fused_inputs' f32 views (same seed), rounded */
    int64_t shape[4] = {c->b, c->tq, c->hq + 2 * c->hkv, c->dh};
    tt_tensor *qkv = NULL, *f = tt_test_rand(shape, 4, 91);
    qkv = cast_to(f, dtype);
    for (int i = 0; i < 3; i++) tt_tensor_release(lp[i]);
    cr_assert(tt_narrow(qkv, 2, 0, c->hq, &lp[0]) == 0);
    cr_assert(tt_narrow(qkv, 2, c->hq, c->hkv, &lp[1]) == 0);
    cr_assert(tt_narrow(qkv, 2, c->hq + c->hkv, c->hkv, &lp[2]) == 0);
    cr_assert(!tt_tensor_is_contiguous(lp[0]));
    tt_tensor_release(qkv);
    tt_tensor_release(f);
  }
  const double tol = dtype == TT_BF16 ? 1e-2 : 2e-3;
  tt_tensor *w = NULL, *out_lp = NULL, *out_f = NULL, *out_r = NULL;
  for (int i = 0; i < 3; i++) {
    cr_assert(tt_set_requires_grad(in[i], 1) == 0);
    cr_assert(tt_set_requires_grad(lp[i], 1) == 0);
    cr_assert(tt_set_requires_grad(back[i], 1) == 0);
  }
  cr_assert(op_attention(lp, &out_lp, (void *)c) == 0, "%s", tt_last_error());
  cr_assert(op_attention(in, &out_f, (void *)c) == 0, "%s", tt_last_error());
  cr_assert(op_attention(back, &out_r, (void *)c) == 0, "%s", tt_last_error());
  cr_assert_eq(out_lp->dtype, dtype);
  double e = rel_l2(out_lp, out_f);
  cr_assert(e < tol, "%s forward: relative error %.3g against f32 (tolerance %.3g)",
            tt_dtype_name(dtype), e, tol);
  tt_tensor *rounded = cast_to(out_r, dtype);
  cr_assert_eq(rel_l2(out_lp, rounded), 0.0, "not the rounded f32 result");

  w = tt_test_rand(out_f->shape, 4, 5);
  tt_tensor *w_lp = cast_to(w, dtype);
  cr_assert(tt_backward_with(out_lp, w_lp) == 0, "%s", tt_last_error());
  cr_assert(tt_backward_with(out_f, w) == 0, "%s", tt_last_error());
  const char *names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    cr_assert(lp[i]->grad != NULL, "%s missing", names[i]);
    cr_assert_eq(lp[i]->grad->dtype, dtype, "%s is %s", names[i],
                 tt_dtype_name(lp[i]->grad->dtype));
    double eg = rel_l2(lp[i]->grad, in[i]->grad);
    cr_assert(eg < 2 * tol, "%s %s: relative error %.3g against f32", tt_dtype_name(dtype),
              names[i], eg);
  }
  tt_tensor *ts[] = {w, w_lp, out_lp, out_f, out_r, rounded};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tt_tensor_release(ts[i]);
  for (int i = 0; i < 3; i++) {
    tt_tensor_release(in[i]);
    tt_tensor_release(lp[i]);
    tt_tensor_release(back[i]);
  }
}

Test(attention, bf16_causal_gqa_odd_lengths) {
  attn_case c = {.b = 2, .tq = 37, .tk = 37, .hq = 4, .hkv = 2, .dh = 64, .causal = 1};
  check_low_precision(&c, TT_BF16, 0);
}

Test(attention, f16_noncausal_cross_lengths_dh128) {
  attn_case c = {.b = 1, .tq = 19, .tk = 45, .hq = 2, .hkv = 1, .dh = 128};
  check_low_precision(&c, TT_F16, 0);
}

Test(attention, bf16_context_parallel_chunk) {
  /* cp = 2, T = 16: rank 1 holds chunks 1 and 2 (positions 4..11) and sees every key */
  static const int64_t qp[8] = {4, 5, 6, 7, 8, 9, 10, 11};
  static const int64_t kp[16] = {0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11};
  attn_case c = {.b = 1, .tq = 8, .tk = 16, .hq = 2, .hkv = 2, .dh = 64, .causal = 1,
                 .q_pos = qp, .k_pos = kp, .pos_dtype = TT_I64};
  check_low_precision(&c, TT_BF16, 0);
}

Test(attention, bf16_fused_qkv_views) {
  attn_case c = {.b = 2, .tq = 13, .tk = 13, .hq = 4, .hkv = 2, .dh = 64, .causal = 1};
  check_low_precision(&c, TT_BF16, 1);
}

Test(attention, rejects_mixed_dtypes) {
  int64_t s[4] = {1, 5, 2, 8};
  tt_tensor *q = tt_test_rand(s, 4, 1), *k = tt_test_rand(s, 4, 2), *out = NULL;
  tt_tensor *kb = cast_to(k, TT_BF16);
  tt_test_assert_error(tt_attention(q, kb, kb, 1, 0.0, &out), "give q, k and v one dtype");
  cr_assert_null(out);
  tt_tensor_release(q);
  tt_tensor_release(k);
  tt_tensor_release(kb);
}
