/*
** test_runtime.c — the CUDA runtime (engine/runtime/cuda.cu, engine/cuda/backend.cu, engine/core/alloc.c) with
** more than one stream, and the launch check:
**   - destroying the current stream makes the default stream current again (the handle
**     too: tt_cuda_get_stream never returns a destroyed stream);
**   - each stream has its own cuBLASLt workspace, and GEMMs on two streams at once give
**     the CPU's results;
**   - a block freed on one stream and taken on another waits for the first stream's
**     kernels: a slow GEMM on stream A writes a block, the block is freed while the GEMM
**     still runs, stream B takes the same block and fills it; the fill must win;
**   - with the launch check on (TETRA_CUDA_SYNC=1), a kernel that faults is reported by
**     the call that launched it, naming the kernel;
**   - with a host-wait hook set (the NCCL watchdog's), a host wait polls and calls it
**     while the device works, and still returns the finished results.
** Without a GPU the program exits 77: ctest reports "Not Run".
*/
#include "cuda_test.h"

static tt_cuda_stream *new_stream(void) {
  tt_cuda_stream *s = NULL;
  cr_assert_eq(tt_cuda_stream_create(&s), 0, "%s", tt_last_error());
  return s;
}

static tt_tensor *full(int64_t rows, int64_t cols, double v) {
  int64_t shape[2] = {rows, cols};
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_full(shape, 2, TT_F32, GPU, v, &t), 0, "%s", tt_last_error());
  return t;
}

Test(cuda_runtime, destroying_the_current_stream_restores_the_default) {
  tt_cuda_stream *s = new_stream();
  cr_assert_eq(tt_cuda_set_stream(s), 0);
  cr_assert_eq(tt_cuda_get_stream(), s);
  tt_cuda_stream_destroy(s);
  cr_assert_null(tt_cuda_get_stream(), "the current stream handle outlived its stream");
  /* Work still runs, on the default stream. */
  tt_tensor *a = full(3, 5, 2.0), *b = full(3, 5, 0.5), *c = NULL;
  cr_assert_eq(tt_add(a, b, &c), 0, "%s", tt_last_error());
  tt_tensor *h = to_dev(c, TT_CPU);
  for (int64_t i = 0; i < 15; i++) cr_assert_float_eq(tt_tensor_get(h, i), 2.5, 0);
  cr_assert_eq(tt_cuda_stream_synchronize(NULL), 0, "%s", tt_last_error());
  tt_tensor_release(h);
  tt_tensor_release(c);
  tt_tensor_release(b);
  tt_tensor_release(a);
}

Test(cuda_runtime, gemm_workspace_per_stream) {
  tt_cuda_stream *s1 = new_stream(), *s2 = new_stream();
  void *w0 = NULL, *w1 = NULL, *w2 = NULL, *again = NULL;
  cr_assert_eq(tt_cuda_gemm_workspace(NULL, &w0), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_gemm_workspace(s1, &w1), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_gemm_workspace(s2, &w2), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_gemm_workspace(s1, &again), 0, "%s", tt_last_error());
  cr_assert(w0 && w1 && w2 && w0 != w1 && w1 != w2 && w0 != w2, "streams share a workspace");
  cr_assert_eq(again, w1, "a stream's workspace changed between GEMMs");

  /* Two GEMMs in flight at once, one per stream, against the CPU. */
  int64_t m = 512, k = 768, n = 640;
  int64_t sa[2] = {m, k}, sb[2] = {k, n};
  tt_tensor *a_c = randn(sa, 2, 1.0), *b_c = randn(sb, 2, 1.0), *b2_c = randn(sb, 2, 1.0);
  tt_tensor *a = to_dev(a_c, GPU), *b = to_dev(b_c, GPU), *b2 = to_dev(b2_c, GPU);
  tt_tensor *ref1 = NULL, *ref2 = NULL, *out1 = NULL, *out2 = NULL;
  cr_assert_eq(tt_matmul(a_c, b_c, NULL, 0, 0, &ref1), 0, "%s", tt_last_error());
  cr_assert_eq(tt_matmul(a_c, b2_c, NULL, 0, 0, &ref2), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_synchronize(), 0);
  cr_assert_eq(tt_cuda_set_stream(s1), 0);
  cr_assert_eq(tt_matmul(a, b, NULL, 0, 0, &out1), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_set_stream(s2), 0);
  cr_assert_eq(tt_matmul(a, b2, NULL, 0, 0, &out2), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_synchronize(), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_set_stream(NULL), 0);
  double e1 = rel_err(out1, ref1), e2 = rel_err(out2, ref2);
  /* f32 GEMMs may run in TF32 on the GPU: about 3e-4. */
  cr_assert(e1 < 2e-3 && e2 < 2e-3, "GEMMs on two streams: relative errors %g, %g", e1, e2);

  /* A destroyed stream's workspace goes back; the table does not grow without bound. */
  tt_tensor_release(out1);
  tt_tensor_release(out2);
  tt_cuda_stream_destroy(s1);
  tt_cuda_stream_destroy(s2);
  for (int i = 0; i < 100; i++) {
    tt_cuda_stream *s = new_stream();
    void *w = NULL;
    cr_assert_eq(tt_cuda_gemm_workspace(s, &w), 0, "stream %d: %s", i, tt_last_error());
    tt_cuda_stream_destroy(s);
  }
  tt_tensor *list[] = {a_c, b_c, b2_c, a, b, b2, ref1, ref2};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) tt_tensor_release(list[i]);
}

Test(cuda_runtime, allocator_orders_a_block_reused_on_another_stream) {
  tt_cuda_stream *sa = new_stream(), *sb = new_stream();
  int64_t n = 4096;
  tt_tensor *x = full(n, n, 1.0), *sevens = NULL;
  cr_assert_eq(tt_cuda_set_stream(sb), 0);
  sevens = full(n, n, 7.0);
  cr_assert_eq(tt_cuda_synchronize(), 0);

  /* On A: four GEMMs of 137 GFLOP each (kept alive) delay a fifth, y = x @ x (every
  ** element 4096), whose output is freed at once, long before it is written. */
  cr_assert_eq(tt_cuda_set_stream(sa), 0);
  tt_tensor *ahead[4] = {0}, *y = NULL;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tt_matmul(x, x, NULL, 0, 0, &ahead[i]), 0, "%s", tt_last_error());
  cr_assert_eq(tt_matmul(x, x, NULL, 0, 0, &y), 0, "%s", tt_last_error());
  void *block = tt_tensor_data(y);
  tt_tensor_release(y);

  /* On B: the same block, filled with 7 while A's GEMM may still be writing it. */
  cr_assert_eq(tt_cuda_set_stream(sb), 0);
  tt_tensor *z = NULL;
  int64_t shape[2] = {n, n};
  cr_assert_eq(tt_tensor_empty(shape, 2, TT_F32, GPU, &z), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_data(z), block, "the allocator did not hand out the freed block: "
               "this test checks nothing");
  cr_assert_eq(tt_copy_(z, sevens), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_synchronize(), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_set_stream(NULL), 0);
  tt_tensor *h = to_dev(z, TT_CPU);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n * n; i += 97) wrong += tt_tensor_get(h, i) != 7.0;
  cr_assert_eq(wrong, 0, "%lld sampled elements were overwritten by the GEMM on the other "
               "stream after the block changed hands", (long long)wrong);
  tt_tensor_release(h);
  tt_tensor_release(z);
  tt_tensor_release(sevens);
  tt_tensor_release(x);
  for (int i = 0; i < 4; i++) tt_tensor_release(ahead[i]);
  tt_cuda_stream_destroy(sa);
  tt_cuda_stream_destroy(sb);
}

static int g_hook_calls;
static void count_hook(void) { g_hook_calls++; }

Test(cuda_runtime, host_wait_polls_the_hook) {
  int64_t n = 4096;
  tt_tensor *x = full(n, n, 1.0), *y = NULL;
  cr_assert_eq(tt_cuda_synchronize(), 0);
  tt_cuda_set_host_wait_hook(count_hook);
  g_hook_calls = 0;
  /* about 20 ms of GEMMs on an H200, then a wait for them */
  for (int i = 0; i < 40; i++) {
    tt_tensor_release(y);
    y = NULL;
    cr_assert_eq(tt_matmul(x, x, NULL, 0, 0, &y), 0, "%s", tt_last_error());
  }
  int64_t before = tt_cuda_host_sync_count();
  cr_assert_eq(tt_cuda_stream_synchronize(NULL), 0, "%s", tt_last_error());
  tt_cuda_set_host_wait_hook(NULL);
  cr_assert_eq(tt_cuda_host_sync_count() - before, 1);
  cr_assert_gt(g_hook_calls, 0, "the host waited without calling the hook");
  tt_tensor *h = to_dev(y, TT_CPU);
  cr_assert_float_eq(tt_tensor_get(h, 12345), 4096.0, 0);
  tt_tensor_release(h);
  tt_tensor_release(y);
  tt_tensor_release(x);
}

/* A tensor whose device pointer is unmapped: any kernel reading it faults. */
static tt_tensor *unmapped(int64_t n, void **real) {
  tt_tensor *t = full(1, n, 1.0);
  *real = t->storage->data;
  t->storage->data = (void *)(uintptr_t)0x10000;
  return t;
}

Test(cuda_runtime, sync_launches_names_the_faulting_kernel) {
  cr_assert_eq(tt_cuda_set_sync_launches(1), 0);
  cr_assert_eq(tt_cuda_sync_launches(), 1);
  void *real = NULL;
  tt_tensor *bad = unmapped(1 << 20, &real), *good = full(1, 1 << 20, 1.0), *out = NULL;
  int rc = tt_add(bad, good, &out);
  cr_assert_neq(rc, 0, "a kernel reading unmapped memory was not reported at its launch");
  cr_assert(strstr(tt_last_error(), "launch of") != NULL, "message: %s", tt_last_error());
  /* The context is lost after a fault: nothing more is released on the device. */
}

Test(cuda_runtime, without_sync_the_fault_shows_later) {
  cr_assert_eq(tt_cuda_set_sync_launches(0), 0);
  void *real = NULL;
  tt_tensor *bad = unmapped(1 << 20, &real), *good = full(1, 1 << 20, 1.0), *out = NULL;
  cr_assert_eq(tt_add(bad, good, &out), 0, "the launch itself failed: %s", tt_last_error());
  cr_assert_neq(tt_cuda_synchronize(), 0, "the fault never showed");
}

/* Context parallelism's input slice on the device (lua/tetra/parallel/context.lua): a
** narrowed i32 token block copied into a narrowed i64 one, both strided, on the GPU,
** equal to the CPU's copy; ids near 2^31 stay exact. */
Test(cuda_runtime, strided_widening_copy_of_token_ids) {
  const int64_t B = 3, T = 17, L = 4, shape[2] = {B, T}, out_shape[2] = {B, 2 * L};
  tt_tensor *tok = NULL, *ref = NULL, *ids = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 2, TT_I32, TT_CPU, &tok), 0, "%s", tt_last_error());
  int32_t *p = tt_tensor_data(tok);
  for (int64_t i = 0; i < B * T; i++) p[i] = 2147483000 + (int32_t)i;
  cr_assert_eq(tt_tensor_empty(out_shape, 2, TT_I64, TT_CPU, &ref), 0);
  tt_tensor *dtok = to_dev(tok, GPU);
  cr_assert_eq(tt_tensor_empty(out_shape, 2, TT_I64, GPU, &ids), 0, "%s", tt_last_error());
  const int64_t starts[2] = {3, 11};
  for (int k = 0; k < 2; k++) {
    tt_tensor *hd = NULL, *hs = NULL, *dd = NULL, *ds = NULL;
    cr_assert_eq(tt_narrow(ref, 1, k * L, L, &hd), 0);
    cr_assert_eq(tt_narrow(tok, 1, starts[k], L, &hs), 0);
    cr_assert_eq(tt_copy_(hd, hs), 0, "%s", tt_last_error());
    cr_assert_eq(tt_narrow(ids, 1, k * L, L, &dd), 0);
    cr_assert_eq(tt_narrow(dtok, 1, starts[k], L, &ds), 0);
    cr_assert_eq(tt_copy_(dd, ds), 0, "%s", tt_last_error());
    tt_tensor_release(hd);
    tt_tensor_release(hs);
    tt_tensor_release(dd);
    tt_tensor_release(ds);
  }
  tt_tensor *back = to_dev(ids, TT_CPU);
  const int64_t *a = tt_tensor_data(back), *b = tt_tensor_data(ref);
  for (int64_t i = 0; i < B * 2 * L; i++)
    cr_assert_eq(a[i], b[i], "element %lld: %lld on the GPU, %lld on the CPU", (long long)i,
                 (long long)a[i], (long long)b[i]);
  tt_tensor_release(back);
  tt_tensor_release(ids);
  tt_tensor_release(dtok);
  tt_tensor_release(ref);
  tt_tensor_release(tok);
}
