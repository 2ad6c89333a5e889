/*
** dist_internal.h — what the files of engine/dist share: the group and handle structs,
** MPI error checking, and the NCCL entry points (engine/dist/nccl.c).
*/
#ifndef TT_DIST_INTERNAL_H
#define TT_DIST_INTERNAL_H
#include "tetra_dist.h"
#include "core/tt_internal.h"
#include <mpi.h>

struct tt_comm {
  MPI_Comm mpi;        /* MPI_COMM_NULL for the one-process world without MPI */
  int rank;
  int size;
  int is_world;        /* owned by the module, never freed by tt_comm_free */
  int *world_ranks;    /* group rank -> world rank (size entries) */
  char name[32];
  void *nccl;          /* NCCL communicator state (tt_dist_nccl_enable), or NULL */
  int nccl_aborted;    /* tt_nccl_abort ran: NULL above says so, not a missing enable */
  int made;            /* its place (from 1) in comm.c's list of groups whose transports
                       ** the exit frees in order; 0 when not listed */
  int dropped;         /* tt_comm_free ran: only the exit frees its transports */
};

/* What a finished transfer still has to do with its buffers. */
typedef enum {
  TT_POST_NONE = 0,
  TT_POST_COPY_BACK,    /* work buffer -> target (target was not contiguous) */
  TT_POST_UNPACK        /* (n, block...) work buffer -> out, block r at slot r of dim */
} tt_post_kind;

struct tt_comm_handle {
  tt_comm *comm;
  const char *what;     /* "all_reduce", ... for messages */
  int backend;          /* 0: local (already complete), 1: MPI, 2: NCCL */
  int n_req;
  MPI_Request req[1];
  void *nccl_event;     /* cudaEvent_t recorded after the NCCL call */
  int done;             /* transfer complete and post-processing done */
  double started;       /* tt_dist_now() at start: the latency telemetry reports */
  tt_post_kind post;
  double scale;         /* multiply the result by this (AVG), 1 otherwise */
  int dim;              /* gather / concat dim for post-processing */
  tt_tensor *target;    /* user tensor for in-place results (retained) */
  tt_tensor *send;      /* contiguous send buffer of out-of-place kinds (retained) */
  tt_tensor *work;      /* contiguous buffer that receives the result (retained) */
  tt_tensor *out;       /* result handed to the caller (retained once more here) */
};

/* Checks an MPI return code; the message names the call site and the MPI error. */
int tt_dist_mpi_error(int rc, const char *what, const tt_comm *c, const char *file,
                      int line);
#define TT_MPI(call, what, comm) \
  do { int rc_ = (call); \
       if (rc_ != MPI_SUCCESS) return tt_dist_mpi_error(rc_, what, comm, __FILE__, __LINE__); \
  } while (0)

/* Host names (hosts.c): every rank's, gathered once at start-up over `world`. */
int tt_dist_hosts_init(MPI_Comm world, int size);
void tt_dist_hosts_free(void);
/* Probes the hosts of c's other members (then, if they all answer, every other host of
** the job) and writes what it found to out: "; host node3 (world ranks 4,5) does not
** answer", or "; every other host answers", or "" with one host; *probed is how many
** hosts it probed. Returns how many do not answer. Takes up to 2 s. */
int tt_dist_hosts_report(const tt_comm *c, int self_world_rank, char *out, size_t size,
                         int *probed);

/* Reports a collective that missed its deadline and aborts the job. Never returns. */
void tt_dist_watchdog_fire(const tt_comm_handle *h, double waited_s);
double tt_dist_now(void);   /* monotonic seconds */
/* Brackets a blocking call on the main thread that cannot poll (MPI_Comm_split, NCCL's
** set-up): the watchdog thread reports it, as "what on group c", past dist.timeout_s. One
** at a time; not nested. */
void tt_dist_blocking_begin(const char *what, tt_comm *c);
void tt_dist_blocking_end(void);
/* 1 with the call, its group and its start while the main thread is in one, else 0. */
int tt_dist_blocking_get(const char **what, tt_comm **c, double *since);

/* Scales a contiguous float tensor in place (CPU). */
int tt_dist_scale_inplace(tt_tensor *t, double s);

/* -- NCCL (engine/dist/nccl.c, only in builds with TETRA_HAVE_NCCL) -------------------- */
/* The transfer kinds the NCCL path implements; buffers are contiguous device memory. */
typedef enum {
  TT_NCCL_ALL_REDUCE, TT_NCCL_ALL_GATHER, TT_NCCL_REDUCE_SCATTER, TT_NCCL_BROADCAST,
  TT_NCCL_SEND, TT_NCCL_RECV, TT_NCCL_ALL_TO_ALL
} tt_nccl_kind;
/* Makes c's NCCL communicator (collective over c: rank 0's unique id travels by MPI). */
int tt_nccl_comm_init(tt_comm *c);
/* Starts `kind` on h->comm's NCCL communicator with send buffer
** `src` and receive buffer `dst` (the same tensor for in-place kinds); `count` elements
** per block; peer is the root / destination / source. Sets h->backend and h->nccl_event. */
int tt_nccl_start(tt_comm_handle *h, tt_nccl_kind kind, tt_tensor *src, tt_tensor *dst,
                  int64_t count, int op, int peer);
/* Sends (send[i] to dst[i]) and receives (into recv[i] from src[i]; contiguous device
** tensors, at most TT_P2P_MAX of each) in one NCCL group, so that they progress
** together. Sets h's backend and event. */
int tt_nccl_p2p_start(tt_comm_handle *h, int n_send, tt_tensor *const *send, const int *dst,
                      int n_recv, tt_tensor *const *recv, const int *src);
/* *done = 1 once the event completed; an asynchronous NCCL error is an error. */
int tt_nccl_test(tt_comm_handle *h, int *done);
/* Aborts the group's NCCL communicator (watchdog) so no kernel stays stuck. */
void tt_nccl_abort(tt_comm *c);
void tt_nccl_comm_free(tt_comm *c);
void tt_nccl_event_free(tt_comm_handle *h);
/* The deferred wait: the current compute stream waits for h's transfer (no host wait)
** and the watchdog keeps h's event in its list until it completes. 0, or -1 with the
** message. */
int tt_nccl_join(tt_comm_handle *h);
/* Watchdog pass over the collectives the device still waits for: a finished one leaves
** the list (its latency reported), an asynchronous NCCL error is an error, one older than
** the dist timeout fires the watchdog (which aborts the job). */
int tt_nccl_poll_pending(void);
/* The watchdog thread's look at the same list (it retires nothing): 1 with *late a copy of
** the oldest entry's handle and *waited its age when one is older than timeout, else 0. */
int tt_nccl_watch(double now, double timeout, tt_comm_handle *late, double *waited);
/* The watchdog the transport calls (comm.c's, set by tt_dist_init): on_late for a
** transfer older than dist.timeout_s (it does not return), on_fatal for a failure found
** while the host waits for the device. */
void tt_nccl_set_watchdog(void (*on_late)(const tt_comm_handle *h, double waited_s),
                          void (*on_fatal)(const char *msg));
/* 1 when waits on NCCL collectives are deferred to the device (the default; the
** environment's TETRA_NCCL_HOST_WAIT=1 makes the host wait for each instead). */
int tt_nccl_deferred(void);

#endif
