/*
** test_emu_kernels.cc — the CUDA kernel families of kernels/cuda/, run on the CPU by the
** emulator (tests/emu/cuda_emu.h), against their CPU twins (kernels/cpu/), entry by entry,
** on odd sizes. Each "device" buffer starts as all-ones bits (NaN), so an element a kernel
** forgets to write fails the comparison; a write outside a buffer fails the launch (the
** guards); a barrier some thread never reaches fails it too. The grid is sized for two
** multiprocessors, so grid-stride loops go round.
**
** What this cannot show (tests/emu/README.md): races between threads or blocks, memory
** ordering, the GPU's fast-math rounding, launch limits beyond the configuration checks,
** and anything cuBLASLt or cuDNN does. tests/cuda/ runs the same comparisons on a GPU.
*/
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "tt_emu.h"
extern "C" {
#include "activation.h"
#include "attention.h"
#include "elementwise.h"
#include "embedding.h"
#include "fused.h"
#include "kernel.h"
#include "loss.h"
#include "norm.h"
#include "optim.h"
#include "reduce.h"
#include "rope.h"
#include "vocab_parallel.h"
const char *tt_last_error(void);
}

namespace {

std::mt19937_64 rng(20261207);
/* each launch runs when issued: the tests read the buffers straight after it */
const bool legacy_now = (tt_emu::legacy_at_once = true);

std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

/* A host vector and its "device" copy. */
template <typename T>
struct Buf {
  std::vector<T> host;
  T *dev = nullptr;
  explicit Buf(std::vector<T> v) : host(std::move(v)) {
    dev = (T *)tt_emu::alloc(host.size() * sizeof(T) + 1);
    if (!host.empty()) memcpy(dev, host.data(), host.size() * sizeof(T));
  }
  /* An output: the host side zeroed, the device side left as all-ones bits. */
  explicit Buf(size_t n) : host(n, T()) { dev = (T *)tt_emu::alloc(n * sizeof(T) + 1); }
  ~Buf() { tt_emu::release(dev); }
  Buf(const Buf &) = delete;
  std::vector<T> back() const {
    std::vector<T> v(host.size());
    if (!v.empty()) memcpy(v.data(), dev, v.size() * sizeof(T));
    return v;
  }
};

float widen(float x) { return x; }
float widen(uint16_t b) { return tt_elem_bf16_to_float(b); }

/* Relative L2 error of the device's values against the CPU's; NaN when either holds a
** NaN where the other does not (an unwritten element). */
template <typename T>
double rel_err(const Buf<T> &b) {
  const std::vector<T> d = b.back();
  double num = 0, den = 0;
  for (size_t i = 0; i < d.size(); i++) {
    const double x = widen(d[i]), y = widen(b.host[i]);
    if (isnan(x) != isnan(y)) return NAN;
    if (isnan(x)) continue;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

template <typename T>
void expect_close(const Buf<T> &b, double tol, const char *what) {
  const double e = rel_err(b);
  cr_expect(e <= tol, "%s: relative error %g > %g (NaN: an element left unwritten)", what,
            e, tol);
}

/* The same bits (the entries whose comment promises the CPU twin's bits). */
template <typename T>
void expect_same(const Buf<T> &b, const char *what) {
  const std::vector<T> d = b.back();
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < d.size(); i++)
    if (memcmp(&d[i], &b.host[i], sizeof(T)) != 0 && diff++ == 0) first = i;
  cr_expect(diff == 0, "%s: %zu of %zu elements differ from the CPU's bits (first at %zu)",
            what, diff, d.size(), first);
}

void expect_ok(int rc_cpu, int rc_emu, const char *what) {
  cr_assert_eq(rc_cpu, 0, "%s on the CPU: %s", what, tt_last_error());
  cr_assert_eq(rc_emu, 0, "%s under the emulator: %s", what, tt_last_error());
  const std::string guards = tt_emu::check_guards();
  cr_assert(guards.empty(), "%s: %s", what, guards.c_str());
}

std::vector<uint16_t> to_bf16(const std::vector<float> &v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = tt_elem_float_to_bf16(v[i]);
  return r;
}

}  // namespace

/* The emulator itself: a planted out-of-bounds write, a divergent barrier and a bad
** configuration are each reported by the launch. */
namespace {
void write_past(float *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) p[i] = 1.0f;   /* one too many */
}
void half_barrier(float *p) {
  if (threadIdx.x < 16) __syncthreads();
  p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
void short_warp(float *p) { p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16); }
}  // namespace

Test(emu, catches_what_it_should) {
  float *p = (float *)tt_emu::alloc(64 * sizeof(float));
  /* p[64] is the page after the 256-byte buffer: the write faults at once */
  tt_emu::launcher(1, 96, [](auto... a) { write_past(a...); })(p, 64);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "a write past the end");
  /* p[60] is in the slack of a 240-byte buffer: the guards, checked after the launch */
  float *q = (float *)tt_emu::alloc(60 * sizeof(float));
  tt_emu::launcher(1, 96, [](auto... a) { write_past(a...); })(q, 60);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "a write into the slack");
  tt_emu::release(q);
  tt_emu::launcher(1, 32, [](auto... a) { half_barrier(a...); })(p);
  cr_expect_eq(cudaGetLastError(), cudaErrorLaunchFailure, "a barrier half the warp skips");
  tt_emu::launcher(dim3(1, 70000), 32, [](auto... a) { short_warp(a...); })(p);
  cr_expect_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "grid.y > 65535");
  tt_emu::launcher(1, 20, [](auto... a) { short_warp(a...); })(p);
  cr_expect_eq(cudaGetLastError(), cudaSuccess);
  /* lane l reads lane l ^ 16: lanes 0-3 and 16-19 read each other; lanes 4-15 read lanes
  ** 20-31, which a block of 20 threads does not have */
  cr_expect(p[0] == 1.0f && p[19] == 1.0f && isnan(p[4]) && isnan(p[15]),
            "a shuffle from a missing lane gives NaN: %g %g %g %g", p[0], p[19], p[4], p[15]);
  tt_emu::release(p);
}

/* -- embedding --------------------------------------------------------------------- */

Test(emu, embedding) {
  const int64_t V = 53, D = 70, n = 301;
  Buf<float> w(randn(V * D));
  std::vector<int64_t> ids64(n);
  for (int64_t i = 0; i < n; i++) ids64[i] = (int64_t)(rng() % V);
  ids64[7] = ids64[8] = ids64[9] = 3;   /* a run of one id */
  std::vector<int32_t> ids32(ids64.begin(), ids64.end());
  Buf<int64_t> i64(ids64);
  Buf<int32_t> i32(ids32);
  for (int bf = 0; bf < 2; bf++) {
    const int dt = bf ? TT_ELEM_BF16 : TT_ELEM_F32;
    Buf<float> out32(n * D);
    Buf<uint16_t> out16(n * D);
    void *oc = bf ? (void *)out16.host.data() : (void *)out32.host.data();
    void *og = bf ? (void *)out16.dev : (void *)out32.dev;
    expect_ok(tt_embedding_cpu.forward(oc, w.host.data(), i32.host.data(), 0, n, V, D, dt, 0, 0),
              tt_embedding_cuda.forward(og, w.dev, i32.dev, 0, n, V, D, dt, 0, 0),
              "embedding forward");
    if (bf) expect_same(out16, "embedding forward bf16");
    else expect_same(out32, "embedding forward f32");
  }
  /* A band of the table (a vocabulary-parallel rank): other ids give zero rows. */
  {
    const int64_t start = 20, Vb = 20;
    Buf<float> wb(randn(Vb * D)), out(n * D);
    expect_ok(tt_embedding_cpu.forward(out.host.data(), wb.host.data(), i64.host.data(), 1, n,
                                       Vb, D, TT_ELEM_F32, start, 1),
              tt_embedding_cuda.forward(out.dev, wb.dev, i64.dev, 1, n, Vb, D, TT_ELEM_F32,
                                        start, 1),
              "embedding forward, a band");
    expect_same(out, "embedding forward, a band");
  }
  /* Backward: the same bits (sorted by id, each id's rows summed in token order), with an
  ** id outside the table that must add nothing and write nowhere. */
  std::vector<int64_t> bad = ids64;
  bad[11] = V + 5;
  bad[12] = -1;
  Buf<int64_t> ib(bad);
  for (int bf = 0; bf < 2; bf++) {
    std::vector<float> g = randn(n * D);
    Buf<float> g32(g);
    Buf<uint16_t> g16(to_bf16(g));
    Buf<float> dw(randn(V * D, 0.1f));   /* accumulated into */
    const int dt = bf ? TT_ELEM_BF16 : TT_ELEM_F32;
    const void *gc = bf ? (const void *)g16.host.data() : (const void *)g32.host.data();
    const void *gg = bf ? (const void *)g16.dev : (const void *)g32.dev;
    expect_ok(tt_embedding_cpu.backward(dw.host.data(), gc, ib.host.data(), 1, n, V, D, dt, 0),
              tt_embedding_cuda.backward(dw.dev, gg, ib.dev, 1, n, V, D, dt, 0),
              "embedding backward");
    expect_same(dw, bf ? "embedding backward bf16" : "embedding backward f32");
  }
  /* row_mask: rows of a gradient that hold anything */
  {
    std::vector<float> g(V * D, 0.0f);
    for (int64_t v : {0, 5, 31, 32, 52}) g[v * D + (v * 7) % D] = 1.0f;
    g[40 * D + 3] = NAN;
    Buf<float> gb(g);
    Buf<uint32_t> mask((V + 31) / 32);
    expect_ok(tt_embedding_cpu.row_mask(mask.host.data(), gb.host.data(), V, D),
              tt_embedding_cuda.row_mask(mask.dev, gb.dev, V, D), "embedding row_mask");
    expect_same(mask, "embedding row_mask");
  }
}

/* -- cross-entropy and its vocabulary-parallel form -------------------------------- */

Test(emu, cross_entropy) {
  const int64_t N = 37, V = 1031, ignore = -100;
  std::vector<float> x = randn(N * V, 3.0f);
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; i++) t[i] = (int64_t)(rng() % V);
  t[4] = ignore;
  Buf<int64_t> tg(t);
  for (int bf = 0; bf < 2; bf++) {
    const int dt = bf ? TT_ELEM_BF16 : TT_ELEM_F32;
    Buf<float> x32(x);
    Buf<uint16_t> x16(to_bf16(x));
    const void *xc = bf ? (const void *)x16.host.data() : (const void *)x32.host.data();
    const void *xg = bf ? (const void *)x16.dev : (const void *)x32.dev;
    Buf<float> loss(1), stats(2 * N);
    expect_ok(tt_loss_cpu.ce_forward(loss.host.data(), stats.host.data(), xc, tg.host.data(), 1,
                                     ignore, N, V, dt),
              tt_loss_cuda.ce_forward(loss.dev, stats.dev, xg, tg.dev, 1, ignore, N, V, dt),
              "ce forward");
    expect_close(loss, 1e-6, "ce loss");
    expect_close(stats, 1e-6, "ce row stats");
    Buf<float> dloss(std::vector<float>{0.7f});
    Buf<float> d32(N * V);
    Buf<uint16_t> d16(N * V);
    void *dc = bf ? (void *)d16.host.data() : (void *)d32.host.data();
    void *dg = bf ? (void *)d16.dev : (void *)d32.dev;
    /* the device's stats, so that the backward compares alone */
    expect_ok(tt_loss_cpu.ce_backward(dc, dloss.host.data(), xc, stats.host.data(),
                                      tg.host.data(), 1, ignore, N, V, dt),
              tt_loss_cuda.ce_backward(dg, dloss.dev, xg, stats.dev, tg.dev, 1, ignore, N, V,
                                       dt),
              "ce backward");
    if (bf) expect_close(d16, 1e-2, "ce backward bf16");
    else expect_close(d32, 1e-5, "ce backward f32");
  }
}

Test(emu, vocab_parallel) {
  /* Two ranks' halves of a vocabulary, each through the four entries; the group's
  ** reductions (max, sums) done here between them, as the all-reduces would. */
  const int64_t N = 29, Vl = 517, ignore = -100;
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; i++) t[i] = (int64_t)(rng() % (2 * Vl));
  t[3] = ignore;
  Buf<int64_t> tg(t);
  for (int bf = 0; bf < 2; bf++) {
    const int dt = bf ? TT_ELEM_BF16 : TT_ELEM_F32;
    std::vector<float> xs[2] = {randn(N * Vl, 2.0f), randn(N * Vl, 2.0f)};
    std::vector<std::unique_ptr<Buf<float>>> x32;
    std::vector<std::unique_ptr<Buf<uint16_t>>> x16;
    std::vector<std::unique_ptr<Buf<float>>> mx;
    for (int r = 0; r < 2; r++) {
      x32.emplace_back(new Buf<float>(xs[r]));
      x16.emplace_back(new Buf<uint16_t>(to_bf16(xs[r])));
      mx.emplace_back(new Buf<float>(N));
    }
    auto xc = [&](int r) { return bf ? (const void *)x16[r]->host.data() : (const void *)x32[r]->host.data(); };
    auto xg = [&](int r) { return bf ? (const void *)x16[r]->dev : (const void *)x32[r]->dev; };
    for (int r = 0; r < 2; r++) {
      expect_ok(tt_vocab_parallel_cpu.row_max(mx[r]->host.data(), xc(r), tg.host.data(), 1,
                                              ignore, N, Vl, dt),
                tt_vocab_parallel_cuda.row_max(mx[r]->dev, xg(r), tg.dev, 1, ignore, N, Vl, dt),
                "vocab-parallel row_max");
      expect_same(*mx[r], "vocab-parallel row_max");
    }
    std::vector<float> gmax(N);
    for (int64_t i = 0; i < N; i++) gmax[i] = fmaxf(mx[0]->host[i], mx[1]->host[i]);
    Buf<float> gm(gmax);
    std::vector<float> psum(3 * N, 0.0f);
    std::vector<float> psum_dev(3 * N, 0.0f);
    for (int r = 0; r < 2; r++) {
      Buf<float> part(3 * N);
      expect_ok(tt_vocab_parallel_cpu.row_partials(part.host.data(), xc(r), gm.host.data(),
                                                   tg.host.data(), 1, ignore, r * Vl, N, Vl, dt),
                tt_vocab_parallel_cuda.row_partials(part.dev, xg(r), gm.dev, tg.dev, 1, ignore,
                                                    r * Vl, N, Vl, dt),
                "vocab-parallel row_partials");
      expect_close(part, 1e-6, "vocab-parallel row_partials");
      const std::vector<float> pd = part.back();
      for (int64_t i = 0; i < 3 * N; i++) psum[i] += part.host[i], psum_dev[i] += pd[i];
    }
    Buf<float> ps(psum), psd(psum_dev);
    Buf<float> loss(1), lse(N);
    expect_ok(tt_vocab_parallel_cpu.finish(loss.host.data(), lse.host.data(), gm.host.data(),
                                           ps.host.data(), tg.host.data(), 1, ignore, 0, N,
                                           2 * Vl),
              tt_vocab_parallel_cuda.finish(loss.dev, lse.dev, gm.dev, psd.dev, tg.dev, 1,
                                            ignore, 0, N, 2 * Vl),
              "vocab-parallel finish");
    expect_close(loss, 1e-6, "vocab-parallel loss");
    expect_close(lse, 1e-6, "vocab-parallel lse");
    Buf<float> dloss(std::vector<float>{1.3f});
    for (int r = 0; r < 2; r++) {
      Buf<float> d32(N * Vl);
      Buf<uint16_t> d16(N * Vl);
      void *dc = bf ? (void *)d16.host.data() : (void *)d32.host.data();
      void *dg = bf ? (void *)d16.dev : (void *)d32.dev;
      expect_ok(tt_vocab_parallel_cpu.backward(dc, dloss.host.data(), xc(r), lse.host.data(),
                                               tg.host.data(), 1, ignore, r * Vl, N, Vl, dt),
                tt_vocab_parallel_cuda.backward(dg, dloss.dev, xg(r), lse.dev, tg.dev, 1,
                                                ignore, r * Vl, N, Vl, dt),
                "vocab-parallel backward");
      if (bf) expect_close(d16, 1e-2, "vocab-parallel backward bf16");
      else expect_close(d32, 1e-5, "vocab-parallel backward f32");
    }
  }
}

/* -- norms -------------------------------------------------------------------------- */

Test(emu, norm) {
  const int64_t N = 19, D = 333;
  Buf<float> x(randn(N * D)), w(randn(D)), b(randn(D)), dy(randn(N * D));
  {
    Buf<float> y(N * D), rstd(N);
    expect_ok(tt_norm_cpu.rmsnorm_forward(y.host.data(), rstd.host.data(), x.host.data(),
                                          w.host.data(), N, D, 1e-5f),
              tt_norm_cuda.rmsnorm_forward(y.dev, rstd.dev, x.dev, w.dev, N, D, 1e-5f),
              "rmsnorm forward");
    expect_close(y, 1e-6, "rmsnorm y");
    expect_close(rstd, 1e-6, "rmsnorm rstd");
    Buf<float> dx(N * D), dw(D);
    expect_ok(tt_norm_cpu.rmsnorm_backward(dx.host.data(), dw.host.data(), dy.host.data(),
                                           x.host.data(), w.host.data(), rstd.host.data(), N, D),
              tt_norm_cuda.rmsnorm_backward(dx.dev, dw.dev, dy.dev, x.dev, w.dev, rstd.dev, N, D),
              "rmsnorm backward");
    expect_close(dx, 1e-5, "rmsnorm dx");
    expect_close(dw, 1e-5, "rmsnorm dw");
  }
  {
    Buf<float> y(N * D), mean(N), rstd(N);
    expect_ok(tt_norm_cpu.layernorm_forward(y.host.data(), mean.host.data(), rstd.host.data(),
                                            x.host.data(), w.host.data(), b.host.data(), N, D,
                                            1e-5f),
              tt_norm_cuda.layernorm_forward(y.dev, mean.dev, rstd.dev, x.dev, w.dev, b.dev, N,
                                             D, 1e-5f),
              "layernorm forward");
    expect_close(y, 1e-5, "layernorm y");
    expect_close(mean, 1e-5, "layernorm mean");
    expect_close(rstd, 1e-5, "layernorm rstd");
    Buf<float> dx(N * D), dw(D), db(D);
    expect_ok(tt_norm_cpu.layernorm_backward(dx.host.data(), dw.host.data(), db.host.data(),
                                             dy.host.data(), x.host.data(), w.host.data(),
                                             mean.host.data(), rstd.host.data(), N, D),
              tt_norm_cuda.layernorm_backward(dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev,
                                              mean.dev, rstd.dev, N, D),
              "layernorm backward");
    expect_close(dx, 1e-5, "layernorm dx");
    expect_close(dw, 1e-5, "layernorm dw");
    expect_close(db, 1e-5, "layernorm db");
  }
}

/* -- reductions --------------------------------------------------------------------- */

Test(emu, reduce) {
  const int64_t shapes[][3] = {{3, 129, 1}, {2, 70, 33}, {1, 2000, 1}, {5, 1, 7}, {1, 9, 300}};
  for (auto &s : shapes) {
    const int64_t o = s[0], r = s[1], in = s[2];
    char what[64];
    snprintf(what, sizeof what, "(%ld, %ld, %ld)", (long)o, (long)r, (long)in);
    Buf<float> x(randn(o * r * in)), g(randn(o * in)), gfull(randn(o * r * in));
    Buf<float> sum(o * in);
    expect_ok(tt_reduce_cpu.sum(sum.host.data(), x.host.data(), o, r, in, 0.5f),
              tt_reduce_cuda.sum(sum.dev, x.dev, o, r, in, 0.5f), "sum");
    expect_close(sum, 1e-5, what);
    Buf<float> gs(o * r * in);
    expect_ok(tt_reduce_cpu.sum_backward(gs.host.data(), g.host.data(), o, r, in, 0.5f),
              tt_reduce_cuda.sum_backward(gs.dev, g.dev, o, r, in, 0.5f), "sum backward");
    expect_same(gs, what);
    Buf<float> mx(o * in);
    Buf<int64_t> idx(o * in);
    expect_ok(tt_reduce_cpu.max(mx.host.data(), idx.host.data(), x.host.data(), o, r, in),
              tt_reduce_cuda.max(mx.dev, idx.dev, x.dev, o, r, in), "max");
    expect_same(mx, what);
    expect_same(idx, what);
    Buf<float> gm(o * r * in);
    expect_ok(tt_reduce_cpu.max_backward(gm.host.data(), g.host.data(), idx.host.data(), o, r, in),
              tt_reduce_cuda.max_backward(gm.dev, g.dev, idx.dev, o, r, in), "max backward");
    expect_same(gm, what);
    Buf<float> y(o * r * in);
    expect_ok(tt_reduce_cpu.softmax(y.host.data(), x.host.data(), o, r, in),
              tt_reduce_cuda.softmax(y.dev, x.dev, o, r, in), "softmax");
    expect_close(y, 1e-5, what);
    Buf<float> gx(o * r * in);
    expect_ok(tt_reduce_cpu.softmax_backward(gx.host.data(), gfull.host.data(), y.host.data(), o,
                                             r, in),
              tt_reduce_cuda.softmax_backward(gx.dev, gfull.dev, y.dev, o, r, in),
              "softmax backward");
    expect_close(gx, 1e-5, what);
  }
}

/* -- activations, elementwise, rope ----------------------------------------------- */

Test(emu, activation) {
  const int64_t n = 5003;
  Buf<float> x(randn(n, 3.0f)), u(randn(n)), dy(randn(n));
  Buf<float> y1(n), y2(n), y3(n), d1(n), d2(n), d3(n), d4(n);
  expect_ok(tt_activation_cpu.silu_forward(y1.host.data(), x.host.data(), n),
            tt_activation_cuda.silu_forward(y1.dev, x.dev, n), "silu");
  expect_close(y1, 1e-6, "silu");
  expect_ok(tt_activation_cpu.silu_backward(d1.host.data(), dy.host.data(), x.host.data(), n),
            tt_activation_cuda.silu_backward(d1.dev, dy.dev, x.dev, n), "silu backward");
  expect_close(d1, 1e-6, "silu backward");
  expect_ok(tt_activation_cpu.gelu_forward(y2.host.data(), x.host.data(), n),
            tt_activation_cuda.gelu_forward(y2.dev, x.dev, n), "gelu");
  expect_close(y2, 1e-6, "gelu");
  expect_ok(tt_activation_cpu.gelu_backward(d2.host.data(), dy.host.data(), x.host.data(), n),
            tt_activation_cuda.gelu_backward(d2.dev, dy.dev, x.dev, n), "gelu backward");
  expect_close(d2, 1e-6, "gelu backward");
  expect_ok(tt_activation_cpu.swiglu_forward(y3.host.data(), x.host.data(), u.host.data(), n),
            tt_activation_cuda.swiglu_forward(y3.dev, x.dev, u.dev, n), "swiglu");
  expect_close(y3, 1e-6, "swiglu");
  expect_ok(tt_activation_cpu.swiglu_backward(d3.host.data(), d4.host.data(), dy.host.data(),
                                              x.host.data(), u.host.data(), n),
            tt_activation_cuda.swiglu_backward(d3.dev, d4.dev, dy.dev, x.dev, u.dev, n),
            "swiglu backward");
  expect_close(d3, 1e-6, "swiglu dgate");
  expect_close(d4, 1e-6, "swiglu dup");
}

Test(emu, elementwise) {
  /* out (4, 5, 67) = a (4, 5, 67) op b (5, 1) broadcast */
  tt_bcast bc = {};
  bc.ndim = 3;
  const int64_t shape[3] = {4, 5, 67}, sa[3] = {5 * 67, 67, 1}, sb[3] = {0, 1, 0};
  for (int i = 0; i < 3; i++) bc.shape[i] = shape[i], bc.stride_a[i] = sa[i], bc.stride_b[i] = sb[i];
  const int64_t n = 4 * 5 * 67;
  Buf<float> a(randn(n)), b(randn(5)), g(randn(n));
  for (auto &v : b.host) v = v > 0 ? v + 0.5f : v - 0.5f;   /* away from 0 for div */
  memcpy(b.dev, b.host.data(), 5 * sizeof(float));
  for (int op = 0; op < 4; op++) {
    char what[32];
    snprintf(what, sizeof what, "binary op %d", op);
    Buf<float> out(n);
    expect_ok(tt_elementwise_cpu.binary(op, out.host.data(), a.host.data(), b.host.data(), &bc),
              tt_elementwise_cuda.binary(op, out.dev, a.dev, b.dev, &bc), what);
    expect_same(out, what);
  }
  Buf<float> out(n);
  expect_ok(tt_elementwise_cpu.affine(out.host.data(), a.host.data(), n, 1.5f, -0.25f),
            tt_elementwise_cuda.affine(out.dev, a.dev, n, 1.5f, -0.25f), "affine");
  expect_close(out, 1e-6, "affine");
  Buf<float> acc(randn(n));
  expect_ok(tt_elementwise_cpu.axpy(acc.host.data(), 0.75f, b.host.data(), &bc),
            tt_elementwise_cuda.axpy(acc.dev, 0.75f, b.dev, &bc), "axpy");
  expect_close(acc, 1e-6, "axpy");
  /* the gradients of mul (2) and div (3): full-shape ga and gb */
  for (int op = 2; op < 4; op++) {
    char what[32];
    snprintf(what, sizeof what, "binary_backward op %d", op);
    Buf<float> ga(n), gb(n);
    expect_ok(tt_elementwise_cpu.binary_backward(op, ga.host.data(), gb.host.data(),
                                                 g.host.data(), a.host.data(), b.host.data(),
                                                 &bc),
              tt_elementwise_cuda.binary_backward(op, ga.dev, gb.dev, g.dev, a.dev, b.dev, &bc),
              what);
    expect_close(ga, 1e-6, what);
    expect_close(gb, 1e-6, what);
  }
  /* a (bf16) += alpha * b (bf16 or f32), rounded once */
  for (int b32 = 0; b32 < 2; b32++) {
    Buf<uint16_t> h(to_bf16(randn(n)));
    Buf<uint16_t> bh(to_bf16(g.host));
    const void *bc_ = b32 ? (const void *)g.host.data() : (const void *)bh.host.data();
    const void *bg_ = b32 ? (const void *)g.dev : (const void *)bh.dev;
    const int bdt = b32 ? TT_ELEM_F32 : TT_ELEM_BF16;
    expect_ok(tt_elementwise_cpu.axpy_half(h.host.data(), TT_ELEM_BF16, -0.5f, bc_, bdt, n),
              tt_elementwise_cuda.axpy_half(h.dev, TT_ELEM_BF16, -0.5f, bg_, bdt, n),
              "axpy_half");
    expect_same(h, "axpy_half");
  }
}

Test(emu, rope) {
  const int64_t B = 2, T = 13, H = 3, Dh = 64;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(5 + 2 * t);
  Buf<int32_t> p(pos);
  Buf<float> table(2 * T * Dh / 2);
  expect_ok(tt_rope_cpu.table(table.host.data(), p.host.data(), 0, T, Dh, 10000.0),
            tt_rope_cuda.table(table.dev, p.dev, 0, T, Dh, 10000.0), "rope table");
  expect_close(table, 1e-6, "rope table");
  Buf<float> x(randn(B * T * H * Dh));
  for (int inter = 0; inter < 2; inter++) {
    Buf<float> y(B * T * H * Dh), dx(B * T * H * Dh);
    expect_ok(tt_rope_cpu.forward(y.host.data(), x.host.data(), table.host.data(), B, T, H, Dh,
                                  inter, TT_ELEM_F32),
              tt_rope_cuda.forward(y.dev, x.dev, table.dev, B, T, H, Dh, inter, TT_ELEM_F32),
              "rope forward");
    expect_close(y, 1e-6, "rope forward");
    expect_ok(tt_rope_cpu.backward(dx.host.data(), y.host.data(), table.host.data(), B, T, H,
                                   Dh, inter, TT_ELEM_F32),
              tt_rope_cuda.backward(dx.dev, y.dev, table.dev, B, T, H, Dh, inter, TT_ELEM_F32),
              "rope backward");
    expect_close(dx, 1e-6, "rope backward");
  }
}

/* -- fused residual-add + norm, GELU, SwiGLU (the 16-byte vector paths and the scalar
** ones: a row width of a multiple of 8 from an aligned start, then one that is not) --- */

Test(emu, fused) {
  const int64_t N = 11;
  for (int64_t D : {64, 77}) {
    for (int bf = 0; bf < 2; bf++) {
      const int dt = bf ? TT_ELEM_BF16 : TT_ELEM_F32;
      char what[80];
      for (int rms = 0; rms < 2; rms++) {
        snprintf(what, sizeof what, "add_norm D=%ld %s %s", (long)D, bf ? "bf16" : "f32",
                 rms ? "rms" : "layer");
        std::vector<float> xf = randn(N * D), rf = randn(N * D), dyf = randn(N * D);
        Buf<float> w(randn(D)), b(randn(D));
        Buf<float> x32(xf), r32(rf), dy32(dyf), h32(N * D), y32(N * D), dh32(N * D);
        Buf<uint16_t> x16(to_bf16(xf)), r16(to_bf16(rf)), dy16(to_bf16(dyf)), h16(N * D),
            y16(N * D), dh16(N * D);
        Buf<float> mean(N), rstd(N);
        auto C = [&](Buf<float> &f, Buf<uint16_t> &s) {
          return bf ? (void *)s.host.data() : (void *)f.host.data();
        };
        auto G = [&](Buf<float> &f, Buf<uint16_t> &s) { return bf ? (void *)s.dev : (void *)f.dev; };
        expect_ok(tt_fused_cpu.add_norm_forward(C(h32, h16), C(y32, y16),
                                                rms ? nullptr : mean.host.data(),
                                                rstd.host.data(), C(x32, x16), C(r32, r16),
                                                w.host.data(), rms ? nullptr : b.host.data(), N,
                                                D, 1e-5f, dt, dt),
                  tt_fused_cuda.add_norm_forward(G(h32, h16), G(y32, y16),
                                                 rms ? nullptr : mean.dev, rstd.dev,
                                                 G(x32, x16), G(r32, r16), w.dev,
                                                 rms ? nullptr : b.dev, N, D, 1e-5f, dt, dt),
                  what);
        if (bf) {
          expect_same(h16, what);
          expect_close(y16, 1e-2, what);
        } else {
          expect_same(h32, what);
          expect_close(y32, 1e-5, what);
        }
        expect_close(rstd, 1e-5, what);
        if (!rms) expect_close(mean, 1e-5, what);
        const int64_t parts = 2 * ((N + TT_FUSED_ROWS_PER_PART - 1) / TT_FUSED_ROWS_PER_PART) * D;
        Buf<float> dw(D), db(D), pc(parts), pg(parts);
        expect_ok(tt_fused_cpu.norm_backward(C(dh32, dh16), dw.host.data(),
                                             rms ? nullptr : db.host.data(), pc.host.data(),
                                             C(dy32, dy16), nullptr, C(h32, h16),
                                             w.host.data(), rms ? nullptr : mean.host.data(),
                                             rstd.host.data(), N, D, dt, dt),
                  tt_fused_cuda.norm_backward(G(dh32, dh16), dw.dev, rms ? nullptr : db.dev,
                                              pg.dev, G(dy32, dy16), nullptr, G(h32, h16),
                                              w.dev, rms ? nullptr : mean.dev, rstd.dev, N, D,
                                              dt, dt),
                  what);
        if (bf) expect_close(dh16, 1e-2, what);
        else expect_close(dh32, 1e-5, what);
        expect_close(dw, bf ? 1e-2 : 1e-5, what);
        if (!rms) expect_close(db, bf ? 1e-2 : 1e-5, what);
      }
      /* GELU and SwiGLU, from an element past an aligned start (the scalar path) and from
      ** the start */
      for (int64_t off : {0, 1}) {
        const int64_t n = N * D - off;
        snprintf(what, sizeof what, "gelu/swiglu n=%ld %s", (long)n, bf ? "bf16" : "f32");
        std::vector<float> xf = randn(N * D, 2.0f), uf = randn(N * D), gf = randn(N * D);
        Buf<float> x32(xf), u32(uf), g32(gf), y32(N * D), a32(N * D), b32(N * D);
        Buf<uint16_t> x16(to_bf16(xf)), u16(to_bf16(uf)), g16(to_bf16(gf)), y16(N * D),
            a16(N * D), b16(N * D);
        const size_t es = bf ? 2 : 4;
        auto C = [&](Buf<float> &f, Buf<uint16_t> &s) {
          return (void *)((char *)(bf ? (void *)s.host.data() : (void *)f.host.data()) + off * es);
        };
        auto G = [&](Buf<float> &f, Buf<uint16_t> &s) {
          return (void *)((char *)(bf ? (void *)s.dev : (void *)f.dev) + off * es);
        };
        /* the skipped element: the same on both sides */
        for (Buf<float> *o : {&y32, &a32, &b32}) o->dev[0] = o->host[0] = 0.0f;
        for (Buf<uint16_t> *o : {&y16, &a16, &b16}) o->dev[0] = o->host[0] = 0;
        expect_ok(tt_fused_cpu.gelu_forward(C(y32, y16), C(x32, x16), n, dt),
                  tt_fused_cuda.gelu_forward(G(y32, y16), G(x32, x16), n, dt), what);
        expect_ok(tt_fused_cpu.gelu_backward(C(a32, a16), C(g32, g16), C(x32, x16), n, dt),
                  tt_fused_cuda.gelu_backward(G(a32, a16), G(g32, g16), G(x32, x16), n, dt),
                  what);
        if (bf) {
          expect_close(y16, 1e-2, what);
          expect_close(a16, 1e-2, what);
        } else {
          expect_close(y32, 1e-6, what);
          expect_close(a32, 1e-6, what);
        }
        expect_ok(tt_fused_cpu.swiglu_forward(C(y32, y16), C(x32, x16), C(u32, u16), n, dt),
                  tt_fused_cuda.swiglu_forward(G(y32, y16), G(x32, x16), G(u32, u16), n, dt),
                  what);
        expect_ok(tt_fused_cpu.swiglu_backward(C(a32, a16), C(b32, b16), C(g32, g16),
                                               C(x32, x16), C(u32, u16), n, dt),
                  tt_fused_cuda.swiglu_backward(G(a32, a16), G(b32, b16), G(g32, g16),
                                                G(x32, x16), G(u32, u16), n, dt),
                  what);
        if (bf) {
          expect_close(y16, 1e-2, what);
          expect_close(a16, 1e-2, what);
          expect_close(b16, 1e-2, what);
        } else {
          expect_close(y32, 1e-6, what);
          expect_close(a32, 1e-6, what);
          expect_close(b32, 1e-6, what);
        }
      }
    }
  }
}

/* -- optimizers ---------------------------------------------------------------------- */

Test(emu, optim) {
  const int64_t n = 70001;
  {
    Buf<float> p(randn(n)), g(randn(n)), m(randn(n, 0.1f)), v(randn(n, 0.1f));
    for (auto &x : v.host) x = fabsf(x);
    memcpy(v.dev, v.host.data(), n * sizeof(float));
    expect_ok(tt_optim_cpu.adamw(p.host.data(), g.host.data(), m.host.data(), v.host.data(), n,
                                 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f),
              tt_optim_cuda.adamw(p.dev, g.dev, m.dev, v.dev, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                  0.1f, 0.1f, 0.05f),
              "adamw");
    expect_close(p, 1e-6, "adamw p");
    expect_close(m, 1e-6, "adamw m");
    expect_close(v, 1e-6, "adamw v");
    Buf<float> buf(randn(n));
    expect_ok(tt_optim_cpu.sgd(p.host.data(), g.host.data(), buf.host.data(), n, 0.01f, 0.9f,
                               0.01f),
              tt_optim_cuda.sgd(p.dev, g.dev, buf.dev, n, 0.01f, 0.9f, 0.01f), "sgd");
    expect_close(p, 1e-6, "sgd p");
    expect_close(buf, 1e-6, "sgd buf");
    double sc = 0, sg = 0;
    expect_ok(tt_optim_cpu.sum_squares(g.host.data(), n, &sc),
              tt_optim_cuda.sum_squares(g.dev, n, &sg), "sum_squares");
    cr_expect(fabs(sc - sg) <= 1e-12 * sc, "sum_squares: %.17g against %.17g", sg, sc);
    expect_ok(tt_optim_cpu.scale(g.host.data(), n, 0.5f), tt_optim_cuda.scale(g.dev, n, 0.5f),
              "scale");
    expect_same(g, "scale");
    expect_ok(tt_optim_cpu.fill(m.host.data(), n, 2.5f), tt_optim_cuda.fill(m.dev, n, 2.5f),
              "fill");
    expect_same(m, "fill");
  }
  /* The multi-tensor forms: tensors of several chunks (65536 elements), one empty */
  {
    const int64_t ns[4] = {70000, 5, 0, 131073};
    std::vector<std::unique_ptr<Buf<float>>> P, G, M, V;
    std::vector<std::unique_ptr<Buf<uint16_t>>> H;
    for (int i = 0; i < 4; i++) {
      P.emplace_back(new Buf<float>(randn(ns[i])));
      G.emplace_back(new Buf<float>(randn(ns[i])));
      M.emplace_back(new Buf<float>(randn(ns[i], 0.1f)));
      std::vector<float> vv = randn(ns[i], 0.1f);
      for (auto &x : vv) x = fabsf(x);
      V.emplace_back(new Buf<float>(vv));
      H.emplace_back(new Buf<uint16_t>(ns[i]));
    }
    float *pc[4], *pg[4], *mc[4], *mg[4], *vc[4], *vg[4];
    const float *gc[4], *gg[4];
    uint16_t *hc[4], *hg[4];
    for (int i = 0; i < 4; i++) {
      pc[i] = P[i]->host.data(), pg[i] = P[i]->dev;
      gc[i] = G[i]->host.data(), gg[i] = G[i]->dev;
      mc[i] = M[i]->host.data(), mg[i] = M[i]->dev;
      vc[i] = V[i]->host.data(), vg[i] = V[i]->dev;
      hc[i] = H[i]->host.data(), hg[i] = H[i]->dev;
    }
    Buf<float> gscale(std::vector<float>{0.5f}), noinf(std::vector<float>{0.0f});
    tt_adamw_multi_args ac = {pc, gc, mc, vc, hc, ns, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                              0.1f, 0.05f, gscale.host.data(), noinf.host.data(), nullptr};
    tt_adamw_multi_args ag = {pg, gg, mg, vg, hg, ns, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                              0.1f, 0.05f, gscale.dev, noinf.dev, nullptr};
    expect_ok(tt_optim_cpu.adamw_multi(&ac), tt_optim_cuda.adamw_multi(&ag), "adamw_multi");
    for (int i = 0; i < 4; i++) {
      expect_close(*P[i], 1e-6, "adamw_multi p");
      expect_close(*M[i], 1e-6, "adamw_multi m");
      expect_close(*V[i], 1e-6, "adamw_multi v");
      expect_close(*H[i], 1e-2, "adamw_multi bf16 copy");
    }
    Buf<float> oc(2), og(2);
    expect_ok(tt_optim_cpu.sum_squares_multi(gc, ns, 4, oc.host.data()),
              tt_optim_cuda.sum_squares_multi(gg, ns, 4, og.dev), "sum_squares_multi");
    const std::vector<float> o = og.back();
    const double c = (double)oc.host[0] + oc.host[1], d = (double)o[0] + o[1];
    cr_expect(fabs(c - d) <= 1e-12 * c, "sum_squares_multi: %.17g against %.17g", d, c);
    Buf<float> norm(1), coef(1), inf(std::vector<float>{0.0f});
    expect_ok(tt_optim_cpu.clip_finish(oc.host.data(), 1, norm.host.data(), coef.host.data(),
                                       inf.host.data(), 1.0, 1.0),
              tt_optim_cuda.clip_finish(og.dev, 1, norm.dev, coef.dev, inf.dev, 1.0, 1.0),
              "clip_finish");
    expect_close(norm, 1e-7, "clip_finish norm");
    expect_close(coef, 1e-7, "clip_finish coef");
    expect_same(inf, "clip_finish found_inf");
  }
  /* the loss's verdict: finite and under the limit, a spike, not finite */
  for (float l : {2.0f, 9.0f, (float)NAN}) {
    Buf<float> loss(std::vector<float>{l}), limit(std::vector<float>{5.0f});
    Buf<float> inf(std::vector<float>{0.0f}), spike(std::vector<float>{0.0f});
    expect_ok(tt_optim_cpu.loss_flags(loss.host.data(), limit.host.data(), inf.host.data(),
                                      spike.host.data()),
              tt_optim_cuda.loss_flags(loss.dev, limit.dev, inf.dev, spike.dev), "loss_flags");
    expect_same(inf, "loss_flags found_inf");
    expect_same(spike, "loss_flags spike");
  }
}

/* -- attention (the f32 kernels; cuDNN's fused path is not emulated) ------------------- */

Test(emu, attention) {
  const int64_t B = 2, T = 37, Hq = 4, Hkv = 2, Dh = 16;
  for (int causal = 0; causal < 2; causal++) {
    tt_attention_args a = {};
    a.batch = B, a.tq = T, a.tk = T, a.hq = Hq, a.hkv = Hkv, a.dh = Dh;
    const int64_t sq[3] = {T * Hq * Dh, Hq * Dh, Dh}, sk[3] = {T * Hkv * Dh, Hkv * Dh, Dh};
    for (int i = 0; i < 3; i++) a.q_stride[i] = sq[i], a.k_stride[i] = sk[i], a.v_stride[i] = sk[i];
    a.causal = causal;
    a.scale = 0.25f;
    const char *what = causal ? "attention, causal" : "attention";
    Buf<float> q(randn(B * T * Hq * Dh)), k(randn(B * T * Hkv * Dh)), v(randn(B * T * Hkv * Dh));
    Buf<float> dout(randn(B * T * Hq * Dh));
    Buf<float> out(B * T * Hq * Dh), lse(B * Hq * T);
    Buf<float> wfc((size_t)tt_attention_cpu.forward_workspace(&a) + 1);
    Buf<float> wfg((size_t)tt_attention_cuda.forward_workspace(&a) + 1);
    expect_ok(tt_attention_cpu.forward(&a, q.host.data(), k.host.data(), v.host.data(),
                                       out.host.data(), lse.host.data(), wfc.host.data()),
              tt_attention_cuda.forward(&a, q.dev, k.dev, v.dev, out.dev, lse.dev, wfg.dev),
              what);
    expect_close(out, 1e-5, what);
    expect_close(lse, 1e-6, what);
    Buf<float> dq(B * T * Hq * Dh), dk(B * T * Hkv * Dh), dv(B * T * Hkv * Dh);
    Buf<float> wbc((size_t)tt_attention_cpu.backward_workspace(&a) + 1);
    Buf<float> wbg((size_t)tt_attention_cuda.backward_workspace(&a) + 1);
    expect_ok(tt_attention_cpu.backward(&a, q.host.data(), k.host.data(), v.host.data(),
                                        out.host.data(), lse.host.data(), dout.host.data(),
                                        dq.host.data(), dk.host.data(), dv.host.data(),
                                        wbc.host.data()),
              tt_attention_cuda.backward(&a, q.dev, k.dev, v.dev, out.dev, lse.dev, dout.dev,
                                         dq.dev, dk.dev, dv.dev, wbg.dev),
              what);
    expect_close(dq, 1e-5, what);
    expect_close(dk, 1e-5, what);
    expect_close(dv, 1e-5, what);
  }
}
