/*
** embedding.c — CPU kernels of the token embedding: a row gather forward (f32 rows, or
** rounded to bf16) and a scatter-add backward (f32 sums of f32 or bf16 rows).
**
** The backward must not race when two tokens share an id. Instead of atomics or
** per-thread copies of dweight, each thread owns a contiguous band of vocabulary rows and
** scans all n ids, adding only the tokens whose id falls in its band. Rows are therefore
** summed in token order by exactly one thread: the result is bitwise reproducible for any
** thread count. Scanning n ids per thread is cheap next to the n * D floats moved.
*/
#include "embedding.h"
#include "kernel.h"
#include <omp.h>
#include <string.h>

static int check_row_dtype(const char *op, int dtype) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16, "%s: rows in %s; expected f32 or bf16", op,
           tt_dtype_name(dtype));
  return 0;
}

/* weight: (V, D), ids: (n), out: (n, D) in out_dtype */
static int embedding_forward(void *out, const float *weight, const void *ids, int ids_i64,
                             int64_t n, int64_t V, int64_t D, int out_dtype, int64_t start,
                             int band) {
  TT_TRY(check_row_dtype("embedding", out_dtype));
  int dtype = ids_i64 ? TT_ELEM_I64 : TT_ELEM_I32;
  int64_t bad = -1;
  for (int64_t i = 0; i < n && !band; i++) {
    int64_t id = tt_index_at(ids, dtype, i) - start;
    if (id < 0 || id >= V) { bad = i; break; }
  }
  if (bad >= 0)
    return tt_set_error("embedding: id %lld at position %lld is outside the vocabulary "
                        "[%lld, %lld)", (long long)tt_index_at(ids, dtype, bad),
                        (long long)bad, (long long)start, (long long)(start + V));
  const size_t row_bytes = (size_t)D * (out_dtype == TT_ELEM_BF16 ? 2 : 4);
#pragma omp parallel for schedule(static) if (n * D > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const int64_t id = tt_index_at(ids, dtype, i) - start;
    if (id < 0 || id >= V) {   /* (band: another rank's id) */
      memset((char *)out + (size_t)i * row_bytes, 0, row_bytes);
      continue;
    }
    const float *src = weight + id * D;
    if (out_dtype == TT_ELEM_BF16) {
      uint16_t *dst = (uint16_t *)out + i * D;
      for (int64_t j = 0; j < D; j++) dst[j] = tt_elem_float_to_bf16(src[j]);
    } else {
      memcpy((float *)out + i * D, src, sizeof(float) * (size_t)D);
    }
  }
  return 0;
}

/* dweight: (V, D) +=, dout: (n, D) in dout_dtype */
static int embedding_backward(float *dweight, const void *dout, const void *ids,
                              int ids_i64, int64_t n, int64_t V, int64_t D, int dout_dtype,
                              int64_t start) {
  TT_TRY(check_row_dtype("embedding_backward", dout_dtype));
  int dtype = ids_i64 ? TT_ELEM_I64 : TT_ELEM_I32;
#pragma omp parallel if (n * D > TT_PARALLEL_GRAIN)
  {
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t lo = V * t / nt, hi = V * (t + 1) / nt;   /* this thread's vocabulary band */
    for (int64_t i = 0; i < n; i++) {
      int64_t id = tt_index_at(ids, dtype, i) - start;
      if (id < lo || id >= hi) continue;   /* (outside [0, V) too: no thread's band) */
      float *dst = dweight + id * D;
      if (dout_dtype == TT_ELEM_BF16) {
        const uint16_t *src = (const uint16_t *)dout + i * D;
        for (int64_t j = 0; j < D; j++) dst[j] += tt_elem_bf16_to_float(src[j]);
      } else {
        const float *src = (const float *)dout + i * D;
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dst[j] += src[j];
      }
    }
  }
  return 0;
}

/* mask: (V + 31) / 32 words, bit v set where row v of g (V, D) is not all zeros. */
static int embedding_row_mask(uint32_t *mask, const float *g, int64_t V, int64_t D) {
  const int64_t words = (V + 31) / 32;
#pragma omp parallel for schedule(static) if (V * D > TT_PARALLEL_GRAIN)
  for (int64_t w = 0; w < words; w++) {
    uint32_t word = 0;
    for (int64_t v = w * 32; v < V && v < w * 32 + 32; v++) {
      const float *row = g + v * D;
      int64_t d = 0;
      while (d < D && row[d] == 0.0f) d++;
      if (d < D) word |= 1u << (v % 32);
    }
    mask[w] = word;
  }
  return 0;
}

const tt_embedding_kernels tt_embedding_cpu = {
  .forward = embedding_forward,
  .backward = embedding_backward,
  .row_mask = embedding_row_mask,
};
