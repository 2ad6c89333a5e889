/*
** threads.c — one thread-count setting for OpenMP loops and OpenBLAS.
*/
#include "core/tt_internal.h"
#include "blas.h"
#include <omp.h>

void openblas_set_num_threads(int num_threads);

static int tt_num_threads;

void tt_set_num_threads(int n) {
  if (n < 1) n = 1;
  tt_num_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  tt_blas_set_threads(n);
}

int tt_get_num_threads(void) { return tt_num_threads ? tt_num_threads : omp_get_max_threads(); }
