/*
** tt_skip_main.h — Criterion's main for a test program some of whose tests can only run
** on a machine with something installed (cuDNN): when a test skipped and none failed, the
** program exits 77, which ctest reports as "Not Run" (SKIP_RETURN_CODE), never as a pass.
** Include it once, in the program's one source file.
*/
#ifndef TT_SKIP_MAIN_H
#define TT_SKIP_MAIN_H
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <stdio.h>

static int tt_skipped_tests;

ReportHook(POST_TEST)(struct criterion_test_stats *stats) {
  if (stats->test_status == CR_STATUS_SKIPPED) tt_skipped_tests++;
}

int main(int argc, char *argv[]) {
  struct criterion_test_set *tests = criterion_initialize();
  int rc = 0;
  if (criterion_handle_args(argc, argv, true)) rc = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  if (rc == 0 && tt_skipped_tests > 0) {
    printf("SKIP: %d test(s) skipped\n", tt_skipped_tests);
    return 77;
  }
  return rc;
}

#endif
