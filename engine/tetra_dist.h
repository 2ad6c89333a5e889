/*
** tetra_dist.h — processes, groups and collectives (the public API of engine/dist).
**
** Read by the C compiler and by LuaJIT's ffi.cdef (lua/tetra/dist.lua, through
** require("tetra.ffi").cdef_header): flat declarations only, no macros.
**
** Model: one process per device, launched by mpirun (or srun with PMIx). A `tt_comm` is a
** group of processes; every collective is called by all members in the same order. CPU
** tensors travel over MPI, CUDA tensors over NCCL (one NCCL communicator per group,
** created on first use, its unique id broadcast over MPI). Without a launcher, the world
** is one process and every collective is a local no-op or copy, so single-process runs
** never touch MPI.
**
** Every wait (blocking call or tt_comm_wait) has a deadline (tt_dist_set_timeout): a
** collective that does not complete in time prints which collective, on which group, at
** which step, and aborts the whole job.
*/
#ifndef TETRA_DIST_H
#define TETRA_DIST_H
#include "tetra.h"

/* -- Processes ---------------------------------------------------------------------- */

/* 1 when the environment says mpirun / srun started this process (OMPI_COMM_WORLD_SIZE,
** PMIX_RANK or PMI_RANK is set). */
int tt_dist_launched(void);
/* World rank from the launcher's environment, usable before tt_dist_init (0 when not
** launched). Lets a caller print a config error on rank 0 only. */
int tt_dist_env_rank(void);
/* Initialises MPI when launched by a launcher, or when force is 1; otherwise sets up a
** one-process world without MPI. Idempotent. Registers an exit handler that finalizes
** MPI on exit status 0 and aborts the job on any other status. */
int tt_dist_init(int force);
int tt_dist_is_initialized(void);   /* 1 once MPI runs (not for the one-process world) */
int tt_dist_rank(void);             /* world rank (0 without MPI) */
int tt_dist_world_size(void);       /* 1 without MPI */
int tt_dist_local_rank(void);       /* rank among the processes of this node: GPU index */
int tt_dist_local_size(void);
/* Hostname of a world rank, as that rank saw it at start-up (NULL out of range). */
const char *tt_dist_rank_host(int world_rank);
/* Finalizes MPI (after a barrier-free shutdown; every rank calls it). */
int tt_dist_finalize(void);
/* The process will exit with `status`, and every rank agreed to (a stop at a signal):
** at the exit MPI is finalized as for status 0, not the job aborted. */
void tt_dist_set_agreed_exit(int status);
/* Prints "tetra: rank R: msg" once to stderr and aborts every rank of the job
** (MPI_Abort); exits with `code` when MPI is not running. Never returns. */
void tt_dist_abort(const char *msg, int code);
/* For an error every rank detects alike (a bad layout): ranks other than 0 call this
** instead of reporting, so the message prints once. Waits up to grace_s seconds for
** rank 0 to report and abort the job, then aborts it without a message. Never returns. */
void tt_dist_await_abort(double grace_s);

/* Watchdog deadline for each wait, in seconds (<= 0: wait forever). Default 600. */
void tt_dist_set_timeout(double seconds);
double tt_dist_get_timeout(void);
/* Seconds this process has spent blocked waiting for communication (every blocking
** collective and tt_comm_wait), since it started: the communication that computation
** did not hide, pipeline bubbles included. */
double tt_dist_wait_seconds(void);
/* The training step the watchdog names in its report. */
void tt_dist_set_step(int64_t step);
int64_t tt_dist_get_step(void);

/* -- Groups ------------------------------------------------------------------------- */

typedef struct tt_comm tt_comm;
typedef struct tt_comm_handle tt_comm_handle;

typedef enum tt_reduce_op {
  TT_REDUCE_SUM = 0,
  TT_REDUCE_AVG = 1,   /* sum / group size (float dtypes) */
  TT_REDUCE_MAX = 2,
  TT_REDUCE_MIN = 3
} tt_reduce_op;
int tt_reduce_op_from_name(const char *name);   /* "sum", "avg", "max", "min"; -1 unknown */

/* The world group (owned by the module; valid from tt_dist_init to tt_dist_finalize). */
tt_comm *tt_comm_world(void);
/* Splits `parent`: processes passing the same color form one group, ordered by key.
** Collective over parent. The new group is named `name` in messages; free it with
** tt_comm_free. */
int tt_comm_split(tt_comm *parent, int color, int key, const char *name, tt_comm **out);
/* The same for a group whose collectives only ever move CPU tensors (the REPL's): it gets
** no NCCL communicator, whose set-up takes a second or more and whose buffers take GPU
** memory until the exit. */
int tt_comm_split_host(tt_comm *parent, int color, int key, const char *name, tt_comm **out);
/* A dropped group's communicators are freed at the exit (tt_dist_finalize), with every
** group's, in the order made: freeing them is collective, and callers drop groups in no
** one order (Lua's collector). */
void tt_comm_free(tt_comm *c);                  /* NULL and the world group are ignored */
/* Collectives on CUDA tensors go through NCCL. Its communicators are made eagerly: this
** call (collective over the world, before any group is split) makes the world's, and from
** then on tt_comm_split makes each new group's before it returns. Every rank splits the
** same groups in the same order (MPI requires it), so every rank joins the communicators
** in that one order: no rank can block in one group's set-up while a member it waits for
** blocks in another's. Groups of one process need none. Fails in a build without NCCL. */
int tt_dist_nccl_enable(void);
int tt_comm_has_nccl(const tt_comm *c);         /* 1 when the group's communicator exists */
int tt_comm_rank(const tt_comm *c);
int tt_comm_size(const tt_comm *c);
const char *tt_comm_name(const tt_comm *c);
int tt_comm_world_rank_of(const tt_comm *c, int group_rank);   /* -1 when out of range */

/* -- Collectives ---------------------------------------------------------------------- */
/* Tensors may be strided views and live on the CPU (MPI) or a CUDA device (NCCL).
** Reductions need f32, bf16, f16, i32 or i64; moves take any dtype. Results returned
** through `out` belong to the caller. None of these record on the autograd tape. */

/* In place: t = op over the group of t. */
int tt_comm_all_reduce(tt_comm *c, tt_tensor *t, int op);
/* out: t's shape with dim multiplied by the group size; rank r's tensor at block r. */
int tt_comm_all_gather(tt_comm *c, tt_tensor *t, int dim, tt_tensor **out);
/* t's dim must divide by the group size; out: block `rank` of the reduction. */
int tt_comm_reduce_scatter(tt_comm *c, tt_tensor *t, int dim, int op, tt_tensor **out);
/* In place: every rank's t becomes root's t. */
int tt_comm_broadcast(tt_comm *c, tt_tensor *t, int root);
int tt_comm_send(tt_comm *c, tt_tensor *t, int dst, int tag);
int tt_comm_recv(tt_comm *c, tt_tensor *t, int src, int tag);   /* into t (shape known) */
/* t is cut into group-size blocks along split_dim; block j goes to rank j; out holds the
** blocks received from ranks 0..n-1 side by side along concat_dim. */
int tt_comm_all_to_all(tt_comm *c, tt_tensor *t, int split_dim, int concat_dim,
                       tt_tensor **out);
int tt_comm_barrier(tt_comm *c);

/* Non-blocking versions: start the operation and return a handle. Tensors are kept
** alive by the handle; results (in place, or *out) are valid after tt_comm_wait. The
** caller must not touch them before. */
int tt_comm_all_reduce_async(tt_comm *c, tt_tensor *t, int op, tt_comm_handle **h);
int tt_comm_all_gather_async(tt_comm *c, tt_tensor *t, int dim, tt_tensor **out,
                             tt_comm_handle **h);
int tt_comm_reduce_scatter_async(tt_comm *c, tt_tensor *t, int dim, int op,
                                 tt_tensor **out, tt_comm_handle **h);
int tt_comm_broadcast_async(tt_comm *c, tt_tensor *t, int root, tt_comm_handle **h);
int tt_comm_send_async(tt_comm *c, tt_tensor *t, int dst, int tag, tt_comm_handle **h);
int tt_comm_recv_async(tt_comm *c, tt_tensor *t, int src, int tag, tt_comm_handle **h);
/* A send of `send` to dst and a receive into `recv` (shape known) from src that progress
** together (on CUDA tensors one NCCL group: two calls in a row on the group's stream would
** each wait for its peer first, and two ranks that each send before they receive would
** wait for good). Returns once `recv` holds the data (on a GPU, once the device waits for
** it); *send_h is the send's handle, to wait for before reusing `send`. */
int tt_comm_sendrecv(tt_comm *c, tt_tensor *send, int dst, int send_tag, tt_tensor *recv,
                     int src, int recv_tag, tt_comm_handle **send_h);
/* Sends and receives that progress together, tt_comm_sendrecv's general form (a pipeline
** round's transfers, Megatron-LM's batched p2p): send[i] to dst[i] (tag send_tag[i]) and a
** receive into recv[i] from src[i] (recv_tag[i]), at most TT_P2P_MAX of each; on CUDA
** tensors one NCCL group. Returns once every recv[i] holds its data (on a GPU, once the
** device waits for the group); send_h[i] is send i's handle (NULL once nothing is left to
** wait for), to wait for before reusing send[i]. */
enum { TT_P2P_MAX = 4 };
int tt_comm_p2p(tt_comm *c, int n_send, tt_tensor *const *send, const int *dst,
                const int *send_tag, int n_recv, tt_tensor *const *recv, const int *src,
                const int *recv_tag, tt_comm_handle **send_h);
int tt_comm_all_to_all_async(tt_comm *c, tt_tensor *t, int split_dim, int concat_dim,
                             tt_tensor **out, tt_comm_handle **h);
int tt_comm_barrier_async(tt_comm *c, tt_comm_handle **h);
/* Waits (under the watchdog deadline) and finishes the operation. Idempotent. */
int tt_comm_wait(tt_comm_handle *h);
/* Drives progress without blocking: *done = 1 once complete (then finished). */
int tt_comm_test(tt_comm_handle *h, int *done);
/* Waits when still pending, then frees. NULL is fine. */
void tt_comm_handle_free(tt_comm_handle *h);

/* -- Differentiable collectives ------------------------------------------------------- */
/* Conjugate pairs for tensor, sequence and context parallelism. Each returns a new
** tensor and records its backward on the tape (when grad mode is on and x requires
** grad). Reductions are sums over the group.
**   copy_to_group        forward identity         backward all-reduce
**   reduce_from_group    forward all-reduce       backward identity
**   gather_from_group    forward all-gather(dim)  backward take own block
**   scatter_to_group     forward take own block   backward all-gather(dim)
**   sp_gather            forward all-gather(dim)  backward reduce-scatter(dim)
**   sp_reduce_scatter    forward reduce-scatter   backward all-gather(dim)          */
int tt_dist_copy_to_group(tt_comm *c, tt_tensor *x, tt_tensor **out);
int tt_dist_reduce_from_group(tt_comm *c, tt_tensor *x, tt_tensor **out);
int tt_dist_gather_from_group(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out);
int tt_dist_scatter_to_group(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out);
int tt_dist_sp_gather(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out);
int tt_dist_sp_reduce_scatter(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out);

/* -- The 4D mesh ---------------------------------------------------------------------- */
/* World ranks laid out over (tp, cp, dp, pp). `order` lists the four names fastest-varying
** first, e.g. "tp-cp-dp-pp" (the default, also used for NULL or ""): consecutive ranks
** share a TP group, PP is outermost. The product of the sizes must equal the world size.
** Groups: "tp", "cp", "dp", "pp", "dpcp" (the ranks that share tp and pp coordinates:
** where gradients are averaged when cp > 1) and "world". */
typedef struct tt_mesh tt_mesh;
int tt_mesh_new(int tp, int cp, int dp, int pp, const char *order, tt_mesh **out);
void tt_mesh_free(tt_mesh *m);
/* The group named `name` this process belongs to (owned by the mesh); NULL + error when
** the name is unknown. */
tt_comm *tt_mesh_group(tt_mesh *m, const char *name);
/* This process's coordinate along "tp"/"cp"/"dp"/"pp" (-1 when unknown), and the size. */
int tt_mesh_coord(const tt_mesh *m, const char *dim);
int tt_mesh_dim_size(const tt_mesh *m, const char *dim);
/* World rank of the process at the given coordinates (-1 when out of range). */
int tt_mesh_rank_at(const tt_mesh *m, int tp, int cp, int dp, int pp);

/* -- Data-parallel gradient reducer ----------------------------------------------------- */
/* Averages the gradients of `params` over `c` in buckets of at most bucket_mb megabytes,
** smaller toward the end of backward (the last about 1/32 of the gradient bytes).
** Buckets follow the order backward produces gradients (tail_order); a bucket starts
** reducing as soon as its last gradient is ready, while backward goes on, always in
** bucket order so every rank issues the same sequence, and its averages are written
** back as soon as it completes. */
typedef struct {
  double bucket_mb;
  /* 1: buckets are reduce-scattered instead; each rank keeps the averaged gradient of
  ** its 1/n share of every bucket (ZeRO-1) and updates only that share. 2: the same,
  ** and the whole-size gradients and bucket buffers are released once reduce-scattered,
  ** so only that share of the gradients stays (ZeRO-2). */
  int zero_stage;
  /* n flags, or NULL: parameters, f32 tables (V, D) such as an embedding, whose gradient
  ** travels as the rows some rank touched (nonzero), in a bucket of their own; the
  ** result is the dense average. The same flags on every rank. */
  const int *row_sparse;
  /* n parameter indices from the last gradient backward produces to the first; NULL:
  ** the reverse parameter order (0 last). */
  const int *tail_order;
  /* The first n_deferred of tail_order: gradients computed after all others while the
  ** reducer is armed (tt_set_deferred_grads), so the ones that follow them in tail_order
  ** (an embedding table, produced last otherwise) start reducing meanwhile. */
  int n_deferred;
  /* ZeRO-3 (zero_stage 3): n unit numbers, from 0, non-decreasing in parameter order: the
  ** parameters each block gathers (unit 0 is the last one backward reaches). Buckets are
  ** the units; tail_order and row_sparse must be NULL. */
  const int *unit_of;
  /* ZeRO-3: the compute dtype (TT_BF16 or TT_F16; TT_F32 or 0: none) the parameters
  ** flagged in gather_lowp (n flags, or NULL) travel in: the blocks' matrices, which only
  ** the GEMMs read, through their bf16 / fp16 copies (tetra_amp.h). Every other parameter
  ** travels in f32, and a whole gather (unit_gather_whole) is f32 throughout. */
  int gather_dtype;
  const int *gather_lowp;
} tt_dist_reducer_opts;
typedef struct tt_dist_reducer tt_dist_reducer;
int tt_dist_reducer_new(tt_comm *c, tt_tensor *const *params, int n,
                        const tt_dist_reducer_opts *opts, tt_dist_reducer **out);
void tt_dist_reducer_free(tt_dist_reducer *r);
/* Arms (1) or disarms (0) the grad-ready hook for the next backward. Armed only for the
** last micro-batch of an accumulation. */
int tt_dist_reducer_arm(tt_dist_reducer *r, int armed);
/* Starts the buckets that are not started yet (gradients backward never produced count
** as zeros), waits for all, and writes the averages back: into every param's grad
** (stage 0), or into the shard gradients (stages 1 and 2). Disarms the hook. */
int tt_dist_reducer_finish(tt_dist_reducer *r);
/* Bytes of gradient per bucket and bucket count, for logs and tests. */
int tt_dist_reducer_num_buckets(const tt_dist_reducer *r);
/* Rows the last step moved as sparse rows (all row-sparse buckets together); -1 when
** none did (no such parameter, or every one fell back to the dense collective). */
int64_t tt_dist_reducer_sparse_rows(const tt_dist_reducer *r);
/* Seconds spent waiting inside finish during the last step (communication left exposed
** after overlap) and seconds from the first bucket start to the last completion. */
double tt_dist_reducer_exposed_s(const tt_dist_reducer *r);
/* Buckets that were complete during the last backward while an earlier one was not, so
** they waited to start: 0 when tail_order is the order backward really produces. */
int tt_dist_reducer_held(const tt_dist_reducer *r);
/* ZeRO-1 and 2 shards: this rank owns `num_shards` pieces, each a view into one parameter
** (shard_param(i) is that parameter's index), shaped (k) for vectors and (1, k) for
** matrices, whose ->grad holds the averaged gradient of the piece after finish. */
int tt_dist_reducer_num_shards(const tt_dist_reducer *r);
tt_tensor *tt_dist_reducer_shard(const tt_dist_reducer *r, int i);   /* borrowed */
int tt_dist_reducer_shard_param(const tt_dist_reducer *r, int i);
/* Where shard i starts in its parameter, as an element offset into the flattened
** parameter (checkpoints rebuild whole optimizer moments from the shards); -1 when out of
** range. */
int64_t tt_dist_reducer_shard_offset(const tt_dist_reducer *r, int i);
/* The piece of parameter `param` (0-based) that group rank `rank` holds under ZeRO: its
** element offset in the flattened parameter and its length; 0 when it holds none. */
int tt_dist_reducer_param_piece(const tt_dist_reducer *r, int param, int rank, int64_t *offset,
                                int64_t *len);
/* Sum over this rank's shards of the squared gradient, all-reduced over the group:
** the square of the global gradient norm (ZeRO-1 and 2). */
int tt_dist_reducer_grad_sq_norm(tt_dist_reducer *r, double *out);
/* After the optimizer updated the shards in place: all-gathers every bucket's updated
** shares so every rank holds the whole updated parameters (ZeRO-1 and 2). */
int tt_dist_reducer_gather_params(tt_dist_reducer *r);

/* ZeRO-3 (reducer.c's header says how). Units are numbered as opts.unit_of. A new reducer
** has every unit gathered (the parameters as given); the optimizer's shards are views into
** this rank's own share, not into the parameters. gather_params, after the step, refreshes
** the units that are gathered. */
int tt_dist_reducer_num_units(const tt_dist_reducer *r);
int64_t tt_dist_reducer_unit_gathers(const tt_dist_reducer *r);   /* all-gathers so far */
int64_t tt_dist_reducer_unit_gather_bytes(const tt_dist_reducer *r);   /* and their bytes */
int tt_dist_reducer_unit_is_gathered(const tt_dist_reducer *r, int unit);   /* -1: no unit */
/* Fills the unit's parameters (waiting for a prefetch when one is in flight); with a
** gather_dtype, the flagged ones may hold only their low-precision copy. _whole: every
** parameter in f32. */
int tt_dist_reducer_unit_gather(tt_dist_reducer *r, int unit);
int tt_dist_reducer_unit_gather_whole(tt_dist_reducer *r, int unit);
/* Starts the unit's gather without waiting; out-of-range units are none (no-op). */
int tt_dist_reducer_unit_prefetch(tt_dist_reducer *r, int unit);
/* Gives the unit's parameter memory back; headers stay. */
int tt_dist_reducer_unit_release(tt_dist_reducer *r, int unit);
/* ZeRO-3 with the f32 shares on the host (reducer.c's section says how): shares_away gives
** the owned buffers' memory back, keeping compute-dtype copies for the blocks' gathers;
** shares_home takes it again (zeroed: the caller writes the shares). away_bytes: the
** bytes shares_away gives back now, *kept those of the copies it keeps instead. */
int tt_dist_reducer_shares_away(tt_dist_reducer *r);
int tt_dist_reducer_shares_home(tt_dist_reducer *r);
int64_t tt_dist_reducer_shares_away_bytes(const tt_dist_reducer *r, int64_t *kept);
/* Identity ops around a block's forward: enter before it (its backward releases the
** unit), exit after it (releases the unit now; its backward gathers it again and starts
** the gather of unit `next`, -1 for none). */
int tt_dist_reducer_unit_enter(tt_dist_reducer *r, int unit, tt_tensor *x, tt_tensor **out);
int tt_dist_reducer_unit_exit(tt_dist_reducer *r, int unit, int next, tt_tensor *y,
                              tt_tensor **out);

#endif
