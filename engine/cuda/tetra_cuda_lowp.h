/*
** tetra_cuda_lowp.h — low-precision GEMMs on CUDA tensors (engine/cuda/matmul_lowp.cu):
** the operands are rounded to bf16 (or fp16) and multiplied on the tensor cores with
** fp32 accumulation through cuBLASLt, the bias added in the GEMM's epilogue. This is the
** compute of train.precision = bf16: the parameters stay f32 (master weights, and the
** optimizer state beside them) and only the GEMMs see bf16 copies, made inside the op.
** Flat C only: lua/tetra/optim/amp.lua feeds this header to ffi.cdef.
*/
#ifndef TETRA_CUDA_LOWP_H
#define TETRA_CUDA_LOWP_H
#include "tetra.h"

/* Like tt_matmul (a: (..., M, K), or (..., K, M) when trans_a; b: (K, N) / (N, K) when
** trans_b, 2-D or with a's leading dims; bias: (N) or NULL; a may also be 1-D, one row)
** with both operands rounded to compute_dtype (TT_BF16 or TT_F16) and the products summed
** in fp32. a, b and bias live on one CUDA device and may have any float dtype (f32, bf16,
** f16) and any strides; out has a's dtype. Differentiable in a, b and bias: backward runs
** the same kind of GEMMs (the output gradient rounded to compute_dtype, fp32 sums) and
** gives each input a gradient of its own dtype, so an f32 master weight gets an f32
** gradient. */
int tt_cuda_matmul_lowp(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a,
                        int trans_b, int compute_dtype, tt_tensor **out);
/* The same written in out_dtype (f32 or compute_dtype). */
int tt_cuda_matmul_lowp_ex(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a,
                           int trans_b, int compute_dtype, int out_dtype, tt_tensor **out);
/* c (f32, contiguous (m, n)) = op(a) op(b) + beta c for matrices a and b, at compute_dtype
** with fp32 sums: a weight-gradient GEMM adding into an existing gradient (beta = 1). */
int tt_cuda_matmul_lowp_into(tt_tensor *a, tt_tensor *b, int trans_a, int trans_b,
                             int compute_dtype, tt_tensor *c, float beta);
/* x: (..., in), w: (out, in), bias: (out) or NULL -> (..., out), as tt_linear. */
int tt_cuda_linear_lowp(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int compute_dtype,
                        tt_tensor **out);
/* As tt_cuda_linear_lowp, with w's low-precision copy w_low (tt_lowp_weight: w's shape,
** compute_dtype, contiguous) read instead of a cast of w; w still receives the gradient.
** The GEMM writes out_dtype (f32, or compute_dtype: bf16 activations between GEMMs). */
int tt_cuda_linear_lowp_cached(tt_tensor *x, tt_tensor *w, tt_tensor *w_low, tt_tensor *bias,
                               int compute_dtype, int out_dtype, tt_tensor **out);
/* A contiguous copy of t (any float dtype, any strides, on a CUDA device) in dtype; t
** itself (retained) when it already is one. No grad. */
int tt_cuda_cast_contiguous(tt_tensor *t, int dtype, tt_tensor **out);

#endif
