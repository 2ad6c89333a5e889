/*
** tetra_ops.h — differentiable ops (part of the public API, included by tetra.h).
**
** Every op: validates shapes/dtypes/devices (error message names the op, the shapes and
** what was expected), allocates its output (caller owns it), runs the kernel of the
** input's device through that op family's backend table, and — when grad mode is on and
** an input requires grad — records a node on the tape. Inputs may be strided views.
** Float ops take f32 on CPU; index tensors are i32 or i64.
*/

/* -- Elementwise (kernels/cpu/elementwise.c) ---------------------------------------- */
/* Binary ops broadcast numpy-style. */
int tt_add(tt_tensor *a, tt_tensor *b, tt_tensor **out);
int tt_sub(tt_tensor *a, tt_tensor *b, tt_tensor **out);
int tt_mul(tt_tensor *a, tt_tensor *b, tt_tensor **out);
int tt_div(tt_tensor *a, tt_tensor *b, tt_tensor **out);
int tt_scale(tt_tensor *a, double s, tt_tensor **out);          /* a * s */
int tt_add_scalar(tt_tensor *a, double s, tt_tensor **out);     /* a + s */
/* In-place, no grad: a += alpha * b (same shape). Used by optimizers and accumulation. */
int tt_axpy_(tt_tensor *a, double alpha, const tt_tensor *b);

/* -- Activations (kernels/cpu/activation.c) ----------------------------------------- */
int tt_silu(tt_tensor *x, tt_tensor **out);
int tt_gelu(tt_tensor *x, tt_tensor **out);                     /* tanh approximation */
int tt_swiglu(tt_tensor *gate, tt_tensor *up, tt_tensor **out); /* silu(gate) * up */

/* -- Reductions (kernels/cpu/reduce.c) ---------------------------------------------- */
/* dims: list of `ndims` dims (negative counts from the end); ndims 0 = all dims. */
int tt_sum(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out);
int tt_mean(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out);
int tt_max(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out);
int tt_softmax(tt_tensor *x, int dim, tt_tensor **out);

/* -- Matmul (kernels/cpu/matmul.c) -------------------------------------------------- */
/* a: (..., M, K) or (..., K, M) when trans_a; b: (K, N) / (N, K) when trans_b, either 2-D
** (shared by every batch) or with the same leading dims as a. bias: (N) or NULL.
** out: (..., M, N). */
int tt_matmul(tt_tensor *a, tt_tensor *b, tt_tensor *bias, int trans_a, int trans_b,
              tt_tensor **out);
/* x: (..., in), w: (out, in), bias: (out) or NULL -> (..., out). */
int tt_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias, tt_tensor **out);

/* -- Embedding (kernels/cpu/embedding.c) -------------------------------------------- */
/* weight: (V, D), ids: any shape, i32/i64 -> (ids..., D). Backward is a scatter-add. */
int tt_embedding(tt_tensor *weight, tt_tensor *ids, tt_tensor **out);
/* The same with the rows in out_dtype: TT_F32, or TT_BF16 (rounded from the f32 table;
** the gradient, bf16 too, is summed into the f32 table's in f32). */
int tt_embedding_ex(tt_tensor *weight, tt_tensor *ids, int out_dtype, tt_tensor **out);
/* A vocabulary-parallel rank's share: weight holds the rows of ids [start, start + V);
** token i gets row ids[i] - start, or a row of zeros when its id is another rank's (no
** error: the ranks' rows are summed), and only this rank's ids receive gradient. */
int tt_embedding_band(tt_tensor *weight, tt_tensor *ids, int64_t start, int out_dtype,
                      tt_tensor **out);

/* -- Normalisation (kernels/cpu/norm.c) --------------------------------------------- */
/* Over the last dim. weight/bias: (D) or NULL. */
int tt_rmsnorm(tt_tensor *x, tt_tensor *weight, double eps, tt_tensor **out);
int tt_layernorm(tt_tensor *x, tt_tensor *weight, tt_tensor *bias, double eps,
                 tt_tensor **out);
/* The pre-norm block's residual add and RMSNorm in one pass (engine/ops/fused.c):
** *h_out = x + residual (x's dtype; x itself, retained, when residual is NULL),
** *y_out = rmsnorm(h) * weight in y_dtype. x, residual: f32 or bf16, same shape and dtype;
** weight: f32 (D) or NULL; y_dtype: TT_F32 or TT_BF16. Differentiable in x, residual and
** weight; the statistics are f32. */
int tt_add_rms_norm(tt_tensor *x, tt_tensor *residual, tt_tensor *weight, double eps,
                    int y_dtype, tt_tensor **h_out, tt_tensor **y_out);
/* The same with LayerNorm: *y_out = layernorm(h) * weight + bias (bias: f32 (D) or NULL);
** also differentiable in bias. */
int tt_add_layer_norm(tt_tensor *x, tt_tensor *residual, tt_tensor *weight, tt_tensor *bias,
                      double eps, int y_dtype, tt_tensor **h_out, tt_tensor **y_out);

/* -- Rotary embedding (kernels/cpu/rope.c) ------------------------------------------ */
/* x: (B, T, H, Dh) f32 or bf16, Dh even (out: x's dtype, rotated in f32). positions: (T)
** i32/i64, or NULL for 0..T-1. interleaved = 0: rotate-half (Llama/HF: pairs (i, i +
** Dh/2)); interleaved = 1: pairs (2i, 2i + 1) (Meta's original). */
int tt_rope(tt_tensor *x, tt_tensor *positions, double theta, int interleaved,
            tt_tensor **out);
/* The same rotating x's own memory (x: contiguous, not a leaf that requires grad): *out
** shares it, and x holds the rotated values afterwards. Backward never reads x, so this
** is safe wherever nothing else kept x for its own backward (a projection's output, say). */
int tt_rope_(tt_tensor *x, tt_tensor *positions, double theta, int interleaved,
             tt_tensor **out);

/* -- Attention (kernels/cpu/attention.c) -------------------------------------------- */
/* q: (B, Tq, Hq, Dh), k and v: (B, Tk, Hkv, Dh), Hq a multiple of Hkv (grouped-query).
** out: (B, Tq, Hq, Dh). scale 0 means 1/sqrt(Dh). causal: key j is visible to query i
** when k_pos[j] <= q_pos[i]; positions default to 0..T-1 (q_pos, k_pos: (T) i32/i64, or
** NULL). Blocked: never holds a (B, H, Tq, Tk) score tensor. */
int tt_attention(tt_tensor *q, tt_tensor *k, tt_tensor *v, int causal, double scale,
                 tt_tensor **out);
int tt_attention_ex(tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *q_pos,
                    tt_tensor *k_pos, int causal, double scale, tt_tensor **out);

/* -- Loss (kernels/cpu/loss.c) ------------------------------------------------------ */
/* logits: (..., V) f32, targets: (...) i32/i64. Mean over targets != ignore_index.
** Fused: the softmax is never stored; backward recomputes it row by row. out: scalar.
** All targets ignored: loss 0 and zero gradient. */
int tt_cross_entropy(tt_tensor *logits, tt_tensor *targets, int64_t ignore_index,
                     tt_tensor **out);

/* -- Optimizers (kernels/cpu/optim.c) ----------------------------------------------- */
typedef struct tt_adamw_config {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;   /* decoupled: p -= lr * wd * p */
  /* tt_adamw_multi only: nonzero takes lr and the step's bias corrections from the stats
  ** (TT_STAT_LR..TT_STAT_BC2, written by tt_step_stats_set_update) instead of lr and step,
  ** so that a captured update replays with each step's values. */
  int lr_from_stats;
} tt_adamw_config;
/* One fused AdamW step over n parameters, using params[i]->grad (params without grad are
** skipped). m and v: f32 state tensors shaped like the params. step: 1-based, for bias
** correction. */
int tt_adamw_step(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                  int n, const tt_adamw_config *cfg, int64_t step);
int tt_sgd_step(tt_tensor *const *params, tt_tensor *const *momentum, int n, double lr,
                double mu, double weight_decay);
/* Global L2 norm of the grads of n params (missing grads count as zero). */
int tt_grad_norm(tt_tensor *const *params, int n, double *out);
/* Scales all grads by min(1, max_norm / (norm + 1e-6)); returns the norm before. */
int tt_clip_grad_norm(tt_tensor *const *params, int n, double max_norm, double *out_norm);

/* -- The step's device-side scalars (engine/optim/step_stats.c, engine/optim/optim.c) -------- */
/* One f32 tensor of TT_STEP_STATS_N values on the parameters' device holds what a step
** computes and decides on the device: the multi-tensor AdamW reads the gradient scale and
** found_inf from it, the gradient norm and the loss land in it, and the host reads it with
** one copy per step (the step's one synchronisation on CUDA). */
enum {
  TT_STAT_LOSS = 0,        /* the step's loss, for the log line (written by the step) */
  TT_STAT_GRAD_NORM = 1,   /* the global gradient norm before clipping */
  TT_STAT_FOUND_INF = 2,   /* nonzero: a gradient was inf or NaN; AdamW skips */
  TT_STAT_GRAD_SCALE = 3,  /* AdamW multiplies every gradient by it (the clip coefficient) */
  TT_STAT_SUMSQ_HI = 4,    /* the float64 sum of squares of the grads as two floats */
  TT_STAT_SUMSQ_LO = 5,
  TT_STAT_ERRORS = 6,      /* device-side input checks that failed (tt_step_stats_errors) */
  TT_STAT_SPIKE = 7,       /* nonzero: the loss was above TT_STAT_LOSS_LIMIT (AdamW skips) */
  /* The update's inputs that change every step, set by the host before the step (a reset
  ** leaves them): the learning rate and the bias corrections 1 - beta^step. */
  TT_STAT_LR = 8,
  TT_STAT_BC1 = 9,
  TT_STAT_BC2 = 10,
  /* fp16's loss scale and its inverse, set by the host before the step (a reset leaves
  ** them): the backward's seed is multiplied by the one, the grads by the other. */
  TT_STAT_LOSS_SCALE = 11,
  TT_STAT_INV_SCALE = 12,
  /* The loss guard's spike limit (tt_step_stats_set_loss_limit; NaN or inf: none). */
  TT_STAT_LOSS_LIMIT = 13,
  TT_STEP_STATS_N = 16
};
/* A new stats tensor on device, reset (tt_step_stats_reset); the update slots hold NaN
** until tt_step_stats_set_update writes them. */
int tt_step_stats_new(int device, tt_tensor **out);
/* Every slot before TT_STAT_LR 0 but TT_STAT_GRAD_SCALE, 1; stream-ordered, no wait on the
** device. */
int tt_step_stats_reset(tt_tensor *stats);
/* The update slots: TT_STAT_LR = lr, TT_STAT_BC1/BC2 = 1 - beta1^step, 1 - beta2^step
** (computed in float64, as tt_adamw_multi does from its step argument). On CUDA by small
** kernels, no wait: launched before a replayed step, they feed its captured update. */
int tt_step_stats_set_update(tt_tensor *stats, double lr, double beta1, double beta2,
                             int64_t step);
/* TT_STAT_LOSS_SCALE = scale, TT_STAT_INV_SCALE = 1 / scale (scale > 0, finite); on CUDA
** by small kernels, no wait. */
int tt_step_stats_set_scale(tt_tensor *stats, double scale);
/* TT_STAT_LOSS_LIMIT = limit (+inf: no spike check); the same way. */
int tt_step_stats_set_loss_limit(tt_tensor *stats, double limit);
/* The sum of squares of the grads of n params (missing grads count as zero) into the
** TT_STAT_SUMSQ_* slots; on the device, deterministic, no wait. */
int tt_grad_sumsq(tt_tensor *const *params, int n, tt_tensor *stats);
/* From the TT_STAT_SUMSQ_* slots, or with gathered (not NULL) from those of every rank
** that holds a different part of the model (an f32 tensor of (hi, lo) pairs, all-gathered
** on the device), added in order in float64: the norm sqrt(sum / replicas) into
** TT_STAT_GRAD_NORM and min(1, max_norm / (norm + 1e-6)) into TT_STAT_GRAD_SCALE (1 when
** max_norm <= 0 or the norm is not finite; a norm that is not finite also sets
** TT_STAT_FOUND_INF, so tt_adamw_multi skips the update). No wait. */
int tt_clip_finish(tt_tensor *stats, tt_tensor *gathered, double replicas, double max_norm);
/* stats[TT_STAT_LOSS] = the one value of loss (a device copy); a loss that is not finite
** also sets TT_STAT_FOUND_INF, and one above TT_STAT_LOSS_LIMIT sets it and TT_STAT_SPIKE,
** so the update that follows is skipped. No wait. */
int tt_step_stats_set_loss(tt_tensor *stats, tt_tensor *loss);
/* Divides the grads of n params by the loss scale in place (f32, bf16 or f16 grads) and
** sets stats[TT_STAT_FOUND_INF] to 1 when one held inf or NaN; on CUDA without waiting. */
int tt_grads_unscale_to_stats(tt_tensor *const *params, int n, double inv_scale,
                              tt_tensor *stats);
/* The same with the inverse scale read from stats[TT_STAT_INV_SCALE] (set by
** tt_step_stats_set_scale), on the device: a captured unscale replays with each step's. */
int tt_grads_unscale_by_stats(tt_tensor *const *params, int n, tt_tensor *stats);
/* The step's one read: copies the TT_STEP_STATS_N values to out (host). With CUDA deferred
** checks on, a recorded failure (an embedding id or a cross-entropy target out of range)
** makes it return -1 with that op's message. */
int tt_step_stats_read(tt_tensor *stats, float *out);
/* tt_adamw_step over every parameter of the list in a few launches (params, m, v on one
** device), with each gradient multiplied by stats[TT_STAT_GRAD_SCALE] and nothing written
** when stats[TT_STAT_FOUND_INF] is nonzero (stats may be NULL: scale 1, no skip). bf16:
** NULL, or per parameter NULL or a contiguous bf16 tensor of its numel that receives the
** updated weight rounded to nearest even. Bitwise tt_adamw_step on CPU when the scale is 1
** (on gradients pre-multiplied by it otherwise). */
int tt_adamw_multi(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                   tt_tensor *const *bf16, int n, const tt_adamw_config *cfg, int64_t step,
                   tt_tensor *stats);
/* The offloaded update on a thread of its own (engine/optim/adamw_jobs.c): job i is
** tt_adamw_multi(&params[i], &m[i], &v[i], NULL, 1, &cfgs[i], step, stats) on host
** tensors (gradients in params[i]->grad), run in order while the caller goes on. wait
** returns once job i is done (the error of the first failed job up to i, if any); finish
** waits for the last job and frees the jobs (every job's tensors are the caller's again).
** One worker thread runs every started set in turn, with the OpenMP thread count the
** starting thread had (tt_set_num_threads). */
typedef struct tt_adamw_jobs tt_adamw_jobs;
int tt_adamw_jobs_start(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                        const tt_adamw_config *cfgs, int n, int64_t step, tt_tensor *stats,
                        tt_adamw_jobs **out);
int tt_adamw_jobs_wait(tt_adamw_jobs *j, int i);
int tt_adamw_jobs_finish(tt_adamw_jobs *j);
/* For tests: workers started in this process (1 once any set ran) and the OpenMP thread
** count the last set ran with. */
void tt_adamw_jobs_worker_info(int64_t *thread_starts, int *last_threads);
