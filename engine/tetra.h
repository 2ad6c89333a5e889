/*
** tetra.h — the public C API of the Tetra engine.
**
** This header is read twice: by the C compiler, and by LuaJIT's ffi.cdef (through
** lua/tetra/ffi.lua, which drops preprocessor lines and inlines the `#include "..."`
** lines below). So: flat C declarations only, enums instead of #define constants, no
** macros, no inline functions.
**
** Conventions (see shared/STYLE.md): every function that can fail returns int
** (0 = ok, -1 = error) and leaves a one-line message in tt_last_error(). Results come
** back through out-parameters named `out` / `pout`. A tensor returned through an
** out-parameter is owned by the caller (refcount 1): release it with tt_tensor_release.
*/
#ifndef TETRA_H
#define TETRA_H
#include <stddef.h>
#include <stdint.h>

/* -- Errors ------------------------------------------------------------------------- */

const char *tt_last_error(void);
void tt_clear_error(void);
/* Sets the message (a hook written in Lua reporting its error) and returns -1. */
int tt_fail(const char *msg);

/* -- Dtypes and devices ------------------------------------------------------------- */

typedef enum tt_dtype {
  TT_F32 = 0,
  TT_BF16 = 1,
  TT_F16 = 2,
  TT_E4M3 = 3,   /* fp8: 4 exponent bits, 3 mantissa bits, max 448, no inf */
  TT_E5M2 = 4,   /* fp8: 5 exponent bits, 2 mantissa bits, max 57344, has inf */
  TT_I32 = 5,
  TT_I64 = 6,
  TT_NUM_DTYPES = 7
} tt_dtype;

/* Device ids: TT_CPU, or a CUDA ordinal 0, 1, ... */
enum { TT_CPU = -1 };
enum { TT_MAX_DIMS = 8 };

const char *tt_dtype_name(int dtype);
int tt_dtype_from_name(const char *name);   /* -1 when unknown */
size_t tt_dtype_size(int dtype);
int tt_dtype_is_float(int dtype);

/* -- Storage and tensors ------------------------------------------------------------ */

typedef struct tt_storage {
  void *data;
  size_t nbytes;
  int device;
  int refcount;
  int external;        /* 1: memory not ours (mmap, caller buffer); never freed */
  void *stream;        /* the device stream current when it was allocated (NULL: default) */
  int64_t version;     /* bumped by every in-place write (tt_storage_bump_version) */
  struct tt_alloc_pool *pool;   /* the private pool it came from (tt_alloc_pool_use), or NULL */
  struct tt_lazy_init *lazy;    /* random values not drawn yet (tt_tensor_randn), or NULL */
} tt_storage;

typedef struct tt_tensor {
  tt_storage *storage;
  int64_t offset;                 /* in elements, into storage */
  int ndim;
  int64_t shape[8];
  int64_t stride[8];              /* in elements */
  int dtype;                      /* tt_dtype */
  int device;
  int refcount;
  int requires_grad;
  int is_leaf;                    /* created by the user, not by a recorded op */
  struct tt_tensor *grad;         /* accumulated gradient (leaves keep it) */
  int64_t tape_uses;              /* internal: pending uses during backward */
  int grad_deferred;              /* internal: during backward, its gradient waits for the
                                  ** deferred pass (tt_set_deferred_grads) */
  struct tt_tensor *lowp;         /* internal: cached bf16/f16 copy (tetra_amp.h), or NULL */
  int64_t lowp_version;           /* internal: storage version the copy was made from */
} tt_tensor;

/* Creation. `shape` has `ndim` entries. New tensors are contiguous, leaf, no grad. */
int tt_tensor_empty(const int64_t *shape, int ndim, int dtype, int device, tt_tensor **out);
int tt_tensor_zeros(const int64_t *shape, int ndim, int dtype, int device, tt_tensor **out);
int tt_tensor_full(const int64_t *shape, int ndim, int dtype, int device, double value,
                   tt_tensor **out);
/* Wraps caller memory (not freed, not copied). The caller keeps it alive. */
int tt_tensor_from_buffer(void *data, const int64_t *shape, int ndim, int dtype,
                          tt_tensor **out);
/* Copies `n` float64 values into a new f32 (or any dtype) tensor. */
int tt_tensor_from_f64(const double *values, const int64_t *shape, int ndim, int dtype,
                       tt_tensor **out);
/* randn and rand tensors are drawn lazily: no memory is taken and nothing is drawn until
** their data is first read (tt_tensor_data), and a copy from a view of one (a slice that
** tensor parallelism keeps, a ZeRO-3 share) draws that view's elements alone, so a rank
** of a model built whole never holds the whole model. The values are those an eager draw
** gives (element k is a function of the generator's state and k), and the generator
** advances at creation as ever. tt_tensor_materialize draws t's storage now (no-op when
** drawn); tt_tensor_is_lazy tells whether it is not yet. tt_set_lazy_init(0) makes
** randn and rand draw at once; it returns the previous setting (on by default). */
int tt_tensor_randn(const int64_t *shape, int ndim, double mean, double std,
                    tt_tensor **out);
int tt_tensor_rand(const int64_t *shape, int ndim, double lo, double hi, tt_tensor **out);
int tt_tensor_randint(const int64_t *shape, int ndim, int64_t lo, int64_t hi, int dtype,
                      tt_tensor **out);
/* f32 zeros on `device` whose memory is taken at first use, the same way (optimizer
** state: under ZeRO the whole-parameter moments an optimizer is built with are never
** allocated, only the shards' that replace them). */
int tt_tensor_lazy_zeros(const int64_t *shape, int ndim, int device, tt_tensor **out);
int tt_tensor_materialize(tt_tensor *t);
int tt_tensor_is_lazy(const tt_tensor *t);
int tt_set_lazy_init(int on);
void tt_manual_seed(uint64_t seed);
uint64_t tt_rng_state(void);
void tt_rng_set_state(uint64_t state);

void tt_tensor_retain(tt_tensor *t);
void tt_tensor_release(tt_tensor *t);     /* NULL is fine */

int64_t tt_tensor_numel(const tt_tensor *t);
int tt_tensor_is_contiguous(const tt_tensor *t);
/* Pointer to element 0 of the view (storage data + offset), host or device memory. */
void *tt_tensor_data(const tt_tensor *t);
/* Element at flat (row-major, logical) index, converted to double; on a device copied to
** the host first (a wait). NaN for an index out of range. */
double tt_tensor_get(const tt_tensor *t, int64_t flat_index);
int tt_tensor_set(tt_tensor *t, int64_t flat_index, double value);
/* Copies all elements (logical order) into `dst` as float64 / from float64. CPU only. */
int tt_tensor_to_f64(const tt_tensor *t, double *dst);
int tt_tensor_copy_from_f64(tt_tensor *t, const double *src);
/* Writes "f32[2, 3] cpu" into buf. */
const char *tt_tensor_describe(const tt_tensor *t, char *buf, size_t n);

/* Views share storage. These are differentiable (they record on the tape). */
int tt_view(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out);      /* -1 infers one dim; copies when not viewable */
/* As tt_view, but a non-contiguous t whose strides allow it (a run of dims split or
** merged, such as the last dim of a column block split into heads) gives a strided view,
** not a contiguous copy; only what cannot be viewed is copied. */
int tt_reshape(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out);
int tt_transpose(tt_tensor *t, int dim0, int dim1, tt_tensor **out);
int tt_permute(tt_tensor *t, const int *dims, int ndim, tt_tensor **out);
int tt_narrow(tt_tensor *t, int dim, int64_t start, int64_t length, tt_tensor **out);
int tt_expand(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out);
int tt_contiguous(tt_tensor *t, tt_tensor **out);   /* retains and returns t when already contiguous */
int tt_clone(tt_tensor *t, tt_tensor **out);        /* always a fresh contiguous copy */
/* Copies src into dst elementwise (same shape; any strides, any dtypes: casts). No grad. */
int tt_copy_(tt_tensor *dst, const tt_tensor *src);
int tt_cast(tt_tensor *t, int dtype, tt_tensor **out);                 /* differentiable */
int tt_to_device(tt_tensor *t, int device, tt_tensor **out);
int tt_fill_(tt_tensor *t, double value);

/* -- Allocator ---------------------------------------------------------------------- */

typedef struct tt_alloc_stats {
  int64_t live_bytes;      /* bytes held by live storages */
  int64_t peak_bytes;      /* high-water mark of live_bytes since the last reset */
  int64_t cached_bytes;    /* freed blocks kept for reuse */
  int64_t num_allocs;      /* allocation requests */
  int64_t num_cache_hits;  /* requests served from the cache */
} tt_alloc_stats;

int tt_alloc_stats_get(int device, tt_alloc_stats *out);
void tt_alloc_reset_peak(int device);
void tt_alloc_empty_cache(int device);
/* The most bytes each device's cache may hold, tensors and cached blocks together (0:
** no limit, the default): beyond it a request fails as out of memory. The host sets it
** from TETRA_ALLOC_LIMIT_MIB. */
void tt_alloc_set_limit(size_t bytes);
/* The bytes a request of nbytes takes from the allocator (its size class): what
** live_bytes and peak_bytes count. The planner (lua/tetra/planner/init.lua) sums these. */
size_t tt_alloc_granted_bytes(size_t nbytes);

/* A private pool of one device's memory, for work captured into a CUDA graph: the graph
** writes the blocks its captured kernels used every time it is replayed, so none of them
** may go to another tensor while the graph lives. While a pool is in use on a thread
** (tt_alloc_pool_use), that thread's new storages on the pool's device come from it (its
** own freed blocks first, then the device's cache or the device); a storage of the pool,
** freed at any time on any thread, goes back to the pool, never to the device's cache.
** The blocks return to the device's cache once the pool is released and its last storage
** freed. Pool storages count in live_bytes while held and in cached_bytes when free. */
typedef struct tt_alloc_pool tt_alloc_pool;
int tt_alloc_pool_new(int device, tt_alloc_pool **out);
/* Routes this thread's allocations on pool's device to pool; NULL stops (device: the
** device whose routing stops). Nested use is refused. */
int tt_alloc_pool_use(int device, tt_alloc_pool *pool);
/* The pool this thread allocates from on device, or NULL. */
tt_alloc_pool *tt_alloc_pool_current(int device);
void tt_alloc_pool_release(tt_alloc_pool *pool);
typedef struct tt_alloc_pool_stats {
  int64_t reserved_bytes;  /* every block the pool holds, taken or free */
  int64_t taken_bytes;     /* held by live storages */
  int64_t grown;           /* blocks the pool took from the device or its cache */
  int64_t adopted;         /* blocks from outside it, freed while it was in use: kept */
} tt_alloc_pool_stats;
int tt_alloc_pool_stats_get(const tt_alloc_pool *pool, tt_alloc_pool_stats *out);
/* After the device finished everything queued (a synchronisation): every block cached
** for device is idle, so taking one needs no ordering against the stream it was last used
** on (a graph capture then touches no other stream). */
void tt_alloc_mark_idle(int device);

/* -- Threads ------------------------------------------------------------------------ */

void tt_set_num_threads(int n);
int tt_get_num_threads(void);

/* The library the CPU matmul family (Linear's products, matmul, bmm) runs its sgemm on:
** "openblas" (the default; NULL or "" too), "blis" or "onednn" (loaded now, from
** libblis.so.4 / libdnnl.so). Attention's block products stay on OpenBLAS. tetra selects
** $TETRA_BLAS at start. 0, or -1 with the error set (an unknown name, a library missing). */
int tt_blas_select(const char *name);
const char *tt_blas_selected(void);
/* Products each library ("openblas", "blis", "onednn", and "bf16-dot" for oneDNN's bf16
** GEMM) has run in this process; -1 for another name. */
int64_t tt_blas_calls(const char *name);
/* How the CPU multiplies bf16 operands (train.precision=bf16): "emulate" (the default;
** NULL or "" too), f32 products of the rounded values on the library above, or "dot",
** oneDNN's bf16 GEMM on the CPU's dot-product instructions, refused unless cpu_has_bf16
** (AVX512_BF16). tetra selects $TETRA_BF16_GEMM at start. 0, or -1 with the error set. */
int tt_bf16_gemm_select(const char *name, int cpu_has_bf16);
const char *tt_bf16_gemm_selected(void);

/* -- Autograd ----------------------------------------------------------------------- */

int tt_set_requires_grad(tt_tensor *t, int requires_grad);
void tt_set_grad_enabled(int enabled);
int tt_is_grad_enabled(void);
/* Backward from a scalar (numel 1) tensor: accumulates into leaf .grad; frees the tape. */
int tt_backward(tt_tensor *loss);
/* Backward with an explicit upstream gradient of the same shape as `root`. */
int tt_backward_with(tt_tensor *root, tt_tensor *grad_root);
int tt_zero_grad(tt_tensor *t);          /* drops t->grad */
int tt_detach(tt_tensor *t, tt_tensor **out);   /* shares storage, no history */
/* Drops every recorded node without running backward (e.g. after an eval forward). */
void tt_tape_clear(void);
int64_t tt_tape_size(void);
/* The name of the op recorded at tape position i (0: the oldest), or NULL out of range:
** what a forward recorded, for tests and debugging. */
const char *tt_tape_node_name(int64_t i);
/* The dtype of that op's output, or -1 out of range. */
int tt_tape_node_dtype(int64_t i);
/* Called for each leaf once its gradient for this backward is complete (used by data
** parallelism to start reducing gradient buckets while backward still runs). */
typedef void (*tt_grad_ready_fn)(tt_tensor *leaf, void *userdata);
void tt_set_grad_ready_hook(tt_grad_ready_fn fn, void *userdata);
/* Called after each node's backward (data parallelism lets the collectives in flight
** progress there: MPI moves bytes only inside MPI calls). */
typedef void (*tt_backward_tick_fn)(void *userdata);
void tt_set_backward_tick_hook(tt_backward_tick_fn fn, void *userdata);
/* Called after each op recorded in forward (ZeRO-3 lets its prefetched parameter gathers
** progress there). NULL: none. */
void tt_set_record_tick_hook(tt_backward_tick_fn fn, void *userdata);
/* Leaves whose gradients backward computes last: every node's work toward them (and
** toward tensors made only from them) waits until every other gradient is complete,
** then runs in the same reverse order. Data parallelism defers the first blocks' weights
** so that the embedding's gradient, otherwise the last, starts reducing while they are
** computed. The same gradients result; only their order changes. The caller keeps the
** leaves alive while set; n = 0 clears. */
int tt_set_deferred_grads(tt_tensor *const *leaves, int n);
/* Activation recompute. tt_checkpoint(x, y, key): y was computed from x with recording
** off (a transformer block's forward keeping none of its activations); records one node
** from x to y (nothing when x needs no grad or recording is off). Its backward calls the
** recompute hook with `key`, a fresh leaf sharing x's storage and y's gradient; the hook
** runs the same forward again from the leaf with recording on and calls
** tt_backward_with(its output, grad_out) (a nested backward: it walks only what the hook
** recorded, deferring nothing), then returns 0 or -1 with the message set. The leaf's
** gradient is then added into x. */
typedef int (*tt_recompute_fn)(int64_t key, tt_tensor *leaf, tt_tensor *grad_out,
                               void *userdata);
void tt_set_recompute_hook(tt_recompute_fn fn, void *userdata);
/* Around the block's first run: tt_checkpoint_begin() before it, tt_checkpoint after it
** (or tt_checkpoint_cancel() when it failed). In between, ops stash what their re-run
** must reuse (an FP8 layer's scales); the node keeps it. */
void tt_checkpoint_begin(void);
void tt_checkpoint_cancel(void);
int tt_checkpoint(tt_tensor *x, tt_tensor *y, int64_t key);
/* Selective recompute: after tt_checkpoint_begin, keep the block's GEMM outputs (every
** tt_matmul / tt_linear family product it computes on the CPU) for its re-run, which
** takes them back instead of computing them again; everything else is re-run. The
** hook calls tt_checkpoint_rerun_done() once the re-run's forward is over, before its
** backward (whose products are not kept ones). */
void tt_checkpoint_keep_gemms(int on);
void tt_checkpoint_rerun_done(void);

/* -- Op profile (engine/core/op_profile.c) ---------------------------------------------- */
/* Where a forward and backward spend their time, op by op. Between start and stop every
** interval between two marks of the tape is charged to the mark that ends it: an op
** recorded in forward (the time since the mark before: its work and any untaped work
** before it), a node's backward (its own time; a checkpoint's less its re-run, charged as
** recompute), outside ops (before each backward node, and up to the stop), or a region
** the caller names (tt_op_profile_region). The entries add up to the whole. On CUDA the marks are events in the current stream's
** order and stop waits for the device once: the kernels' time. Only the starting thread
** leaves marks; a CUDA graph capture must not run inside a profile. */
enum { TT_OP_FORWARD = 0, TT_OP_BACKWARD = 1, TT_OP_RECOMPUTE = 2, TT_OP_OUTSIDE = 3,
       TT_OP_REGION = 4 };
typedef struct tt_op_profile_entry {
  const char *name;   /* the op's tape name, "(outside ops)" or a region's */
  int phase;          /* TT_OP_* */
  int64_t calls;      /* intervals charged */
  double seconds;
} tt_op_profile_entry;
/* Starts a profile on this thread for ops on `device` (TT_CPU: the host clock). */
int tt_op_profile_start(int device);
/* 1 while a profile runs on this thread. */
int tt_op_profile_running(void);
/* Ends it: the number of entries (op, phase), longest first, and the whole time. */
int tt_op_profile_stop(double *total_s);
/* Charges the time since the last mark to a region of this name (phase TT_OP_REGION;
** the name is copied): work that records no op, such as the optimizer's update. Nothing
** when no profile runs on this thread. */
int tt_op_profile_region(const char *name);
/* Copies up to max entries of the last stopped profile into out; returns how many. */
int tt_op_profile_take(tt_op_profile_entry *out, int max);

/* -- Scalar conversions (round-to-nearest-even; fp8 saturates to its max finite) ----- */

uint16_t tt_float_to_bf16(float x);
float tt_bf16_to_float(uint16_t h);
uint16_t tt_float_to_f16(float x);
float tt_f16_to_float(uint16_t h);
uint8_t tt_float_to_fp8(float x, int dtype);   /* dtype TT_E4M3 or TT_E5M2 */
float tt_fp8_to_float(uint8_t v, int dtype);

#include "tetra_ops.h"
#include "tetra_amp.h"
#include "tetra_cuda.h"

#endif
