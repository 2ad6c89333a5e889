/*
** elementwise.cu — CUDA kernels of the elementwise family (kernels/elementwise.h):
** broadcasting binary ops and their input gradients, affine maps and axpy, on f32, and
** axpy into bf16 / f16.
**
** One thread per output element in a grid-stride loop. A broadcast input is read through
** its own strides: the flat output index is split into coordinates over bc->shape
** (ndim is 1 or 2 after the engine collapses dims, so the split is a division or two).
*/
#include "kernel_cuda.h"
extern "C" {
#include "elementwise.h"
}

/* Offsets of output element i in a and b. */
__device__ __forceinline__ void bcast_offsets(const tt_bcast &bc, int64_t i, int64_t *oa,
                                              int64_t *ob) {
  int64_t a = 0, b = 0;
  for (int d = bc.ndim - 1; d >= 0; d--) {
    int64_t c = i % bc.shape[d];
    i /= bc.shape[d];
    a += c * bc.stride_a[d];
    b += c * bc.stride_b[d];
  }
  *oa = a;
  *ob = b;
}

__device__ __forceinline__ float apply(int op, float a, float b) {
  switch (op) {
    case TT_BINARY_ADD: return a + b;
    case TT_BINARY_SUB: return a - b;
    case TT_BINARY_MUL: return a * b;
    default: return a / b;
  }
}

static int64_t bcast_numel(const tt_bcast *bc) {
  int64_t n = 1;
  for (int d = 0; d < bc->ndim; d++) n *= bc->shape[d];
  return n;
}

__global__ void binary_kernel(int op, float *out, const float *a, const float *b,
                              tt_bcast bc, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t oa, ob;
    bcast_offsets(bc, i, &oa, &ob);
    out[i] = apply(op, a[oa], b[ob]);
  }
}

static int binary(int op, float *out, const float *a, const float *b, const tt_bcast *bc) {
  int64_t n = bcast_numel(bc);
  if (n == 0) return 0;
  binary_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(op, out, a, b, *bc, n);
  TT_CU_LAUNCHED("binary_kernel");
  return 0;
}

/* mul: ga = g b, gb = g a; div: ga = g / b, gb = -g a / b^2. */
__global__ void binary_backward_kernel(int op, float *ga, float *gb, const float *g,
                                       const float *a, const float *b, tt_bcast bc,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t oa, ob;
    bcast_offsets(bc, i, &oa, &ob);
    float av = a[oa], bv = b[ob], gv = g[i];
    if (op == TT_BINARY_MUL) {
      if (ga) ga[i] = gv * bv;
      if (gb) gb[i] = gv * av;
    } else {
      if (ga) ga[i] = gv / bv;
      if (gb) gb[i] = -gv * av / (bv * bv);
    }
  }
}

static int binary_backward(int op, float *ga, float *gb, const float *g, const float *a,
                           const float *b, const tt_bcast *bc) {
  TT_CHECK(op == TT_BINARY_MUL || op == TT_BINARY_DIV,
           "binary_backward: only mul and div need a kernel (op %d)", op);
  int64_t n = bcast_numel(bc);
  if (n == 0 || (!ga && !gb)) return 0;
  binary_backward_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
      op, ga, gb, g, a, b, *bc, n);
  TT_CU_LAUNCHED("binary_backward_kernel");
  return 0;
}

__global__ void affine_kernel(float *out, const float *a, int64_t n, float mul, float add) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = a[i] * mul + add;
}

static int affine(float *out, const float *a, int64_t n, float mul, float add) {
  if (n == 0) return 0;
  affine_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(out, a, n, mul, add);
  TT_CU_LAUNCHED("affine_kernel");
  return 0;
}

__global__ void axpy_kernel(float *a, float alpha, const float *b, tt_bcast bc, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t oa, ob;
    bcast_offsets(bc, i, &oa, &ob);
    a[i] += alpha * b[ob];
  }
}

static int axpy(float *a, float alpha, const float *b, const tt_bcast *bc) {
  int64_t n = bcast_numel(bc);
  if (n == 0) return 0;
  axpy_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(a, alpha, b, *bc, n);
  TT_CU_LAUNCHED("axpy_kernel");
  return 0;
}

template <typename A, typename B>
__global__ void axpy_half_kernel(A *a, float alpha, const B *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    tt_st(a, i, __fmaf_rn(alpha, tt_ld(b, i), tt_ld(a, i)));
}

static int axpy_half(void *a, int a_dtype, float alpha, const void *b, int b_dtype,
                     int64_t n) {
  TT_CHECK((a_dtype == TT_ELEM_BF16 || a_dtype == TT_ELEM_F16) &&
               (b_dtype == a_dtype || b_dtype == TT_ELEM_F32),
           "axpy_half: %s += %s; expected bf16 or f16, and the same or f32",
           tt_dtype_name(a_dtype), tt_dtype_name(b_dtype));
  if (n == 0) return 0;
  const unsigned blocks = tt_cuda_blocks(n, 256);
  cudaStream_t st = tt_cuda_cur_stream();
  if (a_dtype == TT_ELEM_BF16 && b_dtype == TT_ELEM_F32)
    axpy_half_kernel<<<blocks, 256, 0, st>>>((__nv_bfloat16 *)a, alpha, (const float *)b, n);
  else if (a_dtype == TT_ELEM_BF16)
    axpy_half_kernel<<<blocks, 256, 0, st>>>((__nv_bfloat16 *)a, alpha,
                                             (const __nv_bfloat16 *)b, n);
  else if (b_dtype == TT_ELEM_F32)
    axpy_half_kernel<<<blocks, 256, 0, st>>>((__half *)a, alpha, (const float *)b, n);
  else
    axpy_half_kernel<<<blocks, 256, 0, st>>>((__half *)a, alpha, (const __half *)b, n);
  TT_CU_LAUNCHED("axpy_half_kernel");
  return 0;
}

extern "C" const tt_elementwise_kernels tt_elementwise_cuda = {
  binary, binary_backward, affine, axpy, axpy_half,
};

TT_CUDA_FAMILY(elementwise)
