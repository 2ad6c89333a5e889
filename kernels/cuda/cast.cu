/*
** cast.cu — CUDA side of the precision code: in-place gradient unscaling with the inf/NaN
** check of the loss scaler (engine/optim/amp.c), and FP8 quantisation with amax
** (engine/ops/fp8.c). Declared in engine/cuda/tt_cuda_ops.h.
**
** Each kernel is one pass over the tensor; the flags (found_inf, amax) are reduced per
** block, then combined into a small device buffer that is read back after the launch;
** tt_cuda_unscale_flag leaves found_inf in device memory instead (a training step reads
** it with the rest of its stats, once).
*/
#include "kernel_cuda.h"
#include "tt_cuda_ops.h"

/* amax and found_inf live in one device buffer: {amax bits, nan flag}. Non-negative
** floats order like their bit patterns, so atomicMax on the bits is a float max. */
struct flags { unsigned amax_bits; int bad; };

/* *bad_out = 1 when an element is not finite (every writer stores the same value). */
template <typename T, typename F>
__global__ void unscale_kernel(T *g, int64_t n, float inv, const float *inv_dev, F *bad_out) {
  __shared__ float scratch[32];
  float bad = 0;
  if (inv_dev) inv = *inv_dev;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = tt_ld(g, i);
    if (!isfinite(v)) bad = 1;
    tt_st(g, i, v * inv);
  }
  bad = tt_block_max(bad, scratch);
  if (threadIdx.x == 0 && bad > 0) *bad_out = (F)1;
}

/* Runs `launch(flags *dev)` and copies the flags back. */
template <typename Launch>
static int with_flags(flags *host, Launch &&launch) {
  flags *dev = NULL;
  cudaStream_t s = tt_cuda_cur_stream();
  *host = flags{0u, 0};
  TT_CU(cudaMallocAsync((void **)&dev, sizeof(flags), s));
  cudaError_t e = cudaMemsetAsync(dev, 0, sizeof(flags), s);
  if (e == cudaSuccess) {
    launch(dev);
    e = tt_cuda_launch_status();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(host, dev, sizeof(flags), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = tt_cuda_host_wait(s);
  cudaFreeAsync(dev, s);
  TT_CU(e);
  return 0;
}

extern "C" int tt_cuda_unscale_check(void *data, int dtype, int64_t n, float inv_scale,
                                     int *found_inf) {
  if (n == 0) return 0;
  flags f;
  int rc = tt_cuda_dispatch_float("unscale grads", dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return with_flags(&f, [&](flags *dev) {
      unscale_kernel<T><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
          (T *)data, n, inv_scale, (const float *)NULL, &dev->bad);
    });
  });
  TT_TRY(rc);
  if (f.bad) *found_inf = 1;
  return 0;
}

/* The same pass with found_inf left on the device (a float flag, in the step stats):
** no host wait; the optimizer and the step's one read consume it. */
static int unscale_flag(void *data, int dtype, int64_t n, float inv_scale,
                        const float *inv_dev, float *found_inf_dev) {
  if (n == 0) return 0;
  return tt_cuda_dispatch_float("unscale grads", dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    unscale_kernel<T><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
        (T *)data, n, inv_scale, inv_dev, found_inf_dev);
    TT_CU_LAUNCHED("unscale_kernel");
    return 0;
  });
}

extern "C" int tt_cuda_unscale_flag(void *data, int dtype, int64_t n, float inv_scale,
                                    float *found_inf_dev) {
  return unscale_flag(data, dtype, n, inv_scale, NULL, found_inf_dev);
}

/* The inverse scale read on the device (a captured unscale replays with each step's). */
extern "C" int tt_cuda_unscale_flag_dev(void *data, int dtype, int64_t n, const float *inv_dev,
                                        float *found_inf_dev) {
  return unscale_flag(data, dtype, n, 0.0f, inv_dev, found_inf_dev);
}

__device__ __forceinline__ __nv_fp8_storage_t to_fp8(float v, int dtype) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, dtype == TT_ELEM_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float from_fp8(__nv_fp8_storage_t q, int dtype) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(q, dtype == TT_ELEM_E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

template <typename T>
__global__ void quantize_kernel(const T *x, int64_t n, float scale, int dtype, int fake,
                                void *out, flags *f) {
  __shared__ float scratch[32];
  float amax = 0, nan = 0;
  float inv = 1.0f / scale;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = tt_ld(x, i);
    if (isnan(v)) nan = 1;
    else amax = fmaxf(amax, fabsf(v));
    __nv_fp8_storage_t q = to_fp8(v * scale, dtype);
    if (fake) ((float *)out)[i] = from_fp8(q, dtype) * inv;
    else ((__nv_fp8_storage_t *)out)[i] = q;
  }
  amax = tt_block_max(amax, scratch);
  nan = tt_block_max(nan, scratch);
  if (threadIdx.x == 0) {
    atomicMax(&f->amax_bits, __float_as_uint(amax));
    if (nan > 0) atomicOr(&f->bad, 1);
  }
}

extern "C" int tt_cuda_fp8_quantize(const void *x, int x_dtype, int64_t n, float scale,
                                    int fp8_dtype, int fake, void *out, float *amax) {
  TT_CHECK(fp8_dtype == TT_ELEM_E4M3 || fp8_dtype == TT_ELEM_E5M2, "fp8 quantize: bad fp8 dtype %d",
           fp8_dtype);
  *amax = 0;
  if (n == 0) return 0;
  flags f;
  int rc = tt_cuda_dispatch_float("fp8 quantize", x_dtype, [&](auto *tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return with_flags(&f, [&](flags *dev) {
      quantize_kernel<T><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
          (const T *)x, n, scale, fp8_dtype, fake, out, dev);
    });
  });
  TT_TRY(rc);
  float a;
  memcpy(&a, &f.amax_bits, sizeof a);
  *amax = f.bad ? NAN : a;
  return 0;
}

__global__ void dequantize_kernel(const __nv_fp8_storage_t *q, int dtype, int64_t n,
                                  float inv, float *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = from_fp8(q[i], dtype) * inv;
}

extern "C" int tt_cuda_fp8_dequantize(const void *q, int fp8_dtype, int64_t n, float scale,
                                      float *out) {
  if (n == 0) return 0;
  dequantize_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
      (const __nv_fp8_storage_t *)q, fp8_dtype, n, 1.0f / scale, out);
  TT_CU_LAUNCHED("dequantize_kernel");
  return 0;
}

TT_CUDA_FAMILY(cast)
