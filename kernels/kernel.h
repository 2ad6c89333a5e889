/*
** kernel.h — what every CPU kernel (kernels/cpu/) needs, and nothing from engine/: the
** error convention, element-type codes, the OpenMP grain, bf16 <-> f32 and the f32 rows
** that let bf16 loops vectorise.
**
** Kernels see raw buffers and sizes, never tensors. They link against three functions of
** the engine's lowest layer (engine/common/error.c and dtype.c), declared below: the
** thread-local error message and a dtype's name and size. The engine includes this header
** too, so the bf16 rounding rule and the error macros exist once.
*/
#ifndef TT_KERNEL_H
#define TT_KERNEL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Errors ------------------------------------------------------------------------- */

/* Sets the thread-local message (printf format) and returns -1. */
int tt_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A dtype code's name ("bf16"), for messages, "?" for an unknown code; its element size
** in bytes (0 when unknown). */
const char *tt_dtype_name(int dtype);
size_t tt_dtype_size(int dtype);

/* Fail with a message when `cond` is false. */
#define TT_CHECK(cond, ...) \
  do { if (!(cond)) return tt_set_error(__VA_ARGS__); } while (0)
/* Propagate a failing status (the callee set the message). */
#define TT_TRY(expr) \
  do { if ((expr) != 0) return -1; } while (0)

/* -- Element types ------------------------------------------------------------------ */
/* The dtype codes kernels receive: equal to tetra.h's tt_dtype (checked where the engine
** defines its dtypes, engine/common/dtype.c). */
enum {
  TT_ELEM_F32 = 0,
  TT_ELEM_BF16 = 1,
  TT_ELEM_F16 = 2,
  TT_ELEM_E4M3 = 3,
  TT_ELEM_E5M2 = 4,
  TT_ELEM_I32 = 5,
  TT_ELEM_I64 = 6
};

/* bf16 is the top half of an f32. Narrowing rounds to nearest, ties to even; a NaN stays
** a (quiet) NaN. */
static inline float tt_elem_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static inline uint16_t tt_elem_float_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest even on the dropped 16 bits */
  return (uint16_t)(u >> 16);
}

/* IEEE half precision (f16): narrowing rounds to nearest, ties to even, in integer
** arithmetic on the f32 bits; values from 65520 up become infinity, a NaN the quiet NaN
** 0x7e00 (its sign kept, its payload not); below 2^-14 the subnormals are the f32 value
** times 2^24 rounded to an integer (the sum with 2^23 rounds it, ties to even: exact for
** the magnitudes below 2^10 that reach it). Widening is exact. */
static inline uint16_t tt_elem_float_to_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float ax;
    memcpy(&ax, &a, 4);
    float q = (ax * 0x1p24f + 0x1p23f) - 0x1p23f;
    return (uint16_t)(sign | (uint32_t)q);
  }
  /* Rebias the exponent (127 -> 15: minus 112 << 23) and round the 13 dropped bits; a
  ** carry out of the mantissa rolls into the exponent. */
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | (a >> 13));
}

static inline float tt_elem_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
  uint32_t u;
  float x;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (frac << 13);
  } else if (exp == 0) {
    x = (float)frac * 0x1p-24f;   /* subnormal (or zero): exact */
    memcpy(&u, &x, 4);
    u |= sign;
  } else {
    u = sign | ((exp + 112u) << 23) | (frac << 13);
  }
  memcpy(&x, &u, 4);
  return x;
}

/* Index value at flat position i of a contiguous i32/i64 buffer. */
static inline int64_t tt_index_at(const void *data, int dtype, int64_t i) {
  return dtype == TT_ELEM_I32 ? (int64_t)((const int32_t *)data)[i]
                              : ((const int64_t *)data)[i];
}

/* -- Threads ------------------------------------------------------------------------ */
/* Grain for OpenMP loops: parallelise only when there is enough work. */
enum { TT_PARALLEL_GRAIN = 32768 };

/* -- f32 rows of f32 or bf16 buffers ------------------------------------------------- */
/* CPU kernels that read or write bf16 work on f32 rows so that their loops vectorise: an
** f32 row is used in place, a bf16 one goes through a scratch row. */

/* The D values at src + off as f32: src itself for f32, else read into scratch. */
static inline const float *tt_row_in(const void *src, int dtype, int64_t off, int64_t D,
                                     float *scratch) {
  if (dtype != TT_ELEM_BF16) return (const float *)src + off;
  const uint16_t *s = (const uint16_t *)src + off;
  for (int64_t j = 0; j < D; j++) scratch[j] = tt_elem_bf16_to_float(s[j]);
  return scratch;
}

/* Where to compute the row at dst + off: dst itself for f32, else scratch (then
** tt_row_done). */
static inline float *tt_row_out(void *dst, int dtype, int64_t off, float *scratch) {
  return dtype != TT_ELEM_BF16 ? (float *)dst + off : scratch;
}

/* A row computed in tt_row_out's place goes to dst + off, rounded to bf16 (f32: it is
** there already). */
static inline void tt_row_done(void *dst, int dtype, int64_t off, int64_t D,
                               const float *row) {
  if (dtype != TT_ELEM_BF16) return;
  uint16_t *d = (uint16_t *)dst + off;
  for (int64_t j = 0; j < D; j++) d[j] = tt_elem_float_to_bf16(row[j]);
}

/* k scratch rows of D floats for each of nthr threads (thread t's start at t k D); NULL
** with the error set, naming op, when out of memory. */
static inline float *tt_scratch_rows(const char *op, int64_t D, int k, int nthr) {
  float *rows = (float *)malloc(sizeof(float) * (size_t)D * (size_t)k * (size_t)nthr);
  if (!rows) tt_set_error("%s: out of host memory (%d x %lld-wide rows)", op, k * nthr,
                          (long long)D);
  return rows;
}

#endif
