/*
** adamw_jobs.c — the offloaded optimizer's host updates on a thread of their own, so that
** the next step's forward runs while the CPU still updates the weights it reaches later
** (tetra.optim's AdamW under parallel.offload_overlap).
**
** The jobs are the host tensors of one step's update, in the order the forward will want
** them; the thread runs tt_adamw_multi on each in turn (the same call, with the same
** config and stats, as the synchronous update: the same bits) and marks it done. The
** caller waits for a job before it copies that job's weight back to the device. Nothing
** here touches a device: the inputs are host tensors whose gradients are in place before
** the start, and each job's tensors belong to the thread until its wait returns.
**
** One worker thread serves every step of the process, taking the steps' job sets in the
** order they were started: a thread made per step would also make its own OpenMP team
** per step (libgomp keeps a team per thread that starts parallel regions, and ends it
** with the thread). The worker runs each set with the thread count the starting thread
** had (tt_set_num_threads: OpenMP's count is per thread, and a new thread would take
** the process default, every core, beside the training thread's own team).
*/
#include "core/tt_internal.h"
#include <omp.h>
#include <pthread.h>

struct tt_adamw_jobs {
  tt_adamw_jobs *next;  /* the worker's queue */
  int threads;          /* OpenMP threads for the updates: the starter's setting */
  int finished;         /* the worker is done with the set */
  pthread_mutex_t mu;
  pthread_cond_t cond;
  int n, done;          /* jobs finished so far (in order) */
  int failed;           /* the first failing job + 1, or 0 */
  char error[512];      /* its message (the thread's own tt_last_error) */
  tt_tensor **p, **m, **v;
  tt_adamw_config *cfg;
  int64_t step;
  tt_tensor *stats;
};

/* The worker and its queue of started sets. */
static struct {
  pthread_mutex_t mu;
  pthread_cond_t queued;
  tt_adamw_jobs *head, *tail;
  int64_t thread_starts;   /* workers started in this process: 1 once running */
  int last_threads;        /* the OpenMP thread count the last set ran with */
} g_worker = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0};

static void run_jobs(tt_adamw_jobs *j) {
  omp_set_num_threads(j->threads);
  pthread_mutex_lock(&g_worker.mu);
  g_worker.last_threads = omp_get_max_threads();
  pthread_mutex_unlock(&g_worker.mu);
  for (int i = 0; i < j->n; i++) {
    int rc = tt_adamw_multi(&j->p[i], &j->m[i], &j->v[i], NULL, 1, &j->cfg[i], j->step,
                            j->stats);
    pthread_mutex_lock(&j->mu);
    if (rc != 0 && !j->failed) {
      j->failed = i + 1;
      snprintf(j->error, sizeof j->error, "%s", tt_last_error());
    }
    j->done = i + 1;
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->mu);
  }
  pthread_mutex_lock(&j->mu);
  j->finished = 1;
  pthread_cond_broadcast(&j->cond);
  pthread_mutex_unlock(&j->mu);
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&g_worker.mu);
    while (!g_worker.head) pthread_cond_wait(&g_worker.queued, &g_worker.mu);
    tt_adamw_jobs *j = g_worker.head;
    g_worker.head = j->next;
    if (!g_worker.head) g_worker.tail = NULL;
    pthread_mutex_unlock(&g_worker.mu);
    run_jobs(j);
  }
  return NULL;
}

/* Queues j for the worker, starting it the first time. */
static int enqueue(tt_adamw_jobs *j) {
  pthread_mutex_lock(&g_worker.mu);
  if (g_worker.thread_starts == 0) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, worker, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      pthread_mutex_unlock(&g_worker.mu);
      return tt_set_error("tt_adamw_jobs_start: cannot start the update thread");
    }
    g_worker.thread_starts++;
  }
  j->next = NULL;
  if (g_worker.tail) g_worker.tail->next = j;
  else g_worker.head = j;
  g_worker.tail = j;
  pthread_cond_signal(&g_worker.queued);
  pthread_mutex_unlock(&g_worker.mu);
  return 0;
}

void tt_adamw_jobs_worker_info(int64_t *thread_starts, int *last_threads) {
  pthread_mutex_lock(&g_worker.mu);
  if (thread_starts) *thread_starts = g_worker.thread_starts;
  if (last_threads) *last_threads = g_worker.last_threads;
  pthread_mutex_unlock(&g_worker.mu);
}

static void jobs_free(tt_adamw_jobs *j) {
  for (int i = 0; i < j->n; i++) {
    tt_tensor_release(j->p[i]);
    tt_tensor_release(j->m[i]);
    tt_tensor_release(j->v[i]);
  }
  tt_tensor_release(j->stats);
  free(j->p);
  free(j->m);
  free(j->v);
  free(j->cfg);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cond);
  free(j);
}

int tt_adamw_jobs_start(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                        const tt_adamw_config *cfgs, int n, int64_t step, tt_tensor *stats,
                        tt_adamw_jobs **out) {
  TT_CHECK(out, "tt_adamw_jobs_start: out is NULL");
  *out = NULL;
  TT_CHECK(params && m && v && cfgs && n >= 1, "tt_adamw_jobs_start: no jobs");
  for (int i = 0; i < n; i++) {
    TT_CHECK(params[i] && m[i] && v[i], "tt_adamw_jobs_start: job %d lacks a tensor", i);
    TT_CHECK(params[i]->device == TT_CPU && m[i]->device == TT_CPU && v[i]->device == TT_CPU,
             "tt_adamw_jobs_start: job %d: the tensors must be host tensors", i);
  }
  TT_CHECK(!stats || stats->device == TT_CPU, "tt_adamw_jobs_start: the stats must be a "
           "host tensor");
  tt_adamw_jobs *j = calloc(1, sizeof *j);
  if (!j) return tt_set_error("tt_adamw_jobs_start: out of host memory");
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cond, NULL);
  j->p = calloc((size_t)n, sizeof *j->p);
  j->m = calloc((size_t)n, sizeof *j->m);
  j->v = calloc((size_t)n, sizeof *j->v);
  j->cfg = malloc((size_t)n * sizeof *j->cfg);
  if (!j->p || !j->m || !j->v || !j->cfg) {
    jobs_free(j);
    return tt_set_error("tt_adamw_jobs_start: out of host memory");
  }
  j->n = n;
  for (int i = 0; i < n; i++) {
    tt_tensor_retain(params[i]);
    tt_tensor_retain(m[i]);
    tt_tensor_retain(v[i]);
    j->p[i] = params[i];
    j->m[i] = m[i];
    j->v[i] = v[i];
    j->cfg[i] = cfgs[i];
  }
  j->step = step;
  if (stats) tt_tensor_retain(stats);
  j->stats = stats;
  j->threads = tt_get_num_threads();
  if (enqueue(j) != 0) {
    jobs_free(j);
    return -1;
  }
  *out = j;
  return 0;
}

int tt_adamw_jobs_wait(tt_adamw_jobs *j, int i) {
  TT_CHECK(j && i >= 0 && i < j->n, "tt_adamw_jobs_wait: job %d of %d", i, j ? j->n : 0);
  pthread_mutex_lock(&j->mu);
  while (j->done <= i) pthread_cond_wait(&j->cond, &j->mu);
  int failed = j->failed;
  pthread_mutex_unlock(&j->mu);
  if (failed && failed <= i + 1)
    return tt_set_error("offloaded update, job %d: %s", failed - 1, j->error);
  return 0;
}

int tt_adamw_jobs_finish(tt_adamw_jobs *j) {
  if (!j) return 0;
  pthread_mutex_lock(&j->mu);
  while (!j->finished) pthread_cond_wait(&j->cond, &j->mu);
  pthread_mutex_unlock(&j->mu);
  int failed = j->failed;
  char error[sizeof j->error];
  memcpy(error, j->error, sizeof error);
  jobs_free(j);
  if (failed) return tt_set_error("offloaded update, job %d: %s", failed - 1, error);
  return 0;
}
