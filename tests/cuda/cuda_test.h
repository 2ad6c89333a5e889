/*
** cuda_test.h — what the CUDA tests share: moving tensors to the GPU, poisoning the
** allocator's cache with NaN blocks (so an output element a kernel forgets to write shows
** up as NaN), the relative L2 error against a CPU reference, and a Criterion main that
** exits 77 (ctest: "Not Run") when there is no GPU.
*/
#ifndef TT_CUDA_TEST_H
#define TT_CUDA_TEST_H
#include <criterion/criterion.h>
#include <execinfo.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#include "core/tt_internal.h"
#include "tetra_cuda.h"

enum { GPU = 0 };

static inline tt_tensor *randn(const int64_t *shape, int ndim, double std) {
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_randn(shape, ndim, 0.0, std, &t), 0, "%s", tt_last_error());
  return t;
}

/* t on the device, drawn there at once when t is lazy (tt_to_device keeps a lazy tensor
** lazy, to be drawn and uploaded at its first touch, with a host wait: the training set-up
** materializes its tensors at its end, and so does this, so that no test counts or times
** a first draw inside what it measures). */
static inline tt_tensor *to_dev(tt_tensor *t, int device) {
  tt_tensor *o = NULL;
  cr_assert_eq(tt_to_device(t, device, &o), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_materialize(o), 0, "%s", tt_last_error());
  return o;
}

/* Puts NaN-filled blocks of n floats into the GPU allocator's cache. */
static inline void poison(int64_t n) {
  if (n <= 0) return;
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_full(&n, 1, TT_F32, GPU, NAN, &t), 0, "%s", tt_last_error());
  tt_tensor_release(t);
}

/* ||gpu - ref|| / ||ref||, gpu of any dtype and device; fails on NaN. */
static inline double rel_err(tt_tensor *gpu, tt_tensor *ref) {
  tt_tensor *h = to_dev(gpu, TT_CPU);
  int64_t n = tt_tensor_numel(ref);
  cr_assert_eq(tt_tensor_numel(h), n);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = tt_tensor_get(h, i), b = tt_tensor_get(ref, i);
    cr_assert(!isnan(a), "element %lld was not written (NaN)", (long long)i);
    num += (a - b) * (a - b);
    den += b * b;
  }
  tt_tensor_release(h);
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* A test that crashes prints where: Criterion says only "Unexpected signal caught" at
** the test's first line, and the GPU machine has no gdb (a crash on the first H200 run
** could not be placed). The frames go to stderr, then the signal takes its course. */
static void cuda_test_on_crash(int sig) {
  void *frames[64];
  const int n = backtrace(frames, 64);
  static const char head[] = "cuda test: crashed; backtrace (addr2line -e PROGRAM +OFFSET):\n";
  if (write(2, head, sizeof head - 1) < 0) _exit(128 + sig);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Criterion runs each test in a child process that it starts by executing this program
** again: the child runs the constructors but never main, so the CUDA backend is brought up
** here (on a machine without a GPU this fails quietly, and main below reports the skip).
** Without it every test found "device cuda:0 is not available" on the first H200 run. */
__attribute__((constructor)) static void cuda_test_worker_init(void) {
  const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], cuda_test_on_crash);
  (void)tt_cuda_init();
}

/* Criterion's own main, run only when a GPU is there. */
int main(int argc, char *argv[]) {
  if (tt_cuda_init() != 0) {
    printf("SKIP: %s\n", tt_last_error());
    return 77;
  }
  char info[256];
  if (tt_cuda_device_info(tt_cuda_current_device(), info, sizeof info) == 0)
    printf("cuda:%d %s\n", tt_cuda_current_device(), info);
  struct criterion_test_set *tests = criterion_initialize();
  int rc = 0;
  if (criterion_handle_args(argc, argv, true)) rc = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return rc;
}

#endif
