/*
** attention.h — kernel table of the attention family: softmax(scale Q K^T + mask) V with
** grouped-query heads, blocked (flash-style) so that no (B, H, Tq, Tk) score tensor is
** ever held, forward and backward.
**
** Layout is the model's own (B, T, H, Dh): q is (B, Tq, Hq, Dh), k and v (B, Tk, Hkv, Dh).
** Query head h reads key/value head h / (Hq / Hkv), as in Llama's repeat_kv. q, k and v may
** be strided views (a narrowed fused-QKV projection, for instance): only the Dh dim must be
** contiguous, and the time stride must be at least Dh when T > 1. Everything else (out,
** dout, dq, dk, dv, lse) is contiguous.
**
** Masking (causal = 1): key j is visible to query i when k_pos[j] <= q_pos[i]. Positions
** default to 0..T-1 (NULL); explicit positions let context parallelism attend from one
** chunk of the sequence to another. A query that sees no key gets a zero output and
** lse = -inf.
**
** The forward saves lse = log(sum_j exp(s_ij)) per query row, (B, Hq, Tq); the backward
** recomputes the probabilities block by block from it (FlashAttention-2):
**   P = exp(S - lse), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
**   dQ = scale dS K, dK = scale dS^T Q; for GQA, dK and dV sum over the group's heads.
**
** Precision: the kernels above read and write f32. q, k and v in bf16 or f16 (out and the
** gradients in the same dtype, lse always f32) go first to the optional fused entries
** (cuDNN's flash attention on CUDA; NULL on the CPU), which take what they support and
** answer 0 for the rest; the engine then runs the f32 kernels on f32 copies and rounds
** the results (engine/ops/attention.c), which is also the CPU twin the fused path is
** tested against.
**
** Kernels take a workspace of f32 elements sized by the matching *_workspace entry (called
** just before, on the same thread) so that they never allocate. Every entry returns 0, or
** -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_ATTENTION_H
#define TT_KERNELS_ATTENTION_H
#include <stdint.h>

typedef struct tt_attention_args {
  int64_t batch, tq, tk, hq, hkv, dh;
  /* Element strides of the batch, time and head dims of q, k and v. */
  int64_t q_stride[3], k_stride[3], v_stride[3];
  /* Positions (tq) and (tk) in the kernel's device memory, or NULL for 0..T-1; and the
  ** same in host memory (NULL with them), for a kernel that plans its launches on them. */
  const int64_t *q_pos, *k_pos;
  const int64_t *q_pos_host, *k_pos_host;
  int causal;
  float scale;
} tt_attention_args;

typedef struct tt_attention_kernels {
  /* Workspace size in f32 elements for forward(a). */
  int64_t (*forward_workspace)(const tt_attention_args *a);
  /* out: (B, Tq, Hq, Dh), lse: (B, Hq, Tq). */
  int (*forward)(const tt_attention_args *a, const float *q, const float *k,
                 const float *v, float *out, float *lse, float *workspace);
  int64_t (*backward_workspace)(const tt_attention_args *a);
  /* out, dout: (B, Tq, Hq, Dh) and lse from forward; overwrites dq (B, Tq, Hq, Dh),
  ** dk and dv (B, Tk, Hkv, Dh). */
  int (*backward)(const tt_attention_args *a, const float *q, const float *k,
                  const float *v, const float *out, const float *lse, const float *dout,
                  float *dq, float *dk, float *dv, float *workspace);
  /* Optional fused low-precision path: dtype is bf16 or f16 for q, k, v, out, dout,
  ** dq, dk and dv (contiguous like the f32 ones); lse f32. 1 when it ran, 0 when it does
  ** not take these arguments (the caller falls back; nothing was written), -1 on error.
  ** Their workspace holds fused_workspace(a, backward) f32 elements (NULL when that is 0),
  ** aligned like a device allocation. */
  int64_t (*fused_workspace)(const tt_attention_args *a, int backward);
  int (*fused_forward)(const tt_attention_args *a, int dtype, const void *q, const void *k,
                       const void *v, void *out, float *lse, float *workspace);
  int (*fused_backward)(const tt_attention_args *a, int dtype, const void *q, const void *k,
                        const void *v, const void *out, const float *lse, const void *dout,
                        void *dq, void *dk, void *dv, float *workspace);
} tt_attention_kernels;

extern const tt_attention_kernels tt_attention_cpu;
extern const tt_attention_kernels tt_attention_cuda __attribute__((weak));

#endif
