/*
** tt_cudnn_sdpa.h — cuDNN's fused flash attention (engine/cuda/cudnn_sdpa.cu) for one
** block of queries against one block of keys, bf16 or f16, forward and backward. Declared
** beside the kernels: the CUDA attention kernel (kernels/cuda/attention.cu) calls it
** through the table tt_cuda_init hands it (tt_cuda_use_fused_sdpa), since the kernels sit
** below the engine's CUDA backend that implements it.
**
** Tensors are in the model's (B, T, H, Dh) layout with element strides (batch, time,
** head) and Dh contiguous; lse is f32 (B, Hq, Tq) with strides (batch, head) and the
** time dim contiguous, so a block of rows of a longer sequence is a pointer offset.
** Mask: none, or "key j visible to query i when j <= i + offset" (offset >= 0: the causal
** diagonal of a block pair whose first query sits `offset` positions after its first key).
*/
#ifndef TT_CUDNN_SDPA_H
#define TT_CUDNN_SDPA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct tt_sdpa_shape {
  int64_t b, hq, hkv, tq, tk, dh;
  int64_t q_stride[3], k_stride[3], v_stride[3];
  int64_t o_stride[3];     /* out, dout and dq */
  int64_t kv_grad_stride[3];   /* dk and dv */
  int64_t lse_stride[2];
  int dtype;               /* TT_BF16 or TT_F16 */
  int masked;
  int64_t offset;
  float scale;
} tt_sdpa_shape;

/* 1 when s can go to cuDNN at all (dtype, Dh 64 or 128, strides multiples of 8 elements,
** cuDNN loaded), else 0 (a line on stderr once per process says why, for the reasons a
** user can act on). Pointers still need 16-byte alignment (checked per call). */
int tt_cudnn_sdpa_supported(const tt_sdpa_shape *s);

/* out (o_stride), lse. 1 ran, 0 cuDNN refused the graph (nothing written; the caller
** falls back), -1 error with the message set. */
int tt_cudnn_sdpa_forward(const tt_sdpa_shape *s, const void *q, const void *k,
                          const void *v, void *out, float *lse);

/* dq (o_stride), dk and dv (kv_grad_stride) from the forward's out and lse (those of the
** whole attention, when this block pair is one of several). Same answers. */
int tt_cudnn_sdpa_backward(const tt_sdpa_shape *s, const void *q, const void *k,
                           const void *v, const void *out, const float *lse,
                           const void *dout, void *dq, void *dk, void *dv);

/* The fused attention as the attention kernel calls it: the three functions above. */
typedef struct tt_cuda_fused_sdpa {
  int (*supported)(const tt_sdpa_shape *s);
  int (*forward)(const tt_sdpa_shape *s, const void *q, const void *k, const void *v,
                 void *out, float *lse);
  int (*backward)(const tt_sdpa_shape *s, const void *q, const void *k, const void *v,
                  const void *out, const float *lse, const void *dout, void *dq, void *dk,
                  void *dv);
} tt_cuda_fused_sdpa;

/* Hands the attention kernel its fused path (NULL: none, every call falls back). */
void tt_cuda_use_fused_sdpa(const tt_cuda_fused_sdpa *f);

/* Builds the operations of the forward (backward = 0) or backward graph without a GPU
** (every tensor and operation descriptor finalized; the operation graph itself needs a
** device handle): their count, or 0 with cuDNN's reason in `why` (also when cuDNN is not
** loaded). Lets the graphs' descriptors be checked on a machine without a GPU. */
int tt_cudnn_sdpa_check_ops(const tt_sdpa_shape *s, int backward, char *why, size_t why_n);

/* cuDNN attention graphs run so far in this process (forward and backward each count):
** how a test tells the fused path from the fallback. */
int64_t tt_cudnn_sdpa_runs(void);

#ifdef __cplusplus
}
#endif
#endif
