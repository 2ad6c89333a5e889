/*
** embedding.cu — CUDA kernels of the embedding family (kernels/embedding.h): row gather
** forward, scatter-add backward, f32 or bf16 rows (f32 table and sums), i32/i64 ids, and
** the touched rows of a gradient (row_mask).
**
** The forward validates ids on the device and reports the first bad position through a
** flag read back after the launch (one small copy per call, which is also where the
** error message needs the offending id), or, with deferred checks on (a training step),
** records it on the device for the step's one read (engine/runtime/cuda.cu). The backward
** sorts the tokens by id and sums each id's rows in token order (below): the CPU twin's
** bits, with no atomics.
*/
#include "kernel_cuda.h"
#include <cub/device/device_radix_sort.cuh>
extern "C" {
#include "embedding.h"
}

__device__ __forceinline__ int64_t load_id(const void *ids, int ids_i64, int64_t i) {
  return ids_i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

/* One block row per token; threads stride over D. bad: the smallest bad position; with
** `band` an id outside the table gives a row of zeros instead. */
template <typename T>
__global__ void embedding_fwd(T *out, const float *weight, const void *ids, int ids_i64,
                              int64_t n, int64_t V, int64_t D, int64_t start, int band,
                              unsigned long long *bad) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    int64_t id = load_id(ids, ids_i64, i) - start;
    if (id < 0 || id >= V) {
      if (band) {
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) tt_st(out, i * D + j, 0.0f);
      } else if (threadIdx.x == 0) {
        atomicMin(bad, (unsigned long long)i);
      }
      continue;
    }
    const float *src = weight + id * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) tt_st(out, i * D + j, src[j]);
  }
}

/* The forward kernel on the current stream; bad as embedding_fwd's (NULL with band). */
static cudaError_t launch_fwd(void *out, const float *weight, const void *ids, int ids_i64,
                              int64_t n, int64_t V, int64_t D, int out_dtype, int64_t start,
                              int band, unsigned long long *bad) {
  const int64_t blocks = n < 65535 ? n : 65535;
  /* (a table of width 0 still checks its ids, as the CPU twin does: one warp a block) */
  const int threads = D >= 256 ? 256 : D > 0 ? (int)((D + 31) / 32 * 32) : 32;
  if (out_dtype == TT_ELEM_BF16)
    embedding_fwd<<<(unsigned)blocks, threads, 0, tt_cuda_cur_stream()>>>(
        (__nv_bfloat16 *)out, weight, ids, ids_i64, n, V, D, start, band, bad);
  else
    embedding_fwd<<<(unsigned)blocks, threads, 0, tt_cuda_cur_stream()>>>(
        (float *)out, weight, ids, ids_i64, n, V, D, start, band, bad);
  return tt_cuda_launch_status();
}

static int embedding_forward(void *out, const float *weight, const void *ids, int ids_i64,
                             int64_t n, int64_t V, int64_t D, int out_dtype, int64_t start,
                             int band) {
  TT_CHECK(out_dtype == TT_ELEM_F32 || out_dtype == TT_ELEM_BF16,
           "embedding: rows in %s; expected f32 or bf16", tt_dtype_name(out_dtype));
  if (n == 0) return 0;
  if (band) {   /* other ranks' ids are zero rows, not errors: nothing to read back */
    cudaError_t e = launch_fwd(out, weight, ids, ids_i64, n, V, D, out_dtype, start, 1, NULL);
    return e == cudaSuccess ? 0 : tt_cu_fail(e, "embedding_fwd", __FILE__, __LINE__);
  }
  unsigned long long *bad_dev = NULL, bad = ~0ull;
  TT_CU(cudaMallocAsync((void **)&bad_dev, sizeof bad, tt_cuda_cur_stream()));
  int rc = -1;
  cudaError_t e = cudaMemsetAsync(bad_dev, 0xff, sizeof bad, tt_cuda_cur_stream());
  if (e == cudaSuccess)
    e = launch_fwd(out, weight, ids, ids_i64, n, V, D, out_dtype, start, 0, bad_dev);
  if (e == cudaSuccess && tt_cuda_checks_deferred()) {   /* the step reads it later */
    rc = tt_cuda_check_defer(TT_CHECK_EMBEDDING_ID, bad_dev, ids, ids_i64, V);
    cudaFreeAsync(bad_dev, tt_cuda_cur_stream());
    return rc;
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost, tt_cuda_cur_stream());
  if (e == cudaSuccess) e = tt_cuda_host_wait(tt_cuda_cur_stream());
  if (e != cudaSuccess) {
    tt_cu_fail(e, "embedding_fwd", __FILE__, __LINE__);
  } else if (bad != ~0ull) {
    int64_t id = 0;
    size_t w = ids_i64 ? 8 : 4;
    if (cudaMemcpy(&id, (const char *)ids + bad * w, w, cudaMemcpyDeviceToHost) == cudaSuccess &&
        !ids_i64)
      id = (int64_t)(int32_t)id;
    tt_set_error("embedding: id %lld at position %llu is outside the vocabulary [%lld, %lld)",
                 (long long)id, bad, (long long)start, (long long)(start + V));
  } else {
    rc = 0;
  }
  cudaFreeAsync(bad_dev, tt_cuda_cur_stream());
  return rc;
}

/* -- Backward: tokens sorted by id ------------------------------------------------------
** dweight[id, :] += dout[i, :] for every token i. Walking the tokens in order per column
** (the first version) gives only D-way parallelism: ceil(D / 128) blocks, each thread
** reading all n tokens. Instead the (id, position) pairs are sorted by id with CUB's
** radix sort, which is stable: the positions of one id stay in token order. Then each
** run of equal ids is a row of blocks, one per tile of columns, each thread summing its
** column of the run starting from the row's current value, in token order: the same
** additions in the same order as the CPU twin, so the same bits. Ids outside [0, V)
** (reported by the forward, or recorded for the step's deferred check) get the key V,
** sort last and are skipped. */

/* key[i] = the row of token i, ids[i] - start (V when outside the table), pos[i] = i. */
__global__ void embedding_keys(uint32_t *key, uint32_t *pos, const void *ids, int ids_i64,
                               int64_t n, int64_t V, int64_t start) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t id = load_id(ids, ids_i64, i) - start;
    key[i] = (uint32_t)(id < 0 || id >= V ? V : id);
    pos[i] = (uint32_t)i;
  }
}

/* Blocks (x) per sorted position p that starts a run of equal keys, and (y) per tile of
** blockDim.x columns: each thread sums one column of the run. A long run (a padding id,
** a common token: half a batch's tokens may share a handful of ids) is then spread over
** ceil(D / blockDim.x) SMs, where one block walked it column tile after column tile;
** every column is still summed alone, in token order (the same bits). */
template <typename T>
__global__ void embedding_runs(float *dweight, const T *dout, const uint32_t *key,
                               const uint32_t *pos, int64_t n, int64_t V, int64_t D) {
  const int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const uint32_t id = key[p];
    if (id >= V || (p > 0 && key[p - 1] == id)) continue;
    int64_t end = p + 1;
    while (end < n && key[end] == id) end++;
    if (j >= D) continue;
    float *row = dweight + (int64_t)id * D;
    float s = row[j];
    for (int64_t q = p; q < end; q++) s += tt_ld(dout, (int64_t)pos[q] * D + j);
    row[j] = s;
  }
}

/* The bits a radix sort of keys in [0, V] must look at. */
static int key_bits(int64_t V) {
  int b = 1;
  while (b < 32 && ((int64_t)1 << b) <= V) b++;
  return b;
}

template <typename T>
static int backward_sorted(float *dweight, const T *dout, const void *ids, int ids_i64,
                           int64_t n, int64_t V, int64_t D, int64_t start) {
  cudaStream_t st = tt_cuda_cur_stream();
  const int bits = key_bits(V);
  size_t sort_bytes = 0;
  TT_CU(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL,
                                        (uint32_t *)NULL, (const uint32_t *)NULL,
                                        (uint32_t *)NULL, (int)n, 0, bits, st));
  /* Four arrays of n keys or positions, then CUB's scratch, in one allocation. */
  const size_t words = ((size_t)n + 63) / 64 * 64;
  char *mem = NULL;
  TT_CU(cudaMallocAsync((void **)&mem, 4 * words * sizeof(uint32_t) + sort_bytes, st));
  uint32_t *key = (uint32_t *)mem, *pos = key + words, *skey = pos + words,
           *spos = skey + words;
  void *scratch = spos + words;
  embedding_keys<<<tt_cuda_blocks(n, 256), 256, 0, st>>>(key, pos, ids, ids_i64, n, V, start);
  cudaError_t e = tt_cuda_launch_status();
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(scratch, sort_bytes, key, skey, pos, spos, (int)n, 0,
                                        bits, st);
  if (e == cudaSuccess) {
    const int threads = D >= 128 ? 128 : (int)((D + 31) / 32 * 32);
    const int64_t tiles = (D + threads - 1) / threads;   /* <= 65535: checked by the caller */
    /* (x: 2^31 - 1 at most; with the tiles, fewer for wide rows: most blocks only look
    ** at two keys, and the loop covers the rest) */
    const int64_t cap = 65535 * 16 / (tiles < 16 ? tiles : 16);
    const dim3 grid((unsigned)(n < cap ? n : cap), (unsigned)tiles);
    embedding_runs<<<grid, threads, 0, st>>>(dweight, dout, skey, spos, n, V, D);
    e = tt_cuda_launch_status();
  }
  cudaFreeAsync(mem, st);
  if (e != cudaSuccess) return tt_cu_fail(e, "embedding backward", __FILE__, __LINE__);
  return 0;
}

static int embedding_backward(float *dweight, const void *dout, const void *ids,
                              int ids_i64, int64_t n, int64_t V, int64_t D, int dout_dtype,
                              int64_t start) {
  TT_CHECK(dout_dtype == TT_ELEM_F32 || dout_dtype == TT_ELEM_BF16,
           "embedding_backward: rows in %s; expected f32 or bf16", tt_dtype_name(dout_dtype));
  TT_CHECK(n < INT32_MAX && V < UINT32_MAX,
           "embedding_backward: %lld tokens of a vocabulary of %lld; the CUDA kernel sorts "
           "32-bit ids and positions", (long long)n, (long long)V);
  TT_CHECK(D <= (int64_t)65535 * 128, "embedding_backward: rows of %lld; the CUDA kernel "
           "takes up to %d", (long long)D, 65535 * 128);
  if (n == 0 || D == 0) return 0;
  if (dout_dtype == TT_ELEM_BF16)
    return backward_sorted(dweight, (const __nv_bfloat16 *)dout, ids, ids_i64, n, V, D,
                           start);
  return backward_sorted(dweight, (const float *)dout, ids, ids_i64, n, V, D, start);
}

/* Bit v % 32 of mask[v / 32] set where row v of g (V, D) holds anything but zeros (NaN
** and inf count: they compare unequal to zero). One warp a word: its 32 rows in turn, each
** read by the lanes together (coalesced), the warp's vote giving the row's bit; no
** atomics, and every word written, so mask needs no clearing. */
__global__ void embedding_row_mask_kernel(uint32_t *mask, const float *g, int64_t V,
                                          int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t words = (V + 31) / 32;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < words;
       w += stride) {
    uint32_t word = 0;
    for (int r = 0; r < 32 && w * 32 + r < V; r++) {   /* the same bound on every lane */
      const float *row = g + (w * 32 + r) * D;
      int nz = 0;
      for (int64_t j = lane; j < D && !nz; j += 32) nz = row[j] != 0.0f;
      if (__any_sync(0xffffffffu, nz)) word |= 1u << r;
    }
    if (lane == 0) mask[w] = word;
  }
}

static int embedding_row_mask(uint32_t *mask, const float *g, int64_t V, int64_t D) {
  const int64_t words = (V + 31) / 32;
  if (words == 0) return 0;
  embedding_row_mask_kernel<<<tt_cuda_blocks(words * 32, 256), 256, 0,
                              tt_cuda_cur_stream()>>>(mask, g, V, D);
  TT_CU(tt_cuda_launch_status());
  return 0;
}

extern "C" const tt_embedding_kernels tt_embedding_cuda = {
  embedding_forward, embedding_backward, embedding_row_mask,
};

TT_CUDA_FAMILY(embedding)
