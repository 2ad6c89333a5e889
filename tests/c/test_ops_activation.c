/*
** test_ops_activation.c — SiLU, GELU (tanh) and SwiGLU against float64 loops: forward on
** contiguous and strided inputs of odd sizes, backward against central differences,
** and rejected arguments.
*/
#include "tt_test.h"

/* -- float64 references ------------------------------------------------------------------ */

typedef struct { int64_t n; } act_ctx;

static double silu_ref1(double x) { return x / (1.0 + exp(-x)); }
static double gelu_ref1(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void silu_ref(double *const *in, double *out, void *ctx) {
  for (int64_t i = 0; i < ((act_ctx *)ctx)->n; i++) out[i] = silu_ref1(in[0][i]);
}
static void gelu_ref(double *const *in, double *out, void *ctx) {
  for (int64_t i = 0; i < ((act_ctx *)ctx)->n; i++) out[i] = gelu_ref1(in[0][i]);
}
static void swiglu_ref(double *const *in, double *out, void *ctx) {
  for (int64_t i = 0; i < ((act_ctx *)ctx)->n; i++) out[i] = silu_ref1(in[0][i]) * in[1][i];
}

static int silu_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  return tt_silu(in[0], out);
}
static int gelu_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  return tt_gelu(in[0], out);
}
static int swiglu_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  return tt_swiglu(in[0], in[1], out);
}

/* Inputs in [-1, 1) scaled to [-6, 6) so both tails of the curves are exercised. */
static tt_tensor *rand_wide(const int64_t *shape, int ndim, uint64_t seed, int strided) {
  tt_tensor *t = strided ? tt_test_rand_strided(shape, ndim, seed)
                         : tt_test_rand(shape, ndim, seed);
  int64_t n = tt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) tt_tensor_set(t, i, 6.0 * tt_tensor_get(t, i));
  return t;
}

static const int64_t shape3[3] = {3, 7, 13};

/* -- Forward -------------------------------------------------------------------------- */

Test(activation, silu_gelu_forward) {
  for (int strided = 0; strided < 2; strided++) {
    tt_tensor *x = rand_wide(shape3, 3, 11 + strided, strided);
    act_ctx c = {tt_tensor_numel(x)};
    tt_test_check_forward(silu_op, silu_ref, &x, 1, &c, 1e-5, 1e-6);
    tt_test_check_forward(gelu_op, gelu_ref, &x, 1, &c, 1e-5, 1e-6);
    tt_tensor_release(x);
  }
}

Test(activation, swiglu_forward) {
  for (int strided = 0; strided < 2; strided++) {
    tt_tensor *in[2] = {rand_wide(shape3, 3, 21, strided), rand_wide(shape3, 3, 22, 0)};
    act_ctx c = {tt_tensor_numel(in[0])};
    tt_test_check_forward(swiglu_op, swiglu_ref, in, 2, &c, 1e-5, 1e-5);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* Large enough to take the threaded path (n > TT_PARALLEL_GRAIN). */
Test(activation, silu_forward_threaded) {
  int64_t shape[1] = {70001};
  tt_tensor *x = rand_wide(shape, 1, 5, 0);
  act_ctx c = {shape[0]};
  tt_test_check_forward(silu_op, silu_ref, &x, 1, &c, 1e-5, 1e-6);
  tt_test_check_forward(gelu_op, gelu_ref, &x, 1, &c, 1e-5, 1e-6);
  tt_tensor_release(x);
}

/* Far tails: no overflow to inf or NaN where the true value is finite. */
Test(activation, extreme_inputs) {
  double v[6] = {-200.0, -90.0, -30.0, 30.0, 90.0, 200.0};
  int64_t shape[1] = {6};
  tt_tensor *x = NULL, *y = NULL, *z = NULL;
  cr_assert(tt_tensor_from_f64(v, shape, 1, TT_F32, &x) == 0);
  cr_assert(tt_silu(x, &y) == 0 && tt_gelu(x, &z) == 0);
  double ws[6], wg[6];
  for (int i = 0; i < 6; i++) {
    ws[i] = silu_ref1(v[i]);
    wg[i] = gelu_ref1(v[i]);
  }
  tt_test_assert_close(y, ws, 6, 1e-6, 1e-30, "silu tails");
  tt_test_assert_close(z, wg, 6, 1e-6, 1e-30, "gelu tails");
  tt_tensor_release(x);
  tt_tensor_release(y);
  tt_tensor_release(z);
}

/* -- Backward ------------------------------------------------------------------------- */

Test(activation, silu_gelu_backward) {
  int64_t shape[2] = {5, 9};
  int check[1] = {1};
  for (int strided = 0; strided < 2; strided++) {
    tt_tensor *x = rand_wide(shape, 2, 31 + strided, strided);
    act_ctx c = {tt_tensor_numel(x)};
    tt_test_check_backward(silu_op, silu_ref, &x, 1, check, &c, 1e-4, 1e-6);
    tt_test_check_backward(gelu_op, gelu_ref, &x, 1, check, &c, 1e-4, 1e-6);
    tt_tensor_release(x);
  }
}

Test(activation, swiglu_backward) {
  int64_t shape[2] = {5, 9};
  int both[2] = {1, 1}, gate_only[2] = {1, 0}, up_only[2] = {0, 1};
  tt_tensor *in[2] = {rand_wide(shape, 2, 41, 1), rand_wide(shape, 2, 42, 0)};
  act_ctx c = {tt_tensor_numel(in[0])};
  tt_test_check_backward(swiglu_op, swiglu_ref, in, 2, both, &c, 1e-4, 1e-6);
  tt_test_check_backward(swiglu_op, swiglu_ref, in, 2, gate_only, &c, 1e-4, 1e-6);
  tt_test_check_backward(swiglu_op, swiglu_ref, in, 2, up_only, &c, 1e-4, 1e-6);
  tt_tensor_release(in[0]);
  tt_tensor_release(in[1]);
}

/* -- Errors --------------------------------------------------------------------------- */

Test(activation, rejects_bad_arguments) {
  int64_t s1[2] = {4, 5}, s2[2] = {4, 6};
  tt_tensor *a = tt_test_rand(s1, 2, 1), *b = tt_test_rand(s2, 2, 2), *y = NULL;
  tt_tensor *ids = tt_test_index(s1, 2, 10, TT_I32, 3);
  tt_test_assert_error(tt_swiglu(a, b, &y), "swiglu: gate f32[4, 5]");
  tt_test_assert_error(tt_swiglu(a, b, &y), "must have the same shape");
  tt_test_assert_error(tt_silu(ids, &y), "silu: x must be f32, got i32");
  tt_test_assert_error(tt_gelu(ids, &y), "gelu: x is i32; expected f32 or bf16");
  tt_test_assert_error(tt_swiglu(a, ids, &y), "swiglu: gate is f32 and up i32; expected both f32 or both bf16");
  tt_test_assert_error(tt_silu(NULL, &y), "silu");
  cr_assert_null(y);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(ids);
}
