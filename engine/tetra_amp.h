/*
** tetra_amp.h — mixed precision: the dynamic loss scaler (fp16) and FP8 scaling
** (e4m3 forward, e5m2 gradients) with delayed scaling from an amax history.
**
** Everything here runs on CPU as well as on CUDA: on CPU the FP8 values are quantised
** and dequantised in C (emulation), which is how the logic is tested without a GPU.
** Flat C only: lua/tetra/ffi.lua feeds this header to ffi.cdef.
*/
#ifndef TETRA_AMP_H
#define TETRA_AMP_H
#include "tetra.h"

/* -- Dynamic loss scaler (engine/optim/amp.c) --------------------------------------------- */

/* Zero fields of the config take the defaults shown (those of torch.cuda.amp). */
typedef struct tt_loss_scaler_config {
  double init_scale;       /* 65536 */
  double growth_factor;    /* 2: scale *= growth after growth_interval clean steps */
  double backoff_factor;   /* 0.5: scale *= backoff on a step with inf/NaN grads */
  int64_t growth_interval; /* 2000 */
  double min_scale;        /* 1: the scale never backs off below this */
  double max_scale;        /* 2^24: nor grows above this (fp32 grads stay exact) */
} tt_loss_scaler_config;

/* Plain data: a checkpoint saves and restores these fields as they are. */
typedef struct tt_loss_scaler {
  tt_loss_scaler_config cfg;
  double scale;            /* the current loss scale */
  int64_t good_steps;      /* clean steps since the scale last changed */
  int64_t skipped_steps;   /* steps skipped for non-finite grads, in total */
  int64_t steps;           /* updates seen, in total */
  int last_skipped;        /* 1 when the last update skipped its step */
} tt_loss_scaler;

/* Fills the defaults into zero fields; errors on factors out of range. cfg may be NULL. */
int tt_loss_scaler_init(tt_loss_scaler *s, const tt_loss_scaler_config *cfg);
/* Multiplies every grad of the n params by 1/scale in place and sets *found_inf to 1
** when any grad element is inf or NaN (the grads are then left unusable: skip the step).
** Params without a grad are skipped. */
int tt_loss_scaler_unscale(const tt_loss_scaler *s, tt_tensor *const *params, int n,
                           int *found_inf);
/* Ends a step: on found_inf backs the scale off and counts a skip; otherwise counts a
** clean step and grows the scale every growth_interval clean steps. Returns 1 when the
** optimizer step must be skipped, 0 when it may run. */
int tt_loss_scaler_update(tt_loss_scaler *s, int found_inf);

/* grad *= inv_scale for every grad of the n params, in place (f32, bf16 or f16; any
** device), and *found_inf = 1 when an element is inf or NaN before scaling. inv_scale 1
** only checks. */
int tt_grads_unscale_check(tt_tensor *const *params, int n, double inv_scale,
                           int *found_inf);

/* -- FP8 scaling (engine/ops/fp8.c) ----------------------------------------------------- */

enum { TT_FP8_MAX_HISTORY = 1024 };

/* Delayed scaling of one tensor: values are stored as fp8(x * scale), and the scale
** comes from the largest |x| seen over the last history_len quantisations:
**   scale = fp8_max / amax * 2^-margin. */
typedef struct tt_fp8_meta {
  int dtype;               /* TT_E4M3 or TT_E5M2 */
  int history_len;         /* 1 .. TT_FP8_MAX_HISTORY */
  int margin;              /* headroom in powers of two */
  int pos;                 /* next slot of the ring */
  int filled;              /* slots holding an amax */
  int quantised;           /* recorded quantisations: the first one (0 before it) scales
                           ** from its tensor's own amax; a later one at the delayed scale,
                           ** even when every amax so far was 0 or non-finite (the device
                           ** cannot tell the host without a sync) */
  double scale;
  float amax_history[1024];
} tt_fp8_meta;

/* history_len 0 means 16. */
int tt_fp8_meta_init(tt_fp8_meta *m, int dtype, int history_len, int margin);
/* Records one amax (ignored when 0 or non-finite) and recomputes the scale. */
void tt_fp8_meta_update(tt_fp8_meta *m, double amax);
/* Largest magnitude an fp8 dtype holds: 448 (e4m3), 57344 (e5m2); 0 otherwise. */
double tt_fp8_max(int dtype);

/* q = fp8(x * scale), a new tensor of dtype TT_E4M3 / TT_E5M2, shaped like x; *amax (may
** be NULL) gets max |x|. Saturates at the fp8 maximum. No grad. */
int tt_fp8_quantize(tt_tensor *x, int dtype, double scale, tt_tensor **out, double *amax);
/* out = float(q) / scale, a new f32 tensor. No grad. */
int tt_fp8_dequantize(tt_tensor *q, double scale, tt_tensor **out);
/* Quantise then dequantise in one pass: a new f32 tensor holding the values x takes
** after a round trip through fp8 at this scale. No grad. */
int tt_fp8_fake_quantize(tt_tensor *x, int dtype, double scale, tt_tensor **out,
                         double *amax);

/* scale = (fp8_max / amax) * 2^-margin, computed in float in that order (the device
** computes it so, and both sides must hold the same scale). */
float tt_fp8_scale_from_amax(int dtype, float amax, int margin);

/* The scaling state of one FP8 linear layer: its input and weight (e4m3) and the
** gradient of its output (e5m2). Owned by the caller (the nn layer), which keeps it alive
** until the backward of every forward that used it has run, then calls
** tt_fp8_linear_state_release. amax_group (a tt_comm *, tetra_dist.h; NULL for none):
** the ranks that run this layer on other parts of the batch or hold other parts of it
** (a pipeline stage's tp x cp x dp ranks); every amax is agreed over them (all-reduce
** MAX) before it joins a history, so their scales are those of one process on the whole
** batch. Set it before the first forward; every rank of the group then runs the layer's
** forward and backward in the same order (as the parallel step does).
** device: the CUDA copy of the metas (engine/cuda/fp8_linear.cu), made on the first
** CUDA forward; tt_fp8_linear_state_sync brings it back into x, w and g.
** fast_accum: the forward GEMM uses cuBLASLt's fast accumulation (Hopper keeps the
** running sums in the tensor cores' reduced precision instead of promoting them to fp32
** along k): faster, slightly less exact. The backward GEMMs never do. CUDA only: the CPU
** emulation has no model of that arithmetic, so a CPU forward with it set is refused. */
typedef struct tt_fp8_linear_state {
  tt_fp8_meta x;
  tt_fp8_meta w;
  tt_fp8_meta g;
  void *amax_group;
  void *device;
  int fast_accum;
} tt_fp8_linear_state;

int tt_fp8_linear_state_init(tt_fp8_linear_state *st, int history_len, int margin);
/* Frees the device copy (nothing on the CPU); the host metas stay. */
void tt_fp8_linear_state_release(tt_fp8_linear_state *st);
/* Copies the device metas (if any) into st->x, w, g (a host sync: for checkpoints), or,
** with to_device = 1, the host metas into the device copy (after a checkpoint load). */
int tt_fp8_linear_state_sync(tt_fp8_linear_state *st, int to_device);
/* Like tt_linear (x: (..., in), w: (out, in), bias: (out) or NULL -> (..., out)) as an
** FP8 GEMM: x and w quantised to e4m3 and, in backward, the output gradient to e5m2,
** each with its delayed scale from `st` (a meta's first quantisation, with an empty
** history, scales from the tensor's own amax). The arithmetic is that of cuBLASLt's FP8
** GEMMs (fp32 sums of exact fp8 products, the inverse scales and the bf16 bias applied
** in the epilogue, the output and dX rounded to bf16, dW in f32): on CUDA tensors it is
** that GEMM, on the CPU an emulation of it (engine/ops/fp8.c says exactly what). Output in
** x's dtype. Differentiable in x, w and bias. */
int tt_fp8_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias, tt_fp8_linear_state *st,
                  tt_tensor **out);

/* -- Low-precision weight copies (engine/optim/lowp_weight.c) ------------------------------ */
/*
** Under train.precision = bf16 / fp16 the GEMMs read a bf16 (f16) copy of each f32 master
** weight. The copy hangs off the weight's header and is remade only when the weight's
** storage changed since: every in-place write (tt_copy_, tt_fill_, tt_axpy_, set, the
** optimizer) bumps the storage's version, and a copy made at another version is stale.
** An optimizer that writes the master weight can write the copy in the same pass:
** tt_lowp_weight_buffer gives it the copy's buffer, and after the step it calls
** tt_tensor_bump_version(w) and then tt_lowp_weight_mark_fresh(w).
*/

/* The version of t's storage: how many in-place writes it has seen. */
int64_t tt_tensor_version(const tt_tensor *t);
/* Records an in-place write of t's data done outside the engine's own ops (a kernel
** writing the pointer, a collective, a file read into it). */
void tt_tensor_bump_version(tt_tensor *t);
/* w's copy in dtype (TT_BF16 or TT_F16), contiguous, on w's device; made (a cast) when
** absent or stale. *out is a new reference. w: a float tensor. No grad. */
int tt_lowp_weight(tt_tensor *w, int dtype, tt_tensor **out);
/* The copy's buffer in dtype, allocated when absent, without casting anything: for an
** optimizer that writes it. *out is a new reference. Mark it fresh once written. */
int tt_lowp_weight_buffer(tt_tensor *w, int dtype, tt_tensor **out);
/* The copies of n weights of one column count as consecutive row blocks of one buffer
** (n_0 + n_1 + ..., in): each weight's copy (tt_lowp_weight, the optimizer's buffer) is
** its block, so the group is cast once per change like a single weight, and *out (a new
** reference) is the whole buffer, read by one GEMM (tt_linear_lowp_group). */
int tt_lowp_weight_group(tt_tensor *const *ws, int n, int dtype, tt_tensor **out);
/* The copy holds w's current values (it was written alongside w's last write). */
int tt_lowp_weight_mark_fresh(tt_tensor *w);
/* Drops w's copy (frees its memory). */
void tt_lowp_weight_drop(tt_tensor *w);
/* Optimizer offload with the f32 master weights on the host (tetra.optim's AdamW under
** bf16 / fp16): through forward and backward a weight that only the GEMMs read keeps just
** its copy on the device. release_master gives w's f32 memory back; w must own its
** storage whole and have a current copy; its header, copy and version stay, so the GEMMs
** go on reading the copy, and tt_lowp_weight refuses to cast from the missing master.
** restore_master takes the memory again (contents undefined until written; the version
** moves, so mark the copy fresh once the master is written back). tt_tensor_resident:
** whether t's memory is on its device (0 after release_master). */
int tt_lowp_weight_release_master(tt_tensor *w);
int tt_lowp_weight_restore_master(tt_tensor *w);
int tt_tensor_resident(const tt_tensor *t);
/* How many casts tt_lowp_weight has made in this process (a counter for tests and
** metrics). */
int64_t tt_lowp_weight_casts(void);
/* y = x W^T + b under bf16 / fp16 (dtype) with W's cached copy: x rounded to dtype,
** fp32 sums, y in x's dtype. On CUDA the tensor-core GEMM of tetra_cuda_lowp.h; on the
** cpu an exact emulation of its arithmetic (operands and the output gradient rounded,
** f32 GEMMs). Differentiable in x, w (an f32 gradient for an f32 master) and bias. */
int tt_linear_lowp(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int dtype, tt_tensor **out);
/* The same with the output's dtype chosen: f32, or dtype itself (bf16 activations between
** GEMMs: the fp32 sums rounded once). x may be f32 or dtype (widened exactly, not
** rounded again); its gradient comes in x's dtype. tt_linear_lowp writes f32 for an f32
** x and dtype for an x in dtype. */
int tt_linear_lowp_ex(tt_tensor *x, tt_tensor *w, tt_tensor *bias, int dtype, int out_dtype,
                      tt_tensor **out);
/* Several Linear layers on one x in one GEMM (fused QKV, fused w1 | w3): outs[j] =
** x W_j^T + b_j as tt_linear_lowp_ex computes it, all from one product with the
** weights' copies side by side (tt_lowp_weight_group). n: 1 to 3; biases: NULL, or one
** per weight. Each outs[j] is a view of the shared (..., sum of out features) result
** (its rows strided); backward runs one dX GEMM and one dW GEMM per weight. */
int tt_linear_lowp_group(tt_tensor *x, tt_tensor *const *ws, tt_tensor *const *biases, int n,
                         int dtype, int out_dtype, tt_tensor **outs);

#endif
