/*
** test_cudnn_sdpa.c — cuDNN's fused attention (engine/cuda/cudnn_sdpa.cu, reached through
** tt_attention_ex with bf16 / f16 inputs on CUDA) against the CPU twin: the same op on
** the CPU with the same low-precision inputs, which computes in f32 and rounds.
**
** Each case checks the output and dq, dk, dv, and that cuDNN really ran (its run counter
** went up by a forward and a backward): a fallback to the built-in kernel would pass the
** numbers but is a failure here, since cuDNN is the point. Cases: causal and not, GQA,
** bf16 and f16, Dh 64 and 128, Tq != Tk, odd T, strided q/k/v (views of one fused QKV
** projection), context-parallel chunk pairs with explicit positions (both ranks of
** cp = 2), a head dim cuDNN does not take (Dh 40) and cuDNN switched off (the fallback:
** right numbers, no cuDNN run, one line on stderr when switched off).
**
** Tolerances (relative L2 over the tensor): cuDNN rounds the probabilities P to the input
** dtype before P V, and E^T, dS^T to it before the dV and dK products, where the twin
** keeps f32; each such rounding is a relative 2^-9 (bf16) or 2^-12 (f16) per element,
** largely averaging out over a row. So 1.5% (bf16) / 0.3% (f16) for the output and twice
** that for the gradients: several times the expected error, far below a wrong mask, head
** or scale (>= 10%).
*/
#include "cuda_test.h"
#include "tt_cudnn_sdpa.h"
#include "cuda/tt_cudnn.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct sdpa_case {
  const char *name;
  int dtype;
  int64_t b, tq, tk, hq, hkv, dh;
  int causal;
  int fused_qkv;              /* q, k, v as strided views of one (B, T, Hq + 2 Hkv, Dh) */
  const int64_t *q_pos, *k_pos;
  int expect_cudnn;
} sdpa_case;

static tt_tensor *positions(const int64_t *pos, int64_t n, int device) {
  if (!pos) return NULL;
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_empty(&n, 1, TT_I64, TT_CPU, &t), 0);
  for (int64_t i = 0; i < n; i++) ((int64_t *)tt_tensor_data(t))[i] = pos[i];
  if (device == TT_CPU) return t;
  tt_tensor *d = to_dev(t, device);
  tt_tensor_release(t);
  return d;
}

/* q, k, v of the case on `device`, in the case's dtype, from one seed. */
static void make_qkv(const sdpa_case *c, int device, tt_tensor **qkv) {
  tt_manual_seed(1234);
  if (c->fused_qkv) {
    int64_t s[4] = {c->b, c->tq, c->hq + 2 * c->hkv, c->dh};
    tt_tensor *f = randn(s, 4, 1.0), *l = NULL;
    cr_assert_eq(tt_cast(f, c->dtype, &l), 0, "%s", tt_last_error());
    tt_tensor *d = to_dev(l, device);
    cr_assert_eq(tt_narrow(d, 2, 0, c->hq, &qkv[0]), 0);
    cr_assert_eq(tt_narrow(d, 2, c->hq, c->hkv, &qkv[1]), 0);
    cr_assert_eq(tt_narrow(d, 2, c->hq + c->hkv, c->hkv, &qkv[2]), 0);
    tt_tensor_release(f);
    tt_tensor_release(l);
    tt_tensor_release(d);
    return;
  }
  int64_t qs[4] = {c->b, c->tq, c->hq, c->dh}, ks[4] = {c->b, c->tk, c->hkv, c->dh};
  for (int i = 0; i < 3; i++) {
    tt_tensor *f = randn(i == 0 ? qs : ks, 4, 1.0), *l = NULL;
    cr_assert_eq(tt_cast(f, c->dtype, &l), 0, "%s", tt_last_error());
    qkv[i] = to_dev(l, device);
    tt_tensor_release(f);
    tt_tensor_release(l);
  }
}

/* out and the grads of sum(out * w) on `device`; all returned on the CPU. */
static void run(const sdpa_case *c, int device, tt_tensor **res) {
  tt_tensor *qkv[3];
  make_qkv(c, device, qkv);
  for (int i = 0; i < 3; i++) cr_assert_eq(tt_set_requires_grad(qkv[i], 1), 0);
  tt_tensor *qp = positions(c->q_pos, c->tq, device), *kp = positions(c->k_pos, c->tk, device);
  tt_tensor *out = NULL;
  cr_assert_eq(tt_attention_ex(qkv[0], qkv[1], qkv[2], qp, kp, c->causal, 0.0, &out), 0,
               "%s: %s", c->name, tt_last_error());
  cr_assert_eq(out->dtype, c->dtype);
  tt_manual_seed(99);
  tt_tensor *wf = randn(out->shape, 4, 1.0), *wl = NULL;
  cr_assert_eq(tt_cast(wf, c->dtype, &wl), 0);
  tt_tensor *w = to_dev(wl, device);
  cr_assert_eq(tt_backward_with(out, w), 0, "%s: %s", c->name, tt_last_error());
  res[0] = to_dev(out, TT_CPU);
  for (int i = 0; i < 3; i++) {
    cr_assert_not_null(qkv[i]->grad, "%s: grad %d missing", c->name, i);
    res[1 + i] = to_dev(qkv[i]->grad, TT_CPU);
    tt_tensor_release(qkv[i]);
  }
  tt_tensor *ts[] = {qp, kp, out, wf, wl, w};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tt_tensor_release(ts[i]);
}

static void check(const sdpa_case *c) {
  tt_tensor *ref[4], *gpu[4];
  run(c, TT_CPU, ref);
  poison((int64_t)1 << 22);
  int64_t before = tt_cudnn_sdpa_runs();
  run(c, GPU, gpu);
  cr_assert_eq(tt_cuda_synchronize(), 0, "%s", tt_last_error());
  int64_t ran = tt_cudnn_sdpa_runs() - before;
  if (c->expect_cudnn)
    cr_assert(ran >= 2, "%s: cuDNN did not run (%lld graphs; cuDNN at '%s' version %zu): "
              "the fallback kernel answered", c->name, (long long)ran, tt_cudnn_path(),
              tt_cudnn_version());
  else
    cr_assert_eq(ran, 0, "%s: cuDNN ran on a case it should refuse", c->name);
  const double tol = c->dtype == TT_BF16 ? 1.5e-2 : 3e-3;
  const char *names[4] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    double e = rel_err(gpu[i], ref[i]);
    double t = i == 0 ? tol : 2 * tol;
    cr_assert(e < t, "%s %s: relative error %.3g (tolerance %.3g)", c->name, names[i], e, t);
    printf("%-28s %s rel err %.2e\n", c->name, names[i], e);
    tt_tensor_release(ref[i]);
    tt_tensor_release(gpu[i]);
  }
}

Test(cudnn_sdpa, causal_gqa_bf16_dh128_odd_t) {
  sdpa_case c = {"causal gqa bf16 dh128 T77", TT_BF16, 2, 77, 77, 8, 2, 128, 1, 0, NULL, NULL,
                 1};
  check(&c);
}

Test(cudnn_sdpa, noncausal_f16_dh64_tq_ne_tk) {
  sdpa_case c = {"non-causal f16 dh64 33x95", TT_F16, 2, 33, 95, 4, 4, 64, 0, 0, NULL, NULL, 1};
  check(&c);
}

Test(cudnn_sdpa, causal_f16_dh64_tq_ne_tk) {
  sdpa_case c = {"causal f16 dh64 48x80", TT_F16, 1, 48, 80, 4, 1, 64, 1, 0, NULL, NULL, 1};
  check(&c);
}

Test(cudnn_sdpa, strided_fused_qkv_bf16) {
  sdpa_case c = {"strided qkv bf16 dh128 T61", TT_BF16, 2, 61, 61, 4, 2, 128, 1, 1, NULL,
                 NULL, 1};
  check(&c);
}

Test(cudnn_sdpa, strided_fused_qkv_f16_dh64) {
  sdpa_case c = {"strided qkv f16 dh64 T129", TT_F16, 1, 129, 129, 8, 8, 64, 1, 1, NULL, NULL,
                 1};
  check(&c);
}

/* cp = 2, T = 256, chunks of 64: rank r holds chunks r and 3 - r; the keys are gathered
** in rank order (rank 0's chunks 0 and 3, then rank 1's 1 and 2). */
static void cp_positions(int rank, int64_t *qp, int64_t *kp) {
  const int64_t L = 64;
  int chunks[2] = {rank, 3 - rank}, order[4] = {0, 3, 1, 2};
  for (int c = 0; c < 2; c++)
    for (int64_t i = 0; i < L; i++) qp[c * L + i] = chunks[c] * L + i;
  for (int c = 0; c < 4; c++)
    for (int64_t i = 0; i < L; i++) kp[c * L + i] = order[c] * L + i;
}

Test(cudnn_sdpa, context_parallel_rank0_bf16) {
  int64_t qp[128], kp[256];
  cp_positions(0, qp, kp);
  sdpa_case c = {"cp rank 0 bf16 gqa", TT_BF16, 2, 128, 256, 8, 2, 128, 1, 0, qp, kp, 1};
  check(&c);
}

Test(cudnn_sdpa, context_parallel_rank1_f16) {
  int64_t qp[128], kp[256];
  cp_positions(1, qp, kp);
  sdpa_case c = {"cp rank 1 f16", TT_F16, 1, 128, 256, 4, 4, 64, 1, 0, qp, kp, 1};
  check(&c);
}

Test(cudnn_sdpa, head_dim_40_falls_back) {
  sdpa_case c = {"dh40 bf16 (fallback)", TT_BF16, 1, 37, 37, 4, 2, 40, 1, 0, NULL, NULL, 0};
  check(&c);
}

/* TETRA_CUDNN=0 (read once per process; Criterion runs each test in its own): the
** fallback answers, right, with exactly one line on stderr saying why. */
Test(cudnn_sdpa, disabled_falls_back_with_one_line) {
  setenv("TETRA_CUDNN", "0", 1);
  char log[] = "/tmp/tt_cudnn_sdpa_stderr_XXXXXX";
  int fd = mkstemp(log);
  cr_assert(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  sdpa_case c = {"disabled bf16 (fallback)", TT_BF16, 1, 45, 45, 4, 2, 64, 1, 0, NULL, NULL, 0};
  check(&c);
  check(&c);
  fflush(stderr);
  dup2(saved, 2);
  FILE *f = fopen(log, "r");
  char line[512];
  int lines = 0, named = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    named += strstr(line, "TETRA_CUDNN=0") != NULL;
  }
  fclose(f);
  unlink(log);
  cr_assert_eq(lines, 1, "%d lines on stderr", lines);
  cr_assert_eq(named, 1);
}
