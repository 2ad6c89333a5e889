/*
** test_lowp.c — the bf16 / fp16 GEMMs of engine/cuda/matmul_lowp.cu against an f32 CPU
** reference computed on the same rounded values.
**
** A product of two bf16 (or fp16) numbers is exact in f32, so the GPU result, summed in
** fp32 on the tensor cores, differs from "round the operands on the CPU, then an f32
** GEMM" only in the order of the sums: with f32 outputs the relative L2 error stays near
** 1e-6 (tolerance 1e-5). Backward rounds the output gradient the same way; the bias
** gradient is the column sum of the unrounded gradient. With a bf16 output (bf16
** activations in) the tolerance is that of one bf16 rounding, 8e-3. Inputs are fresh
** random values of odd sizes, outputs poisoned (NaN blocks in the allocator's cache)
** before each GPU run.
**
** Without a GPU the program exits 77 before running anything: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "cuda/tetra_cuda_lowp.h"
#include "tetra_amp.h"

static tt_tensor *cast(tt_tensor *t, int dtype) {
  tt_tensor *o = NULL;
  cr_assert_eq(tt_cast(t, dtype, &o), 0, "%s", tt_last_error());
  return o;
}

/* t rounded to dtype and back to f32, as a fresh leaf (CPU). */
static tt_tensor *rounded(tt_tensor *t, int dtype) {
  tt_set_grad_enabled(0);
  tt_tensor *low = cast(t, dtype), *r = cast(low, TT_F32);
  tt_set_grad_enabled(1);
  tt_tensor_release(low);
  return r;
}

/* Column sums of g (rows, n), the reference bias gradient. */
static tt_tensor *column_sums(tt_tensor *g, int64_t n) {
  tt_tensor *o = NULL;
  cr_assert_eq(tt_tensor_zeros(&n, 1, TT_F32, TT_CPU, &o), 0);
  const int64_t total = tt_tensor_numel(g);
  double *s = calloc((size_t)n, sizeof *s);
  cr_assert_not_null(s);
  for (int64_t i = 0; i < total; i++) s[i % n] += tt_tensor_get(g, i);
  for (int64_t j = 0; j < n; j++) tt_tensor_set(o, j, s[j]);
  free(s);
  return o;
}

typedef struct lowp_case {
  const char *name;
  int ta, tb;
  int in_dtype;      /* dtype a is given in on the GPU (b and bias stay f32); out has it */
  int compute;
  int view_a;        /* a is the transpose of the stored leaf (a strided view) */
  double tol;        /* for outputs and gradients in in_dtype; f32 ones use 1e-5 */
} lowp_case;

static tt_tensor *maybe_view(tt_tensor *leaf, int view) {
  tt_tensor *v = NULL;
  if (!view) {
    tt_tensor_retain(leaf);
    return leaf;
  }
  cr_assert_eq(tt_transpose(leaf, -1, -2, &v), 0, "%s", tt_last_error());
  return v;
}

/* a_store, b, bias (may be NULL): CPU f32; a = a_store, or its transpose with view_a.
** Checks the output and the gradients of a_store, b and bias. */
static void check_case(const lowp_case *c, tt_tensor *a_store, tt_tensor *b, tt_tensor *bias) {
  const double tol32 = 1e-5;
  const double tol_in = c->in_dtype == TT_F32 ? tol32 : c->tol;
  /* Reference leaves: the values the GPU multiplies. */
  tt_tensor *a_in = rounded(a_store, c->in_dtype);
  tt_tensor *ar = rounded(a_in, c->compute), *br = rounded(b, c->compute);
  tt_tensor *biasr = bias ? rounded(bias, c->in_dtype) : NULL;
  cr_assert_eq(tt_set_requires_grad(ar, 1), 0);
  cr_assert_eq(tt_set_requires_grad(br, 1), 0);
  tt_tensor *av = maybe_view(ar, c->view_a), *ref = NULL;
  cr_assert_eq(tt_matmul(av, br, NULL, c->ta, c->tb, &ref), 0, "%s", tt_last_error());
  tt_tensor *g = randn(ref->shape, ref->ndim, 1.0);
  tt_tensor *g_in = rounded(g, c->in_dtype), *gr = rounded(g_in, c->compute);
  cr_assert_eq(tt_backward_with(ref, gr), 0, "%s", tt_last_error());

  /* GPU: a given in in_dtype, b and bias f32. */
  tt_tensor *a_dev32 = to_dev(a_store, GPU), *ag = cast(a_dev32, c->in_dtype);
  tt_tensor *bg = to_dev(b, GPU), *biasg = bias ? to_dev(bias, GPU) : NULL;
  cr_assert_eq(tt_set_requires_grad(ag, 1), 0);
  cr_assert_eq(tt_set_requires_grad(bg, 1), 0);
  if (biasg) cr_assert_eq(tt_set_requires_grad(biasg, 1), 0);
  tt_tensor *agv = maybe_view(ag, c->view_a), *out = NULL;
  for (int i = 0; i < 3; i++) poison(tt_tensor_numel(ref));
  cr_assert_eq(tt_cuda_matmul_lowp(agv, bg, biasg, c->ta, c->tb, c->compute, &out), 0,
               "%s: %s", c->name, tt_last_error());
  cr_assert_eq(out->dtype, c->in_dtype, "%s: output dtype %s", c->name,
               tt_dtype_name(out->dtype));
  /* The bias enters after the products: add it to the reference here. */
  tt_tensor *want = NULL;
  if (biasr) cr_assert_eq(tt_add(ref, biasr, &want), 0);
  else { tt_tensor_retain(ref); want = ref; }
  double e = rel_err(out, want);
  cr_assert(e <= tol_in, "%s forward: relative error %g > %g", c->name, e, tol_in);

  tt_tensor *gd = to_dev(g_in, GPU), *gdc = cast(gd, c->in_dtype);
  for (int i = 0; i < 3; i++) poison(tt_tensor_numel(a_store) + tt_tensor_numel(b));
  cr_assert_eq(tt_backward_with(out, gdc), 0, "%s backward: %s", c->name, tt_last_error());
  cr_assert_not_null(ag->grad, "%s: no grad for a", c->name);
  cr_assert_not_null(bg->grad, "%s: no grad for b", c->name);
  cr_assert_eq(ag->grad->dtype, c->in_dtype);
  cr_assert_eq(bg->grad->dtype, TT_F32);
  double ea = rel_err(ag->grad, ar->grad), eb = rel_err(bg->grad, br->grad);
  cr_assert(ea <= tol_in, "%s grad a: relative error %g > %g", c->name, ea, tol_in);
  cr_assert(eb <= tol32, "%s grad b: relative error %g > %g", c->name, eb, tol32);
  if (biasg) {
    tt_tensor *gbias = column_sums(g_in, bias->shape[0]);
    double eg = rel_err(biasg->grad, gbias);
    cr_assert(eg <= tol32, "%s grad bias: relative error %g > %g", c->name, eg, tol32);
    tt_tensor_release(gbias);
  }
  tt_tensor *all[] = {a_in, ar, br, biasr, av, ref, g, g_in, gr, a_dev32, ag, bg, biasg,
                      agv, out, want, gd, gdc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_lowp, casts_match_the_cpu) {
  int64_t s[3] = {5, 7, 333};
  tt_tensor *x = randn(s, 3, 30.0), *xd = to_dev(x, GPU);
  const int dtypes[2] = {TT_BF16, TT_F16};
  for (int k = 0; k < 2; k++) {
    tt_tensor *want = cast(x, dtypes[k]), *got = NULL, *view = NULL, *got_v = NULL;
    poison(5 * 7 * 333);
    cr_assert_eq(tt_cuda_cast_contiguous(xd, dtypes[k], &got), 0, "%s", tt_last_error());
    cr_assert(rel_err(got, want) == 0, "%s rounding differs from the cpu", tt_dtype_name(dtypes[k]));
    /* A strided view goes through the strided copy and must give the same values. */
    tt_tensor *wantv = NULL, *wv = NULL;
    cr_assert_eq(tt_transpose(xd, 0, 2, &view), 0);
    cr_assert_eq(tt_cuda_cast_contiguous(view, dtypes[k], &got_v), 0, "%s", tt_last_error());
    cr_assert(tt_tensor_is_contiguous(got_v));
    cr_assert_eq(tt_transpose(want, 0, 2, &wv), 0);
    cr_assert_eq(tt_contiguous(wv, &wantv), 0);
    cr_assert(rel_err(got_v, wantv) == 0, "strided %s cast differs", tt_dtype_name(dtypes[k]));
    tt_tensor *all[] = {want, got, view, got_v, wantv, wv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  }
  tt_tensor_release(x);
  tt_tensor_release(xd);
}

Test(cuda_lowp, linear_f32_master_weights) {
  /* x (3, 41, 67) @ w (53, 67)^T + bias: the Linear of train.precision = bf16. */
  int64_t xs[3] = {3, 41, 67}, ws[2] = {53, 67}, bs[1] = {53};
  tt_tensor *x = randn(xs, 3, 1.0), *w = randn(ws, 2, 0.1), *bias = randn(bs, 1, 0.1);
  lowp_case c = {"linear bf16", 0, 1, TT_F32, TT_BF16, 0, 0};
  check_case(&c, x, w, bias);
  lowp_case h = {"linear fp16", 0, 1, TT_F32, TT_F16, 0, 0};
  check_case(&h, x, w, NULL);
  tt_tensor_release(x); tt_tensor_release(w); tt_tensor_release(bias);
}

Test(cuda_lowp, linear_bf16_activations) {
  int64_t xs[3] = {2, 37, 96}, ws[2] = {45, 96}, bs[1] = {45};
  tt_tensor *x = randn(xs, 3, 1.0), *w = randn(ws, 2, 0.1), *bias = randn(bs, 1, 0.1);
  lowp_case c = {"linear bf16 in/out", 0, 1, TT_BF16, TT_BF16, 0, 8e-3};
  check_case(&c, x, w, bias);
  tt_tensor_release(x); tt_tensor_release(w); tt_tensor_release(bias);
}

Test(cuda_lowp, transposes_and_views) {
  int64_t as[2] = {67, 41}, bs[2] = {29, 67};
  tt_tensor *a = randn(as, 2, 1.0), *b = randn(bs, 2, 1.0);
  lowp_case tt = {"matmul a^T b^T", 1, 1, TT_F32, TT_BF16, 0, 0};
  check_case(&tt, a, b, NULL);
  /* a passed as the (41, 67) transposed view of the stored (67, 41): a strided operand. */
  lowp_case v = {"matmul view(a) b^T", 0, 1, TT_F32, TT_BF16, 1, 0};
  check_case(&v, a, b, NULL);
  tt_tensor_release(a); tt_tensor_release(b);
}

Test(cuda_lowp, batched) {
  /* b with a's leading dims: a strided batch. */
  int64_t as[4] = {2, 3, 19, 33}, bs[4] = {2, 3, 33, 17};
  tt_tensor *a = randn(as, 4, 1.0), *b = randn(bs, 4, 1.0);
  lowp_case c = {"batched matmul", 0, 0, TT_F32, TT_BF16, 0, 0};
  check_case(&c, a, b, NULL);
  /* A 2-D b shared by the batches of a transposed a: dB sums the batches. */
  int64_t a2s[3] = {4, 33, 19}, b2s[2] = {17, 33};
  tt_tensor *a2 = randn(a2s, 3, 1.0), *b2 = randn(b2s, 2, 1.0);
  lowp_case s = {"shared b, a^T", 1, 1, TT_F32, TT_BF16, 0, 0};
  check_case(&s, a2, b2, NULL);
  lowp_case n = {"shared b, a", 0, 0, TT_F32, TT_BF16, 0, 0};
  int64_t a3s[3] = {4, 19, 33}, b3s[2] = {33, 17};
  tt_tensor *a3 = randn(a3s, 3, 1.0), *b3 = randn(b3s, 2, 1.0);
  check_case(&n, a3, b3, NULL);
  tt_tensor *all[] = {a, b, a2, b2, a3, b3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_lowp, errors_name_the_problem) {
  int64_t s[2] = {3, 4};
  tt_tensor *cpu = randn(s, 2, 1.0), *dev = to_dev(cpu, GPU), *out = NULL;
  cr_assert_eq(tt_cuda_matmul_lowp(cpu, cpu, NULL, 0, 1, TT_BF16, &out), -1);
  cr_assert(strstr(tt_last_error(), "cpu") != NULL, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_matmul_lowp(dev, dev, NULL, 0, 1, TT_F32, &out), -1);
  cr_assert(strstr(tt_last_error(), "compute dtype") != NULL, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_matmul_lowp(dev, dev, NULL, 0, 0, TT_BF16, &out), -1);
  cr_assert(strstr(tt_last_error(), "inner dims") != NULL, "%s", tt_last_error());
  tt_tensor_release(cpu);
  tt_tensor_release(dev);
}

/* tt_linear_lowp with cached weights: the GPU op against its CPU twin (the emulation in
** engine/ops/matmul.c) on the same values, run twice so that the second backward adds
** into the weight's gradient inside the GEMM (beta = 1); the weight is cast once for
** both forwards and both backwards; x is a strided view (a transpose). */
Test(cuda_lowp, linear_cached_weight_matches_the_cpu_twin) {
  int64_t xs[3] = {3, 67, 41}, ws[2] = {53, 67}, bs[1] = {53};
  tt_tensor *x = randn(xs, 3, 1.0), *w = randn(ws, 2, 0.1), *bias = randn(bs, 1, 0.1);
  tt_tensor *xd = to_dev(x, GPU), *wd = to_dev(w, GPU), *bd = to_dev(bias, GPU);
  tt_tensor *leaves[6] = {x, w, bias, xd, wd, bd};
  for (int i = 0; i < 6; i++) cr_assert_eq(tt_set_requires_grad(leaves[i], 1), 0);
  tt_tensor *xv = NULL, *xdv = NULL;
  cr_assert_eq(tt_transpose(x, 1, 2, &xv), 0);
  cr_assert_eq(tt_transpose(xd, 1, 2, &xdv), 0);
  int64_t gs[3] = {3, 41, 53};
  tt_tensor *g = randn(gs, 3, 1.0), *gd = to_dev(g, GPU);
  const int64_t casts0 = tt_lowp_weight_casts();
  for (int rep = 0; rep < 2; rep++) {
    tt_tensor *ref = NULL, *out = NULL;
    cr_assert_eq(tt_linear_lowp(xv, w, bias, TT_BF16, &ref), 0, "%s", tt_last_error());
    for (int i = 0; i < 3; i++) poison(3 * 41 * 53);
    cr_assert_eq(tt_linear_lowp(xdv, wd, bd, TT_BF16, &out), 0, "%s", tt_last_error());
    double e = rel_err(out, ref);
    cr_assert(e <= 1e-5, "forward %d: relative error %g", rep, e);
    cr_assert_eq(tt_backward_with(ref, g), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(out, gd), 0, "%s", tt_last_error());
    double ex = rel_err(xd->grad, x->grad), ew = rel_err(wd->grad, w->grad);
    double eb = rel_err(bd->grad, bias->grad);
    cr_assert(ex <= 1e-5 && ew <= 1e-5 && eb <= 1e-5,
              "backward %d: grad x %g, grad w %g, grad bias %g", rep, ex, ew, eb);
    tt_tensor_release(ref);
    tt_tensor_release(out);
  }
  /* One cast of w for the CPU twin, one of wd on the GPU. */
  cr_assert_eq(tt_lowp_weight_casts() - casts0, 2);
  tt_tensor *all[] = {x, w, bias, xd, wd, bd, xv, xdv, g, gd};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* bf16 activations between GEMMs: a bf16 x read as it is, the output written in bf16
** (the fp32 sums rounded once) or in f32 (a layer feeding the residual stream), and the
** gradient of x in bf16, against the CPU twin on the same values. */
Test(cuda_lowp, linear_bf16_activations_match_the_cpu_twin) {
  int64_t xs[3] = {2, 37, 67}, ws[2] = {45, 67}, bs[1] = {45}, gs[3] = {2, 37, 45};
  tt_tensor *x32 = randn(xs, 3, 1.0), *w = randn(ws, 2, 0.1), *bias = randn(bs, 1, 0.1);
  tt_tensor *x = cast(x32, TT_BF16), *xd = to_dev(x, GPU), *wd = to_dev(w, GPU);
  tt_tensor *bd = to_dev(bias, GPU);
  cr_assert_eq(xd->dtype, TT_BF16);
  const int outs[2] = {TT_BF16, TT_F32};
  for (int o = 0; o < 2; o++) {
    tt_tensor *leaves[6] = {x, w, bias, xd, wd, bd};
    for (int i = 0; i < 6; i++) {
      tt_tensor_release(leaves[i]->grad);
      leaves[i]->grad = NULL;
      cr_assert_eq(tt_set_requires_grad(leaves[i], 1), 0);
    }
    tt_tensor *ref = NULL, *out = NULL;
    cr_assert_eq(tt_linear_lowp_ex(x, w, bias, TT_BF16, outs[o], &ref), 0, "%s",
                 tt_last_error());
    poison(2 * 37 * 45);
    cr_assert_eq(tt_linear_lowp_ex(xd, wd, bd, TT_BF16, outs[o], &out), 0, "%s",
                 tt_last_error());
    cr_assert_eq(out->dtype, outs[o]);
    const double tol = outs[o] == TT_BF16 ? 8e-3 : 1e-5;
    double e = rel_err(out, ref);
    cr_assert(e <= tol, "forward (%s out): relative error %g", tt_dtype_name(outs[o]), e);
    tt_tensor *g = randn(gs, 3, 1.0), *gl = cast(g, outs[o]), *gd = to_dev(gl, GPU);
    cr_assert_eq(tt_backward_with(ref, gl), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(out, gd), 0, "%s", tt_last_error());
    cr_assert_eq(xd->grad->dtype, TT_BF16);
    double ex = rel_err(xd->grad, x->grad), ew = rel_err(wd->grad, w->grad);
    cr_assert(ex <= 8e-3 && ew <= 1e-5, "backward (%s out): grad x %g, grad w %g",
              tt_dtype_name(outs[o]), ex, ew);
    tt_tensor *tmp[] = {ref, out, g, gl, gd};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) tt_tensor_release(tmp[i]);
  }
  tt_tensor *all[] = {x32, w, bias, x, xd, wd, bd};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* Fused q/k/v (and w1 | w3): tt_linear_lowp_group on the GPU against its CPU twin on the
** same values, bf16 x in, bf16 out, with biases: the three outputs (strided views of one
** GEMM's result), then dX, each dW and each db. */
Test(cuda_lowp, linear_group_matches_the_cpu_twin) {
  int64_t xs[3] = {2, 19, 64}, gs[3] = {2, 19, 0};
  const int64_t rows[3] = {64, 16, 16};
  tt_tensor *x32 = randn(xs, 3, 1.0), *x = cast(x32, TT_BF16), *xd = to_dev(x, GPU);
  tt_tensor *w[3], *wd[3], *b[3], *bd[3];
  for (int j = 0; j < 3; j++) {
    int64_t ws[2] = {rows[j], 64};
    w[j] = randn(ws, 2, 0.1);
    b[j] = randn(&rows[j], 1, 0.1);
    wd[j] = to_dev(w[j], GPU);
    bd[j] = to_dev(b[j], GPU);
    tt_tensor *leaves[4] = {w[j], b[j], wd[j], bd[j]};
    for (int i = 0; i < 4; i++) cr_assert_eq(tt_set_requires_grad(leaves[i], 1), 0);
  }
  cr_assert_eq(tt_set_requires_grad(x, 1), 0);
  cr_assert_eq(tt_set_requires_grad(xd, 1), 0);
  tt_tensor *ref[3], *out[3];
  cr_assert_eq(tt_linear_lowp_group(x, w, b, 3, TT_BF16, TT_BF16, ref), 0, "%s",
               tt_last_error());
  poison(2 * 19 * 96);
  cr_assert_eq(tt_linear_lowp_group(xd, wd, bd, 3, TT_BF16, TT_BF16, out), 0, "%s",
               tt_last_error());
  /* One backward per device of sum_j <out_j, g_j> (g_j bf16 values): the three parts
  ** of the shared result's gradient meet before the group's node runs. */
  tt_tensor *loss_ref = NULL, *loss_dev = NULL;
  for (int j = 0; j < 3; j++) {
    cr_assert_eq(out[j]->dtype, TT_BF16);
    double e = rel_err(out[j], ref[j]);
    cr_assert(e <= 8e-3, "output %d: relative error %g", j, e);
    gs[2] = rows[j];
    tt_tensor *g = randn(gs, 3, 1.0), *gl = cast(g, TT_BF16), *g32 = cast(gl, TT_F32);
    tt_tensor *gd = to_dev(g32, GPU);
    tt_tensor **loss[2] = {&loss_ref, &loss_dev};
    tt_tensor *o[2] = {ref[j], out[j]}, *gg[2] = {g32, gd};
    for (int d = 0; d < 2; d++) {
      tt_tensor *wide = cast(o[d], TT_F32), *prod = NULL, *s = NULL, *acc = NULL;
      cr_assert_eq(tt_mul(wide, gg[d], &prod), 0, "%s", tt_last_error());
      cr_assert_eq(tt_sum(prod, NULL, 0, 0, &s), 0, "%s", tt_last_error());
      if (*loss[d]) {
        cr_assert_eq(tt_add(*loss[d], s, &acc), 0, "%s", tt_last_error());
        tt_tensor_release(*loss[d]);
        tt_tensor_release(s);
        *loss[d] = acc;
      } else {
        *loss[d] = s;
      }
      tt_tensor_release(prod);
      tt_tensor_release(wide);
    }
    tt_tensor *tmp[] = {g, gl, g32, gd};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) tt_tensor_release(tmp[i]);
  }
  cr_assert_eq(tt_backward(loss_ref), 0, "%s", tt_last_error());
  cr_assert_eq(tt_backward(loss_dev), 0, "%s", tt_last_error());
  tt_tensor_release(loss_ref);
  tt_tensor_release(loss_dev);
  double ex = rel_err(xd->grad, x->grad);
  cr_assert(ex <= 8e-3, "grad x: relative error %g", ex);
  for (int j = 0; j < 3; j++) {
    double ew = rel_err(wd[j]->grad, w[j]->grad), eb = rel_err(bd[j]->grad, b[j]->grad);
    cr_assert(ew <= 1e-5 && eb <= 1e-5, "weight %d: grad w %g, grad b %g", j, ew, eb);
    tt_tensor *tmp[] = {ref[j], out[j], w[j], wd[j], b[j], bd[j]};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) tt_tensor_release(tmp[i]);
  }
  tt_tensor *all[] = {x32, x, xd};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}
