/*
** tt_internal.h — what engine modules share but users do not see: the autograd node and
** tape, helpers for writing ops, device backends (the kernels' own needs are in
** kernels/kernel.h, which common/common.h includes).
*/
#ifndef TT_INTERNAL_H
#define TT_INTERNAL_H
#include "tetra.h"
#include "common/common.h"   /* errors (and kernel.h's TT_CHECK / TT_TRY), buffers, JSON */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Autograd ----------------------------------------------------------------------- */

enum { TT_NODE_MAX_INPUTS = 8, TT_NODE_MAX_SAVED = 8 };

typedef struct tt_node tt_node;
/* Computes the gradients of node->inputs from grad_out (shaped like node->out) and adds
** each into its input with tt_accumulate_grad (skipping inputs where
** !tt_needs_grad(input)). */
typedef int (*tt_backward_fn)(tt_node *node, tt_tensor *grad_out);

struct tt_node {
  const char *name;                          /* op name, for errors and profiles */
  tt_backward_fn backward;
  void (*free_ctx)(void *ctx);               /* frees ctx; NULL when ctx is NULL or static */
  tt_tensor *out;                            /* retained */
  int n_inputs;
  tt_tensor *inputs[TT_NODE_MAX_INPUTS];     /* retained; may hold NULL (optional input) */
  int n_saved;
  tt_tensor *saved[TT_NODE_MAX_SAVED];       /* extra tensors kept for backward (retained) */
  double f[4];                               /* scalar arguments */
  int64_t i[8];                              /* integer arguments */
  void *ctx;                                 /* anything else */
  int whole;   /* 1: its backward has effects beyond the gradients (an fp8 amax history),
               ** so deferred gradients never split it in two runs (autograd.c) */
};

/* True when grad mode is on and any of the n inputs (NULLs allowed) requires grad. */
int tt_should_record(tt_tensor *const *inputs, int n);
/* Records a node producing `out` from `inputs`: retains out and inputs, marks out as
** requiring grad and non-leaf. Returns the node so the op can save tensors and scalars,
** or NULL on allocation failure (message set). Call only when tt_should_record(). */
tt_node *tt_record(const char *name, tt_backward_fn backward, tt_tensor *out,
                   tt_tensor *const *inputs, int n_inputs);
/* Retains t and stores it in node->saved[node->n_saved++]. */
void tt_node_save(tt_node *node, tt_tensor *t);
/* Activation recompute (autograd.c, tt_checkpoint): whether the running forward is a
** checkpointed block's first run (TT_CKPT_STASHING) or its re-run in backward
** (TT_CKPT_REPLAYING). An op whose forward reads state it then changes (an FP8 layer's
** scale, from an amax history it moves on) stashes what it read on the first run and, on
** the re-run, takes it back (tt_checkpoint_replay, in the same order) and changes nothing,
** so the re-run computes what the first run did and the state moves once. */
enum { TT_CKPT_OFF, TT_CKPT_STASHING, TT_CKPT_REPLAYING };
int tt_checkpoint_mode(void);
int tt_checkpoint_stash(const double *v, int n);   /* 0 (no-op) outside STASHING */
int tt_checkpoint_replay(double *v, int n);
/* The same for a value held in a tensor (a device's scales, which the host does not
** read): retained by the stash on the first run; on the re-run the next one, retained
** for the caller (the same tensor, not a copy). */
int tt_checkpoint_stash_tensor(tt_tensor *t);   /* 0 (no-op) outside STASHING */
int tt_checkpoint_replay_tensor(tt_tensor **out);
/* A forward with gradient recording off outside activation recompute (evaluation,
** generation, anything under no_grad) is inference: an FP8 layer then quantises at its
** current scales, records no amax and agrees nothing with its amax group, so it leaves
** training's scaling as it was and may run on some ranks of the group only
** (engine/ops/fp8.c, engine/cuda/fp8_linear.cu). Read at the op's entry. */
static inline int tt_fp8_inference(void) {
  return !tt_is_grad_enabled() && tt_checkpoint_mode() == TT_CKPT_OFF;
}
/* Selective recompute (tt_checkpoint_keep_gemms): a GEMM's output (its final tensor, of
** the caller's shape and dtype) kept on the block's first run, 0 (no-op) otherwise; and
** on the re-run the next kept one, checked against the shape, dtype and device the
** re-run would compute (*out NULL when nothing is kept: compute it). */
int tt_checkpoint_keep_output(tt_tensor *t);
/* tt_checkpoint_keep_output of a copy of t (the block may change t in place later); 0
** (no-op, no copy) unless a block that keeps its GEMM outputs is being stashed. */
int tt_checkpoint_keep_copy(tt_tensor *t);
int tt_checkpoint_take_output(const int64_t *shape, int ndim, int dtype, int device,
                              tt_tensor **out);
/* Whether GEMM outputs are being kept, and set that to on, returning what it was: an op
** that keeps its own final output (the CPU FP8 layer's bf16 Y, not the f32 product of the
** tt_matmul inside it) turns it off around that inner GEMM and back after. */
int tt_checkpoint_keep_swap(int on);
/* True when t takes part in autograd (requires_grad set). */
int tt_needs_grad(const tt_tensor *t);
/* t->grad += g (allocating t->grad as zeros on first use). g's shape must equal t's;
** g may be a strided view. Steals nothing: the caller still releases g. */
int tt_accumulate_grad(tt_tensor *t, tt_tensor *g);
/* True when t has a gradient buffer that a kernel may add into directly (beta = 1):
** t's dtype, device and shape, contiguous. tt_accumulate_grad is then not needed. */
int tt_grad_accumulates_in_place(const tt_tensor *t);
/* Reduces a broadcast gradient `g` back to `shape` (sums over broadcast dims).
** *out is a new tensor (or g retained when shapes already match). */
int tt_reduce_to_shape(tt_tensor *g, const int64_t *shape, int ndim, tt_tensor **out);

/* -- Helpers for ops ---------------------------------------------------------------- */

/* New contiguous tensor like t (same shape/dtype/device), uninitialised. */
int tt_empty_like(const tt_tensor *t, tt_tensor **out);
int tt_zeros_like(const tt_tensor *t, tt_tensor **out);
/* Contiguous version of t that records nothing on the tape: t itself (retained) when it
** already is. For ops that copy an input only to feed their kernel and record their own
** node against the original input (tt_contiguous would add a clone node whose copy stays
** alive until backward). */
int tt_contiguous_nograd(tt_tensor *t, tt_tensor **out);
/* dst = src's values rounded to dtype (bf16 or f16) and widened back, in one pass: what a
** copy to dtype and back gives, bit for bit, without the dtype tensor between. Both f32,
** contiguous, on the cpu, of one shape. */
int tt_round_f32_(tt_tensor *dst, const tt_tensor *src, int dtype);
/* Broadcast shape of a and b into shape/ndim, or an error naming `op`. */
int tt_broadcast_shape(const char *op, const tt_tensor *a, const tt_tensor *b,
                       int64_t *shape, int *ndim);
/* Checks: same device for n tensors; dtype equals `dtype`. Messages name `op`. */
int tt_check_same_device(const char *op, tt_tensor *const *ts, int n);
int tt_check_dtype(const char *op, const char *arg, const tt_tensor *t, int dtype);
int tt_check_float(const char *op, const char *arg, const tt_tensor *t);
int tt_check_index(const char *op, const char *arg, const tt_tensor *t);
/* Shape as text "[2, 3, 4]" into buf. */
const char *tt_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);
/* Normalises a possibly negative dim; error naming op when out of range. */
int tt_norm_dim(const char *op, int dim, int ndim, int *out);
/* A new header sharing base's storage and view (offset/shape/strides): a leaf with no
** grad. Views start from this and then adjust shape and strides. */
tt_tensor *tt_tensor_header_alias(tt_tensor *base);
/* Element count of a tensor's shape. Unchecked: every tensor's shape passed
** tt_shape_numel_checked when the tensor was made. */
int64_t tt_shape_numel(const int64_t *shape, int ndim);
/* Element count of a shape from outside (a file, a user call), or an error naming op when
** it has a bad dim count, a negative size, or a count or stride that overflows int64. */
int tt_shape_numel_checked(const char *op, const int64_t *shape, int ndim, int64_t *numel);
/* Strided/casting copy on a CUDA device; provided by the CUDA backend when built. */
int tt_cuda_copy_strided(tt_tensor *dst, const tt_tensor *src) __attribute__((weak));

/* Storage allocation through the device's caching allocator. */
tt_storage *tt_storage_new(size_t nbytes, int device);
void tt_storage_release(tt_storage *s);
/* ZeRO-3: frees a storage's memory, headers kept (data NULL until restored); restore
** allocates s->nbytes again (contents undefined) and bumps the storage's version. */
void tt_storage_evict(tt_storage *s);
int tt_storage_restore(tt_storage *s);
/* Takes s->nbytes of memory for a storage that has none (data NULL), leaving s->lazy. */
int tt_storage_take(tt_storage *s);
/* The values a lazy storage will hold (tensor.c): draws from the generator's state, or
** zeros. */
enum { TT_LAZY_UNIFORM, TT_LAZY_NORMAL, TT_LAZY_ZEROS };
typedef struct tt_lazy_init {
  int kind;            /* uniform in [a, b), normal(a = mean, b = std), or zeros */
  uint64_t state;      /* the generator's state before the draws */
  double a, b;
  int64_t numel;       /* f32 elements */
} tt_lazy_init;
/* Draws the lazy storage s's values now (thread-safe; no-op once drawn). */
int tt_lazy_materialize(tt_storage *s);

/* Attention positions (ops/attention.c) in host memory, a reference the caller releases:
** pos itself on the CPU; on a device, a host copy made once per storage and version and
** kept (with a reference to pos) among the last few, so that positions uploaded once
** (context parallelism's, cached by tetra.parallel.context) are read back once, not at
** every call. tt_attention_forget_positions drops the copies. */
int tt_attention_host_positions(tt_tensor *pos, tt_tensor **out);
void tt_attention_forget_positions(void);

/* -- Device backends ---------------------------------------------------------------- */
/* Each device provides raw memory; op families keep their own kernel tables
** (kernels/<family>.h) and pick the table with tt_device_is_cuda(). */
typedef struct tt_device_backend {
  const char *name;
  void *(*alloc)(size_t nbytes, int device);           /* NULL on failure */
  void (*free)(void *ptr, int device);
  /* Copies nbytes between any two devices (TT_CPU or ordinal). */
  int (*memcpy)(void *dst, int dst_device, const void *src, int src_device, size_t nbytes);
  int (*memset0)(void *ptr, int device, size_t nbytes);
  /* Streams (NULL for a device without them): the current stream's key (NULL: the
  ** default stream), and "work queued on the current stream from now on runs after
  ** everything queued so far on stream `key`" (no host wait). */
  void *(*current_stream)(void);
  int (*order_after)(int device, void *key);
  /* n f32 values at ptr set to value by a kernel, in stream order (NULL: none). */
  int (*fill_f32)(float *ptr, int device, int64_t n, float value);
  /* Timing marks for the op profile (NULL: none): record *mark (made first when NULL) in
  ** the current stream's order; the seconds from one recorded mark to a later one
  ** (waiting for the later); free one. */
  int (*mark_record)(int device, void **mark);
  int (*mark_seconds)(int device, void *from, void *to, double *out);
  void (*mark_free)(int device, void *mark);
} tt_device_backend;

/* The op profile's mark (engine/core/op_profile.c): autograd calls it at each record and
** around each node's backward while tt_op_profile_running() on this thread. name NULL:
** outside ops. */
void tt_op_profile_mark(const char *name, int phase);

/* The backend calls this when stream `key` is destroyed, after waiting for it: cached
** blocks last used there no longer need ordering, nor do storages and pooled blocks that
** still name it when they are freed (the key is remembered until tt_alloc_stream_born). */
void tt_alloc_stream_retired(int device, void *key);
/* ... and this when it creates a stream: a key the runtime hands out again is live. */
void tt_alloc_stream_born(int device, void *key);

/* A backend's alloc that fails for another reason than a lack of memory calls this
** (its message set first): the allocator then neither empties its cache and retries nor
** reports "out of memory". Per thread. */
void tt_alloc_failed_not_oom(void);

/* The CUDA backend registers itself at start-up when compiled in and a GPU exists. */
void tt_register_cuda_backend(const tt_device_backend *backend);
const tt_device_backend *tt_backend_for(int device);   /* NULL (error set) if absent */
static inline int tt_device_is_cuda(int device) { return device >= 0; }
/* An op family `fam` declares in kernels/fam.h a table type and two tables:
**   extern const tt_fam_kernels tt_fam_cpu;
**   extern const tt_fam_kernels tt_fam_cuda __attribute__((weak));   (in kernels/cuda/fam.cu)
** TT_KERNELS(tt_fam, device) picks one; NULL means "not built for that device". */
#define TT_KERNELS(fam, device) \
  (tt_device_is_cuda(device) ? (&fam##_cuda) : (&fam##_cpu))
/* Fails with "op: not implemented on cuda" style message when a family has no kernel. */
int tt_no_kernel(const char *op, int device);

/* Adds n to the bytes copied that tt_io_bytes reports (engine/io/checksum.c). */
void tt_io_count_copied(uint64_t n);

#endif
