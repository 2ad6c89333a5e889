/*
** telemetry.c — the store of live training figures and its Prometheus text format.
**
** Writers (the training thread, engine/dist's collectives) take g.lock for a few stores;
** the reader (the HTTP thread) takes it only to copy the store, then formats the copy
** with the lock released. Series names start with tetra_; every series carries the
** labels job, rank, dp, tp, pp, cp (docs/monitoring.md lists them all).
*/
#include "tetra_telemetry.h"
#include "core/tt_internal.h"
#include "common/common.h"
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* -- The store ---------------------------------------------------------------------- */

/* Upper bounds (seconds) of the histogram buckets; +Inf is implicit. */
static const double step_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,  5,     10,   30,  60,   120};
enum { N_STEP_BOUNDS = sizeof step_bounds / sizeof step_bounds[0] };
static const double comm_bounds[] = {1e-5,   5e-5,  1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                     5e-3,   1e-2,  2.5e-2, 5e-2, 0.1,  0.25, 0.5,
                                     1,      2.5,   10};
enum { N_COMM_BOUNDS = sizeof comm_bounds / sizeof comm_bounds[0] };

typedef struct {
  char op[24];
  char group[24];
  uint64_t buckets[N_COMM_BOUNDS];   /* non-cumulative: observations in (b[i-1], b[i]] */
  uint64_t count;
  double sum;
} comm_series;

/* A (op, group) pair beyond this many is dropped: groups are the mesh's few. */
enum { MAX_COMM_SERIES = 64 };

/* The step phases, in the order they are reported. */
static const char *const phase_names[] = {"data_wait", "forward", "backward",
                                          "exposed_comm", "optimizer", "other"};
enum { N_PHASES = sizeof phase_names / sizeof phase_names[0] };

typedef struct {
  int configured;
  char labels[256];           /* job="..",rank="..",dp="..",tp="..",pp="..",cp=".." */
  int restarts;
  int gpu;
  int has_step;
  tt_step_telemetry last;
  double last_step_unix_s;
  uint64_t skipped_total;
  uint64_t step_buckets[N_STEP_BOUNDS];
  uint64_t step_count;
  double step_sum;
  double phase_total[N_PHASES];
  double checkpoint_last_s;
  int has_straggler;          /* rank 0 with more than one rank: tt_telemetry_straggler */
  int straggler_rank;
  double straggler_compute_s, straggler_ratio;
  double checkpoint_total_s;
  uint64_t checkpoint_count;
  double lock_wait_s;         /* writers' time waiting for g_lock (a scrape copying) */
  int n_comm;
  comm_series comm[MAX_COMM_SERIES];
} store;

static store g;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Bumped (under g_lock) by every change to g: a scrape that finds it unchanged answers
** from the text it formatted last time instead of copying and formatting the store. */
static uint64_t g_version;

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Takes g_lock for a writer, counting how long it waited: what scrapes cost training. */
static void writer_lock(void) {
  if (pthread_mutex_trylock(&g_lock) == 0) return;
  double t0 = mono_now();
  pthread_mutex_lock(&g_lock);
  g.lock_wait_s += mono_now() - t0;
}

static double unix_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Appends v as a label value: backslash, double quote and newline escaped. */
static void escape_label(char *dst, size_t n, const char *v) {
  size_t j = 0;
  for (; *v && j + 3 < n; v++) {
    if (*v == '\\' || *v == '"') dst[j++] = '\\';
    if (*v == '\n') {
      dst[j++] = '\\';
      dst[j++] = 'n';
      continue;
    }
    dst[j++] = *v;
  }
  dst[j] = '\0';
}

int tt_telemetry_configure(const char *job, int rank, int dp, int tp, int pp, int cp,
                           int restarts, int gpu) {
  char esc[128];
  escape_label(esc, sizeof esc, job ? job : "tetra");
  pthread_mutex_lock(&g_lock);
  memset(&g, 0, sizeof g);
  snprintf(g.labels, sizeof g.labels,
           "job=\"%s\",rank=\"%d\",dp=\"%d\",tp=\"%d\",pp=\"%d\",cp=\"%d\"", esc, rank, dp,
           tp, pp, cp);
  g.restarts = restarts;
  g.gpu = gpu;
  g.configured = 1;
  g_version++;
  pthread_mutex_unlock(&g_lock);
  return 0;
}

int tt_telemetry_enabled(void) {
  /* Read without the lock: set once before training, and a stale 0 only skips a sample. */
  return __atomic_load_n(&g.configured, __ATOMIC_RELAXED);
}

static void observe(const double *bounds, int n, uint64_t *buckets, double v) {
  for (int i = 0; i < n; i++) {
    if (v <= bounds[i]) {
      buckets[i]++;
      return;
    }
  }
}

void tt_telemetry_step(const tt_step_telemetry *s) {
  double phases[N_PHASES] = {s->data_wait_s,    s->forward_s,   s->backward_s,
                             s->exposed_comm_s, s->optimizer_s, s->other_s};
  double now = unix_now();
  writer_lock();
  g.last = *s;
  g.has_step = 1;
  g.last_step_unix_s = now;
  if (s->skipped) g.skipped_total++;
  observe(step_bounds, N_STEP_BOUNDS, g.step_buckets, s->step_time_s);
  g.step_count++;
  g.step_sum += s->step_time_s;
  for (int i = 0; i < N_PHASES; i++) g.phase_total[i] += phases[i];
  g_version++;
  pthread_mutex_unlock(&g_lock);
}

void tt_telemetry_straggler(int rank, double compute_s, double ratio) {
  writer_lock();
  g.has_straggler = 1;
  g.straggler_rank = rank;
  g.straggler_compute_s = compute_s;
  g.straggler_ratio = ratio;
  g_version++;
  pthread_mutex_unlock(&g_lock);
}

void tt_telemetry_checkpoint(double seconds) {
  writer_lock();
  g.checkpoint_last_s = seconds;
  g.checkpoint_total_s += seconds;
  g.checkpoint_count++;
  g_version++;
  pthread_mutex_unlock(&g_lock);
}

void tt_telemetry_collective(const char *op, const char *group, double seconds) {
  if (!tt_telemetry_enabled()) return;
  writer_lock();
  comm_series *c = NULL;
  for (int i = 0; i < g.n_comm; i++) {
    if (strcmp(g.comm[i].op, op) == 0 && strcmp(g.comm[i].group, group) == 0) {
      c = &g.comm[i];
      break;
    }
  }
  if (!c && g.n_comm < MAX_COMM_SERIES) {
    c = &g.comm[g.n_comm++];
    snprintf(c->op, sizeof c->op, "%s", op);
    escape_label(c->group, sizeof c->group, group);
  }
  if (c) {
    observe(comm_bounds, N_COMM_BOUNDS, c->buckets, seconds);
    c->count++;
    c->sum += seconds;
  }
  g_version++;
  pthread_mutex_unlock(&g_lock);
}

/* -- Formatting --------------------------------------------------------------------- */

/* Prometheus spells the special values NaN, +Inf and -Inf. */
static int put_value(tt_buf *b, double v) {
  if (isnan(v)) return tt_buf_printf(b, " NaN\n");
  if (isinf(v)) return tt_buf_printf(b, v > 0 ? " +Inf\n" : " -Inf\n");
  return tt_buf_printf(b, " %.17g\n", v);
}

static int put_header(tt_buf *b, const char *name, const char *type, const char *help) {
  return tt_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample: name{labels[,extra]} value. */
static int put_sample(tt_buf *b, const char *name, const char *labels, const char *extra,
                      double v) {
  TT_TRY(tt_buf_printf(b, "%s{%s%s%s}", name, labels, extra ? "," : "", extra ? extra : ""));
  return put_value(b, v);
}

static int put_metric(tt_buf *b, const char *name, const char *type, const char *help,
                      const char *labels, double v) {
  TT_TRY(put_header(b, name, type, help));
  return put_sample(b, name, labels, NULL, v);
}

/* The _bucket (cumulative), _sum and _count samples of one histogram series. */
static int put_histogram(tt_buf *b, const char *name, const char *labels, const char *extra,
                         const double *bounds, int n, const uint64_t *buckets,
                         uint64_t count, double sum) {
  char key[96], le[160];
  uint64_t cum = 0;
  snprintf(key, sizeof key, "%s_bucket", name);
  for (int i = 0; i < n; i++) {
    cum += buckets[i];
    snprintf(le, sizeof le, "%s%sle=\"%g\"", extra ? extra : "", extra ? "," : "", bounds[i]);
    TT_TRY(put_sample(b, key, labels, le, (double)cum));
  }
  snprintf(le, sizeof le, "%s%sle=\"+Inf\"", extra ? extra : "", extra ? "," : "");
  TT_TRY(put_sample(b, key, labels, le, (double)count));
  snprintf(key, sizeof key, "%s_sum", name);
  TT_TRY(put_sample(b, key, labels, extra, sum));
  snprintf(key, sizeof key, "%s_count", name);
  return put_sample(b, key, labels, extra, (double)count);
}

int tt_nvml_format(tt_buf *b, const char *labels, int gpu);   /* engine/obs/nvml.c */

/* User + system CPU seconds of the whole process. */
static double process_cpu_s(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int format_store(tt_buf *b, const store *s) {
  const char *L = s->labels;
  const tt_step_telemetry *x = &s->last;
  TT_TRY(put_metric(b, "tetra_step", "gauge", "Last completed optimizer step.", L, x->step));
  TT_TRY(put_metric(b, "tetra_restarts", "gauge",
                    "Times the supervisor restarted this job (TETRA_RESTART_COUNT).", L,
                    s->restarts));
  if (s->has_step) {
    TT_TRY(put_metric(b, "tetra_last_step_timestamp_seconds", "gauge",
                      "Unix time the last optimizer step completed.", L,
                      s->last_step_unix_s));
    TT_TRY(put_metric(b, "tetra_loss", "gauge",
                      "Training loss of the last step (mean over the global batch).", L,
                      x->loss));
    TT_TRY(put_metric(b, "tetra_learning_rate", "gauge", "Learning rate of the last step.",
                      L, x->lr));
    TT_TRY(put_metric(b, "tetra_grad_norm", "gauge",
                      "Global gradient norm of the last step, before clipping.", L,
                      x->grad_norm));
    TT_TRY(put_metric(b, "tetra_tokens_per_second", "gauge",
                      "Global batch tokens over the last step's time.", L, x->tokens_per_s));
    TT_TRY(put_metric(b, "tetra_loss_scale", "gauge",
                      "fp16 dynamic loss scale after the last step (1 otherwise).", L,
                      x->loss_scale));
    if (x->mfu >= 0)
      TT_TRY(put_metric(b, "tetra_mfu", "gauge",
                        "Model FLOPs utilisation of the last step (0-1) against the "
                        "device peak.", L, x->mfu));
    TT_TRY(put_metric(b, "tetra_memory_live_bytes", "gauge",
                      "Allocator bytes held by live tensors after the last optimizer update.", L,
                      x->live_bytes));
    TT_TRY(put_metric(b, "tetra_memory_peak_bytes", "gauge",
                      "Allocator high-water mark during the last step.", L, x->peak_bytes));
    TT_TRY(put_metric(b, "tetra_memory_cached_bytes", "gauge",
                      "Freed allocator blocks kept for reuse.", L, x->cached_bytes));
    double phases[N_PHASES] = {x->data_wait_s,    x->forward_s,   x->backward_s,
                               x->exposed_comm_s, x->optimizer_s, x->other_s};
    TT_TRY(put_header(b, "tetra_step_phase_seconds", "gauge",
                      "Seconds of the last step by phase; the phases add up to the step."));
    char ph[64];
    for (int i = 0; i < N_PHASES; i++) {
      snprintf(ph, sizeof ph, "phase=\"%s\"", phase_names[i]);
      TT_TRY(put_sample(b, "tetra_step_phase_seconds", L, ph, phases[i]));
    }
    /* Each rank's own: Prometheus compares them across ranks (TetraStraggler). */
    TT_TRY(put_metric(b, "tetra_step_last_seconds", "gauge",
                      "Wall time of the last optimizer step.", L, x->step_time_s));
    TT_TRY(put_metric(b, "tetra_step_wait_seconds", "gauge",
                      "Seconds the last step waited in collectives (exposed_comm).", L,
                      x->exposed_comm_s));
    TT_TRY(put_metric(b, "tetra_step_compute_seconds", "gauge",
                      "Seconds of the last step not spent waiting in collectives.", L,
                      x->step_time_s - x->exposed_comm_s));
    TT_TRY(put_header(b, "tetra_step_phase_seconds_total", "counter",
                      "Seconds spent in each step phase since start."));
    for (int i = 0; i < N_PHASES; i++) {
      snprintf(ph, sizeof ph, "phase=\"%s\"", phase_names[i]);
      TT_TRY(put_sample(b, "tetra_step_phase_seconds_total", L, ph, s->phase_total[i]));
    }
  }
  if (s->has_straggler) {
    TT_TRY(put_metric(b, "tetra_straggler_rank", "gauge",
                      "Rank 0: the world rank with the longest compute time last step.", L,
                      (double)s->straggler_rank));
    TT_TRY(put_metric(b, "tetra_straggler_compute_seconds", "gauge",
                      "Rank 0: that rank's compute seconds (step less collective waits).",
                      L, s->straggler_compute_s));
    if (s->straggler_ratio >= 0)
      TT_TRY(put_metric(b, "tetra_straggler_ratio", "gauge",
                        "Rank 0: the slowest rank's compute time over the ranks' median.",
                        L, s->straggler_ratio));
  }
  TT_TRY(put_metric(b, "tetra_tokens_total", "counter", "Tokens trained on (global batch).",
                    L, s->has_step ? x->tokens_total : 0));
  TT_TRY(put_metric(b, "tetra_skipped_steps_total", "counter",
                    "Optimizer steps skipped for inf/NaN gradients.", L,
                    (double)s->skipped_total));
  TT_TRY(put_header(b, "tetra_step_seconds", "histogram", "Optimizer step wall time."));
  TT_TRY(put_histogram(b, "tetra_step_seconds", L, NULL, step_bounds, N_STEP_BOUNDS,
                       s->step_buckets, s->step_count, s->step_sum));
  TT_TRY(put_metric(b, "tetra_checkpoint_save_seconds", "gauge",
                    "Wall time of the last checkpoint save (0: none yet).", L,
                    s->checkpoint_last_s));
  TT_TRY(put_metric(b, "tetra_checkpoint_save_seconds_total", "counter",
                    "Wall time spent saving checkpoints.", L, s->checkpoint_total_s));
  TT_TRY(put_metric(b, "tetra_checkpoint_saves_total", "counter", "Checkpoints saved.", L,
                    (double)s->checkpoint_count));
  TT_TRY(put_metric(b, "tetra_telemetry_lock_wait_seconds_total", "counter",
                    "Seconds training waited for the metrics store while a scrape copied it.",
                    L, s->lock_wait_s));
  if (s->n_comm > 0) {
    TT_TRY(put_header(b, "tetra_collective_seconds", "histogram",
                      "Collective latency from start to completion on this rank, by op "
                      "and group."));
    char extra[96];
    for (int i = 0; i < s->n_comm; i++) {
      const comm_series *c = &s->comm[i];
      snprintf(extra, sizeof extra, "op=\"%s\",group=\"%s\"", c->op, c->group);
      TT_TRY(put_histogram(b, "tetra_collective_seconds", L, extra, comm_bounds,
                           N_COMM_BOUNDS, c->buckets, c->count, c->sum));
    }
  }
  return 0;
}

/* CPU seconds of the metrics endpoint's thread, which the endpoint hands in before it asks
** for the text (tt_telemetry_exporter_cpu): the store never calls the endpoint. Guarded by
** g_cache.lock. */
static double g_exporter_cpu_s;

/* What is read at each scrape rather than stored: CPU times and the GPU's figures. */
static int format_live(tt_buf *b, const char *L, int gpu) {
  TT_TRY(put_metric(b, "tetra_process_cpu_seconds_total", "counter",
                    "User and system CPU seconds of this rank's process, every thread.", L,
                    process_cpu_s()));
  TT_TRY(put_metric(b, "tetra_exporter_cpu_seconds_total", "counter",
                    "CPU seconds of the metrics endpoint's own thread (its cost to the rank).",
                    L, g_exporter_cpu_s));
  if (gpu >= 0) TT_TRY(tt_nvml_format(b, L, gpu));
  return 0;
}

/* The store's text as of version `version` (its labels and GPU beside it), kept between
** scrapes: between two steps a scraper polling fast gets it for the price of a copy. */
static struct {
  pthread_mutex_t lock;
  int valid;
  uint64_t version;
  tt_buf text;
  char labels[256];
  int gpu;
} g_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Brings g_cache up to date with the store (formatting only when it changed). */
static int refresh_cache(void) {
  pthread_mutex_lock(&g_lock);
  const uint64_t version = g_version;
  pthread_mutex_unlock(&g_lock);
  if (g_cache.valid && g_cache.version == version) return 0;
  store *copy = malloc(sizeof *copy);
  TT_CHECK(copy != NULL, "telemetry: out of host memory");
  pthread_mutex_lock(&g_lock);
  *copy = g;
  const uint64_t copied = g_version;
  pthread_mutex_unlock(&g_lock);
  tt_buf b = {0};
  int rc = format_store(&b, copy);
  if (rc == 0) {
    tt_buf_free(&g_cache.text);
    g_cache.text = b;
    g_cache.version = copied;
    g_cache.gpu = copy->gpu;
    memcpy(g_cache.labels, copy->labels, sizeof g_cache.labels);
    g_cache.valid = 1;
  } else {
    tt_buf_free(&b);
  }
  free(copy);
  return rc;
}

char *tt_telemetry_format(void) {
  pthread_mutex_lock(&g_cache.lock);
  tt_buf b = {0};
  int rc = refresh_cache();
  if (rc == 0) rc = tt_buf_append(&b, g_cache.text.data, g_cache.text.len);
  if (rc == 0) rc = format_live(&b, g_cache.labels, g_cache.gpu);
  pthread_mutex_unlock(&g_cache.lock);
  if (rc != 0 || tt_buf_append(&b, "", 1) != 0) {   /* the terminating NUL */
    tt_buf_free(&b);
    return NULL;
  }
  return b.data;
}

void tt_telemetry_text_free(char *text) { free(text); }

void tt_telemetry_exporter_cpu(double seconds) {
  pthread_mutex_lock(&g_cache.lock);
  g_exporter_cpu_s = seconds;
  pthread_mutex_unlock(&g_cache.lock);
}
