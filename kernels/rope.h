/*
** rope.h — kernel table of rotary position embedding on raw contiguous buffers.
**
** x is (B, T, H, Dh) with Dh even; half = Dh / 2. Position t rotates pair i by the angle
** pos[t] * theta^(-2i / Dh). The pairs are (i, i + half) for rotate-half (Llama / Hugging
** Face) and (2i, 2i + 1) for interleaved (Meta's original). The angles come from a table
** built once per call: table is (2, T, half), cos values then sin values, f32 computed in
** float64. Every entry returns 0, or -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_ROPE_H
#define TT_KERNELS_ROPE_H
#include <stdint.h>

typedef struct tt_rope_kernels {
  /* table: (2, T, half). positions: (T) int32 (pos_i64 = 0) or int64, or NULL for 0..T-1 */
  int (*table)(float *table, const void *positions, int pos_i64, int64_t T, int64_t Dh,
               double theta);
  /* out = rotate(x) by +angle. x, out: (B, T, H, Dh) in dtype (f32 or bf16),
  ** rotated in f32 and rounded once; out may be x itself (in place). */
  int (*forward)(void *out, const void *x, const float *table, int64_t B, int64_t T,
                 int64_t H, int64_t Dh, int interleaved, int dtype);
  /* dx = rotate(dout) by -angle (the transpose of a rotation is its inverse).
  ** dout, dx: (B, T, H, Dh) in dtype; dx may be dout. */
  int (*backward)(void *dx, const void *dout, const float *table, int64_t B, int64_t T,
                  int64_t H, int64_t Dh, int interleaved, int dtype);
} tt_rope_kernels;

extern const tt_rope_kernels tt_rope_cpu;
extern const tt_rope_kernels tt_rope_cuda __attribute__((weak));

#endif
