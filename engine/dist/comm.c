/*
** comm.c — process start-up, groups, and collectives on tensors with a watchdog.
**
** Every collective is non-blocking underneath: start (MPI_I* or an NCCL call on a stream)
** returns a handle; waiting polls the handle until it completes or the deadline passes.
** The blocking functions are start + wait. Polling instead of a blocking MPI call is
** what lets a hung peer turn into a clear report instead of a silent hang.
*/
#include "dist/dist_internal.h"
#include "tetra_telemetry.h"
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* -- Under AddressSanitizer (tools/test --sanitize) ---------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
/* A rank that mpirun started checks no leaks: Open MPI 4.1 keeps allocations past
** MPI_Finalize, some made by plugins it unloads before exit, whose frames no suppression
** can name. Memory errors are still caught. LeakSanitizer asks this at exit. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL; }
#endif

/* -- Process state ------------------------------------------------------------------ */

static struct {
  int setup;            /* tt_dist_init ran */
  int mpi_running;      /* MPI initialised and not finalized */
  int we_initialized;   /* we called MPI_Init (so we finalize) */
  int local_rank;
  int local_size;
  int64_t step;
  int aborting;
  int agreed_exit;      /* an exit status every rank agreed on (tt_dist_set_agreed_exit) */
  int half_ops_created;
  int nccl_eager;       /* tt_dist_nccl_enable ran: every new group gets its communicator */
  MPI_Op half_ops[2][4];   /* [bf16, f16][tt_reduce_op]; the AVG slot holds the sum */
} g = {.local_size = 1};

static int g_self_rank = 0;
static tt_comm g_world;

static void world_as_one_process(void) {
  g_world.mpi = MPI_COMM_NULL;
  g_world.rank = 0;
  g_world.size = 1;
  g_world.is_world = 1;
  g_world.world_ranks = &g_self_rank;
  g_world.nccl = NULL;
  snprintf(g_world.name, sizeof g_world.name, "world");
}

int tt_dist_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL ||
         getenv("PMI_RANK") != NULL;
}

int tt_dist_env_rank(void) {
  const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v) return atoi(v);
  }
  return 0;
}


/* Exits with status arg after 15 s, from a thread of its own: MPI_Abort asks the
** launcher to end the job, and waits for good when the launcher is out of reach (this
** host cut off from mpirun's). */
static void *exit_after(void *arg) {
  double until = tt_dist_now() + 15.0;
  while (tt_dist_now() < until) {
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "tetra: rank %d: MPI_Abort did not end this process in 15 s; exiting\n",
          g_world.rank);
  fflush(stderr);
  _exit((int)(intptr_t)arg);
}

void tt_dist_set_agreed_exit(int status) { g.agreed_exit = status; }

static void abort_job(int code) {
  pthread_t t;
  if (pthread_create(&t, NULL, exit_after, (void *)(intptr_t)code) == 0) pthread_detach(t);
  MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

/* Exit hook: a clean exit finalizes MPI; any other exit status aborts the whole job, so
** a rank that fails (a Lua error, an exit(1)) never leaves the others waiting. A status
** every rank agreed to exit with (a stop at a signal) finalizes too. */
static void on_process_exit(int status, void *arg) {
  (void)arg;
  if (!g.mpi_running) return;
  if (status == 0 || (g.agreed_exit != 0 && status == g.agreed_exit)) {
    tt_dist_finalize();
    return;
  }
  if (!g.aborting) {
    g.aborting = 1;
    fprintf(stderr, "tetra: rank %d: exited with status %d; aborting the job\n",
            g_world.rank, status);
    fflush(stderr);
  }
  abort_job(status);
}

/* bf16 / f16 reductions: MPI has no 16-bit float types, so the buffers travel as
** MPI_UINT16_T with user operations that widen to float, reduce, and round back. */
typedef float (*half_to_float)(uint16_t);
typedef uint16_t (*float_to_half)(float);

static void half_reduce(const uint16_t *in, uint16_t *inout, int n, half_to_float to_f,
                        float_to_half from_f, int op) {
  for (int i = 0; i < n; i++) {
    float a = to_f(in[i]), b = to_f(inout[i]);
    float r = op == TT_REDUCE_MAX ? (a > b ? a : b) : op == TT_REDUCE_MIN ? (a < b ? a : b)
                                                                          : a + b;
    inout[i] = from_f(r);
  }
}
#define TT_HALF_OP(fname, to_f, from_f, op) \
  static void fname(void *in, void *inout, int *len, MPI_Datatype *dt) { \
    (void)dt; half_reduce(in, inout, *len, to_f, from_f, op); }
TT_HALF_OP(bf16_sum, tt_bf16_to_float, tt_float_to_bf16, TT_REDUCE_SUM)
TT_HALF_OP(bf16_max, tt_bf16_to_float, tt_float_to_bf16, TT_REDUCE_MAX)
TT_HALF_OP(bf16_min, tt_bf16_to_float, tt_float_to_bf16, TT_REDUCE_MIN)
TT_HALF_OP(f16_sum, tt_f16_to_float, tt_float_to_f16, TT_REDUCE_SUM)
TT_HALF_OP(f16_max, tt_f16_to_float, tt_float_to_f16, TT_REDUCE_MAX)
TT_HALF_OP(f16_min, tt_f16_to_float, tt_float_to_f16, TT_REDUCE_MIN)
#undef TT_HALF_OP

static int create_half_ops(void) {
  MPI_User_function *fns[2][4] = {{bf16_sum, bf16_sum, bf16_max, bf16_min},
                                  {f16_sum, f16_sum, f16_max, f16_min}};
  for (int k = 0; k < 2; k++)
    for (int op = 0; op < 4; op++)
      TT_MPI(MPI_Op_create(fns[k][op], 1, &g.half_ops[k][op]), "init", NULL);
  g.half_ops_created = 1;
  return 0;
}

/* -- The watchdog thread ------------------------------------------------------------ */

/* Waits no poll can watch: a blocking MPI call (making a group, NCCL's set-up), and on
** GPUs a host stuck in a kernel launch behind a collective that never ends (the launch
** queue is full, so the join or host wait that would poll next never comes). A thread of
** its own looks at both a few times a second and fires the watchdog on one past
** dist.timeout_s. It calls no MPI itself; firing does (MPI_Abort), once for the process. */
static struct {
  pthread_mutex_t lock;
  pthread_t thread;
  int running;
  int stop;
} g_wd = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *watchdog_main(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    double now = tt_dist_now(), timeout = tt_dist_get_timeout();
    tt_comm_handle late;
    double waited = 0.0, since = 0.0;
    int fire = 0;
    pthread_mutex_lock(&g_wd.lock);
    int stop = g_wd.stop;
    pthread_mutex_unlock(&g_wd.lock);
    if (stop) return NULL;
    const char *what = NULL;
    tt_comm *comm = NULL;
    if (timeout > 0 && tt_dist_blocking_get(&what, &comm, &since) && now - since > timeout) {
      memset(&late, 0, sizeof late);
      late.comm = comm;
      late.what = what;
      late.backend = 1;
      waited = now - since;
      fire = 1;
    }
    if (!fire && timeout > 0) fire = tt_nccl_watch(now, timeout, &late, &waited);
    if (fire) tt_dist_watchdog_fire(&late, waited);
  }
}

static void watchdog_start(void) {
  if (g_wd.running) return;
  g_wd.stop = 0;
  /* (without it the polls on the main thread still watch; only the blocked cases go
  ** unseen, so a failure here is said, not fatal) */
  if (pthread_create(&g_wd.thread, NULL, watchdog_main, NULL) != 0) {
    fprintf(stderr, "tetra: rank %d: could not start the watchdog thread; a rank blocked "
            "in a call that cannot poll will not be reported\n", g_world.rank);
    return;
  }
  g_wd.running = 1;
}

static void watchdog_stop(void) {
  if (!g_wd.running) return;
  pthread_mutex_lock(&g_wd.lock);
  g_wd.stop = 1;
  pthread_mutex_unlock(&g_wd.lock);
  pthread_join(g_wd.thread, NULL);
  g_wd.running = 0;
}

/* What the NCCL transport does with a transfer past the deadline, or a failure found
** while the host waits for the device: this file's watchdog and abort. */
static void fatal(const char *msg) { tt_dist_abort(msg, 1); }

int tt_dist_init(int force) {
  if (g.setup) return 0;
  world_as_one_process();
  tt_nccl_set_watchdog(tt_dist_watchdog_fire, fatal);
  if (!force && !tt_dist_launched()) {
    g.setup = 1;
    return 0;
  }
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    /* Every rank on this node: shared memory only, so no rank listens for TCP on every
    ** interface. The user's own Open MPI settings win. */
    const char *world = getenv("OMPI_COMM_WORLD_SIZE"), *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (world && local && strcmp(world, local) == 0) setenv("OMPI_MCA_btl", "self,vader", 0);
    /* The gradient all-reduce is nonblocking and in place (MPI_Iallreduce, MPI_IN_PLACE):
    ** Open MPI 4.1's libnbc then picks its binomial tree (reduce to one rank, broadcast
    ** back), which moves each bucket over a link twice in a row; its ring moves 2(n-1)/n
    ** of it, as the planner prices (measured at 100 Mbit/s between 2 hosts: 492 ms
    ** exposed a step binomial, 250 ring; docs/multinode.md). Ring unless set. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    /* Only the main thread calls MPI; data workers and comm polling stay on it. */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return tt_set_error("dist: MPI_Init_thread failed");
    g.we_initialized = 1;
  }
  g.mpi_running = 1;
  /* Errors come back as return codes so they reach the caller with the group named. */
  TT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "init", NULL);
  TT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &g_world.mpi), "init", NULL);
  TT_MPI(MPI_Comm_rank(g_world.mpi, &g_world.rank), "init", NULL);
  TT_MPI(MPI_Comm_size(g_world.mpi, &g_world.size), "init", NULL);
  TT_ALLOC(g_world.world_ranks, sizeof(int) * (size_t)g_world.size);
  for (int i = 0; i < g_world.size; i++) g_world.world_ranks[i] = i;
  watchdog_start();
  MPI_Comm node;
  tt_dist_blocking_begin("init (ranks of this host)", &g_world);
  int rc = MPI_Comm_split_type(g_world.mpi, MPI_COMM_TYPE_SHARED, g_world.rank,
                               MPI_INFO_NULL, &node);
  tt_dist_blocking_end();
  TT_MPI(rc, "init", NULL);
  TT_MPI(MPI_Comm_rank(node, &g.local_rank), "init", NULL);
  TT_MPI(MPI_Comm_size(node, &g.local_size), "init", NULL);
  MPI_Comm_free(&node);
  tt_dist_blocking_begin("init (host names)", &g_world);
  rc = tt_dist_hosts_init(g_world.mpi, g_world.size);
  tt_dist_blocking_end();
  TT_TRY(rc);
  TT_TRY(create_half_ops());
  if (on_exit(on_process_exit, NULL) != 0) return tt_set_error("dist: on_exit failed");
  g.setup = 1;
  return 0;
}

int tt_dist_is_initialized(void) { return g.mpi_running; }
int tt_dist_rank(void) { return g.setup ? g_world.rank : 0; }
int tt_dist_world_size(void) { return g.setup ? g_world.size : 1; }
int tt_dist_local_rank(void) { return g.local_rank; }
int tt_dist_local_size(void) { return g.local_size; }

/* Groups with transports to free, in the order they were made (the world among them once
** it has an NCCL communicator). Freeing either transport is collective: ncclCommDestroy
** first finalizes a communicator not yet finalized, and finalizing lasts until the
** communicator is "globally quiescent" (nccl.h), so it waits for the other ranks; and
** MPI_Comm_free is collective by the standard. A dropped group's Lua finalizer runs when
** each rank's collector gets to it, in each rank's own order, and two ranks that free two
** shared communicators in opposite orders wait on each other for good. So a dropped group
** is only marked, and the exit (tt_dist_finalize) frees every group's transports in the
** order they were made, the same on every rank. The cost: a dropped group's NCCL buffers
** stay on the device until the exit. */
static tt_comm **g_made;
static int g_n_made, g_cap_made, g_made_seq;

static int remember_group(tt_comm *c) {
  if (g_n_made == g_cap_made) {
    int cap = g_cap_made ? 2 * g_cap_made : 16;
    tt_comm **grown = realloc(g_made, sizeof *grown * (size_t)cap);
    TT_CHECK(grown, "group %s: out of host memory", c->name);
    g_made = grown;
    g_cap_made = cap;
  }
  g_made[g_n_made++] = c;
  c->made = ++g_made_seq;
  return 0;
}

static void forget_group(const tt_comm *c) {
  for (int i = 0; i < g_n_made; i++)
    if (g_made[i] == c) {
      memmove(g_made + i, g_made + i + 1, sizeof *g_made * (size_t)(g_n_made - i - 1));
      g_n_made--;
      return;
    }
}

/* Frees c's NCCL and MPI communicators (TETRA_TEST_LOG_TEARDOWN=1 says so, for the test
** of the order: tests/dist/teardown_order.sh). */
static void free_transports(tt_comm *c) {
  const char *e = getenv("TETRA_TEST_LOG_TEARDOWN");
  if (e && strcmp(e, "1") == 0 && c->made) {
    fprintf(stderr, "tetra: rank %d: freeing group %s (made #%d%s)\n", g_world.rank, c->name,
            c->made, c->dropped ? ", dropped" : "");
    fflush(stderr);
  }
  tt_nccl_comm_free(c);
  if (!c->is_world && c->mpi != MPI_COMM_NULL && g.mpi_running) MPI_Comm_free(&c->mpi);
  c->made = 0;
}

static void free_groups_in_order(void) {
  for (int i = 0; i < g_n_made; i++) {
    tt_comm *c = g_made[i];
    free_transports(c);
    if (c->dropped) {
      free(c->world_ranks);
      free(c);
    }
  }
  free(g_made);
  g_made = NULL;
  g_n_made = g_cap_made = 0;
}

int tt_dist_finalize(void) {
  if (!g.mpi_running) return 0;
  /* (watched: freeing waits for the other ranks, and one may be gone) */
  tt_dist_blocking_begin("exit (freeing the groups' communicators)", &g_world);
  free_groups_in_order();
  tt_nccl_comm_free(&g_world);
  tt_dist_blocking_end();
  watchdog_stop();
  if (g.half_ops_created)
    for (int k = 0; k < 2; k++)
      for (int op = 0; op < 4; op++) MPI_Op_free(&g.half_ops[k][op]);
  g.half_ops_created = 0;
  MPI_Comm_free(&g_world.mpi);
  free(g_world.world_ranks);
  tt_dist_hosts_free();
  world_as_one_process();
  g.mpi_running = 0;
  g.nccl_eager = 0;
  if (g.we_initialized) MPI_Finalize();
  return 0;
}

void tt_dist_abort(const char *msg, int code) {
  if (code == 0) code = 1;
  if (!g.aborting) {
    g.aborting = 1;
    if (g.mpi_running)
      fprintf(stderr, "tetra: rank %d: %s\n", g_world.rank, msg);
    else
      fprintf(stderr, "tetra: %s\n", msg);
    fflush(stderr);
  }
  if (g.mpi_running) abort_job(code);
  exit(code);
}

static void sleep_s(double s) {
  double until = tt_dist_now() + s;
  while (tt_dist_now() < until) {
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
}

void tt_dist_await_abort(double grace_s) {
  g.aborting = 1;
  sleep_s(grace_s);
  if (g.mpi_running) abort_job(1);
  exit(1);
}

void tt_dist_set_step(int64_t step) { g.step = step; }
int64_t tt_dist_get_step(void) { return g.step; }

/* Sends SIGTERM to this process's parent when it is Open MPI's daemon (orted), which
** then ends the job's other processes on this host and exits. */
static void end_local_daemon(void) {
  char path[64], comm[32] = "";
  pid_t parent = getppid();
  snprintf(path, sizeof path, "/proc/%d/comm", (int)parent);
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(comm, sizeof comm, f)) comm[0] = '\0';
  fclose(f);
  if (strncmp(comm, "orted", 5) == 0) kill(parent, SIGTERM);
}

/* Seconds Open MPI's mpirun takes to declare a host lost whose connection went silent:
** its oob keepalive (oob_tcp_keepalive_time + intvl x probes), which mpirun hands every
** rank in the environment; Open MPI's defaults when unset. */
static double launcher_loss_s(void) {
  const char *names[3] = {"OMPI_MCA_oob_tcp_keepalive_time", "OMPI_MCA_oob_tcp_keepalive_intvl",
                          "OMPI_MCA_oob_tcp_keepalive_probes"};
  double v[3] = {300, 20, 9};
  for (int i = 0; i < 3; i++) {
    const char *e = getenv(names[i]);
    if (e && *e) v[i] = atof(e);
  }
  return v[0] + v[1] * v[2];
}

void tt_dist_watchdog_fire(const tt_comm_handle *h, double waited_s) {
  /* The main thread's poll and the watchdog thread can find the same late transfer: the
  ** first reports and ends the job, the other waits for that. */
  static atomic_int firing;
  if (atomic_exchange(&firing, 1))
    for (;;) pause();
  const tt_comm *c = h->comm;
  char members[256];
  size_t used = 0;
  members[0] = '\0';
  for (int i = 0; i < c->size && used + 16 < sizeof members; i++)
    used += (size_t)snprintf(members + used, sizeof members - used, "%s%d", i ? "," : "",
                             c->world_ranks[i]);
  char hosts[512] = "";
  int silent = 0, probed = 0;
  if (g.mpi_running && !g.aborting)
    silent = tt_dist_hosts_report(c, g_world.rank, hosts, sizeof hosts, &probed);
  char msg[1024];
  snprintf(msg, sizeof msg,
           "watchdog: %s on group %s (world ranks %s; this is group rank %d of %d) at step "
           "%lld has not completed after %.1f s (dist.timeout_s = %g)%s; aborting the job",
           h->what, c->name, members, c->rank, c->size, (long long)g.step, waited_s,
           tt_dist_get_timeout(), hosts);
  if (!g.mpi_running || g.aborting) tt_dist_abort(msg, 1);
  fprintf(stderr, "tetra: rank %d: %s\n", g_world.rank, msg);
  fflush(stderr);
  /* NCCL's abort (which frees the streams that wait on the collective) after the report:
  ** it may itself wait for the other ranks of this node (NVIDIA/nccl#863), and a rank
  ** stuck there must not be one that said nothing. */
  if (h->backend == 2) tt_nccl_abort(h->comm);
  /* Cut off from every other host, this process cannot reach mpirun either: an abort
  ** would wait for nothing, and the daemon that started it (Open MPI's orted) would wait
  ** for good to pass on its exit. The peers' reports name this host; after a moment for
  ** the other ranks here to report, it ends the daemon, which ends them, and itself. */
  if (probed > 1 && silent == probed) {
    g.aborting = 1;
    sleep_s(2.0);
    end_local_daemon();
    _exit(1);
  }
  /* A host that does not answer is lost to mpirun as well, but mpirun may not know it
  ** yet. An abort now would queue a message to that host's daemon, and Open MPI 4.1's
  ** mpirun then waits on that connection as long as TCP retransmits (a quarter of an
  ** hour): the job would never end. So wait until mpirun's keepalive has declared the
  ** host lost; mpirun then ends the job, this process included. */
  if (silent > 0 && getenv("OMPI_COMM_WORLD_SIZE")) {
    double wait = launcher_loss_s() + 5.0;
    if (wait > 60.0) {
      fprintf(stderr, "tetra: rank %d: mpirun notices a lost host after "
              "oob_tcp_keepalive_time + intvl x probes = %.0f s; waiting %.0f s before the "
              "abort (set them lower on mpirun's line: docs/multinode.md)\n",
              g_world.rank, wait - 5.0, wait);
      fflush(stderr);
    }
    g.aborting = 1;
    sleep_s(wait);
  }
  /* The other members waited about as long: a moment before the abort lets each of them
  ** report too, so the log shows every rank that was waiting (and so which one was not). */
  tt_dist_await_abort(2.0);
}

/* -- Groups ------------------------------------------------------------------------- */

tt_comm *tt_comm_world(void) {
  if (!g.setup && tt_dist_init(0) != 0) return NULL;
  return &g_world;
}

static int split(tt_comm *parent, int color, int key, const char *name, int nccl,
                 tt_comm **out) {
  *out = NULL;
  TT_CHECK(parent, "comm_split: no parent group");
  tt_comm *c = calloc(1, sizeof *c);
  TT_CHECK(c, "comm_split: out of host memory");
  snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
  if (parent->mpi == MPI_COMM_NULL) {
    c->mpi = MPI_COMM_NULL;
    c->rank = 0;
    c->size = 1;
    c->world_ranks = malloc(sizeof(int));
    if (!c->world_ranks) {
      free(c);
      return tt_set_error("comm_split: out of host memory");
    }
    c->world_ranks[0] = 0;
    *out = c;
    return 0;
  }
  tt_dist_blocking_begin("comm_split", parent);
  int rc = MPI_Comm_split(parent->mpi, color, key, &c->mpi);
  tt_dist_blocking_end();
  if (rc != MPI_SUCCESS) {
    free(c);
    return tt_dist_mpi_error(rc, "comm_split", parent, __FILE__, __LINE__);
  }
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  c->world_ranks = malloc(sizeof(int) * (size_t)c->size);
  if (!c->world_ranks) {
    MPI_Comm_free(&c->mpi);
    free(c);
    return tt_set_error("comm_split: out of host memory");
  }
  int me = g_world.rank;
  tt_dist_blocking_begin("comm_split (member list)", c);
  rc = MPI_Allgather(&me, 1, MPI_INT, c->world_ranks, 1, MPI_INT, c->mpi);
  tt_dist_blocking_end();
  if (rc != MPI_SUCCESS) {
    tt_comm_free(c);
    return tt_dist_mpi_error(rc, "comm_split", parent, __FILE__, __LINE__);
  }
  if (nccl && g.nccl_eager && c->size > 1 && tt_nccl_comm_init(c) != 0) {
    tt_comm_free(c);
    return -1;
  }
  if (remember_group(c) != 0) {
    tt_comm_free(c);
    return -1;
  }
  *out = c;
  return 0;
}

int tt_comm_split(tt_comm *parent, int color, int key, const char *name, tt_comm **out) {
  return split(parent, color, key, name, 1, out);
}

int tt_comm_split_host(tt_comm *parent, int color, int key, const char *name, tt_comm **out) {
  return split(parent, color, key, name, 0, out);
}

int tt_dist_nccl_enable(void) {
  TT_CHECK(g.setup, "tt_dist_nccl_enable: call tt_dist_init first");
  if (g.nccl_eager) return 0;
  if (g_world.size > 1 && !g_world.nccl) {
    TT_TRY(tt_nccl_comm_init(&g_world));
    TT_TRY(remember_group(&g_world));
  }
  g.nccl_eager = 1;
  return 0;
}

int tt_comm_has_nccl(const tt_comm *c) { return c && c->nccl != NULL; }

void tt_comm_free(tt_comm *c) {
  if (!c || c->is_world) return;
  if (c->made && g.mpi_running) {   /* the exit frees it, in order (free_groups_in_order) */
    c->dropped = 1;
    return;
  }
  forget_group(c);
  free_transports(c);
  free(c->world_ranks);
  free(c);
}

int tt_comm_rank(const tt_comm *c) { return c->rank; }
int tt_comm_size(const tt_comm *c) { return c->size; }
const char *tt_comm_name(const tt_comm *c) { return c->name; }
int tt_comm_world_rank_of(const tt_comm *c, int group_rank) {
  return group_rank >= 0 && group_rank < c->size ? c->world_ranks[group_rank] : -1;
}

int tt_reduce_op_from_name(const char *name) {
  const char *names[] = {"sum", "avg", "max", "min"};
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, names[i]) == 0) return i;
  return -1;
}

/* -- Datatypes ---------------------------------------------------------------------- */

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
  case TT_F32: return MPI_FLOAT;
  case TT_I32: return MPI_INT32_T;
  case TT_I64: return MPI_INT64_T;
  case TT_BF16:
  case TT_F16: return MPI_UINT16_T;
  default: return MPI_UINT8_T;
  }
}

static int check_reducible(const char *what, const tt_tensor *t, int op) {
  TT_CHECK(op >= 0 && op <= TT_REDUCE_MIN, "%s: unknown reduce op %d (sum, avg, max, min)",
           what, op);
  int d = t->dtype;
  TT_CHECK(d == TT_F32 || d == TT_BF16 || d == TT_F16 || d == TT_I32 || d == TT_I64,
           "%s: cannot reduce %s tensors (f32, bf16, f16, i32, i64)", what,
           tt_dtype_name(d));
  TT_CHECK(op != TT_REDUCE_AVG || tt_dtype_is_float(d),
           "%s: avg needs a float tensor, got %s", what, tt_dtype_name(d));
  return 0;
}

static MPI_Op mpi_op(int dtype, int op) {
  if (dtype == TT_BF16) return g.half_ops[0][op];
  if (dtype == TT_F16) return g.half_ops[1][op];
  return op == TT_REDUCE_MAX ? MPI_MAX : op == TT_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

int tt_dist_scale_inplace(tt_tensor *t, double s) {
  int64_t n = tt_tensor_numel(t);
  void *p = tt_tensor_data(t);
  switch (t->dtype) {
  case TT_F32: {
    float *x = p, f = (float)s;
    for (int64_t i = 0; i < n; i++) x[i] *= f;
    return 0;
  }
  case TT_BF16: {
    uint16_t *x = p;
    for (int64_t i = 0; i < n; i++) x[i] = tt_float_to_bf16(tt_bf16_to_float(x[i]) * (float)s);
    return 0;
  }
  case TT_F16: {
    uint16_t *x = p;
    for (int64_t i = 0; i < n; i++) x[i] = tt_float_to_f16(tt_f16_to_float(x[i]) * (float)s);
    return 0;
  }
  default: return tt_set_error("scale: %s is not a float dtype", tt_dtype_name(t->dtype));
  }
}

/* -- Handles ------------------------------------------------------------------------ */

static int handle_new(tt_comm *c, const char *what, tt_comm_handle **out) {
  tt_comm_handle *h = calloc(1, sizeof *h);
  TT_CHECK(h, "%s: out of host memory", what);
  h->comm = c;
  h->what = what;
  h->scale = 1.0;
  h->req[0] = MPI_REQUEST_NULL;
  /* Always: the NCCL watchdog measures a pending collective from here (it once read 0.0
  ** with telemetry and tracing off, the default, and so took every collective still
  ** running for one as old as the node's uptime, past dist.timeout_s). */
  h->started = tt_dist_now();
  *out = h;
  return 0;
}

static void handle_release_tensors(tt_comm_handle *h) {
  tt_tensor_release(h->target);
  tt_tensor_release(h->work);
  tt_tensor_release(h->out);
  tt_tensor_release(h->send);
  h->target = h->work = h->out = h->send = NULL;
}

/* Block r of a (n, block...) buffer as a tensor shaped like the block. */
static int block_of(tt_tensor *buf, int64_t r, tt_tensor **out) {
  tt_tensor *row = NULL;
  TT_TRY(tt_narrow(buf, 0, r, 1, &row));
  int rc = tt_view(row, buf->shape + 1, buf->ndim - 1, out);
  tt_tensor_release(row);
  return rc;
}

/* Copies block r of buf (n, block...) into slot r of `dst` along `dim`, for every r. */
static int unpack_blocks(tt_tensor *buf, tt_tensor *dst, int dim) {
  int64_t n = buf->shape[0], len = buf->shape[1 + dim];
  for (int64_t r = 0; r < n; r++) {
    tt_tensor *src = NULL, *slot = NULL;
    int rc = block_of(buf, r, &src);
    if (rc == 0) rc = tt_narrow(dst, dim, r * len, len, &slot);
    if (rc == 0) rc = tt_copy_(slot, src);
    tt_tensor_release(src);
    tt_tensor_release(slot);
    TT_TRY(rc);
  }
  return 0;
}

/* Copies slot r of `src` along `dim` into block r of buf (n, block...), for every r. */
static int pack_blocks(tt_tensor *src, int dim, tt_tensor *buf) {
  int64_t n = buf->shape[0], len = buf->shape[1 + dim];
  for (int64_t r = 0; r < n; r++) {
    tt_tensor *dst = NULL, *slot = NULL;
    int rc = block_of(buf, r, &dst);
    if (rc == 0) rc = tt_narrow(src, dim, r * len, len, &slot);
    if (rc == 0) rc = tt_copy_(dst, slot);
    tt_tensor_release(dst);
    tt_tensor_release(slot);
    TT_TRY(rc);
  }
  return 0;
}

/* Post-processing once the transfer is complete: scale (avg), then move the result from
** the work buffer to where the caller expects it. */
static int handle_finish(tt_comm_handle *h) {
  /* Latency as this rank saw it, for groups that really communicate (a group of one is a
  ** local copy). An async operation completes when it is next tested or waited on. A
  ** joined NCCL transfer has started 0.0: its latency is reported when it finishes. */
  if (h->started > 0.0 && h->comm->size > 1) {
    double end = tt_dist_now();
    tt_telemetry_collective(h->what, h->comm->name, end - h->started);
    if (tt_trace_enabled()) tt_trace_collective(h->what, h->comm->name, h->started, end);
  }
  int rc = 0;
  if (h->scale != 1.0 && h->work) rc = tt_dist_scale_inplace(h->work, h->scale);
  if (rc == 0 && h->post == TT_POST_COPY_BACK) rc = tt_copy_(h->target, h->work);
  if (rc == 0 && h->post == TT_POST_UNPACK) rc = unpack_blocks(h->work, h->out, h->dim);
  if (h->backend == 2) tt_nccl_event_free(h);
  handle_release_tensors(h);
  h->done = 1;
  if (rc != 0) return tt_error_context("%s on group %s", h->what, h->comm->name);
  return 0;
}

static int handle_poll(tt_comm_handle *h, int *done) {
  *done = 0;
  if (h->backend == 1) {
    int flag = 0;
    TT_MPI(MPI_Testall(h->n_req, h->req, &flag, MPI_STATUSES_IGNORE), h->what, h->comm);
    *done = flag;
    return 0;
  }
  if (h->backend == 2) return tt_nccl_test(h, done);
  *done = 1;
  return 0;
}

/* Finishing unpacks through views, which must not land on the autograd tape. */
static int finish_without_grad(tt_comm_handle *h) {
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = handle_finish(h);
  tt_set_grad_enabled(prev);
  return rc;
}

int tt_comm_test(tt_comm_handle *h, int *done) {
  *done = h->done;
  if (h->done) return 0;
  TT_TRY(handle_poll(h, done));
  if (!*done) return 0;
  return finish_without_grad(h);
}

/* Seconds callers spent blocked in tt_comm_wait (every blocking collective waits there). */
static double g_wait_s = 0.0;

double tt_dist_wait_seconds(void) { return g_wait_s; }

int tt_comm_wait(tt_comm_handle *h) {
  if (h->done) return 0;
  if (h->backend == 2 && tt_nccl_deferred()) {
    /* The device waits, not the host (nccl.c); the latency is reported when the
    ** watchdog sees the transfer finish. */
    TT_TRY(tt_nccl_join(h));
    h->started = 0.0;   /* (so that handle_finish reports nothing: the watchdog will) */
    return finish_without_grad(h);
  }
  double start = tt_dist_now();
  for (int polls = 0;; polls++) {
    int done = 0;
    TT_TRY(handle_poll(h, &done));
    if (done) break;
    double waited = tt_dist_now() - start;
    double timeout = tt_dist_get_timeout();
    if (timeout > 0 && waited > timeout) tt_dist_watchdog_fire(h, waited);
    /* Spin briefly for small messages, then sleep so oversubscribed ranks share cores. */
    if (polls < 64) {
      sched_yield();
    } else {
      struct timespec ts = {0, polls < 1024 ? 20000 : 200000};
      nanosleep(&ts, NULL);
    }
  }
  g_wait_s += tt_dist_now() - start;
  return finish_without_grad(h);
}

/* After a transfer failed, or was never seen to end: it may still write its buffers, so
** those must not go back to the cache, where another tensor could get them. An MPI
** request left active is left as it is (MPI forbids freeing a nonblocking collective's
** request, MPI-3.1 5.12) and its tensors are kept: the job is failing. An NCCL transfer
** the compute stream does not wait for yet (not joined) has its communicator aborted,
** which ends its kernels but is not said to wait for them, so its tensors are kept too.
** A transfer already joined needs neither: a block freed there is reused after it, in
** stream order. */
static void forsake(tt_comm_handle *h) {
  int keep = 0;
  for (int i = 0; i < h->n_req; i++)
    if (h->req[i] != MPI_REQUEST_NULL) keep = 1;
  if (h->backend == 2 && h->nccl_event) {
    tt_nccl_abort(h->comm);
    keep = 1;
  }
  if (h->backend == 2) tt_nccl_event_free(h);
  if (!keep) handle_release_tensors(h);
}

void tt_comm_handle_free(tt_comm_handle *h) {
  if (!h) return;
  if (!h->done && tt_comm_wait(h) != 0) forsake(h);
  free(h);
}

/* -- Starting transfers ------------------------------------------------------------- */

static int check_count(const char *what, int64_t n) {
  TT_CHECK(n <= INT32_MAX, "%s: %lld elements exceed one MPI message (2^31 - 1)", what,
           (long long)n);
  return 0;
}

static int check_device(const char *what, const tt_tensor *t) {
#ifdef TETRA_HAVE_NCCL
  (void)what;
  (void)t;
  return 0;
#else
  TT_CHECK(!tt_device_is_cuda(t->device),
           "%s: tensor on cuda:%d but this build has no NCCL backend", what, t->device);
  return 0;
#endif
}

/* Contiguous work buffer for t: t itself (retained) when already contiguous, else a
** copy; *copied says which. */
static int work_of(tt_tensor *t, tt_tensor **work, int *copied) {
  TT_TRY(tt_contiguous(t, work));
  *copied = *work != t;
  return 0;
}

static int empty_blocks(const tt_tensor *t, int dim, int64_t n, int64_t dim_len,
                        tt_tensor **out) {
  int64_t shape[TT_MAX_DIMS];
  TT_CHECK(t->ndim + 1 <= TT_MAX_DIMS, "collective: tensor has too many dims (%d)", t->ndim);
  shape[0] = n;
  for (int i = 0; i < t->ndim; i++) shape[1 + i] = i == dim ? dim_len : t->shape[i];
  return tt_tensor_empty(shape, t->ndim + 1, t->dtype, t->device, out);
}

static int empty_resized(const tt_tensor *t, int dim, int64_t dim_len, tt_tensor **out) {
  int64_t shape[TT_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) shape[i] = i == dim ? dim_len : t->shape[i];
  return tt_tensor_empty(shape, t->ndim, t->dtype, t->device, out);
}

#ifdef TETRA_HAVE_NCCL
#define TT_IS_NCCL(t) tt_device_is_cuda((t)->device)
#else
#define TT_IS_NCCL(t) 0
#endif

static int all_reduce_start(tt_comm *c, tt_tensor *t, int op, tt_comm_handle *h) {
  TT_TRY(check_reducible("all_reduce", t, op));
  TT_TRY(check_device("all_reduce", t));
  if (c->size == 1) return 0;
  int copied = 0;
  TT_TRY(work_of(t, &h->work, &copied));
  if (copied) {
    tt_tensor_retain(t);
    h->target = t;
    h->post = TT_POST_COPY_BACK;
  }
  int64_t n = tt_tensor_numel(t);
  if (TT_IS_NCCL(t)) return tt_nccl_start(h, TT_NCCL_ALL_REDUCE, h->work, h->work, n, op, 0);
  TT_TRY(check_count("all_reduce", n));
  if (op == TT_REDUCE_AVG) h->scale = 1.0 / c->size;
  h->backend = 1;
  h->n_req = 1;
  TT_MPI(MPI_Iallreduce(MPI_IN_PLACE, tt_tensor_data(h->work), (int)n, mpi_type(t->dtype),
                        mpi_op(t->dtype, op), c->mpi, &h->req[0]), "all_reduce", c);
  return 0;
}

static int all_gather_start(tt_comm *c, tt_tensor *t, int dim, tt_tensor **out,
                            tt_comm_handle *h) {
  TT_TRY(check_device("all_gather", t));
  TT_TRY(tt_norm_dim("all_gather", dim, t->ndim, &dim));
  TT_TRY(empty_resized(t, dim, t->shape[dim] * c->size, out));
  if (c->size == 1) return tt_copy_(*out, t);
  tt_tensor *send = NULL;
  int copied = 0;
  TT_TRY(work_of(t, &send, &copied));
  h->send = send;
  if (dim == 0) {
    /* (n * d0, ...) is laid out exactly like (n, d0, ...): receive straight into out. */
    tt_tensor_retain(*out);
    h->work = *out;
  } else {
    TT_TRY(empty_blocks(t, dim, c->size, t->shape[dim], &h->work));
    tt_tensor_retain(*out);
    h->out = *out;
    h->post = TT_POST_UNPACK;
    h->dim = dim;
  }
  int64_t n = tt_tensor_numel(t);
  if (TT_IS_NCCL(t)) return tt_nccl_start(h, TT_NCCL_ALL_GATHER, send, h->work, n, 0, 0);
  TT_TRY(check_count("all_gather", n * c->size));
  h->backend = 1;
  h->n_req = 1;
  MPI_Datatype ty = mpi_type(t->dtype);
  TT_MPI(MPI_Iallgather(tt_tensor_data(send), (int)n, ty, tt_tensor_data(h->work), (int)n,
                        ty, c->mpi, &h->req[0]), "all_gather", c);
  return 0;
}

static int reduce_scatter_start(tt_comm *c, tt_tensor *t, int dim, int op, tt_tensor **out,
                                tt_comm_handle *h) {
  TT_TRY(check_reducible("reduce_scatter", t, op));
  TT_TRY(check_device("reduce_scatter", t));
  TT_TRY(tt_norm_dim("reduce_scatter", dim, t->ndim, &dim));
  TT_CHECK(t->shape[dim] % c->size == 0,
           "reduce_scatter: dim %d of size %lld does not divide by group %s of size %d", dim,
           (long long)t->shape[dim], c->name, c->size);
  int64_t len = t->shape[dim] / c->size;
  TT_TRY(empty_resized(t, dim, len, out));
  if (c->size == 1) return tt_copy_(*out, t);
  tt_tensor *send = NULL;
  if (dim == 0) {
    int copied = 0;
    TT_TRY(work_of(t, &send, &copied));
    h->send = send;
  } else {
    TT_TRY(empty_blocks(t, dim, c->size, len, &send));
    h->send = send;
    TT_TRY(pack_blocks(t, dim, send));
  }
  tt_tensor_retain(*out);
  h->work = *out;
  int64_t n = tt_tensor_numel(*out);
  if (TT_IS_NCCL(t)) return tt_nccl_start(h, TT_NCCL_REDUCE_SCATTER, send, *out, n, op, 0);
  TT_TRY(check_count("reduce_scatter", n * c->size));
  if (op == TT_REDUCE_AVG) h->scale = 1.0 / c->size;
  h->backend = 1;
  h->n_req = 1;
  TT_MPI(MPI_Ireduce_scatter_block(tt_tensor_data(send), tt_tensor_data(*out), (int)n,
                                   mpi_type(t->dtype), mpi_op(t->dtype, op), c->mpi,
                                   &h->req[0]), "reduce_scatter", c);
  return 0;
}

static int broadcast_start(tt_comm *c, tt_tensor *t, int root, tt_comm_handle *h) {
  TT_TRY(check_device("broadcast", t));
  TT_CHECK(root >= 0 && root < c->size, "broadcast: root %d outside group %s of size %d",
           root, c->name, c->size);
  if (c->size == 1) return 0;
  int copied = 0;
  TT_TRY(work_of(t, &h->work, &copied));
  if (copied) {
    tt_tensor_retain(t);
    h->target = t;
    h->post = TT_POST_COPY_BACK;
  }
  int64_t n = tt_tensor_numel(t);
  if (TT_IS_NCCL(t)) return tt_nccl_start(h, TT_NCCL_BROADCAST, h->work, h->work, n, 0, root);
  TT_TRY(check_count("broadcast", n));
  h->backend = 1;
  h->n_req = 1;
  TT_MPI(MPI_Ibcast(tt_tensor_data(h->work), (int)n, mpi_type(t->dtype), root, c->mpi,
                    &h->req[0]), "broadcast", c);
  return 0;
}

/* TETRA_TEST_P2P_IN_ORDER=1 (tests only): point-to-point transfers on the host as NCCL
** runs them on a GPU, where the group's calls queue on one stream: a send completes only
** once its receiver took it, and nothing after it starts before (tt_comm_send_async
** waits); a tt_comm_sendrecv's two halves progress together, as NCCL's grouped pair does.
** MPI alone lets sends run ahead, which hides an order in which two ranks each send
** before they receive (tests/dist/pipeline_in_order.sh). */
static int p2p_in_order(void) {
  static int on = -1;
  if (on < 0) {
    const char *v = getenv("TETRA_TEST_P2P_IN_ORDER");
    on = v && strcmp(v, "1") == 0;
  }
  return on;
}

static int p2p_start(tt_comm *c, tt_tensor *t, int peer, int tag, int is_send,
                     tt_comm_handle *h) {
  const char *what = is_send ? "send" : "recv";
  TT_TRY(check_device(what, t));
  TT_CHECK(peer >= 0 && peer < c->size && peer != c->rank,
           "%s: peer %d is not another rank of group %s (size %d, this is rank %d)", what,
           peer, c->name, c->size, c->rank);
  TT_CHECK(tag >= 0 && tag < 32768, "%s: tag %d outside 0..32767", what, tag);
  int copied = 0;
  TT_TRY(work_of(t, &h->work, &copied));
  if (copied && !is_send) {
    tt_tensor_retain(t);
    h->target = t;
    h->post = TT_POST_COPY_BACK;
  }
  int64_t n = tt_tensor_numel(t);
  if (TT_IS_NCCL(t))
    return tt_nccl_start(h, is_send ? TT_NCCL_SEND : TT_NCCL_RECV, h->work, h->work, n, 0,
                         peer);
  TT_TRY(check_count(what, n));
  h->backend = 1;
  h->n_req = 1;
  void *p = tt_tensor_data(h->work);
  if (is_send && p2p_in_order())   /* (a send that completes only once it is received) */
    TT_MPI(MPI_Issend(p, (int)n, mpi_type(t->dtype), peer, tag, c->mpi, &h->req[0]), what, c);
  else if (is_send)
    TT_MPI(MPI_Isend(p, (int)n, mpi_type(t->dtype), peer, tag, c->mpi, &h->req[0]), what, c);
  else
    TT_MPI(MPI_Irecv(p, (int)n, mpi_type(t->dtype), peer, tag, c->mpi, &h->req[0]), what, c);
  return 0;
}

static int all_to_all_start(tt_comm *c, tt_tensor *t, int split_dim, int concat_dim,
                            tt_tensor **out, tt_comm_handle *h) {
  TT_TRY(check_device("all_to_all", t));
  TT_TRY(tt_norm_dim("all_to_all", split_dim, t->ndim, &split_dim));
  TT_TRY(tt_norm_dim("all_to_all", concat_dim, t->ndim, &concat_dim));
  TT_CHECK(t->shape[split_dim] % c->size == 0,
           "all_to_all: dim %d of size %lld does not divide by group %s of size %d",
           split_dim, (long long)t->shape[split_dim], c->name, c->size);
  int64_t len = t->shape[split_dim] / c->size;
  /* The block each rank exchanges: t's shape with split_dim cut to len. */
  int64_t bshape[TT_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) bshape[i] = i == split_dim ? len : t->shape[i];
  int64_t oshape[TT_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) oshape[i] = i == concat_dim ? bshape[i] * c->size : bshape[i];
  TT_TRY(tt_tensor_empty(oshape, t->ndim, t->dtype, t->device, out));
  if (c->size == 1) return tt_copy_(*out, t);
  tt_tensor *send = NULL;
  if (split_dim == 0) {
    int copied = 0;
    TT_TRY(work_of(t, &send, &copied));
    h->send = send;
  } else {
    TT_TRY(empty_blocks(t, split_dim, c->size, len, &send));
    h->send = send;
    TT_TRY(pack_blocks(t, split_dim, send));
  }
  if (concat_dim == 0) {
    tt_tensor_retain(*out);
    h->work = *out;
  } else {
    int64_t shape[TT_MAX_DIMS];
    shape[0] = c->size;
    memcpy(shape + 1, bshape, sizeof(int64_t) * (size_t)t->ndim);
    TT_TRY(tt_tensor_empty(shape, t->ndim + 1, t->dtype, t->device, &h->work));
    tt_tensor_retain(*out);
    h->out = *out;
    h->post = TT_POST_UNPACK;
    h->dim = concat_dim;
  }
  int64_t n = tt_tensor_numel(t) / c->size;
  if (TT_IS_NCCL(t)) return tt_nccl_start(h, TT_NCCL_ALL_TO_ALL, send, h->work, n, 0, 0);
  TT_TRY(check_count("all_to_all", n * c->size));
  h->backend = 1;
  h->n_req = 1;
  MPI_Datatype ty = mpi_type(t->dtype);
  TT_MPI(MPI_Ialltoall(tt_tensor_data(send), (int)n, ty, tt_tensor_data(h->work), (int)n, ty,
                       c->mpi, &h->req[0]), "all_to_all", c);
  return 0;
}

static int barrier_start(tt_comm *c, tt_comm_handle *h) {
  if (c->size == 1) return 0;
  h->backend = 1;
  h->n_req = 1;
  TT_MPI(MPI_Ibarrier(c->mpi, &h->req[0]), "barrier", c);
  return 0;
}

/* -- Public entry points ------------------------------------------------------------ */
/* Each one: a handle, the start function with grad mode off (packing uses views that
** must not land on the tape), and on failure the handle and any result freed. */

typedef struct {
  int kind;
  tt_comm *c;
  tt_tensor *t;
  int a, b, op;
  tt_tensor **out;
} start_args;

enum { K_ALL_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_SEND, K_RECV,
       K_ALL_TO_ALL, K_BARRIER };
static const char *const kind_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                         "broadcast", "send", "recv", "all_to_all",
                                         "barrier"};

static int dispatch_start(const start_args *s, tt_comm_handle *h) {
  switch (s->kind) {
  case K_ALL_REDUCE: return all_reduce_start(s->c, s->t, s->op, h);
  case K_ALL_GATHER: return all_gather_start(s->c, s->t, s->a, s->out, h);
  case K_REDUCE_SCATTER: return reduce_scatter_start(s->c, s->t, s->a, s->op, s->out, h);
  case K_BROADCAST: return broadcast_start(s->c, s->t, s->a, h);
  case K_SEND: return p2p_start(s->c, s->t, s->a, s->b, 1, h);
  case K_RECV: return p2p_start(s->c, s->t, s->a, s->b, 0, h);
  case K_ALL_TO_ALL: return all_to_all_start(s->c, s->t, s->a, s->b, s->out, h);
  default: return barrier_start(s->c, h);
  }
}

static int start(const start_args *s, tt_comm_handle **ph) {
  *ph = NULL;
  if (s->out) *s->out = NULL;
  const char *what = kind_names[s->kind];
  TT_CHECK(s->c, "%s: no group (call tt_dist_init first)", what);
  TT_CHECK(s->kind == K_BARRIER || s->t, "%s: no tensor", what);
  tt_comm_handle *h = NULL;
  TT_TRY(handle_new(s->c, what, &h));
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = dispatch_start(s, h);
  tt_set_grad_enabled(prev);
  if (rc != 0) {
    handle_release_tensors(h);
    if (h->backend == 2) tt_nccl_event_free(h);
    free(h);
    if (s->out) {
      tt_tensor_release(*s->out);
      *s->out = NULL;
    }
    return -1;
  }
  if (h->backend == 0) handle_finish(h);
  *ph = h;
  return 0;
}

static int run_blocking(const start_args *s) {
  tt_comm_handle *h = NULL;
  TT_TRY(start(s, &h));
  int rc = tt_comm_wait(h);
  tt_comm_handle_free(h);
  if (rc != 0 && s->out) {
    tt_tensor_release(*s->out);
    *s->out = NULL;
  }
  return rc;
}

int tt_comm_all_reduce_async(tt_comm *c, tt_tensor *t, int op, tt_comm_handle **h) {
  start_args s = {K_ALL_REDUCE, c, t, 0, 0, op, NULL};
  return start(&s, h);
}
int tt_comm_all_gather_async(tt_comm *c, tt_tensor *t, int dim, tt_tensor **out,
                             tt_comm_handle **h) {
  start_args s = {K_ALL_GATHER, c, t, dim, 0, 0, out};
  return start(&s, h);
}
int tt_comm_reduce_scatter_async(tt_comm *c, tt_tensor *t, int dim, int op,
                                 tt_tensor **out, tt_comm_handle **h) {
  start_args s = {K_REDUCE_SCATTER, c, t, dim, 0, op, out};
  return start(&s, h);
}
int tt_comm_broadcast_async(tt_comm *c, tt_tensor *t, int root, tt_comm_handle **h) {
  start_args s = {K_BROADCAST, c, t, root, 0, 0, NULL};
  return start(&s, h);
}
int tt_comm_send_async(tt_comm *c, tt_tensor *t, int dst, int tag, tt_comm_handle **h) {
  start_args s = {K_SEND, c, t, dst, tag, 0, NULL};
  TT_TRY(start(&s, h));
  if (p2p_in_order() && (*h)->backend == 1 && tt_comm_wait(*h) != 0) {
    tt_comm_handle_free(*h);
    *h = NULL;
    return -1;
  }
  return 0;
}

int tt_comm_p2p(tt_comm *c, int n_send, tt_tensor *const *send, const int *dst,
                const int *send_tag, int n_recv, tt_tensor *const *recv, const int *src,
                const int *recv_tag, tt_comm_handle **send_h) {
  TT_CHECK(c, "p2p: no group");
  TT_CHECK(n_send >= 0 && n_recv >= 0 && n_send <= TT_P2P_MAX && n_recv <= TT_P2P_MAX,
           "p2p: %d sends and %d receives (at most %d of each)", n_send, n_recv, TT_P2P_MAX);
  int nccl = 0, host = 0;
  for (int i = 0; i < n_send + n_recv; i++) {
    tt_tensor *t = i < n_send ? send[i] : recv[i - n_send];
    int peer = i < n_send ? dst[i] : src[i - n_send];
    TT_CHECK(t, "p2p: no tensor");
    TT_CHECK(peer >= 0 && peer < c->size && peer != c->rank, "p2p: peer %d is not another "
             "rank of group %s (size %d, this is rank %d)", peer, c->name, c->size, c->rank);
    if (TT_IS_NCCL(t)) nccl = 1; else host = 1;
  }
  for (int i = 0; i < n_send; i++) send_h[i] = NULL;
  TT_CHECK(!(nccl && host), "p2p on group %s: tensors on a GPU and on the host in one group",
           c->name);
  if (nccl) {
    for (int i = 0; i < n_recv; i++)
      TT_CHECK(tt_tensor_is_contiguous(recv[i]),
               "p2p: the receiving tensor on cuda:%d must be contiguous", recv[i]->device);
    tt_comm_handle *h = NULL;
    TT_TRY(handle_new(c, n_send && n_recv ? "sendrecv" : n_send ? "send" : "recv", &h));
    tt_tensor *work[TT_P2P_MAX] = {NULL};
    int rc = 0, copied = 0;
    for (int i = 0; i < n_send && rc == 0; i++) rc = work_of(send[i], &work[i], &copied);
    if (rc == 0) rc = tt_nccl_p2p_start(h, n_send, work, dst, n_recv, recv, src);
    if (rc == 0) rc = tt_comm_wait(h);   /* the device waits for the whole group */
    if (rc != 0) {
      forsake(h);
      free(h);
      /* (a contiguous copy may still be read by a transfer not joined: kept then) */
      if (!c->nccl_aborted)
        for (int i = 0; i < n_send; i++) tt_tensor_release(work[i]);
      return -1;
    }
    /* Done: the compute stream waits for the group, so the sends' memory (the copies, and
    ** the caller's tensors) goes back to the cache in stream order after it. */
    for (int i = 0; i < n_send; i++) tt_tensor_release(work[i]);
    if (n_send) send_h[0] = h; else tt_comm_handle_free(h);
    return 0;
  }
  /* MPI: the sends go out, then the receives; all are posted before any is waited for. In
  ** order (p2p_in_order) the sends are waited for too, as NCCL's group ends only when all
  ** of it has: nothing after the group starts before its sends were received. */
  tt_comm_handle *rh[TT_P2P_MAX] = {NULL};
  int rc = 0;
  for (int i = 0; i < n_send && rc == 0; i++) {
    start_args s = {K_SEND, c, send[i], dst[i], send_tag[i], 0, NULL};
    rc = start(&s, &send_h[i]);
  }
  for (int i = 0; i < n_recv && rc == 0; i++) {
    start_args s = {K_RECV, c, recv[i], src[i], recv_tag[i], 0, NULL};
    rc = start(&s, &rh[i]);
  }
  for (int i = 0; i < n_recv && rc == 0; i++) rc = tt_comm_wait(rh[i]);
  for (int i = 0; i < n_send && rc == 0 && p2p_in_order(); i++) rc = tt_comm_wait(send_h[i]);
  for (int i = 0; i < n_recv; i++) tt_comm_handle_free(rh[i]);
  if (rc != 0)
    for (int i = 0; i < n_send; i++) {
      tt_comm_handle_free(send_h[i]);
      send_h[i] = NULL;
    }
  return rc;
}

int tt_comm_sendrecv(tt_comm *c, tt_tensor *send, int dst, int send_tag, tt_tensor *recv,
                     int src, int recv_tag, tt_comm_handle **send_h) {
  *send_h = NULL;
  TT_CHECK(c && send && recv, "sendrecv: no group or no tensor");
  return tt_comm_p2p(c, 1, &send, &dst, &send_tag, 1, &recv, &src, &recv_tag, send_h);
}
int tt_comm_recv_async(tt_comm *c, tt_tensor *t, int src, int tag, tt_comm_handle **h) {
  start_args s = {K_RECV, c, t, src, tag, 0, NULL};
  return start(&s, h);
}
int tt_comm_all_to_all_async(tt_comm *c, tt_tensor *t, int split_dim, int concat_dim,
                             tt_tensor **out, tt_comm_handle **h) {
  start_args s = {K_ALL_TO_ALL, c, t, split_dim, concat_dim, 0, out};
  return start(&s, h);
}
int tt_comm_barrier_async(tt_comm *c, tt_comm_handle **h) {
  start_args s = {K_BARRIER, c, NULL, 0, 0, 0, NULL};
  return start(&s, h);
}

int tt_comm_all_reduce(tt_comm *c, tt_tensor *t, int op) {
  start_args s = {K_ALL_REDUCE, c, t, 0, 0, op, NULL};
  return run_blocking(&s);
}
int tt_comm_all_gather(tt_comm *c, tt_tensor *t, int dim, tt_tensor **out) {
  start_args s = {K_ALL_GATHER, c, t, dim, 0, 0, out};
  return run_blocking(&s);
}
int tt_comm_reduce_scatter(tt_comm *c, tt_tensor *t, int dim, int op, tt_tensor **out) {
  start_args s = {K_REDUCE_SCATTER, c, t, dim, 0, op, out};
  return run_blocking(&s);
}
int tt_comm_broadcast(tt_comm *c, tt_tensor *t, int root) {
  start_args s = {K_BROADCAST, c, t, root, 0, 0, NULL};
  return run_blocking(&s);
}
int tt_comm_send(tt_comm *c, tt_tensor *t, int dst, int tag) {
  start_args s = {K_SEND, c, t, dst, tag, 0, NULL};
  return run_blocking(&s);
}
int tt_comm_recv(tt_comm *c, tt_tensor *t, int src, int tag) {
  start_args s = {K_RECV, c, t, src, tag, 0, NULL};
  return run_blocking(&s);
}
int tt_comm_all_to_all(tt_comm *c, tt_tensor *t, int split_dim, int concat_dim,
                       tt_tensor **out) {
  start_args s = {K_ALL_TO_ALL, c, t, split_dim, concat_dim, 0, out};
  return run_blocking(&s);
}
int tt_comm_barrier(tt_comm *c) {
  start_args s = {K_BARRIER, c, NULL, 0, 0, 0, NULL};
  return run_blocking(&s);
}
