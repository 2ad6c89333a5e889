/*
** fused.cu — CUDA kernels of the fused memory-bound family (kernels/fused.h): residual
** add + RMSNorm or LayerNorm (+ cast) forward and backward, SwiGLU, GELU; f32 or bf16 in memory, f32 in
** registers.
**
** Row kernels run one block per row. Each thread walks its row in groups of 8 values
** loaded and stored as 128-bit words (two per group for f32, one for bf16) when every
** buffer's rows start 16-byte aligned (aligned base pointers and D a multiple of 8);
** what is left of a row (or all of it otherwise) goes value by value. A thread reads
** back only what it wrote itself, so the forward's second pass over h needs no barrier.
** The norms' weight (and bias) gradients are a deterministic two-stage reduction: stage one sums
** TT_FUSED_ROWS_PER_PART rows per partial (one thread per column and partial, rows in
** order), stage two adds the partials in order; no atomics, the same sums every run.
*/
#include "kernel_cuda.h"
extern "C" {
#include "fused.h"
}

enum { FUSED_THREADS = 256, VW = 8 };

/* -- 128-bit groups of 8 values ------------------------------------------------------------ */

template <typename T>
__device__ __forceinline__ void ld8(const T *p, float *v) {
  constexpr int per = 16 / sizeof(T);
#pragma unroll
  for (int q = 0; q < VW / per; q++) {
    const uint4 u = reinterpret_cast<const uint4 *>(p)[q];
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int k = 0; k < per; k++) v[q * per + k] = tt_ld(e, k);
  }
}

template <typename T>
__device__ __forceinline__ void st8(T *p, const float *v) {
  constexpr int per = 16 / sizeof(T);
#pragma unroll
  for (int q = 0; q < VW / per; q++) {
    uint4 u;
    T *e = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int k = 0; k < per; k++) tt_st(e, k, v[q * per + k]);
    reinterpret_cast<uint4 *>(p)[q] = u;
  }
}

/* v as stored in T and read back. */
template <typename T>
__device__ __forceinline__ float rnd(float v) {
  T t[1];
  tt_st(t, 0, v);
  return tt_ld(t, 0);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The vector path's reach in each row: D rounded down to groups of 8 when all rows of
** every (non-NULL) buffer start 16-byte aligned, else 0. */
static int64_t vec_reach(int64_t D, std::initializer_list<const void *> ptrs) {
  if (D % VW != 0) return 0;
  for (const void *p : ptrs)
    if (p && !aligned16(p)) return 0;
  return D;
}

/* -- Residual add + RMSNorm or LayerNorm ------------------------------------------------- */

/* Both norms (as kernels/cpu/fused.c): mean NULL is RMSNorm (statistics of h^2, no
** centring, no bias); otherwise LayerNorm, whose variance takes a second pass over h. */
template <typename T, typename Y>
__global__ void add_norm_fwd(T *h, Y *y, float *mean, float *rstd, const T *x, const T *res,
                             const float *w, const float *b, int64_t D, int64_t Dv,
                             float eps) {
  __shared__ float scratch[32];
  const int64_t o = (int64_t)blockIdx.x * D;
  float s = 0.0f;   /* sum of h (LayerNorm) or of h^2 (RMSNorm) */
  for (int64_t j = threadIdx.x * VW; j < Dv; j += blockDim.x * VW) {
    float a[VW];
    ld8(x + o + j, a);
    if (res) {
      float c[VW];
      ld8(res + o + j, c);
#pragma unroll
      for (int k = 0; k < VW; k++) a[k] = rnd<T>(a[k] + c[k]);
      st8(h + o + j, a);
    }
#pragma unroll
    for (int k = 0; k < VW; k++) s += mean ? a[k] : a[k] * a[k];
  }
  for (int64_t j = Dv + threadIdx.x; j < D; j += blockDim.x) {
    float a = tt_ld(x, o + j);
    if (res) {
      a = rnd<T>(a + tt_ld(res, o + j));
      tt_st(h, o + j, a);
    }
    s += mean ? a : a * a;
  }
  s = tt_block_sum(s, scratch);
  const T *hin = res ? h : x;
  float mu = 0.0f;
  if (mean) {
    mu = s / (float)D;
    s = 0.0f;
    for (int64_t j = threadIdx.x * VW; j < Dv; j += blockDim.x * VW) {
      float a[VW];
      ld8(hin + o + j, a);
#pragma unroll
      for (int k = 0; k < VW; k++) s += (a[k] - mu) * (a[k] - mu);
    }
    for (int64_t j = Dv + threadIdx.x; j < D; j += blockDim.x) {
      const float d = tt_ld(hin, o + j) - mu;
      s += d * d;
    }
    s = tt_block_sum(s, scratch);
    if (threadIdx.x == 0) mean[blockIdx.x] = mu;
  }
  const float r = rsqrtf(s / (float)D + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x * VW; j < Dv; j += blockDim.x * VW) {
    float a[VW];
    ld8(hin + o + j, a);
#pragma unroll
    for (int k = 0; k < VW; k++) {
      a[k] = (a[k] - mu) * r * (w ? w[j + k] : 1.0f);
      if (b) a[k] += b[j + k];
    }
    st8(y + o + j, a);
  }
  for (int64_t j = Dv + threadIdx.x; j < D; j += blockDim.x) {
    float v = (tt_ld(hin, o + j) - mu) * r * (w ? w[j] : 1.0f);
    if (b) v += b[j];
    tt_st(y, o + j, v);
  }
}

template <typename T, typename Y>
__global__ void norm_bwd_dh(T *dh, const Y *dy, const T *dh_in, const T *h, const float *w,
                            const float *mean, const float *rstd, int64_t D, int64_t Dv) {
  __shared__ float scratch[32];
  const int64_t o = (int64_t)blockIdx.x * D;
  const float r = rstd[blockIdx.x], mu = mean ? mean[blockIdx.x] : 0.0f;
  float dot = 0.0f, sg = 0.0f;   /* sums of g (h - mu) and of g, g = dy w */
  for (int64_t j = threadIdx.x * VW; j < Dv; j += blockDim.x * VW) {
    float g[VW], a[VW];
    ld8(dy + o + j, g);
    ld8(h + o + j, a);
#pragma unroll
    for (int k = 0; k < VW; k++) {
      const float gw = g[k] * (w ? w[j + k] : 1.0f);
      dot += gw * (a[k] - mu);
      sg += gw;
    }
  }
  for (int64_t j = Dv + threadIdx.x; j < D; j += blockDim.x) {
    const float gw = tt_ld(dy, o + j) * (w ? w[j] : 1.0f);
    dot += gw * (tt_ld(h, o + j) - mu);
    sg += gw;
  }
  dot = tt_block_sum(dot, scratch);
  if (mean) sg = tt_block_sum(sg, scratch);
  const float c = dot * r * r * r / (float)D, m = mean ? sg / (float)D : 0.0f;
  for (int64_t j = threadIdx.x * VW; j < Dv; j += blockDim.x * VW) {
    float g[VW], a[VW], d[VW];
    ld8(dy + o + j, g);
    ld8(h + o + j, a);
    if (dh_in) ld8(dh_in + o + j, d);
#pragma unroll
    for (int k = 0; k < VW; k++)
      g[k] = r * (g[k] * (w ? w[j + k] : 1.0f) - m) - (a[k] - mu) * c + (dh_in ? d[k] : 0.0f);
    st8(dh + o + j, g);
  }
  for (int64_t j = Dv + threadIdx.x; j < D; j += blockDim.x) {
    float v = r * (tt_ld(dy, o + j) * (w ? w[j] : 1.0f) - m) - (tt_ld(h, o + j) - mu) * c;
    if (dh_in) v += tt_ld(dh_in, o + j);
    tt_st(dh, o + j, v);
  }
}

/* Stage one: over rows [p R, (p+1) R), rows in order, pw[p, j] = sum of dy xhat (xhat =
** (h - mean) rstd, mean 0 for RMSNorm) and pb[p, j] = sum of dy; either may be NULL. */
template <typename T, typename Y>
__global__ void norm_param_partials(float *pw, float *pb, const Y *dy, const T *h,
                                    const float *mean, const float *rstd, int64_t N,
                                    int64_t D) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, p = blockIdx.y;
  if (j >= D) return;
  const int64_t n0 = p * TT_FUSED_ROWS_PER_PART;
  const int64_t n1 = n0 + TT_FUSED_ROWS_PER_PART < N ? n0 + TT_FUSED_ROWS_PER_PART : N;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t n = n0; n < n1; n++) {
    const float g = tt_ld(dy, n * D + j), mu = mean ? mean[n] : 0.0f;
    sw += g * ((tt_ld(h, n * D + j) - mu) * rstd[n]);
    sb += g;
  }
  if (pw) pw[p * D + j] = sw;
  if (pb) pb[p * D + j] = sb;
}

/* Stage two: out[j] = sum of partials[., j], partials in order. */
__global__ void sum_partials(float *out, const float *partials, int64_t P, int64_t D) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float s = 0.0f;
  for (int64_t p = 0; p < P; p++) s += partials[p * D + j];
  out[j] = s;
}

/* fn.template operator()<T, Y>() for dtype, y_dtype each f32 or bf16. */
template <typename Fn>
static int dispatch2(const char *op, int dtype, int y_dtype, Fn &&fn) {
  TT_CHECK((dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16) && (y_dtype == TT_ELEM_F32 || y_dtype == TT_ELEM_BF16),
           "%s: dtypes %s -> %s; the fused kernels read and write f32 or bf16", op,
           tt_dtype_name(dtype), tt_dtype_name(y_dtype));
  return tt_cuda_dispatch_float(op, dtype, [&](auto *ttag) {
    return tt_cuda_dispatch_float(op, y_dtype, [&](auto *ytag) { return fn(ttag, ytag); });
  });
}

static int add_norm_forward(void *h, void *y, float *mean, float *rstd, const void *x,
                            const void *res, const float *w, const float *b, int64_t N,
                            int64_t D, float eps, int dtype, int y_dtype) {
  const char *op = mean ? "add_layernorm" : "add_rmsnorm";
  if (N == 0) return 0;
  TT_CHECK(N <= 0x7fffffff, "%s: %lld rows is too many for one launch", op, (long long)N);
  const int64_t Dv = vec_reach(D, {h, y, x, res, w, b});
  return dispatch2(op, dtype, y_dtype, [&](auto *ttag, auto *ytag) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    using Y = std::remove_pointer_t<decltype(ytag)>;
    add_norm_fwd<T, Y><<<(unsigned)N, FUSED_THREADS, 0, tt_cuda_cur_stream()>>>(
        (T *)h, (Y *)y, mean, rstd, (const T *)x, (const T *)res, w, b, D, Dv, eps);
    TT_CU_LAUNCHED("add_norm_fwd");
    return 0;
  });
}

static int norm_backward(void *dh, float *dw, float *db, float *partials, const void *dy,
                         const void *dh_in, const void *h, const float *w, const float *mean,
                         const float *rstd, int64_t N, int64_t D, int dtype, int y_dtype) {
  const char *op = mean ? "layernorm_backward" : "rmsnorm_backward";
  if (!w) dw = NULL;
  TT_CHECK(!(dw || db) || partials, "%s: a weight gradient needs the partials workspace", op);
  if (N == 0) return 0;
  TT_CHECK(N <= 0x7fffffff, "%s: %lld rows is too many for one launch", op, (long long)N);
  const int64_t P = (N + TT_FUSED_ROWS_PER_PART - 1) / TT_FUSED_ROWS_PER_PART;
  TT_CHECK(P <= 65535, "%s: %lld rows is too many for one launch", op, (long long)N);
  const int64_t Dv = vec_reach(D, {dh, dy, dh_in, h, w});
  return dispatch2(op, dtype, y_dtype, [&](auto *ttag, auto *ytag) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    using Y = std::remove_pointer_t<decltype(ytag)>;
    cudaStream_t s = tt_cuda_cur_stream();
    if (dw || db) {
      float *pw = dw ? partials : NULL, *pb = db ? partials + P * D : NULL;
      const dim3 grid((unsigned)((D + 127) / 128), (unsigned)P);
      norm_param_partials<T, Y><<<grid, 128, 0, s>>>(pw, pb, (const Y *)dy, (const T *)h, mean,
                                                     rstd, N, D);
      TT_CU_LAUNCHED("norm_param_partials");
      const unsigned blocks = (unsigned)((D + 127) / 128);
      if (dw) sum_partials<<<blocks, 128, 0, s>>>(dw, pw, P, D);
      if (db) sum_partials<<<blocks, 128, 0, s>>>(db, pb, P, D);
      TT_CU_LAUNCHED("sum_partials");
    }
    if (dh) {
      norm_bwd_dh<T, Y><<<(unsigned)N, FUSED_THREADS, 0, s>>>(
          (T *)dh, (const Y *)dy, (const T *)dh_in, (const T *)h, w, mean, rstd, D, Dv);
      TT_CU_LAUNCHED("norm_bwd_dh");
    }
    return 0;
  });
}

/* -- SwiGLU ------------------------------------------------------------------------------ */

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + __expf(-g)); }

/* Groups of 8 below nv (0 when a pointer is not 16-byte aligned), single values above. */
template <typename T>
__global__ void swiglu_fwd(T *y, const T *gate, const T *up, int64_t n, int64_t nv) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = t * VW; i < nv; i += stride * VW) {
    float g[VW], u[VW];
    ld8(gate + i, g);
    ld8(up + i, u);
#pragma unroll
    for (int k = 0; k < VW; k++) g[k] = g[k] * sigmoidf_(g[k]) * u[k];
    st8(y + i, g);
  }
  for (int64_t i = nv + t; i < n; i += stride) {
    const float g = tt_ld(gate, i);
    tt_st(y, i, g * sigmoidf_(g) * tt_ld(up, i));
  }
}

template <typename T>
__global__ void swiglu_bwd(T *dgate, T *dup, const T *dy, const T *gate, const T *up, int64_t n,
                           int64_t nv) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = t * VW; i < nv; i += stride * VW) {
    float g[VW], u[VW], d[VW], a[VW], b[VW];
    ld8(gate + i, g);
    ld8(up + i, u);
    ld8(dy + i, d);
#pragma unroll
    for (int k = 0; k < VW; k++) {
      const float s = sigmoidf_(g[k]);
      a[k] = d[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
      b[k] = d[k] * g[k] * s;
    }
    if (dgate) st8(dgate + i, a);
    if (dup) st8(dup + i, b);
  }
  for (int64_t i = nv + t; i < n; i += stride) {
    const float g = tt_ld(gate, i), s = sigmoidf_(g), d = tt_ld(dy, i);
    if (dgate) tt_st(dgate, i, d * tt_ld(up, i) * s * (1.0f + g * (1.0f - s)));
    if (dup) tt_st(dup, i, d * g * s);
  }
}

static int swiglu_forward(void *y, const void *gate, const void *up, int64_t n, int dtype) {
  if (n == 0) return 0;
  const int64_t nv = vec_reach(n, {y, gate, up}) / VW * VW;
  return dispatch2("swiglu", dtype, dtype, [&](auto *ttag, auto *) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    swiglu_fwd<T><<<tt_cuda_blocks((n + VW - 1) / VW, FUSED_THREADS), FUSED_THREADS, 0,
                    tt_cuda_cur_stream()>>>((T *)y, (const T *)gate, (const T *)up, n, nv);
    TT_CU_LAUNCHED("swiglu_fwd");
    return 0;
  });
}

static int swiglu_backward(void *dgate, void *dup, const void *dy, const void *gate,
                           const void *up, int64_t n, int dtype) {
  if (n == 0 || (!dgate && !dup)) return 0;
  const int64_t nv = vec_reach(n, {dgate, dup, dy, gate, up}) / VW * VW;
  return dispatch2("swiglu_backward", dtype, dtype, [&](auto *ttag, auto *) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    swiglu_bwd<T><<<tt_cuda_blocks((n + VW - 1) / VW, FUSED_THREADS), FUSED_THREADS, 0,
                    tt_cuda_cur_stream()>>>((T *)dgate, (T *)dup, (const T *)dy,
                                            (const T *)gate, (const T *)up, n, nv);
    TT_CU_LAUNCHED("swiglu_bwd");
    return 0;
  });
}

/* -- GELU (x sigmoid(2u), as the CPU twin) ------------------------------------------------ */

__device__ __forceinline__ float gelu_s(float v) {
  return sigmoidf_(2.0f * 0.7978845608028654f * (v + 0.044715f * v * v * v));
}

__device__ __forceinline__ float gelu_d(float v) {
  const float s = gelu_s(v), du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * v * v);
  return s + 2.0f * v * s * (1.0f - s) * du;
}

/* Groups of 8 below nv, single values above (as swiglu_fwd). dy NULL: the forward. */
template <typename T>
__global__ void gelu_kernel(T *out, const T *dy, const T *x, int64_t n, int64_t nv) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = t * VW; i < nv; i += stride * VW) {
    float v[VW], d[VW];
    ld8(x + i, v);
    if (dy) ld8(dy + i, d);
#pragma unroll
    for (int k = 0; k < VW; k++) v[k] = dy ? d[k] * gelu_d(v[k]) : v[k] * gelu_s(v[k]);
    st8(out + i, v);
  }
  for (int64_t i = nv + t; i < n; i += stride) {
    const float v = tt_ld(x, i);
    tt_st(out, i, dy ? tt_ld(dy, i) * gelu_d(v) : v * gelu_s(v));
  }
}

static int gelu_launch(const char *op, void *out, const void *dy, const void *x, int64_t n,
                       int dtype) {
  if (n == 0) return 0;
  const int64_t nv = vec_reach(n, {out, dy, x}) / VW * VW;
  return dispatch2(op, dtype, dtype, [&](auto *ttag, auto *) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    gelu_kernel<T><<<tt_cuda_blocks((n + VW - 1) / VW, FUSED_THREADS), FUSED_THREADS, 0,
                     tt_cuda_cur_stream()>>>((T *)out, (const T *)dy, (const T *)x, n, nv);
    TT_CU_LAUNCHED("gelu_kernel");
    return 0;
  });
}

static int gelu_forward(void *y, const void *x, int64_t n, int dtype) {
  return gelu_launch("gelu", y, NULL, x, n, dtype);
}

static int gelu_backward(void *dx, const void *dy, const void *x, int64_t n, int dtype) {
  return gelu_launch("gelu_backward", dx, dy, x, n, dtype);
}

extern "C" const tt_fused_kernels tt_fused_cuda = {
  add_norm_forward,
  norm_backward,
  gelu_forward,
  gelu_backward,
  swiglu_forward,
  swiglu_backward,
};

TT_CUDA_FAMILY(fused)
