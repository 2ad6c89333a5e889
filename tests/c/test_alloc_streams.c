/*
** test_alloc_streams.c — the caching allocator's stream rules (engine/core/alloc.c), on the CPU:
** a device backend of host memory with two pretend streams stands in for CUDA and
** records every "order the current stream after stream X" the allocator asks for.
**   - a block freed and taken again on one stream needs no ordering;
**   - a block taken on another stream orders that stream after the block's;
**   - a stream prefers its own (or idle) blocks to another stream's;
**   - a storage freed on another stream than it was allocated on orders the freeing
**     stream after the allocating one, and then belongs to the freeing stream;
**   - a retired (destroyed, drained) stream's blocks are idle, and so is every block after
**     tt_alloc_mark_idle (the device synchronised);
**   - a storage, or a graph pool's block, whose stream was destroyed before it was freed
**     asks for no ordering after that stream (on CUDA an event on a dead stream: the host
**     crash of step/graph_replay_equals_eager_steps, which freed its stats after
**     destroying their stream), until a new stream takes the same key;
**   - when ordering fails the allocation fails with the backend's message, and the block
**     stays cached;
**   - an allocation that fails for another reason than memory (on CUDA an earlier
**     kernel's fault, which cudaMalloc reports too) keeps the backend's message, and the
**     cache is neither emptied nor the call retried; a real lack of memory empties the
**     cache and retries, except while a pool is in use (a CUDA graph being captured, where
**     freeing device memory would end the capture);
**   - while a pool is in use, a cached block of another stream is not taken (ordering the
**     capturing stream after work outside the capture is not allowed): a new one is;
**   - a storage evicted while a pool is in use (ZeRO-3 inside a capture) is the pool's;
**   - tt_copy_ between the CPU and the device with strides or a cast on the host side (a
**     checkpoint shard narrowed along a row-parallel weight's dim 1, resumed in another
**     tensor-parallel layout) goes through contiguous buffers, where it was refused;
**   - tt_tensor_get reads a device tensor's element through the backend (it was NaN, and
**     every loss F.item read on a GPU was taken as not finite);
**   - tt_fill_ on a device fills by the backend (memset for zeros, its f32 fill kernel)
**     without a copy from the host, which would wait for the device (and broke every
**     CUDA-graph capture of a step on the first H200 run); integers other than zero
**     still come from the host;
**   - attention positions on a device come to the host once per storage and version, not
**     at every call (context parallelism's fused attention waited four times a layer).
*/
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/tt_internal.h"

enum { DEV = 0 };
static int g_stream_a, g_stream_b;   /* their addresses are the stream keys */
static void *g_current;              /* the pretend current stream (NULL: default) */
static void *g_ordered_after[16];    /* order_after calls, in order */
static int g_num_ordered;
static int g_order_fails;
static int g_copies, g_memsets, g_fills;   /* backend calls */
static int g_alloc_fails;   /* 1: a pretend lack of memory; 2: a pretend earlier fault */
static int g_allocs, g_frees;

static void *host_alloc(size_t n, int device) {
  (void)device;
  g_allocs++;
  if (g_alloc_fails == 2) {
    tt_set_error("pretend: an illegal memory access was encountered");
    tt_alloc_failed_not_oom();
    return NULL;
  }
  if (g_alloc_fails == 1) {
    tt_set_error("pretend: out of memory");
    return NULL;
  }
  return malloc(n ? n : 1);
}
static void host_free(void *p, int device) {
  (void)device;
  g_frees++;
  free(p);
}
static int host_memcpy(void *d, int dd, const void *s, int sd, size_t n) {
  (void)dd, (void)sd;
  memcpy(d, s, n);
  g_copies++;
  return 0;
}
static int host_memset0(void *p, int device, size_t n) {
  (void)device;
  memset(p, 0, n);
  g_memsets++;
  return 0;
}
static int host_fill_f32(float *p, int device, int64_t n, float v) {
  (void)device;
  for (int64_t i = 0; i < n; i++) p[i] = v;
  g_fills++;
  return 0;
}
static void *current_stream(void) { return g_current; }
static void *g_dead;                 /* a pretend stream destroyed and not created again */
static int order_after(int device, void *key) {
  (void)device;
  cr_assert(key != g_dead || !key, "ordered after a destroyed stream");
  if (g_order_fails) return tt_set_error("pretend: stream wait failed");
  if (g_num_ordered < 16) g_ordered_after[g_num_ordered++] = key;
  return 0;
}

static const tt_device_backend g_pretend = {
  "pretend-cuda", host_alloc, host_free, host_memcpy, host_memset0, current_stream, order_after,
  host_fill_f32, NULL, NULL, NULL,
};

/* What the CUDA runtime tells the allocator when it destroys or creates a stream. */
static void destroy_stream(void *key) {
  tt_alloc_stream_retired(DEV, key);
  g_dead = key;
}

static void create_stream(void *key) {
  tt_alloc_stream_born(DEV, key);
  if (g_dead == key) g_dead = NULL;
}

static void setup(void) {
  tt_register_cuda_backend(&g_pretend);
  tt_alloc_empty_cache(DEV);
  g_current = NULL;
  g_num_ordered = 0;
  g_order_fails = 0;
  g_copies = g_memsets = g_fills = 0;
  g_alloc_fails = 0;
  g_allocs = g_frees = 0;
}

TestSuite(alloc_streams, .init = setup);

static tt_tensor *new_on(void *stream, int64_t n) {
  g_current = stream;
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_empty(&n, 1, TT_F32, DEV, &t), 0, "%s", tt_last_error());
  return t;
}

static void free_on(void *stream, tt_tensor *t) {
  g_current = stream;
  tt_tensor_release(t);
}

Test(alloc_streams, same_stream_reuse_needs_no_ordering) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);
  tt_tensor *u = new_on(&g_stream_a, 1000);
  cr_assert_eq(tt_tensor_data(u), p, "the cached block was not reused");
  cr_assert_eq(g_num_ordered, 0);
  free_on(&g_stream_a, u);
}

Test(alloc_streams, reuse_on_another_stream_orders_it_after_the_first) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), p);
  cr_assert_eq(g_num_ordered, 1, "stream B took A's block without waiting for A");
  cr_assert_eq(g_ordered_after[0], (void *)&g_stream_a);
  /* Now B's: freed and taken again on B without more ordering. */
  free_on(&g_stream_b, u);
  tt_tensor *w = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(w), p);
  cr_assert_eq(g_num_ordered, 1);
  free_on(&g_stream_b, w);
}

Test(alloc_streams, a_stream_prefers_its_own_block) {
  tt_tensor *ta = new_on(&g_stream_a, 1000), *tb = new_on(&g_stream_b, 1000);
  void *pb = tt_tensor_data(tb);
  free_on(&g_stream_b, tb);
  free_on(&g_stream_a, ta);   /* most recently freed: first in the list */
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), pb, "B took A's block while one of its own was cached");
  cr_assert_eq(g_num_ordered, 0);
  free_on(&g_stream_b, u);
}

Test(alloc_streams, freed_on_another_stream_waits_for_the_allocating_one) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_b, t);
  cr_assert_eq(g_num_ordered, 1, "freeing on B did not order B after A, where it was made");
  cr_assert_eq(g_ordered_after[0], (void *)&g_stream_a);
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), p);
  cr_assert_eq(g_num_ordered, 1, "the block should now belong to B");
  free_on(&g_stream_b, u);
}

Test(alloc_streams, retired_stream_blocks_are_idle) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);
  tt_alloc_stream_retired(DEV, &g_stream_a);
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), p);
  cr_assert_eq(g_num_ordered, 0, "a drained stream's block still asked for ordering");
  free_on(&g_stream_b, u);
}

Test(alloc_streams, storage_of_a_destroyed_stream_frees_without_ordering) {
  tt_tensor *t = new_on(&g_stream_a, 1000), *t2 = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  g_current = NULL;
  destroy_stream(&g_stream_a);
  free_on(&g_stream_b, t);
  cr_assert_eq(g_num_ordered, 0, "freeing asked for ordering after the destroyed stream");
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), p, "the block went to the freeing stream");
  cr_assert_eq(g_num_ordered, 0);
  free_on(&g_stream_b, u);
  /* a new stream with the destroyed one's key: its storages are ordered after it again */
  create_stream(&g_stream_a);
  tt_tensor *v = new_on(&g_stream_a, 1000);
  int before = g_num_ordered;
  free_on(&g_stream_b, v);
  cr_assert_eq(g_num_ordered, before + 1, "a stream created again with the key was taken as gone");
  cr_assert_eq(g_ordered_after[before], (void *)&g_stream_a);
  /* a storage of the old stream freed now: ordered after the new one (valid, cautious) */
  free_on(&g_stream_b, t2);
  cr_assert_eq(g_num_ordered, before + 2);
  cr_assert_eq(g_ordered_after[before + 1], (void *)&g_stream_a);
}

Test(alloc_streams, pooled_block_of_a_destroyed_stream_is_idle) {
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(DEV, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(DEV, pool), 0);
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);   /* back to the pool, named after stream A */
  cr_assert_eq(tt_alloc_pool_use(DEV, NULL), 0);
  destroy_stream(&g_stream_a);
  tt_alloc_pool_release(pool);   /* the pool's blocks go to the cache */
  tt_tensor *u = new_on(&g_stream_b, 1000);
  cr_assert_eq(tt_tensor_data(u), p);
  cr_assert_eq(g_num_ordered, 0, "a block of the destroyed stream asked for ordering");
  free_on(&g_stream_b, u);
}

Test(alloc_streams, marked_idle_blocks_need_no_ordering) {
  tt_tensor *t = new_on(&g_stream_a, 1000), *d = new_on(NULL, 1000);
  void *pa = tt_tensor_data(t), *pd = tt_tensor_data(d);
  free_on(&g_stream_a, t);
  free_on(NULL, d);
  tt_alloc_mark_idle(DEV);
  tt_tensor *u = new_on(&g_stream_b, 1000), *v = new_on(&g_stream_b, 1000);
  cr_assert((tt_tensor_data(u) == pa || tt_tensor_data(u) == pd) &&
            (tt_tensor_data(v) == pa || tt_tensor_data(v) == pd));
  cr_assert_eq(g_num_ordered, 0, "a block cached before the synchronisation asked for ordering");
  free_on(&g_stream_b, u);
  free_on(&g_stream_b, v);
}

Test(alloc_streams, failed_ordering_fails_the_allocation_and_keeps_the_block) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);
  g_order_fails = 1;
  g_current = &g_stream_b;
  int64_t n = 1000;
  tt_tensor *u = NULL;
  cr_assert_neq(tt_tensor_empty(&n, 1, TT_F32, DEV, &u), 0);
  cr_assert(strstr(tt_last_error(), "pretend: stream wait failed"), "%s", tt_last_error());
  g_order_fails = 0;
  tt_tensor *w = new_on(&g_stream_a, 1000);
  cr_assert_eq(tt_tensor_data(w), p, "the block was lost when ordering failed");
  free_on(&g_stream_a, w);
}

/* A block of `n` floats cached on stream A; the cache's byte count after it. */
static int64_t cache_one(int64_t n) {
  free_on(&g_stream_a, new_on(&g_stream_a, n));
  tt_alloc_stats st;
  cr_assert_eq(tt_alloc_stats_get(DEV, &st), 0);
  cr_assert_gt(st.cached_bytes, 0);
  return st.cached_bytes;
}

static int64_t cached_bytes(void) {
  tt_alloc_stats st;
  cr_assert_eq(tt_alloc_stats_get(DEV, &st), 0);
  return st.cached_bytes;
}

Test(alloc_streams, a_fault_is_not_reported_as_out_of_memory) {
  int64_t cached = cache_one(1000);
  g_alloc_fails = 2;
  g_allocs = g_frees = 0;
  int64_t n = 5000;   /* another size class: the cache cannot serve it */
  tt_tensor *t = NULL;
  cr_assert_neq(tt_tensor_empty(&n, 1, TT_F32, DEV, &t), 0);
  cr_assert(strstr(tt_last_error(), "illegal memory access") &&
            !strstr(tt_last_error(), "out of memory"), "%s", tt_last_error());
  cr_assert_eq(g_allocs, 1, "a fault was retried (%d calls)", g_allocs);
  cr_assert_eq(g_frees, 0, "a fault emptied the cache");
  cr_assert_eq(cached_bytes(), cached);
}

Test(alloc_streams, out_of_memory_empties_the_cache_and_retries) {
  cache_one(1000);
  g_alloc_fails = 1;
  g_allocs = g_frees = 0;
  int64_t n = 5000;
  tt_tensor *t = NULL;
  cr_assert_neq(tt_tensor_empty(&n, 1, TT_F32, DEV, &t), 0);
  cr_assert(strstr(tt_last_error(), "out of memory on pretend-cuda:0"), "%s", tt_last_error());
  cr_assert_eq(g_allocs, 2, "no retry after emptying the cache (%d calls)", g_allocs);
  cr_assert_eq(g_frees, 1, "the cache was not given back");
  cr_assert_eq(cached_bytes(), 0);
}

Test(alloc_streams, out_of_memory_in_a_capture_frees_nothing) {
  int64_t cached = cache_one(1000);
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(DEV, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(DEV, pool), 0);
  g_alloc_fails = 1;
  g_allocs = g_frees = 0;
  int64_t n = 5000;
  tt_tensor *t = NULL;
  g_current = &g_stream_a;
  int rc = tt_tensor_empty(&n, 1, TT_F32, DEV, &t);
  cr_assert_eq(tt_alloc_pool_use(DEV, NULL), 0);
  tt_alloc_pool_release(pool);
  cr_assert_neq(rc, 0);
  cr_assert(strstr(tt_last_error(), "out of memory") &&
            strstr(tt_last_error(), "CUDA graph was being captured"), "%s", tt_last_error());
  cr_assert_eq(g_frees, 0, "device memory was freed during a capture");
  cr_assert_eq(g_allocs, 1);
  cr_assert_eq(cached_bytes(), cached);
}

Test(alloc_streams, a_capture_takes_no_block_of_another_stream) {
  tt_tensor *t = new_on(&g_stream_a, 1000);
  void *p = tt_tensor_data(t);
  free_on(&g_stream_a, t);
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(DEV, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(DEV, pool), 0);
  tt_tensor *u = new_on(&g_stream_b, 1000);   /* captured on B */
  void *pu = tt_tensor_data(u);
  cr_assert_eq(g_num_ordered, 0, "the capturing stream was ordered after another stream");
  cr_assert_neq(pu, p, "the capture took another stream's block");
  free_on(&g_stream_b, u);
  cr_assert_eq(tt_alloc_pool_use(DEV, NULL), 0);
  tt_alloc_pool_release(pool);
}

Test(alloc_streams, evicted_in_a_capture_stays_with_the_pool) {
  tt_tensor *t = new_on(&g_stream_a, 1000);   /* made before the capture */
  void *p = tt_tensor_data(t);
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(DEV, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(DEV, pool), 0);
  tt_storage_evict(t->storage);               /* ZeRO-3 gives it back inside the capture */
  tt_alloc_pool_stats ps;
  cr_assert_eq(tt_alloc_pool_stats_get(pool, &ps), 0);
  cr_assert_eq(ps.adopted, 1, "the pool did not take the evicted block");
  cr_assert_eq(tt_alloc_pool_use(DEV, NULL), 0);
  /* Outside the pool, on the same stream: the block the graph uses is not handed out. */
  tt_tensor *u = new_on(&g_stream_a, 1000);
  cr_assert_neq(tt_tensor_data(u), p, "the evicted block went back to the device's cache");
  free_on(&g_stream_a, u);
  cr_assert_eq(tt_storage_restore(t->storage), 0, "%s", tt_last_error());
  tt_tensor_release(t);
  tt_alloc_pool_release(pool);
}

/* A (4, 6) f32 CPU tensor holding 0..23, and its columns 2..4 as a strided view. */
static tt_tensor *host_4x6(tt_tensor **cols) {
  int64_t shape[2] = {4, 6};
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 2, TT_F32, TT_CPU, &t), 0, "%s", tt_last_error());
  for (int i = 0; i < 24; i++) tt_tensor_set(t, i, i + 0.3);
  cr_assert_eq(tt_narrow(t, 1, 2, 3, cols), 0, "%s", tt_last_error());
  cr_assert(!tt_tensor_is_contiguous(*cols));
  return t;
}

static tt_tensor *device_4x3(int dtype) {
  int64_t shape[2] = {4, 3};
  tt_tensor *t = NULL;
  g_current = &g_stream_a;
  cr_assert_eq(tt_tensor_empty(shape, 2, dtype, DEV, &t), 0, "%s", tt_last_error());
  return t;
}

Test(alloc_streams, strided_host_side_copies_to_and_from_a_device) {
  tt_tensor *cols = NULL, *whole = host_4x6(&cols);
  /* up: a strided host view into a contiguous device tensor, f32 and cast to bf16 */
  tt_tensor *d = device_4x3(TT_F32), *h = device_4x3(TT_BF16);
  cr_assert_eq(tt_copy_(d, cols), 0, "%s", tt_last_error());
  cr_assert_eq(tt_copy_(h, cols), 0, "%s", tt_last_error());
  const float *df = tt_tensor_data(d);
  const uint16_t *hb = tt_tensor_data(h);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) {
      float want = (float)(r * 6 + 2 + c + 0.3);
      cr_assert_eq(df[r * 3 + c], want, "up f32 (%d, %d): %g", r, c, df[r * 3 + c]);
      cr_assert_eq(hb[r * 3 + c], tt_elem_float_to_bf16(want), "up bf16 (%d, %d)", r, c);
    }
  /* down: the device tensors into the strided host view (the other columns untouched) */
  float *dw = tt_tensor_data(d);
  for (int i = 0; i < 12; i++) dw[i] = -1.0f - (float)i;
  cr_assert_eq(tt_copy_(cols, d), 0, "%s", tt_last_error());
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 6; c++) {
      double got = tt_tensor_get(whole, r * 6 + c);
      double want = c >= 2 && c < 5 ? -1.0 - (r * 3 + (c - 2)) : (float)(r * 6 + c + 0.3);
      cr_assert_eq(got, want, "down f32 (%d, %d): %g, want %g", r, c, got, want);
    }
  cr_assert_eq(tt_copy_(cols, h), 0, "%s", tt_last_error());   /* bf16 up, f32 down */
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++)
      cr_assert_eq(tt_tensor_get(cols, r * 3 + c), tt_elem_bf16_to_float(hb[r * 3 + c]),
                   "down bf16 (%d, %d)", r, c);
  tt_tensor_release(cols);
  tt_tensor_release(whole);
  free_on(&g_stream_a, d);
  free_on(&g_stream_a, h);
}

Test(alloc_streams, get_reads_a_device_element) {
  tt_tensor *d = device_4x3(TT_BF16);
  uint16_t *p = tt_tensor_data(d);
  for (int i = 0; i < 12; i++) p[i] = tt_elem_float_to_bf16(0.5f * (float)i - 1.0f);
  tt_tensor *col = NULL;
  cr_assert_eq(tt_narrow(d, 1, 1, 1, &col), 0);   /* a strided view: element (2, 0) is 7 */
  int copies = g_copies;
  cr_assert_eq(tt_tensor_get(col, 2), 2.5);
  cr_assert_eq(tt_tensor_get(d, 11), 4.5);
  cr_assert_eq(g_copies, copies + 2, "not read through the backend");
  cr_assert(isnan(tt_tensor_get(d, 12)), "an index out of range");
  tt_tensor_release(col);
  free_on(&g_stream_a, d);
}

Test(alloc_streams, live_and_cached_bytes_balance) {
  tt_alloc_stats before, after;
  cr_assert_eq(tt_alloc_stats_get(DEV, &before), 0);
  tt_tensor *t = new_on(&g_stream_a, 4096);
  free_on(&g_stream_b, t);
  tt_tensor *u = new_on(&g_stream_a, 4096);
  free_on(&g_stream_a, u);
  cr_assert_eq(tt_alloc_stats_get(DEV, &after), 0);
  cr_assert_eq(after.live_bytes, before.live_bytes);
  cr_assert_eq(after.cached_bytes, before.cached_bytes + 4096 * 4);
}

Test(alloc_streams, device_fills_never_copy_from_the_host) {
  int64_t n = 1000;
  tt_tensor *t = NULL, *z = NULL, *m = NULL, *i = NULL;
  cr_assert_eq(tt_tensor_full(&n, 1, TT_F32, DEV, 2.5, &t), 0, "%s", tt_last_error());
  cr_assert_eq(g_fills, 1);
  const float *p = tt_tensor_data(t);
  for (int64_t k = 0; k < n; k++) cr_assert_eq(p[k], 2.5f, "element %lld", (long long)k);
  cr_assert_eq(tt_tensor_zeros(&n, 1, TT_BF16, DEV, &z), 0, "%s", tt_last_error());
  cr_assert_eq(g_memsets, 1, "zeros of any dtype are a memset");
  /* -0.0 is no memset: its sign bit must survive. */
  cr_assert_eq(tt_tensor_full(&n, 1, TT_F32, DEV, -0.0, &m), 0, "%s", tt_last_error());
  cr_assert_eq(g_memsets, 1);
  cr_assert(signbit(((const float *)tt_tensor_data(m))[n - 1]));
  cr_assert_eq(g_copies, 0, "a device fill copied from the host");
  /* Integers other than zero: from the host, the one copy. */
  cr_assert_eq(tt_tensor_full(&n, 1, TT_I32, DEV, 7.0, &i), 0, "%s", tt_last_error());
  cr_assert_eq(g_copies, 1);
  cr_assert_eq(((const int32_t *)tt_tensor_data(i))[n - 1], 7);
  tt_tensor *all[] = {t, z, m, i};
  for (int k = 0; k < 4; k++) tt_tensor_release(all[k]);
}

/* Attention positions on a device (context parallelism's, uploaded once) come to the host
** once per storage and version (ops/attention.c), not at every call, which was a device
** wait four times a layer and micro-batch; a write makes a fresh copy; the kept copy holds
** its tensor, so a tensor made after the caller let the first go cannot be taken for it;
** and on the CPU the positions are their own host copy. */
static tt_tensor *device_positions(int64_t n, int64_t first) {
  tt_tensor *h = NULL, *d = NULL;
  cr_assert_eq(tt_tensor_empty(&n, 1, TT_I64, TT_CPU, &h), 0);
  for (int64_t i = 0; i < n; i++) ((int64_t *)tt_tensor_data(h))[i] = first + i;
  cr_assert_eq(tt_to_device(h, DEV, &d), 0, "%s", tt_last_error());
  tt_tensor_release(h);
  return d;
}

Test(alloc_streams, attention_positions_read_back_once) {
  tt_attention_forget_positions();
  tt_tensor *pos = device_positions(6, 10), *h1 = NULL, *h2 = NULL, *h3 = NULL;
  int copies = g_copies;
  cr_assert_eq(tt_attention_host_positions(pos, &h1), 0, "%s", tt_last_error());
  cr_assert_eq(h1->device, TT_CPU);
  cr_assert_eq(((const int64_t *)tt_tensor_data(h1))[5], 15);
  cr_assert_eq(g_copies, copies + 1);
  cr_assert_eq(tt_attention_host_positions(pos, &h2), 0);
  cr_assert_eq(g_copies, copies + 1, "read back again");
  cr_assert_eq(tt_tensor_data(h2), tt_tensor_data(h1));
  /* A write (an in-place copy moves the storage's version): read back afresh. */
  tt_tensor *other = device_positions(6, 100);
  cr_assert_eq(tt_copy_(pos, other), 0);
  copies = g_copies;
  cr_assert_eq(tt_attention_host_positions(pos, &h3), 0);
  cr_assert_eq(g_copies, copies + 1);
  cr_assert_eq(((const int64_t *)tt_tensor_data(h3))[0], 100);
  cr_assert_eq(((const int64_t *)tt_tensor_data(h1))[0], 10, "an earlier copy changed");
  /* The caller lets go; a new tensor of the same size gets its own values. */
  free_on(NULL, pos);
  tt_tensor *pos2 = device_positions(6, 40), *h4 = NULL;
  cr_assert_eq(tt_attention_host_positions(pos2, &h4), 0);
  cr_assert_eq(((const int64_t *)tt_tensor_data(h4))[2], 42);
  tt_tensor *cpu = NULL, *h5 = NULL;
  int64_t n = 3;
  cr_assert_eq(tt_tensor_zeros(&n, 1, TT_I64, TT_CPU, &cpu), 0);
  cr_assert_eq(tt_attention_host_positions(cpu, &h5), 0);
  cr_assert_eq(h5, cpu, "a CPU tensor is its own host copy");
  tt_tensor *all[] = {h1, h2, h3, h4, h5, other, pos2, cpu};
  for (int k = 0; k < 8; k++) tt_tensor_release(all[k]);
  tt_attention_forget_positions();
}

/* A lazy draw (tetra.h) moved to a device stays lazy there: no block and no copy. A
** share of it (flat elements 7 to 18, across rows) copied into a device buffer holds the
** eager draw's elements and leaves it lazy; reading it draws it on the host and uploads
** it once. Lazy zeros on a device are a memset at first read. */
Test(alloc_streams, lazy_draws_stay_lazy_on_a_device) {
  const int64_t shape[2] = {6, 5};
  int64_t thirty = 30, twelve = 12;
  tt_manual_seed(3);
  uint64_t state = tt_rng_state();
  tt_tensor *host = NULL, *dev = NULL, *eager = NULL, *flat = NULL, *piece = NULL, *share;
  cr_assert_eq(tt_tensor_randn(shape, 2, 0.0, 1.0, &host), 0);
  int allocs = g_allocs, copies = g_copies;
  g_current = &g_stream_a;
  cr_assert_eq(tt_to_device(host, DEV, &dev), 0, "%s", tt_last_error());
  cr_assert(tt_tensor_is_lazy(dev));
  cr_assert_eq(g_allocs, allocs, "the move took device memory");
  cr_assert_eq(g_copies, copies, "the move copied");
  int was = tt_set_lazy_init(0);
  tt_rng_set_state(state);
  cr_assert_eq(tt_tensor_randn(shape, 2, 0.0, 1.0, &eager), 0);
  tt_set_lazy_init(was);
  const float *e = tt_tensor_data(eager);
  cr_assert_eq(tt_view(dev, &thirty, 1, &flat), 0, "%s", tt_last_error());
  cr_assert_eq(tt_narrow(flat, 0, 7, 12, &piece), 0);
  share = new_on(&g_stream_a, twelve);
  cr_assert_eq(tt_copy_(share, piece), 0, "%s", tt_last_error());
  cr_assert(tt_tensor_is_lazy(dev), "copying a share drew the whole tensor");
  cr_assert_eq(memcmp(tt_tensor_data(share), e + 7, 12 * sizeof(float)), 0, "the share differs");
  copies = g_copies;
  const float *d = tt_tensor_data(dev);
  cr_assert(!tt_tensor_is_lazy(dev));
  cr_assert_eq(g_copies, copies + 1, "drawn with %d uploads", g_copies - copies);
  cr_assert_eq(memcmp(d, e, 30 * sizeof(float)), 0, "the drawn device tensor differs");
  tt_tensor *z = NULL;
  int memsets = g_memsets;
  cr_assert_eq(tt_tensor_lazy_zeros(shape, 2, DEV, &z), 0, "%s", tt_last_error());
  cr_assert(tt_tensor_is_lazy(z));
  const float *zp = tt_tensor_data(z);
  cr_assert_eq(g_memsets, memsets + 1);
  for (int i = 0; i < 30; i++) cr_assert_eq(zp[i], 0.0f);
  tt_tensor_release(piece);
  tt_tensor_release(flat);
  tt_tensor_release(host);
  tt_tensor_release(eager);
  free_on(&g_stream_a, share);
  free_on(&g_stream_a, dev);
  free_on(&g_stream_a, z);
}
