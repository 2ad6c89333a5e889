/*
** test_op_profile.c — the op profile (engine/core/op_profile.c): every interval between
** the tape's marks charged once, to the op that ends it. A test op that sleeps a known
** time in its forward and longer in its backward must find at least that time in its own
** entries (lower bounds only: a busy machine makes sleeps longer, never shorter); the
** entries add up to the whole; op names and call counts are the tape's; a checkpoint's
** re-run is charged as recompute; a device's timing marks (a pretend backend on the host
** clock, as CUDA's events would be) are used instead of the host clock, kept between
** profiles and freed when the device changes; a region the caller names gets the time
** since the mark before it; misuse and lost marks are reported.
*/
#include "tt_test.h"
#include "core/tt_internal.h"
#include <pthread.h>
#include <time.h>

static const double FWD_NAP = 0.020, BWD_NAP = 0.030;

static void nap(double s) {
  struct timespec ts = {0, (long)(s * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static int sleepy_backward(tt_node *node, tt_tensor *grad_out) {
  nap(BWD_NAP);
  return tt_needs_grad(node->inputs[0]) ? tt_accumulate_grad(node->inputs[0], grad_out) : 0;
}

/* y = x (a view), after a nap; recorded as "sleepy" when x needs grad. */
static int sleepy(tt_tensor *x, tt_tensor **out) {
  nap(FWD_NAP);
  tt_tensor *y = NULL;
  TT_TRY(tt_detach(x, &y));
  if (tt_should_record(&x, 1) && !tt_record("sleepy", sleepy_backward, y, &x, 1)) {
    tt_tensor_release(y);
    return -1;
  }
  *out = y;
  return 0;
}

/* loss = mean(sleepy(x * x)); the tape: mul, sleepy, mean. */
static tt_tensor *loss_of(tt_tensor *x) {
  tt_tensor *sq = NULL, *s = NULL, *loss = NULL;
  cr_assert(tt_mul(x, x, &sq) == 0, "%s", tt_last_error());
  cr_assert(sleepy(sq, &s) == 0, "%s", tt_last_error());
  cr_assert(tt_mean(s, NULL, 0, 0, &loss) == 0, "%s", tt_last_error());
  tt_tensor_release(sq);
  tt_tensor_release(s);
  return loss;
}

static const tt_op_profile_entry *find(const tt_op_profile_entry *e, int n, const char *name,
                                       int phase) {
  for (int i = 0; i < n; i++)
    if (e[i].phase == phase && strcmp(e[i].name, name) == 0) return &e[i];
  return NULL;
}

/* The entries of the profile just stopped: they add up to total, longest first. */
static int take_checked(tt_op_profile_entry *e, int max, int n, double total) {
  cr_assert(n > 0 && n <= max, "%d entries", n);
  cr_assert_eq(tt_op_profile_take(e, max), n);
  double sum = 0.0;
  for (int i = 0; i < n; i++) {
    cr_assert(e[i].seconds >= 0.0 && e[i].calls >= 1, "%s: %g s, %lld calls", e[i].name,
              e[i].seconds, (long long)e[i].calls);
    if (i > 0) cr_assert(e[i].seconds <= e[i - 1].seconds, "not longest first at %d", i);
    sum += e[i].seconds;
  }
  cr_assert(fabs(sum - total) <= 1e-9 * (1.0 + total), "entries add up to %.9f, total %.9f",
            sum, total);
  return n;
}

static tt_tensor *leaf(uint64_t seed) {
  int64_t shape[2] = {8, 16};
  tt_tensor *x = tt_test_rand(shape, 2, seed);
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  return x;
}

Test(op_profile, intervals_charged_to_the_op_that_ends_them) {
  tt_tensor *x = leaf(1);
  cr_assert(tt_op_profile_start(TT_CPU) == 0, "%s", tt_last_error());
  tt_tensor *loss = loss_of(x);
  cr_assert_eq(tt_tape_size(), 3);
  const char *taped[3] = {tt_tape_node_name(0), tt_tape_node_name(1), tt_tape_node_name(2)};
  cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
  /* a region named by the caller, its name copied */
  char name[16];
  snprintf(name, sizeof name, "update");
  nap(FWD_NAP);
  cr_assert(tt_op_profile_region(name) == 0);
  snprintf(name, sizeof name, "changed");
  double total = 0.0;
  int n = tt_op_profile_stop(&total);
  tt_op_profile_entry e[32];
  take_checked(e, 32, n, total);
  const tt_op_profile_entry *u = find(e, n, "update", TT_OP_REGION);
  cr_assert(u && u->calls == 1 && u->seconds >= FWD_NAP, "region: %g s", u ? u->seconds : -1.0);
  const tt_op_profile_entry *f = find(e, n, "sleepy", TT_OP_FORWARD),
                            *b = find(e, n, "sleepy", TT_OP_BACKWARD);
  cr_assert(f && f->calls == 1 && f->seconds >= FWD_NAP, "sleepy forward: %g s",
            f ? f->seconds : -1.0);
  cr_assert(b && b->calls == 1 && b->seconds >= BWD_NAP, "sleepy backward: %g s",
            b ? b->seconds : -1.0);
  cr_assert(total >= 2 * FWD_NAP + BWD_NAP);
  /* every taped op once in forward and once in backward, nothing else but outside ops */
  for (int i = 0; i < 3; i++) {
    cr_assert(find(e, n, taped[i], TT_OP_FORWARD), "%s: no forward entry", taped[i]);
    const tt_op_profile_entry *bw = find(e, n, taped[i], TT_OP_BACKWARD);
    cr_assert(bw && bw->calls == 1, "%s: backward entry", taped[i]);
  }
  const tt_op_profile_entry *out = find(e, n, "(outside ops)", TT_OP_OUTSIDE);
  cr_assert(out && out->calls == 3 + 1, "outside ops: before each backward node, the stop");
  cr_assert(out->seconds < FWD_NAP, "the region's nap is the region's: outside %g s",
            out->seconds);
  cr_assert_eq(n, 3 + 3 + 1 + 1);
  /* the sleep before the mean is not the mean's, nor the nap of sleepy's backward */
  cr_assert(find(e, n, taped[2], TT_OP_FORWARD)->seconds < FWD_NAP + BWD_NAP);
  tt_tensor_release(loss);
  /* stopped: ops leave no marks, and the next profile starts from nothing */
  loss = loss_of(x);
  cr_assert(tt_backward(loss) == 0);
  tt_tensor_release(loss);
  cr_assert(tt_op_profile_start(TT_CPU) == 0);
  n = tt_op_profile_stop(&total);
  cr_assert_eq(n, 1, "an empty profile: the interval to the stop alone");
  cr_assert_eq(tt_op_profile_take(e, 32), 1);
  cr_assert_eq(e[0].phase, TT_OP_OUTSIDE);
  cr_assert(total < FWD_NAP, "%g s", total);
  tt_tensor_release(x);
}

/* -- Recompute ----------------------------------------------------------------------- */

static int rerun(int64_t key, tt_tensor *in, tt_tensor *grad_out, void *ud) {
  (void)key, (void)ud;
  tt_tensor *y = NULL;
  int rc = sleepy(in, &y);
  if (!rc) rc = tt_backward_with(y, grad_out);
  tt_tensor_release(y);
  return rc;
}

Test(op_profile, checkpoint_rerun_is_recompute) {
  tt_tensor *x = leaf(2), *sq = NULL, *y = NULL, *loss = NULL;
  tt_set_recompute_hook(rerun, NULL);
  cr_assert(tt_op_profile_start(TT_CPU) == 0, "%s", tt_last_error());
  cr_assert(tt_mul(x, x, &sq) == 0);
  tt_set_grad_enabled(0);
  tt_checkpoint_begin();
  cr_assert(sleepy(sq, &y) == 0);
  tt_set_grad_enabled(1);
  cr_assert(tt_checkpoint(sq, y, 1) == 0, "%s", tt_last_error());
  cr_assert(tt_mean(y, NULL, 0, 0, &loss) == 0);
  cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
  double total = 0.0;
  int n = tt_op_profile_stop(&total);
  tt_op_profile_entry e[32];
  take_checked(e, 32, n, total);
  /* the block's first run recorded nothing: its time is the checkpoint node's forward */
  const tt_op_profile_entry *c = find(e, n, "checkpoint", TT_OP_FORWARD);
  cr_assert(c && c->seconds >= FWD_NAP, "checkpoint forward %g", c ? c->seconds : -1.0);
  cr_assert_null(find(e, n, "sleepy", TT_OP_FORWARD));
  const tt_op_profile_entry *r = find(e, n, "sleepy", TT_OP_RECOMPUTE),
                            *b = find(e, n, "sleepy", TT_OP_BACKWARD),
                            *cb = find(e, n, "checkpoint", TT_OP_BACKWARD);
  cr_assert(r && r->calls == 1 && r->seconds >= FWD_NAP, "recompute %g", r ? r->seconds : -1.0);
  cr_assert(b && b->calls == 1 && b->seconds >= BWD_NAP);
  /* the checkpoint's own backward excludes its re-run and nested nodes */
  cr_assert(cb && cb->calls == 1 && cb->seconds < FWD_NAP, "checkpoint backward %g",
            cb ? cb->seconds : -1.0);
  tt_tensor *all[] = {x, sq, y, loss};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
}

/* -- Device marks -------------------------------------------------------------------- */

/* A pretend CUDA backend whose timing marks are host clock readings on the heap. */
static int g_made, g_freed, g_mark_fails;

static int pretend_record(int device, void **mark) {
  cr_assert_eq(device, 0);
  if (g_mark_fails) return tt_set_error("pretend: event record failed");
  if (!*mark) {
    *mark = malloc(sizeof(double));
    g_made++;
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *(double *)*mark = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return 0;
}

static int pretend_seconds(int device, void *from, void *to, double *out) {
  (void)device;
  *out = *(double *)to - *(double *)from;
  return 0;
}

static void pretend_free(int device, void *mark) {
  (void)device;
  free(mark);
  g_freed++;
}

static void *host_alloc(size_t n, int device) { (void)device; return malloc(n ? n : 1); }
static void host_free(void *p, int device) { (void)device; free(p); }
static int host_memcpy(void *d, int dd, const void *s, int sd, size_t n) {
  (void)dd, (void)sd;
  memcpy(d, s, n);
  return 0;
}
static int host_memset0(void *p, int device, size_t n) {
  (void)device;
  memset(p, 0, n);
  return 0;
}

static const tt_device_backend g_pretend = {
  "pretend-cuda", host_alloc, host_free, host_memcpy, host_memset0, NULL, NULL, NULL,
  pretend_record, pretend_seconds, pretend_free,
};

static const tt_device_backend g_no_marks = {
  "no-marks", host_alloc, host_free, host_memcpy, host_memset0, NULL, NULL, NULL,
  NULL, NULL, NULL,
};

Test(op_profile, device_marks_kept_and_freed) {
  tt_register_cuda_backend(&g_pretend);
  tt_tensor *x = leaf(3);
  int made_first = 0;
  for (int run = 0; run < 2; run++) {
    cr_assert(tt_op_profile_start(0) == 0, "%s", tt_last_error());
    tt_tensor *loss = loss_of(x);
    cr_assert(tt_backward(loss) == 0);
    tt_tensor_release(loss);
    double total = 0.0;
    int n = tt_op_profile_stop(&total);
    tt_op_profile_entry e[32];
    take_checked(e, 32, n, total);
    const tt_op_profile_entry *f = find(e, n, "sleepy", TT_OP_FORWARD),
                              *b = find(e, n, "sleepy", TT_OP_BACKWARD);
    cr_assert(f && f->seconds >= FWD_NAP && b && b->seconds >= BWD_NAP);
    if (run == 0) made_first = g_made;
    cr_assert(g_made >= 3 + 3 + 3 && g_made == made_first,
              "run %d: %d marks made (first run %d): kept between profiles", run, g_made,
              made_first);
    tt_zero_grad(x);
  }
  cr_assert_eq(g_freed, 0);
  /* the host clock again: the device's marks go */
  cr_assert(tt_op_profile_start(TT_CPU) == 0);
  cr_assert(tt_op_profile_stop(NULL) == 1);
  cr_assert_eq(g_freed, g_made);
  tt_tensor_release(x);
}

/* Another thread's start while this thread profiles: refused with its message. */
static void *start_elsewhere(void *out) {
  int rc = tt_op_profile_start(TT_CPU);
  snprintf(out, 200, "%d %s", rc, rc ? tt_last_error() : "");
  if (rc == 0) tt_op_profile_stop(NULL);
  return NULL;
}

Test(op_profile, misuse_and_lost_marks_reported) {
  char other[200];
  pthread_t t;
  cr_assert(tt_op_profile_start(TT_CPU) == 0);
  cr_assert(pthread_create(&t, NULL, start_elsewhere, other) == 0);
  pthread_join(t, NULL);
  cr_assert(strstr(other, "-1 op_profile_start: a profile is already running on another thread"),
            "%s", other);
  cr_assert(tt_op_profile_stop(NULL) == 1);
  cr_assert(tt_op_profile_stop(NULL) != 0);
  cr_assert(strstr(tt_last_error(), "no profile is running"), "%s", tt_last_error());
  cr_assert(tt_op_profile_start(TT_CPU) == 0);
  cr_assert(tt_op_profile_start(TT_CPU) != 0);
  cr_assert(strstr(tt_last_error(), "already running"), "%s", tt_last_error());
  cr_assert(tt_op_profile_stop(NULL) == 1);
  cr_assert(tt_op_profile_region("") != 0);
  cr_assert(strstr(tt_last_error(), "needs a name"), "%s", tt_last_error());
  cr_assert(tt_op_profile_region("off") == 0, "no profile: nothing to charge, no error");
  /* a device without timing marks is refused */
  tt_register_cuda_backend(&g_no_marks);
  cr_assert(tt_op_profile_start(0) != 0);
  cr_assert(strstr(tt_last_error(), "has no timing marks"), "%s", tt_last_error());
  /* a mark the device could not record: the stop says so, no figures */
  tt_register_cuda_backend(&g_pretend);
  tt_tensor *x = leaf(4);
  cr_assert(tt_op_profile_start(0) == 0);
  g_mark_fails = 1;
  tt_tensor *loss = loss_of(x);
  cr_assert(tt_backward(loss) == 0, "the step itself goes on");
  g_mark_fails = 0;
  cr_assert(tt_op_profile_stop(NULL) != 0);
  cr_assert(strstr(tt_last_error(), "op profile lost marks: pretend: event record failed"),
            "%s", tt_last_error());
  tt_op_profile_entry e[4];
  cr_assert_eq(tt_op_profile_take(e, 4), 0);
  tt_tensor_release(loss);
  tt_tensor_release(x);
}
