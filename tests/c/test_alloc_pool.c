/*
** test_alloc_pool.c — private allocator pools (engine/core/alloc.c, tt_alloc_pool_*), the memory
** of a captured CUDA graph, on the CPU device (the pool logic does not depend on it):
**   - while a pool is in use, new storages come from it, and freed ones go back to it and
**     are reused there;
**   - a pool block freed after the use ends (a gradient freed at zero_grad after the
**     capture) stays in the pool: the device's other tensors never get it;
**   - another thread's allocations do not land in the pool;
**   - once the pool is released and its last storage freed, its blocks return to the
**     device's cache;
**   - nested use of two pools is refused;
**   - a block from outside the pool freed while the pool is in use (a tensor made before a
**     capture and dropped inside it, which the captured kernels used) is kept by the pool,
**     not handed to a tensor outside it.
*/
#include <criterion/criterion.h>
#include <pthread.h>
#include "core/tt_internal.h"

enum { N = 1000 };   /* floats: one size class */

static tt_tensor *new_f32(int64_t n) {
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_empty(&n, 1, TT_F32, TT_CPU, &t), 0, "%s", tt_last_error());
  return t;
}

static void *data_of(tt_tensor *t) { return tt_tensor_data(t); }

static tt_alloc_pool_stats pool_stats(tt_alloc_pool *pool) {
  tt_alloc_pool_stats s;
  cr_assert_eq(tt_alloc_pool_stats_get(pool, &s), 0);
  return s;
}

static void setup(void) { tt_alloc_empty_cache(TT_CPU); }

TestSuite(alloc_pool, .init = setup);

Test(alloc_pool, reuses_its_own_blocks) {
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &pool), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  cr_assert_eq(tt_alloc_pool_current(TT_CPU), pool);
  tt_tensor *a = new_f32(N);
  void *pa = data_of(a);
  tt_tensor_release(a);
  tt_tensor *b = new_f32(N);
  cr_assert_eq(data_of(b), pa, "the pool hands its freed block out again");
  tt_alloc_pool_stats s = pool_stats(pool);
  cr_assert_eq(s.grown, 1, "one block taken from the device for two storages (%lld)",
               (long long)s.grown);
  cr_assert_eq(s.taken_bytes, s.reserved_bytes);
  tt_tensor_release(b);
  cr_assert_eq(pool_stats(pool).taken_bytes, 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  cr_assert_null(tt_alloc_pool_current(TT_CPU));
  tt_alloc_pool_release(pool);
}

Test(alloc_pool, keeps_blocks_freed_after_use) {
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &pool), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor *grad = new_f32(N), *act = new_f32(N);
  void *pg = data_of(grad), *pa = data_of(act);
  tt_tensor_release(act);   /* freed during the capture */
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  tt_tensor_release(grad);  /* freed after it (zero_grad) */
  /* Outside the pool, same size: neither block may be handed out. */
  tt_tensor *other[4];
  for (int i = 0; i < 4; i++) {
    other[i] = new_f32(N);
    cr_assert_neq(data_of(other[i]), pg, "a pool block went to a tensor outside the pool");
    cr_assert_neq(data_of(other[i]), pa, "a pool block went to a tensor outside the pool");
  }
  tt_alloc_pool_stats s = pool_stats(pool);
  cr_assert_eq(s.taken_bytes, 0);
  cr_assert_eq(s.reserved_bytes, 2 * (int64_t)tt_alloc_granted_bytes(N * sizeof(float)));
  /* Back in the pool: its blocks again, nothing new. */
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor *x = new_f32(N), *y = new_f32(N);
  cr_assert((data_of(x) == pg || data_of(x) == pa) && (data_of(y) == pg || data_of(y) == pa));
  cr_assert_eq(pool_stats(pool).grown, 2);
  tt_tensor_release(x);
  tt_tensor_release(y);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  for (int i = 0; i < 4; i++) tt_tensor_release(other[i]);
  tt_alloc_pool_release(pool);
}

static void *alloc_elsewhere(void *arg) {
  tt_tensor **out = arg;
  int64_t n = N;
  if (tt_tensor_empty(&n, 1, TT_F32, TT_CPU, out) != 0) *out = NULL;
  return NULL;
}

Test(alloc_pool, other_threads_are_not_routed) {
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &pool), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor *mine = new_f32(N);
  tt_tensor *theirs = NULL;
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, alloc_elsewhere, &theirs), 0);
  pthread_join(th, NULL);
  cr_assert_not_null(theirs);
  cr_assert_null(theirs->storage->pool, "another thread's tensor came from the pool");
  cr_assert_eq(mine->storage->pool, pool);
  cr_assert_eq(pool_stats(pool).grown, 1);
  tt_tensor_release(theirs);
  tt_tensor_release(mine);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  tt_alloc_pool_release(pool);
}

Test(alloc_pool, released_pool_returns_blocks_with_its_last_storage) {
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &pool), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor *kept = new_f32(N), *tmp = new_f32(N);
  void *pk = data_of(kept), *pt = data_of(tmp);
  tt_tensor_release(tmp);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  tt_alloc_pool_release(pool);   /* the graph destroyed; `kept` still alive */
  cr_assert_null(tt_alloc_pool_current(TT_CPU));
  tt_alloc_stats st;
  tt_alloc_stats_get(TT_CPU, &st);
  int64_t cached_before = st.cached_bytes;
  tt_tensor_release(kept);       /* the last storage: the pool goes, its blocks to the cache */
  tt_alloc_stats_get(TT_CPU, &st);
  cr_assert_eq(st.cached_bytes, cached_before + (int64_t)tt_alloc_granted_bytes(N * 4),
               "the kept block joined the device's cache");
  tt_tensor *a = new_f32(N), *b = new_f32(N);
  cr_assert((data_of(a) == pk || data_of(a) == pt) && (data_of(b) == pk || data_of(b) == pt),
            "the device's cache hands out the pool's blocks again");
  tt_tensor_release(a);
  tt_tensor_release(b);
}

Test(alloc_pool, nested_use_is_refused) {
  tt_alloc_pool *p1 = NULL, *p2 = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &p1), 0);
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &p2), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, p1), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, p2), -1);
  cr_assert(strstr(tt_last_error(), "another pool"), "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  tt_alloc_pool_release(p1);
  tt_alloc_pool_release(p2);
}

Test(alloc_pool, adopts_outside_blocks_freed_in_use) {
  tt_tensor *before = new_f32(N);   /* made before the capture */
  void *pb = data_of(before);
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(TT_CPU, &pool), 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor_release(before);        /* dropped inside it */
  tt_alloc_pool_stats s = pool_stats(pool);
  cr_assert_eq(s.adopted, 1);
  cr_assert_eq(s.reserved_bytes, (int64_t)tt_alloc_granted_bytes(N * sizeof(float)));
  cr_assert_eq(s.taken_bytes, 0);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  /* Outside the pool, same size: the block is not handed out. */
  tt_tensor *other[4];
  for (int i = 0; i < 4; i++) {
    other[i] = new_f32(N);
    cr_assert_neq(data_of(other[i]), pb, "a block the capture used went to a tensor outside it");
  }
  /* Inside the pool it is the pool's to reuse, without growing. */
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, pool), 0);
  tt_tensor *x = new_f32(N);
  cr_assert_eq(data_of(x), pb);
  cr_assert_eq(pool_stats(pool).grown, 0);
  tt_tensor_release(x);
  cr_assert_eq(tt_alloc_pool_use(TT_CPU, NULL), 0);
  for (int i = 0; i < 4; i++) tt_tensor_release(other[i]);
  /* Released with no live storage: its blocks go back to the cache. */
  tt_alloc_pool_release(pool);
  tt_tensor *y = new_f32(N);
  tt_tensor *z = new_f32(N);
  tt_tensor *w[4];
  int seen = data_of(y) == pb || data_of(z) == pb;
  for (int i = 0; i < 4; i++) {
    w[i] = new_f32(N);
    seen |= data_of(w[i]) == pb;
  }
  cr_assert(seen, "the pool's block did not return to the device's cache");
  tt_tensor_release(y);
  tt_tensor_release(z);
  for (int i = 0; i < 4; i++) tt_tensor_release(w[i]);
}
