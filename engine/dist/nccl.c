/*
** nccl.c — the NCCL backend for collectives on CUDA tensors.
**
** Each group of more than one process gets an NCCL communicator when it is made, once
** tt_dist_nccl_enable ran (comm.c): group rank 0 makes the unique id, MPI broadcasts it
** over the group, every member joins. Never lazily at a group's first collective: ranks
** that reach different groups' first collectives in different orders would each block
** in a set-up the other has not entered. Transfers run on
** the group's own stream so they overlap compute; a "ready" event recorded on the
** compute stream orders them after the kernels that produced the data, and a "done"
** event recorded after them is what the watchdog polls. Waiting for a collective makes
** the compute stream wait for "done" (tt_nccl_join): the host goes on launching, and
** every later kernel on that stream sees the result. The event then joins the pending
** list, which the watchdog polls at the next collective and while the host waits for the
** device (tt_cuda_set_host_wait_hook): a collective that never ends is still reported,
** at the step's read instead of at its own wait. TETRA_NCCL_HOST_WAIT=1 restores the
** host wait per collective (comm.c polls "done" then). Inside a CUDA graph capture the
** join is the capture's dependency and nothing is listed.
**
** Built only with TETRA_HAVE_NCCL (the CUDA build defines it when libnccl is found);
** otherwise comm.c rejects CUDA tensors and the stubs at the end keep the links whole.
*/
#include "dist/dist_internal.h"
#include "tetra_telemetry.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef TETRA_HAVE_NCCL
#include "tetra_cuda.h"
#include <cuda_runtime.h>
#include <nccl.h>

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  int device;
} nccl_state;

static int cuda_failed(cudaError_t e, const char *call, const tt_comm *c) {
  return tt_set_error("%s on group %s: %s", call, c->name, cudaGetErrorString(e));
}
static int nccl_failed(ncclResult_t e, const char *call, const tt_comm *c) {
  return tt_set_error("%s on group %s: NCCL error: %s", call, c->name, ncclGetErrorString(e));
}
#define TT_CUDA_CALL(call, c) \
  do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cuda_failed(e_, #call, c); } while (0)
#define TT_NCCL_CALL(call, c) \
  do { ncclResult_t e_ = (call); if (e_ != ncclSuccess) return nccl_failed(e_, #call, c); } while (0)

static int nccl_state_of(tt_comm *c, nccl_state **out) {
  TT_CHECK(c->nccl || !c->nccl_aborted, "group %s: its NCCL communicator was aborted after a "
           "failed transfer (the first error says which)", c->name);
  TT_CHECK(c->nccl,
           "group %s has no NCCL communicator: collectives on CUDA tensors need "
           "tt_dist_nccl_enable (tetra.dist.init does it for train.device=cuda) before the "
           "groups are made", c->name);
  *out = c->nccl;
  return 0;
}

/* Whether another rank on this host computes on `device` too (set as the error; every
** member of `world` calls it, -1 for a rank without a device). NCCL does not support two
** ranks of one communicator on one GPU (it may hang): train.device=cuda gives each rank
** its node rank's GPU, but cuda:N, or more ranks on a host than it has GPUs, share one. */
static int shares_a_gpu(tt_comm *world, int device) {
  MPI_Comm node;
  if (MPI_Comm_split_type(world->mpi, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL,
                          &node) != MPI_SUCCESS)
    return 0;   /* (the set-up's own collectives report a broken MPI) */
  int n = 1, me = 0, shared = -1;
  MPI_Comm_size(node, &n);
  MPI_Comm_rank(node, &me);
  int *devs = malloc(sizeof *devs * (size_t)n);
  tt_dist_blocking_begin("nccl set-up (devices of this host)", world);
  int gathered = devs && MPI_Allgather(&device, 1, MPI_INT, devs, 1, MPI_INT, node) == MPI_SUCCESS;
  tt_dist_blocking_end();
  if (gathered)
    for (int i = 0; i < n && shared < 0; i++)
      if (i != me && device >= 0 && devs[i] == device) shared = i;
  free(devs);
  MPI_Comm_free(&node);
  if (shared < 0) return 0;
  tt_set_error("nccl set-up: ranks %d and %d of this host both compute on cuda:%d, and NCCL "
               "needs a GPU of its own for every rank: use train.device=cuda (each rank takes "
               "the GPU of its rank on the host), not cuda:N, and start at most as many ranks "
               "on a host as it has GPUs", me < shared ? me : shared, me < shared ? shared : me,
               device);
  return 1;
}

/* Every member prepares locally (its device, a stream; rank 0 the unique id) and the
** group agrees by MPI that all did before anyone enters ncclCommInitRank, which blocks
** until every member has: a member that failed to prepare would otherwise leave the
** others waiting there for ever. */
int tt_nccl_comm_init(tt_comm *c) {
  TT_CHECK(!c->nccl, "group %s already has an NCCL communicator", c->name);
  nccl_state *st = calloc(1, sizeof *st);
  TT_CHECK(st, "nccl: out of host memory");
  struct { int ok; ncclUniqueId id; } root;
  memset(&root, 0, sizeof root);
  int rc = 0, ok = 1, all_ok = 0;
  const char *call = "cudaGetDevice";
  cudaError_t ce = cudaGetDevice(&st->device);
  if (ce == cudaSuccess) {
    call = "cudaStreamCreateWithFlags";
    ce = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
  }
  if (ce != cudaSuccess) {
    st->stream = NULL;
    rc = cuda_failed(ce, call, c);
    ok = 0;
  }
  if (c->is_world && shares_a_gpu(c, ok ? st->device : -1)) {
    rc = -1;
    ok = 0;
  }
  if (c->rank == 0) {
    ncclResult_t ne = ok ? ncclGetUniqueId(&root.id) : ncclSuccess;
    if (ne != ncclSuccess) rc = nccl_failed(ne, "ncclGetUniqueId", c);
    root.ok = ok = ok && ne == ncclSuccess;
  }
  tt_dist_blocking_begin("nccl set-up (unique id)", c);
  int mpi = MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, c->mpi);
  if (mpi == MPI_SUCCESS) mpi = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->mpi);
  tt_dist_blocking_end();
  if (mpi != MPI_SUCCESS) rc = tt_dist_mpi_error(mpi, "nccl set-up", c, __FILE__, __LINE__);
  else if (!all_ok && rc == 0)
    rc = tt_set_error("nccl set-up on group %s: another member could not prepare (%s)",
                      c->name, root.ok ? "its device or stream" : "rank 0's unique id");
  if (rc == 0) {
    tt_dist_blocking_begin("ncclCommInitRank", c);
    ncclResult_t ne = ncclCommInitRank(&st->comm, c->size, root.id, c->rank);
    tt_dist_blocking_end();
    if (ne != ncclSuccess) rc = nccl_failed(ne, "ncclCommInitRank", c);
  }
  if (rc != 0) {
    if (st->stream) cudaStreamDestroy(st->stream);
    free(st);
    return rc;
  }
  c->nccl = st;
  return 0;
}

static int nccl_type(int dtype, ncclDataType_t *out) {
  switch (dtype) {
  case TT_F32: *out = ncclFloat32; return 0;
  case TT_BF16: *out = ncclBfloat16; return 0;
  case TT_F16: *out = ncclFloat16; return 0;
  case TT_I32: *out = ncclInt32; return 0;
  case TT_I64: *out = ncclInt64; return 0;
  default: *out = ncclUint8; return 0;   /* fp8: moved as bytes, never reduced */
  }
}

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
  case TT_REDUCE_AVG: return ncclAvg;
  case TT_REDUCE_MAX: return ncclMax;
  case TT_REDUCE_MIN: return ncclMin;
  default: return ncclSum;
  }
}

/* Orders the comm stream after the work already queued on the compute stream. */
static int after_compute(nccl_state *st, const tt_comm *c) {
  cudaStream_t compute = (cudaStream_t)tt_cuda_stream_raw();
  cudaEvent_t ready;
  TT_CUDA_CALL(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), c);
  cudaError_t e = cudaEventRecord(ready, compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(st->stream, ready, 0);
  cudaEventDestroy(ready);
  if (e != cudaSuccess) return cuda_failed(e, "cudaStreamWaitEvent", c);
  return 0;
}

/* h's transfer, queued on st's stream, gets the event recorded after it. */
static int record_done(tt_comm_handle *h, nccl_state *st, const tt_comm *c) {
  cudaEvent_t done;
  TT_CUDA_CALL(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), c);
  cudaError_t e = cudaEventRecord(done, st->stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(done);
    return cuda_failed(e, "cudaEventRecord", c);
  }
  h->nccl_event = done;
  h->backend = 2;
  return 0;
}

int tt_nccl_start(tt_comm_handle *h, tt_nccl_kind kind, tt_tensor *src, tt_tensor *dst,
                  int64_t count, int op, int peer) {
  tt_comm *c = h->comm;
  nccl_state *st = NULL;
  TT_TRY(nccl_state_of(c, &st));
  ncclDataType_t ty;
  TT_TRY(nccl_type(src->dtype, &ty));
  /* The data first: a lazy tensor's fill (lazy zeros: a memset on the compute stream) must
  ** be among the work the comm stream is ordered after, or the two streams write the
  ** same bytes in no set order (a receive into lazy zeros could end up zeros). */
  const void *s = tt_tensor_data(src);
  void *d = tt_tensor_data(dst);
  TT_TRY(after_compute(st, c));
  size_t bytes = (size_t)count * tt_dtype_size(src->dtype);
  size_t n = (size_t)count;
  switch (kind) {
  case TT_NCCL_ALL_REDUCE:
    TT_NCCL_CALL(ncclAllReduce(s, d, n, ty, nccl_op(op), st->comm, st->stream), c);
    break;
  case TT_NCCL_ALL_GATHER:
    TT_NCCL_CALL(ncclAllGather(s, d, n, ty, st->comm, st->stream), c);
    break;
  case TT_NCCL_REDUCE_SCATTER:
    TT_NCCL_CALL(ncclReduceScatter(s, d, n, ty, nccl_op(op), st->comm, st->stream), c);
    break;
  case TT_NCCL_BROADCAST:
    TT_NCCL_CALL(ncclBroadcast(s, d, n, ty, peer, st->comm, st->stream), c);
    break;
  case TT_NCCL_SEND:
    TT_NCCL_CALL(ncclSend(s, n, ty, peer, st->comm, st->stream), c);
    break;
  case TT_NCCL_RECV:
    TT_NCCL_CALL(ncclRecv(d, n, ty, peer, st->comm, st->stream), c);
    break;
  case TT_NCCL_ALL_TO_ALL: {
    TT_NCCL_CALL(ncclGroupStart(), c);
    ncclResult_t e = ncclSuccess;
    const char *failed = NULL;
    for (int r = 0; r < c->size && e == ncclSuccess; r++) {
      e = ncclSend((const char *)s + (size_t)r * bytes, n, ty, r, st->comm, st->stream);
      if (e != ncclSuccess) {
        failed = "ncclSend (all_to_all)";
        break;
      }
      e = ncclRecv((char *)d + (size_t)r * bytes, n, ty, r, st->comm, st->stream);
      if (e != ncclSuccess) failed = "ncclRecv (all_to_all)";
    }
    /* The group is closed even after a failed call, so NCCL's group state stays sound. */
    ncclResult_t end = ncclGroupEnd();
    if (failed) return nccl_failed(e, failed, c);
    if (end != ncclSuccess) return nccl_failed(end, "ncclGroupEnd (all_to_all)", c);
    break;
  }
  }
  return record_done(h, st, c);
}

int tt_nccl_p2p_start(tt_comm_handle *h, int n_send, tt_tensor *const *send, const int *dst,
                      int n_recv, tt_tensor *const *recv, const int *src) {
  tt_comm *c = h->comm;
  nccl_state *st = NULL;
  TT_TRY(nccl_state_of(c, &st));
  for (int i = 0; i < n_send + n_recv; i++) {
    ncclDataType_t ty;
    TT_TRY(nccl_type((i < n_send ? send[i] : recv[i - n_send])->dtype, &ty));
  }
  /* The data first, before the ready event, as in tt_nccl_start (lazy fills). */
  const void *s[TT_P2P_MAX];
  void *d[TT_P2P_MAX];
  TT_CHECK(n_send <= TT_P2P_MAX && n_recv <= TT_P2P_MAX, "p2p: at most %d sends and %d "
           "receives in one group", TT_P2P_MAX, TT_P2P_MAX);
  for (int i = 0; i < n_send; i++) s[i] = tt_tensor_data(send[i]);
  for (int i = 0; i < n_recv; i++) d[i] = tt_tensor_data(recv[i]);
  TT_TRY(after_compute(st, c));
  /* One group: NCCL runs a group's sends and receives together, where calls in a row on
  ** the stream would each wait for its peer in turn. */
  TT_NCCL_CALL(ncclGroupStart(), c);
  ncclResult_t e = ncclSuccess;
  const char *failed = NULL;
  for (int i = 0; i < n_send && !failed; i++) {
    ncclDataType_t ty;
    nccl_type(send[i]->dtype, &ty);
    e = ncclSend(s[i], (size_t)tt_tensor_numel(send[i]), ty, dst[i], st->comm, st->stream);
    if (e != ncclSuccess) failed = "ncclSend (p2p)";
  }
  for (int i = 0; i < n_recv && !failed; i++) {
    ncclDataType_t ty;
    nccl_type(recv[i]->dtype, &ty);
    e = ncclRecv(d[i], (size_t)tt_tensor_numel(recv[i]), ty, src[i], st->comm, st->stream);
    if (e != ncclSuccess) failed = "ncclRecv (p2p)";
  }
  /* The group is closed even after a failed call, so NCCL's group state stays sound. */
  ncclResult_t end = ncclGroupEnd();
  if (failed) return nccl_failed(e, failed, c);
  if (end != ncclSuccess) return nccl_failed(end, "ncclGroupEnd (p2p)", c);
  return record_done(h, st, c);
}

/* The list of deferred waits' lock (below): collectives run from the training thread; the
** lock is for the watchdog thread's look (tt_nccl_watch), which retires nothing, and for
** its abort (tt_nccl_abort takes it in drop_pending before ncclCommAbort). */
static pthread_mutex_t g_pending_lock = PTHREAD_MUTEX_INITIALIZER;

int tt_nccl_test(tt_comm_handle *h, int *done) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)h->nccl_event);
  if (e == cudaSuccess) {
    *done = 1;
    return 0;
  }
  if (e != cudaErrorNotReady) return cuda_failed(e, h->what, h->comm);
  cudaGetLastError();   /* "not ready" is recorded as the thread's last error, which a later
                        ** launch check would report: clear it */
  /* The communicator's state is read and asked under the pending list's lock: an abort on
  ** the watchdog's thread takes it (drop_pending) before ncclCommAbort frees the comm. */
  ncclResult_t async = ncclSuccess, got = ncclSuccess;
  pthread_mutex_lock(&g_pending_lock);
  nccl_state *st = __atomic_load_n((nccl_state **)&h->comm->nccl, __ATOMIC_ACQUIRE);
  if (st) got = ncclCommGetAsyncError(st->comm, &async);
  pthread_mutex_unlock(&g_pending_lock);
  TT_CHECK(st, "%s on group %s: its NCCL communicator was aborted after a failed transfer "
           "(the first error says which)", h->what, h->comm->name);
  if (got != ncclSuccess) return nccl_failed(got, "ncclCommGetAsyncError", h->comm);
  if (async != ncclSuccess) return nccl_failed(async, h->what, h->comm);
  *done = 0;
  return 0;
}

static void drop_pending(const tt_comm *c, int sync);

/* Once per communicator, whichever thread gets there first (the watchdog's, or one
** whose transfer failed): its entries leave the list before ncclCommAbort, which may
** block (NVIDIA/nccl#863), so that the watchdog does not fire on them meanwhile. The
** state is not freed: a stream or handle may still name it. */
void tt_nccl_abort(tt_comm *c) {
  nccl_state *st = __atomic_exchange_n((nccl_state **)&c->nccl, NULL, __ATOMIC_ACQ_REL);
  if (!st) return;
  c->nccl_aborted = 1;
  drop_pending(c, 0);
  ncclCommAbort(st->comm);
}

void tt_nccl_comm_free(tt_comm *c) {
  drop_pending(c, 1);
  nccl_state *st = c->nccl;
  if (!st) return;
  ncclCommDestroy(st->comm);
  cudaStreamDestroy(st->stream);
  free(st);
  c->nccl = NULL;
}

void tt_nccl_event_free(tt_comm_handle *h) {
  if (h->nccl_event) cudaEventDestroy((cudaEvent_t)h->nccl_event);
  h->nccl_event = NULL;
}

/* -- Deferred waits ------------------------------------------------------------------ */

typedef struct pending {
  tt_comm_handle h;       /* comm, what, started: what the watchdog reports */
  cudaEvent_t done;
  struct pending *next;
} pending;

static pending *g_pending;   /* under g_pending_lock */

int tt_nccl_deferred(void) {
  static int deferred = -1;
  if (deferred < 0) {
    const char *e = getenv("TETRA_NCCL_HOST_WAIT");
    deferred = !(e && strcmp(e, "1") == 0);
  }
  return deferred;
}

/* The watchdog comm.c hands this transport (tt_nccl_set_watchdog): what to do with a
** transfer past the deadline, and with a failure found inside a host wait. */
static void (*g_on_late)(const tt_comm_handle *h, double waited_s);
static void (*g_on_fatal)(const char *msg);

void tt_nccl_set_watchdog(void (*on_late)(const tt_comm_handle *h, double waited_s),
                          void (*on_fatal)(const char *msg)) {
  g_on_late = on_late;
  g_on_fatal = on_fatal;
}

/* The hook of the host's waits for the device: a failed pass is fatal there (the wait
** cannot end while a transfer is broken). */
static void host_wait_hook(void) {
  if (tt_nccl_poll_pending() != 0 && g_on_fatal) g_on_fatal(tt_last_error());
}

int tt_nccl_join(tt_comm_handle *h) {
  cudaStream_t compute = (cudaStream_t)tt_cuda_stream_raw();
  cudaEvent_t done = (cudaEvent_t)h->nccl_event;
  TT_CHECK(done, "%s on group %s: no transfer to wait for", h->what, h->comm->name);
  TT_CUDA_CALL(cudaStreamWaitEvent(compute, done, 0), h->comm);
  h->nccl_event = NULL;
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(compute, &cap) == cudaSuccess && cap != cudaStreamCaptureStatusNone) {
    cudaEventDestroy(done);   /* the graph holds the dependency; no watchdog inside it */
    return 0;
  }
  pending *p = malloc(sizeof *p);
  if (!p) {
    cudaEventDestroy(done);   /* (the stream's wait was taken at the call) */
    return tt_set_error("%s on group %s: out of host memory", h->what, h->comm->name);
  }
  p->h = *h;
  p->done = done;
  pthread_mutex_lock(&g_pending_lock);
  p->next = g_pending;
  g_pending = p;
  pthread_mutex_unlock(&g_pending_lock);
  tt_cuda_set_host_wait_hook(host_wait_hook);
  /* then the list's pass (listed first: a pass that fails leaves the event there, where
  ** the watchdog sees it and the communicator's end frees it) */
  return tt_nccl_poll_pending();
}

/* Drops c's entries from the list (c is going away); with sync, after they finished
** (waited for with the list let go: the watchdog thread must not wait on it meanwhile). */
static void drop_pending(const tt_comm *c, int sync) {
  pending *mine = NULL;
  pthread_mutex_lock(&g_pending_lock);
  for (pending **l = &g_pending; *l;) {
    pending *p = *l;
    if (p->h.comm != c) {
      l = &p->next;
      continue;
    }
    *l = p->next;
    p->next = mine;
    mine = p;
  }
  pthread_mutex_unlock(&g_pending_lock);
  while (mine) {
    pending *p = mine;
    mine = p->next;
    if (sync) cudaEventSynchronize(p->done);
    cudaEventDestroy(p->done);
    free(p);
  }
}

/* One pass of tt_nccl_poll_pending with the list locked: 0, -1 with the message, or 1
** with *late a copy of a late entry's handle (fired once the lock is let go). */
static int poll_locked(double now, double timeout, tt_comm_handle *late) {
  for (pending **l = &g_pending; *l;) {
    pending *p = *l;
    const tt_comm *c = p->h.comm;
    cudaError_t e = cudaEventQuery(p->done);
    if (e == cudaSuccess) {   /* its latency as the host saw it: an upper bound */
      if (c->size > 1) {
        tt_telemetry_collective(p->h.what, c->name, now - p->h.started);
        if (tt_trace_enabled()) tt_trace_collective(p->h.what, c->name, p->h.started, now);
      }
      cudaEventDestroy(p->done);
      *l = p->next;
      free(p);
      continue;
    }
    if (e != cudaErrorNotReady) return cuda_failed(e, p->h.what, c);
    cudaGetLastError();   /* clear the recorded "not ready" (as in tt_nccl_test) */
    nccl_state *st = c->nccl;
    ncclResult_t async = ncclSuccess;
    if (st) TT_NCCL_CALL(ncclCommGetAsyncError(st->comm, &async), c);
    if (async != ncclSuccess) return nccl_failed(async, p->h.what, c);
    if (timeout > 0 && now - p->h.started > timeout) {
      *late = p->h;
      return 1;
    }
    l = &p->next;
  }
  return 0;
}

int tt_nccl_poll_pending(void) {
  double now = tt_dist_now(), timeout = tt_dist_get_timeout();
  tt_comm_handle late;
  pthread_mutex_lock(&g_pending_lock);
  int rc = poll_locked(now, timeout, &late);
  pthread_mutex_unlock(&g_pending_lock);
  if (rc <= 0) return rc;
  TT_CHECK(g_on_late, "%s on group %s: past dist.timeout_s with no watchdog set "
           "(tt_dist_init sets it)", late.what, late.comm->name);
  g_on_late(&late, now - late.started);
  return 0;
}

/* The watchdog thread's CUDA calls run on the device of the collectives it watches. */
int tt_nccl_watch(double now, double timeout, tt_comm_handle *late, double *waited) {
  static __thread int device = -1;
  int found = 0;
  pthread_mutex_lock(&g_pending_lock);
  for (pending *p = g_pending; p; p = p->next) {
    const nccl_state *st = p->h.comm->nccl;
    if (st && st->device != device && cudaSetDevice(st->device) == cudaSuccess)
      device = st->device;
    if (now - p->h.started <= timeout || cudaEventQuery(p->done) != cudaErrorNotReady) continue;
    if (!found || p->h.started < late->started) *late = p->h;
    found = 1;
  }
  pthread_mutex_unlock(&g_pending_lock);
  if (found) *waited = now - late->started;
  return found;
}

#else

int tt_nccl_comm_init(tt_comm *c) {
  return tt_set_error("group %s: collectives on CUDA tensors need a build with NCCL "
                      "(libnccl was not found when this tetra was configured)", c->name);
}
int tt_nccl_start(tt_comm_handle *h, tt_nccl_kind kind, tt_tensor *src, tt_tensor *dst,
                  int64_t count, int op, int peer) {
  (void)h, (void)kind, (void)src, (void)dst, (void)count, (void)op, (void)peer;
  return tt_set_error("collectives on CUDA tensors need a build with NCCL");
}
int tt_nccl_p2p_start(tt_comm_handle *h, int n_send, tt_tensor *const *send, const int *dst,
                      int n_recv, tt_tensor *const *recv, const int *src) {
  (void)h, (void)n_send, (void)send, (void)dst, (void)n_recv, (void)recv, (void)src;
  return tt_set_error("collectives on CUDA tensors need a build with NCCL");
}
int tt_nccl_test(tt_comm_handle *h, int *done) {
  (void)h;
  *done = 1;
  return 0;
}
void tt_nccl_abort(tt_comm *c) { (void)c; }
void tt_nccl_comm_free(tt_comm *c) { (void)c; }
void tt_nccl_event_free(tt_comm_handle *h) { (void)h; }
int tt_nccl_join(tt_comm_handle *h) {
  (void)h;
  return tt_set_error("collectives on CUDA tensors need a build with NCCL");
}
int tt_nccl_poll_pending(void) { return 0; }
int tt_nccl_watch(double now, double timeout, tt_comm_handle *late, double *waited) {
  (void)now, (void)timeout, (void)late, (void)waited;
  return 0;
}
void tt_nccl_set_watchdog(void (*on_late)(const tt_comm_handle *h, double waited_s),
                          void (*on_fatal)(const char *msg)) {
  (void)on_late;
  (void)on_fatal;
}
int tt_nccl_deferred(void) { return 0; }

#endif
