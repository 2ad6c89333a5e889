/*
** copy.cu — strided and casting copies between two tensors on one CUDA device
** (tt_cuda_copy_strided, declared in engine/core/tt_internal.h): what tt_copy_ uses for
** tt_contiguous, tt_cast and strided assignment when the data is on a GPU.
**
** One thread per element of the logical (row-major) index space, simplified first
** (engine/core/copy_geom.h: size-1 dimensions dropped, contiguous neighbours merged); both
** sides are located through their own strides, so any view on either side works. The
** index math is 32-bit when the sizes allow (GPUs divide 64-bit integers in software).
** Same-dtype copies move the elements' bits; f32 <-> bf16 and f32 <-> f16 convert
** directly; other pairs pass through double, which holds every value of every dtype
** (int64 up to 2^53) and rounds once, on the store, exactly as a direct conversion would.
*/
#include "cuda/tt_cuda.h"
extern "C" {
#include "core/copy_geom.h"
}

/* The geometry as the kernel reads it, in the index type I. */
template <typename I> struct copy_dims {
  int ndim;
  I shape[TT_MAX_DIMS], dst_stride[TT_MAX_DIMS], src_stride[TT_MAX_DIMS];
};

__device__ __forceinline__ double load_as_double(const char *p, int dtype, int64_t off) {
  switch (dtype) {
    case TT_F32: return ((const float *)p)[off];
    case TT_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    case TT_F16: return __half2float(((const __half *)p)[off]);
    case TT_E4M3:
    case TT_E5M2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)p)[off],
                                             dtype == TT_E4M3 ? __NV_E4M3 : __NV_E5M2);
      return __half2float(__half(h));
    }
    case TT_I32: return ((const int32_t *)p)[off];
    default: return (double)((const int64_t *)p)[off];
  }
}

__device__ __forceinline__ void store_from_double(char *p, int dtype, int64_t off, double v) {
  switch (dtype) {
    case TT_F32: ((float *)p)[off] = (float)v; break;
    case TT_BF16: ((__nv_bfloat16 *)p)[off] = __double2bfloat16(v); break;
    case TT_F16: ((__half *)p)[off] = __double2half(v); break;
    case TT_E4M3:
    case TT_E5M2:
      ((__nv_fp8_storage_t *)p)[off] = __nv_cvt_double_to_fp8(
          v, __NV_SATFINITE, dtype == TT_E4M3 ? __NV_E4M3 : __NV_E5M2);
      break;
    case TT_I32: ((int32_t *)p)[off] = (int32_t)v; break;
    default: ((int64_t *)p)[off] = (int64_t)v; break;
  }
}

/* The offsets of element i on both sides, in the index type I. */
template <typename I>
__device__ __forceinline__ void offsets(const copy_dims<I> &g, I i, I *doff, I *soff) {
  I d = 0, s = 0;
  for (int k = g.ndim - 1; k > 0; k--) {
    const I c = i % g.shape[k];
    i /= g.shape[k];
    d += c * g.dst_stride[k];
    s += c * g.src_stride[k];
  }
  *doff = d + i * g.dst_stride[0];   /* what is left of i is the outermost index */
  *soff = s + i * g.src_stride[0];
}

/* Any dtype pair, through double. */
template <typename I>
__global__ void copy_any(char *dst, int dst_dtype, const char *src, int src_dtype,
                         copy_dims<I> g, I n) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I doff, soff;
    offsets(g, i, &doff, &soff);
    store_from_double(dst, dst_dtype, (int64_t)doff, load_as_double(src, src_dtype, soff));
  }
}

/* One float dtype into another (D != S), through f32, which holds bf16 and f16 exactly. */
template <typename I, typename D, typename S>
__global__ void copy_cast(D *dst, const S *src, copy_dims<I> g, I n) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I doff, soff;
    offsets(g, i, &doff, &soff);
    tt_st(dst, (int64_t)doff, tt_ld(src, (int64_t)soff));
  }
}

/* Same dtype: the elements' bits, W the element's width as an unsigned integer. */
template <typename I, typename W>
__global__ void copy_bits(W *dst, const W *src, copy_dims<I> g, I n) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I doff, soff;
    offsets(g, i, &doff, &soff);
    dst[doff] = src[soff];
  }
}

template <typename I>
static void launch(char *dst, int dst_dtype, const char *src, int src_dtype,
                   const tt_copy_geom *geom) {
  copy_dims<I> g;
  memset(&g, 0, sizeof g);
  g.ndim = geom->ndim;
  for (int d = 0; d < geom->ndim; d++) {
    g.shape[d] = (I)geom->shape[d];
    g.dst_stride[d] = (I)geom->dst_stride[d];
    g.src_stride[d] = (I)geom->src_stride[d];
  }
  const I n = (I)geom->n;
  const unsigned blocks = tt_cuda_blocks(geom->n, 256);
  cudaStream_t st = tt_cuda_cur_stream();
  if (dst_dtype == src_dtype) {
    switch (tt_dtype_size(dst_dtype)) {
      case 1: copy_bits<<<blocks, 256, 0, st>>>((uint8_t *)dst, (const uint8_t *)src, g, n);
        return;
      case 2: copy_bits<<<blocks, 256, 0, st>>>((uint16_t *)dst, (const uint16_t *)src, g, n);
        return;
      case 4: copy_bits<<<blocks, 256, 0, st>>>((uint32_t *)dst, (const uint32_t *)src, g, n);
        return;
      default: copy_bits<<<blocks, 256, 0, st>>>((uint64_t *)dst, (const uint64_t *)src, g, n);
        return;
    }
  }
#define TT_COPY_CAST(DT, D, ST, S)                                                         \
  if (dst_dtype == DT && src_dtype == ST) {                                                \
    copy_cast<<<blocks, 256, 0, st>>>((D *)dst, (const S *)src, g, n);                     \
    return;                                                                                \
  }
  TT_COPY_CAST(TT_F32, float, TT_BF16, __nv_bfloat16)
  TT_COPY_CAST(TT_BF16, __nv_bfloat16, TT_F32, float)
  TT_COPY_CAST(TT_F32, float, TT_F16, __half)
  TT_COPY_CAST(TT_F16, __half, TT_F32, float)
#undef TT_COPY_CAST
  copy_any<<<blocks, 256, 0, st>>>(dst, dst_dtype, src, src_dtype, g, n);
}

extern "C" int tt_cuda_copy_strided(tt_tensor *dst, const tt_tensor *src) {
  TT_CHECK(dst->device == src->device && dst->device >= 0,
           "cuda copy: both tensors must be on one CUDA device (cuda:%d, cuda:%d)", dst->device,
           src->device);
  TT_CHECK(dst->ndim == src->ndim && dst->ndim <= TT_MAX_DIMS, "cuda copy: rank mismatch");
  tt_copy_geom g;
  tt_copy_geom_make(&g, dst->ndim, dst->shape, dst->stride, src->stride);
  if (g.n == 0) return 0;
  TT_CU(cudaSetDevice(dst->device));
  char *d = (char *)tt_tensor_data(dst);
  const char *s = (const char *)tt_tensor_data(src);
  if (g.index32)
    launch<uint32_t>(d, dst->dtype, s, src->dtype, &g);
  else
    launch<int64_t>(d, dst->dtype, s, src->dtype, &g);
  TT_CU_LAUNCHED("copy kernel");
  return 0;
}

TT_CUDA_FAMILY(copy)
