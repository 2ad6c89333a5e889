/*
** trace.c — the collectives of the traced steps (log.trace_steps), for tetra.obs.trace.
**
** engine/dist reports each collective here when it completes; the training thread takes
** the events out after each traced step. A mutex guards the buffer because NCCL and MPI
** completions may one day be seen from another thread; today both sides run on the
** training thread.
*/
#include "tetra_telemetry.h"
#include "core/tt_internal.h"
#include <pthread.h>
#include <string.h>

static struct {
  int enabled;
  tt_trace_event *events;
  int n, cap;
} g;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void tt_trace_set_enabled(int on) { __atomic_store_n(&g.enabled, on != 0, __ATOMIC_RELAXED); }

int tt_trace_enabled(void) { return __atomic_load_n(&g.enabled, __ATOMIC_RELAXED); }

void tt_trace_collective(const char *op, const char *group, double start_s, double end_s) {
  pthread_mutex_lock(&g_lock);
  if (g.n == g.cap) {
    int cap = g.cap ? 2 * g.cap : 1024;
    tt_trace_event *grown = realloc(g.events, (size_t)cap * sizeof *grown);
    if (!grown) {   /* out of memory: the trace loses this event, training goes on */
      pthread_mutex_unlock(&g_lock);
      return;
    }
    g.events = grown;
    g.cap = cap;
  }
  tt_trace_event *e = &g.events[g.n++];
  e->op = op;
  snprintf(e->group, sizeof e->group, "%s", group);
  e->start_s = start_s;
  e->end_s = end_s;
  pthread_mutex_unlock(&g_lock);
}

int tt_trace_take(tt_trace_event *out, int max) {
  pthread_mutex_lock(&g_lock);
  int n = g.n < max ? g.n : max;
  memcpy(out, g.events, (size_t)n * sizeof *out);
  memmove(g.events, g.events + n, (size_t)(g.n - n) * sizeof *out);
  g.n -= n;
  pthread_mutex_unlock(&g_lock);
  return n;
}
