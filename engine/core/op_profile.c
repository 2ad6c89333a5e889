/*
** op_profile.c — where a forward and backward spend their time, op by op
** (tt_op_profile_*, tetra.h).
**
** While a profile runs, the autograd tape leaves a mark at every op it records and around
** every node's backward (engine/core/autograd.c). Each interval between two consecutive
** marks is charged to the mark that ends it, so the entries add up to the profile's
** whole time and nothing is counted twice:
**   - a forward op gets the time since the mark before it: its own work, plus any work
**     that records nothing (ops on tensors that need no gradient, host work between ops);
**   - a node's backward gets the time from its start to its end, less what nested marks
**     took (a checkpoint's re-run forward, charged as recompute, and its nested
**     backward's nodes);
**   - "(outside ops)" gets the time before each backward node (the walk's bookkeeping,
**     the loss's untaped work) and from the last mark to the stop;
**   - a region the caller names (tt_op_profile_region: the optimizer's update, say) gets
**     the time since the mark before it.
** On the CPU the marks read the monotonic clock. On a device with timing marks (CUDA:
** events in the current stream's order) the host only records them, and the stop waits
** once for the device and reads the intervals: the kernels' time, not the launches'.
** Only the thread that started the profile leaves marks.
*/
#include "core/tt_internal.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *name;   /* the op's tape name (static), NULL for outside ops */
  int phase;          /* TT_OP_FORWARD ... */
  double t;           /* host clock seconds (no device marks) */
} op_mark;

static struct {
  int active;                    /* a profile runs (on the thread whose flag is set) */
  int device;
  const tt_device_backend *be;   /* has timing marks, else NULL: the host clock */
  op_mark *marks;
  int64_t n, cap;
  void **events;                 /* device marks of be/device, one per op_mark, kept */
  int64_t n_events;
  int failed;                    /* a mark could not be kept: the stop reports it */
  char why[160];
  tt_op_profile_entry *entries;
  int n_entries;
  double total_s;
  char **region_names;           /* copies of the regions' names, freed at the next start */
  int n_regions;
} g;

static __thread int tt_op_profile_here;   /* the profiling thread */

int tt_op_profile_running(void) { return tt_op_profile_here; }

static double host_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(const char *why) {
  if (!g.failed) snprintf(g.why, sizeof g.why, "%s", why);
  g.failed = 1;
}

void tt_op_profile_mark(const char *name, int phase) {
  if (!tt_op_profile_here || g.failed) return;
  if (g.n == g.cap) {
    int64_t cap = g.cap ? 2 * g.cap : 1024;
    op_mark *grown = realloc(g.marks, (size_t)cap * sizeof *grown);
    if (!grown) {
      fail("out of host memory for the profile's marks");
      return;
    }
    g.marks = grown;
    g.cap = cap;
  }
  if (g.be) {
    if (g.n == g.n_events) {
      void **grown = realloc(g.events, (size_t)g.cap * sizeof *grown);
      if (!grown) {
        fail("out of host memory for the profile's device marks");
        return;
      }
      for (int64_t i = g.n_events; i < g.cap; i++) grown[i] = NULL;
      g.events = grown;
      g.n_events = g.cap;
    }
    if (g.be->mark_record(g.device, &g.events[g.n]) != 0) {
      fail(tt_last_error());
      return;
    }
  }
  g.marks[g.n++] = (op_mark){name, phase, g.be ? 0.0 : host_now()};
}

/* The region's name as the profile keeps it: one copy per distinct name. */
static const char *region_name(const char *name) {
  for (int i = 0; i < g.n_regions; i++)
    if (strcmp(g.region_names[i], name) == 0) return g.region_names[i];
  char **grown = realloc(g.region_names, (size_t)(g.n_regions + 1) * sizeof *grown);
  if (!grown) return NULL;
  g.region_names = grown;
  char *copy = strdup(name);
  if (copy) g.region_names[g.n_regions++] = copy;
  return copy;
}

int tt_op_profile_region(const char *name) {
  TT_CHECK(name && *name, "op_profile_region: the region needs a name");
  if (!tt_op_profile_here) return 0;
  const char *kept = region_name(name);
  if (!kept) fail("out of host memory for a region's name");
  tt_op_profile_mark(kept, TT_OP_REGION);
  return 0;
}

int tt_op_profile_start(int device) {
  TT_CHECK(!tt_op_profile_here, "op_profile_start: a profile is already running");
  TT_CHECK(!g.active, "op_profile_start: a profile is already running on another thread "
           "(one at a time per process)");
  g.n_entries = 0;   /* the last profile's entries may name the regions freed here */
  for (int i = 0; i < g.n_regions; i++) free(g.region_names[i]);
  g.n_regions = 0;
  const tt_device_backend *be = NULL;
  if (tt_device_is_cuda(device)) {
    be = tt_backend_for(device);
    if (!be) return -1;
    TT_CHECK(be->mark_record && be->mark_seconds && be->mark_free,
             "op_profile_start: device %d (%s) has no timing marks", device, be->name);
  }
  if (g.n_events && (g.be != be || g.device != device)) {   /* the last profile's device */
    for (int64_t i = 0; i < g.n_events; i++)
      if (g.events[i]) g.be->mark_free(g.device, g.events[i]);
    free(g.events);
    g.events = NULL;
    g.n_events = 0;
  }
  g.device = device;
  g.be = be;
  g.n = 0;
  g.failed = 0;
  g.active = 1;
  tt_op_profile_here = 1;
  tt_op_profile_mark(NULL, TT_OP_OUTSIDE);   /* the start: its interval is empty */
  return 0;
}

static tt_op_profile_entry *entry_for(const char *name, int phase) {
  for (int i = 0; i < g.n_entries; i++) {
    tt_op_profile_entry *e = &g.entries[i];
    if (e->phase == phase && strcmp(e->name, name) == 0) return e;
  }
  tt_op_profile_entry *grown = realloc(g.entries, (size_t)(g.n_entries + 1) * sizeof *grown);
  if (!grown) return NULL;
  g.entries = grown;
  tt_op_profile_entry *e = &g.entries[g.n_entries++];
  *e = (tt_op_profile_entry){name, phase, 0, 0.0};
  return e;
}

static int by_seconds(const void *a, const void *b) {
  const tt_op_profile_entry *x = a, *y = b;
  if (x->seconds != y->seconds) return x->seconds < y->seconds ? 1 : -1;
  if (x->phase != y->phase) return x->phase - y->phase;
  return strcmp(x->name, y->name);
}

int tt_op_profile_stop(double *total_s) {
  TT_CHECK(tt_op_profile_here, "op_profile_stop: no profile is running on this thread");
  tt_op_profile_mark(NULL, TT_OP_OUTSIDE);
  tt_op_profile_here = 0;
  g.active = 0;
  g.n_entries = 0;
  g.total_s = 0.0;
  TT_CHECK(!g.failed, "op profile lost marks: %s", g.why);
  for (int64_t i = 1; i < g.n; i++) {
    double dt = 0.0;
    if (g.be && g.be->mark_seconds(g.device, g.events[i - 1], g.events[i], &dt) != 0) {
      g.n_entries = 0;   /* no partial figures */
      return -1;
    }
    if (!g.be) dt = g.marks[i].t - g.marks[i - 1].t;
    const char *name = g.marks[i].name ? g.marks[i].name : "(outside ops)";
    tt_op_profile_entry *e = entry_for(name, g.marks[i].phase);
    if (!e) {
      g.n_entries = 0;
      return tt_set_error("op_profile_stop: out of host memory");
    }
    e->calls++;
    e->seconds += dt;
    g.total_s += dt;
  }
  qsort(g.entries, (size_t)g.n_entries, sizeof *g.entries, by_seconds);
  if (total_s) *total_s = g.total_s;
  return g.n_entries;
}

int tt_op_profile_take(tt_op_profile_entry *out, int max) {
  int n = g.n_entries < max ? g.n_entries : max;
  if (n > 0) memcpy(out, g.entries, (size_t)n * sizeof *out);
  return n;
}
