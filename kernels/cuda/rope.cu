/*
** rope.cu — CUDA kernels of rotary position embedding (kernels/rope.h), f32 or bf16 (f32
** arithmetic), in place or not.
** The angle table is computed in float64 like the CPU twin, so both rotate by the same
** f32 cos/sin values; forward and backward are one thread per rotated pair.
*/
#include "kernel_cuda.h"
extern "C" {
#include "rope.h"
}

/* table: (2, T, half): cos then sin of pos[t] * theta^(-2i / Dh). */
__global__ void rope_table(float *table, const void *pos, int pos_i64, int64_t T, int64_t Dh,
                           double theta) {
  int64_t half = Dh / 2, n = T * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n;
       k += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = k / half, i = k % half;
    double p = !pos ? (double)t
                    : pos_i64 ? (double)((const int64_t *)pos)[t]
                              : (double)((const int32_t *)pos)[t];
    double a = p * pow(theta, -2.0 * (double)i / (double)Dh);
    table[k] = (float)cos(a);
    table[n + k] = (float)sin(a);
  }
}

/* sign +1 rotates by +angle (forward), -1 by -angle (backward). One thread per pair: it
** reads both values before writing them, so out may be x (in place). */
template <typename T>
__global__ void rope_rotate(T *out, const T *x, const float *table, int64_t B, int64_t Tn,
                            int64_t H, int64_t Dh, int interleaved, float sign) {
  int64_t half = Dh / 2, n = B * Tn * H * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n;
       k += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = k % half, row = k / half;      /* row = (b, t, h) */
    int64_t t = (row / H) % Tn;
    float c = table[t * half + i], s = sign * table[Tn * half + t * half + i];
    int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float x0 = tt_ld(x, row * Dh + a), x1 = tt_ld(x, row * Dh + b);
    tt_st(out, row * Dh + a, x0 * c - x1 * s);
    tt_st(out, row * Dh + b, x0 * s + x1 * c);
  }
}

static int table(float *tab, const void *positions, int pos_i64, int64_t T, int64_t Dh,
                 double theta) {
  int64_t n = T * (Dh / 2);
  if (n == 0) return 0;
  rope_table<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(tab, positions, pos_i64, T,
                                                                   Dh, theta);
  TT_CU_LAUNCHED("rope_table");
  return 0;
}

static int rotate(void *out, const void *x, const float *tab, int64_t B, int64_t T,
                  int64_t H, int64_t Dh, int interleaved, int dtype, float sign) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16, "rope: x is %s; expected f32 or bf16",
           tt_dtype_name(dtype));
  int64_t n = B * T * H * (Dh / 2);
  if (n == 0) return 0;
  return tt_cuda_dispatch_float("rope", dtype, [&](auto *tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    rope_rotate<E><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
        (E *)out, (const E *)x, tab, B, T, H, Dh, interleaved, sign);
    TT_CU_LAUNCHED("rope_rotate");
    return 0;
  });
}

static int forward(void *out, const void *x, const float *tab, int64_t B, int64_t T,
                   int64_t H, int64_t Dh, int interleaved, int dtype) {
  return rotate(out, x, tab, B, T, H, Dh, interleaved, dtype, 1.0f);
}

static int backward(void *dx, const void *dout, const float *tab, int64_t B, int64_t T,
                    int64_t H, int64_t Dh, int interleaved, int dtype) {
  return rotate(dx, dout, tab, B, T, H, Dh, interleaved, dtype, -1.0f);
}

extern "C" const tt_rope_kernels tt_rope_cuda = {
  table, forward, backward,
};

TT_CUDA_FAMILY(rope)
