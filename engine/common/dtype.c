/*
** dtype.c — dtype metadata and scalar conversions between f32 and the narrow floats.
**
** All narrowing conversions round to nearest, ties to even. bf16 and f16 overflow to inf
** like IEEE; the fp8 formats saturate to their largest finite value instead, which is
** what FP8 training recipes expect (a clamp after scaling). NaN stays NaN everywhere.
*/
#include "common/common.h"
#include <math.h>

/* Kernels receive dtype codes as kernels/kernel.h spells them. */
#define SAME_CODE(k, d) ((int)(k) == (int)(d))
_Static_assert(SAME_CODE(TT_ELEM_F32, TT_F32) && SAME_CODE(TT_ELEM_BF16, TT_BF16) &&
                   SAME_CODE(TT_ELEM_F16, TT_F16) && SAME_CODE(TT_ELEM_E4M3, TT_E4M3) &&
                   SAME_CODE(TT_ELEM_E5M2, TT_E5M2) && SAME_CODE(TT_ELEM_I32, TT_I32) &&
                   SAME_CODE(TT_ELEM_I64, TT_I64) && TT_NUM_DTYPES == 7,
               "kernel.h's element codes must equal tetra.h's dtypes");
#undef SAME_CODE

static const struct {
  const char *name;
  size_t size;
  int is_float;
} tt_dtypes[TT_NUM_DTYPES] = {
  [TT_F32] = {"f32", 4, 1},   [TT_BF16] = {"bf16", 2, 1}, [TT_F16] = {"f16", 2, 1},
  [TT_E4M3] = {"e4m3", 1, 1}, [TT_E5M2] = {"e5m2", 1, 1}, [TT_I32] = {"i32", 4, 0},
  [TT_I64] = {"i64", 8, 0},
};

const char *tt_dtype_name(int dtype) {
  return (dtype >= 0 && dtype < TT_NUM_DTYPES) ? tt_dtypes[dtype].name : "?";
}

int tt_dtype_from_name(const char *name) {
  static const struct { const char *alias; int dtype; } aliases[] = {
    {"float32", TT_F32}, {"float", TT_F32}, {"bfloat16", TT_BF16}, {"float16", TT_F16},
    {"half", TT_F16}, {"fp8_e4m3", TT_E4M3}, {"fp8_e5m2", TT_E5M2}, {"int32", TT_I32},
    {"int64", TT_I64}, {"long", TT_I64}, {"int", TT_I32},
  };
  for (int d = 0; d < TT_NUM_DTYPES; d++)
    if (strcmp(name, tt_dtypes[d].name) == 0) return d;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) return aliases[i].dtype;
  return -1;
}

size_t tt_dtype_size(int dtype) {
  return (dtype >= 0 && dtype < TT_NUM_DTYPES) ? tt_dtypes[dtype].size : 0;
}

int tt_dtype_is_float(int dtype) {
  return dtype >= 0 && dtype < TT_NUM_DTYPES && tt_dtypes[dtype].is_float;
}

/* -- bf16 / f16 ---------------------------------------------------------------------- */

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

uint16_t tt_float_to_bf16(float x) { return tt_elem_float_to_bf16(x); }

float tt_bf16_to_float(uint16_t h) { return tt_elem_bf16_to_float(h); }

/* Generic encoder for a small IEEE-like format: `ebits` exponent bits, `mbits` mantissa
** bits, bias 2^(ebits-1)-1. Returns the magnitude bits (sign added by the caller); values
** past `max_finite` are handled by the caller. Subnormals are rounded to nearest even. */
static uint32_t encode_small_float(float ax, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1;
  int e;
  float m = frexpf(ax, &e);            /* ax = m * 2^e, m in [0.5, 1) */
  int exp = e - 1 + bias;              /* biased exponent of 1.f form */
  if (ax == 0.0f) return 0;
  if (exp <= 0) {
    /* Subnormal: value = q * 2^(1 - bias - mbits) with integer q. */
    float q = ldexpf(ax, bias - 1 + mbits);
    float r = nearbyintf(q);           /* default rounding mode: ties to even */
    return (uint32_t)r;                /* r == 2^mbits rolls into the smallest normal */
  }
  /* Normal: mantissa scaled to integer with mbits fraction bits. */
  float q = ldexpf(m * 2.0f - 1.0f, mbits);
  uint32_t frac = (uint32_t)nearbyintf(q);
  uint32_t bits = ((uint32_t)exp << mbits) + frac;   /* carry rolls into exponent */
  return bits;
}

/* kernels/kernel.h has the rule (integer arithmetic; checked against a frexpf/nearbyintf
** encoder on all 2^32 f32 patterns when it replaced one). */
uint16_t tt_float_to_f16(float x) { return tt_elem_float_to_f16(x); }

float tt_f16_to_float(uint16_t h) { return tt_elem_f16_to_float(h); }

/* -- fp8 ----------------------------------------------------------------------------- */
/* e4m3 (OCP "fn" variant): bias 7, no infinities, S.1111.111 is NaN, max 448.
** e5m2: bias 15, IEEE-like with inf and NaN, max 57344. */

uint8_t tt_float_to_fp8(float x, int dtype) {
  uint8_t sign = (uint8_t)((f32_bits(x) >> 24) & 0x80u);
  float ax = fabsf(x);
  if (dtype == TT_E4M3) {
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    if (ax >= 448.0f) return (uint8_t)(sign | 0x7e);          /* saturate (inf too) */
    uint32_t bits = encode_small_float(ax, 4, 3);
    if (bits > 0x7e) bits = 0x7e;
    return (uint8_t)(sign | bits);
  }
  if (isnan(x)) return (uint8_t)(sign | 0x7f);
  if (ax >= 57344.0f) return (uint8_t)(sign | 0x7b);            /* saturate (inf too) */
  uint32_t bits = encode_small_float(ax, 5, 2);
  if (bits > 0x7b) bits = 0x7b;
  return (uint8_t)(sign | bits);
}

float tt_fp8_to_float(uint8_t v, int dtype) {
  int neg = v & 0x80;
  float r;
  if (dtype == TT_E4M3) {
    int exp = (v >> 3) & 0xf, frac = v & 0x7;
    if (exp == 0xf && frac == 0x7) return NAN;
    r = exp == 0 ? ldexpf((float)frac, -9) : ldexpf((float)(frac | 8), exp - 10);
  } else {
    int exp = (v >> 2) & 0x1f, frac = v & 0x3;
    if (exp == 0x1f) return frac ? NAN : (neg ? -INFINITY : INFINITY);
    r = exp == 0 ? ldexpf((float)frac, -16) : ldexpf((float)(frac | 4), exp - 17);
  }
  return neg ? -r : r;
}
