/*
** util.c — what every file of the dist layer uses and which calls nothing of it: the
** monotonic clock, the collectives' deadline (dist.timeout_s), the record of a blocking
** call the main thread is in (which comm.c's watchdog thread reads) and MPI's error text.
** The NCCL transport (nccl.c) sits on this file, comm.c on both.
*/
#include "dist/dist_internal.h"
#include <pthread.h>
#include <time.h>

static double g_timeout_s = 600.0;

double tt_dist_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tt_dist_set_timeout(double seconds) { g_timeout_s = seconds; }
double tt_dist_get_timeout(void) { return g_timeout_s; }

static struct {
  pthread_mutex_t lock;
  const char *what;   /* NULL: none */
  tt_comm *comm;
  double since;
} g_blocking = {.lock = PTHREAD_MUTEX_INITIALIZER};

void tt_dist_blocking_begin(const char *what, tt_comm *c) {
  pthread_mutex_lock(&g_blocking.lock);
  g_blocking.what = what;
  g_blocking.comm = c;
  g_blocking.since = tt_dist_now();
  pthread_mutex_unlock(&g_blocking.lock);
}

void tt_dist_blocking_end(void) {
  pthread_mutex_lock(&g_blocking.lock);
  g_blocking.what = NULL;
  pthread_mutex_unlock(&g_blocking.lock);
}

int tt_dist_blocking_get(const char **what, tt_comm **c, double *since) {
  pthread_mutex_lock(&g_blocking.lock);
  int in = g_blocking.what != NULL;
  *what = g_blocking.what;
  *c = g_blocking.comm;
  *since = g_blocking.since;
  pthread_mutex_unlock(&g_blocking.lock);
  return in;
}

int tt_dist_mpi_error(int rc, const char *what, const tt_comm *c, const char *file,
                      int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  return tt_set_error("%s on group %s: MPI error: %s (%s:%d)", what, c ? c->name : "world",
                      msg, file, line);
}
