/*
** copy.cu — strided and casting copies between two tensors on one CUDA device
** (tt_cuda_copy_strided, declared in engine/core/tt_internal.h): what tt_copy_ uses for
** tt_contiguous, tt_cast and strided assignment when the data is on a GPU.
**
** One thread per element of the logical (row-major) index space; both sides are located
** through their own strides, so any view on either side works. Values pass through
** double, which holds every value of every dtype (int64 up to 2^53) and rounds once,
** on the store.
*/
#include "cuda/tt_cuda.h"

typedef struct copy_geom {
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  int64_t dst_stride[TT_MAX_DIMS];
  int64_t src_stride[TT_MAX_DIMS];
} copy_geom;

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

__global__ void copy_kernel(char *dst, int dst_dtype, const char *src, int src_dtype,
                            copy_geom g, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, doff = 0, soff = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
      int64_t c = rest % g.shape[d];
      rest /= g.shape[d];
      doff += c * g.dst_stride[d];
      soff += c * g.src_stride[d];
    }
    store_from_double(dst, dst_dtype, doff, load_as_double(src, src_dtype, soff));
  }
}

extern "C" int tt_cuda_copy_strided(tt_tensor *dst, const tt_tensor *src) {
  TT_CHECK(dst->device == src->device && dst->device >= 0,
           "cuda copy: both tensors must be on one CUDA device (cuda:%d, cuda:%d)", dst->device,
           src->device);
  TT_CHECK(dst->ndim == src->ndim && dst->ndim <= TT_MAX_DIMS, "cuda copy: rank mismatch");
  copy_geom g;
  memset(&g, 0, sizeof g);
  g.ndim = dst->ndim;
  int64_t n = 1;
  for (int d = 0; d < dst->ndim; d++) {
    g.shape[d] = dst->shape[d];
    g.dst_stride[d] = dst->stride[d];
    g.src_stride[d] = src->stride[d];
    n *= dst->shape[d];
  }
  if (n == 0) return 0;
  TT_CU(cudaSetDevice(dst->device));
  copy_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
      (char *)tt_tensor_data(dst), dst->dtype, (const char *)tt_tensor_data(src), src->dtype, g,
      n);
  TT_CU_LAUNCHED("copy_kernel");
  return 0;
}

TT_CUDA_FAMILY(copy)
