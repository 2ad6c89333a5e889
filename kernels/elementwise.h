/*
** elementwise.h — kernel table of the elementwise family: broadcasting binary ops
** (add, sub, mul, div), affine maps (scale, add-scalar) and axpy.
**
** Kernels see raw f32 buffers plus sizes. A broadcast is described by tt_bcast: the
** output is contiguous over `shape`, each input is read through its own strides (0 on
** a broadcast dim), so a strided or expanded input needs no copy. The engine collapses
** dims before calling, so most calls arrive with ndim 1 or 2.
*/
#ifndef TT_KERNELS_ELEMENTWISE_H
#define TT_KERNELS_ELEMENTWISE_H
#include <stdint.h>

typedef enum tt_binary_op {
  TT_BINARY_ADD = 0,
  TT_BINARY_SUB = 1,
  TT_BINARY_MUL = 2,
  TT_BINARY_DIV = 3
} tt_binary_op;

/* out (shape) is contiguous; input a's element at index (i0, .., in) sits at
** a + sum_d i_d * stride_a[d]; same for b. */
typedef struct tt_bcast {
  int ndim;
  int64_t shape[8];
  int64_t stride_a[8];
  int64_t stride_b[8];
} tt_bcast;

typedef struct tt_elementwise_kernels {
  /* out (shape) = a (op) b, inputs read through bc's strides. */
  int (*binary)(int op, float *out, const float *a, const float *b, const tt_bcast *bc);
  /* Full-shape input gradients of out = a (op) b, from the contiguous upstream g (shape):
  **   mul: ga = g * b,  gb = g * a;   div: ga = g / b,  gb = -g * a / b^2.
  ** ga and gb are contiguous (shape); either may be NULL when not wanted. add and sub
  ** need no kernel (their gradients are g and -g). */
  int (*binary_backward)(int op, float *ga, float *gb, const float *g, const float *a,
                         const float *b, const tt_bcast *bc);
  /* out (n) = a (n) * mul + add. Forward of scale / add-scalar, backward of scale. */
  int (*affine)(float *out, const float *a, int64_t n, float mul, float add);
  /* a (shape, contiguous) += alpha * b, b read through bc->stride_b (stride_a unused). */
  int (*axpy)(float *a, float alpha, const float *b, const tt_bcast *bc);
  /* a (n, contiguous, bf16 or f16: a_dtype) += alpha * b (n, contiguous, a's dtype or
  ** f32: b_dtype): each element widened to f32, a + alpha * b as one fused multiply-add,
  ** rounded once into a. How a low-precision activation's gradient receives its second
  ** contribution, in one pass. */
  int (*axpy_half)(void *a, int a_dtype, float alpha, const void *b, int b_dtype, int64_t n);
} tt_elementwise_kernels;

extern const tt_elementwise_kernels tt_elementwise_cpu;
extern const tt_elementwise_kernels tt_elementwise_cuda __attribute__((weak));

#endif
