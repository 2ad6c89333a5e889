/*
** test_alloc_limit.c — the allocator's limit (tt_alloc_set_limit, TETRA_ALLOC_LIMIT_MIB),
** on the CPU device:
**   - a request that would take what the device's cache holds past the limit fails with
**     the out-of-memory line, which names the limit; what is held stays usable, and a
**     request within the limit still succeeds;
**   - cached blocks count, and are given back to the device before a request is refused;
**   - 0 lifts the limit.
*/
#include <criterion/criterion.h>
#include <string.h>
#include "core/tt_internal.h"

enum { MIB = 1 << 20 };

static int new_bytes(size_t nbytes, tt_tensor **out) {
  int64_t n = (int64_t)(nbytes / sizeof(float));
  return tt_tensor_empty(&n, 1, TT_F32, TT_CPU, out);
}

static tt_alloc_stats stats(void) {
  tt_alloc_stats s;
  cr_assert_eq(tt_alloc_stats_get(TT_CPU, &s), 0);
  return s;
}

static void setup(void) {
  tt_alloc_empty_cache(TT_CPU);
  tt_alloc_set_limit(MIB);
}

static void teardown(void) { tt_alloc_set_limit(0); }

TestSuite(alloc_limit, .init = setup, .fini = teardown);

Test(alloc_limit, refuses_past_the_limit) {
  const int64_t held0 = stats().live_bytes;   /* the test's own, under the limit */
  cr_assert_eq(held0 + (int64_t)tt_alloc_granted_bytes(MIB / 2) <= MIB, 1);
  tt_tensor *a = NULL, *b = NULL, *c = NULL;
  cr_assert_eq(new_bytes(MIB / 2, &a), 0, "%s", tt_last_error());
  memset(tt_tensor_data(a), 1, MIB / 2);
  cr_assert_neq(new_bytes(MIB / 2 + 4096, &b), 0, "half a MiB more passed a 1 MiB limit");
  cr_assert_null(b);
  const char *e = tt_last_error();
  cr_assert(strstr(e, "out of memory on cpu allocating") != NULL, "message: %s", e);
  cr_assert(strstr(e, "(over TETRA_ALLOC_LIMIT_MIB=1)") != NULL, "message: %s", e);
  cr_assert_eq(((unsigned char *)tt_tensor_data(a))[MIB / 2 - 1], 1, "what was held changed");
  /* Within the limit still: a small request. */
  cr_assert_eq(new_bytes(64 * 1024, &c), 0, "%s", tt_last_error());
  tt_tensor_release(c);
  /* No limit: the same request passes. */
  tt_alloc_set_limit(0);
  cr_assert_eq(new_bytes(MIB / 2 + 4096, &b), 0, "%s", tt_last_error());
  tt_tensor_release(b);
  tt_tensor_release(a);
}

Test(alloc_limit, gives_the_cache_back_before_refusing) {
  tt_tensor *a = NULL, *b = NULL;
  cr_assert_eq(new_bytes(600 * 1024, &a), 0, "%s", tt_last_error());
  tt_tensor_release(a);   /* cached: counted against the limit */
  cr_assert_geq(stats().cached_bytes, 600 * 1024);
  /* A different size class: the cached block cannot serve it, and the two together pass
  ** 1 MiB; the cache goes back to the device and the request fits. */
  cr_assert_eq(new_bytes(700 * 1024, &b), 0, "%s", tt_last_error());
  cr_assert_eq(stats().cached_bytes, 0, "the cache was not given back");
  tt_tensor_release(b);
}
