/*
** test_runtime.c — the CUDA runtime (engine/runtime/cuda.cu, engine/cuda/backend.cu, engine/core/alloc.c) with
** more than one stream, and the launch check:
**   - destroying the current stream makes the default stream current again (the handle
**     too: tt_cuda_get_stream never returns a destroyed stream);
**   - each stream has its own cuBLASLt workspace, and GEMMs on two streams at once give
**     the CPU's results; a graph keeps its stream's workspace when the stream goes;
**   - a block freed on one stream and taken on another waits for the first stream's
**     kernels: a slow GEMM on stream A writes a block, the block is freed while the GEMM
**     still runs, stream B takes the same block and fills it; the fill must win;
**   - with the launch check on (TETRA_CUDA_SYNC=1), a kernel that faults is reported by
**     the call that launched it, naming the kernel;
**   - with a host-wait hook set (the NCCL watchdog's), a host wait polls and calls it
**     while the device works, and still returns the finished results;
**   - an event query of pending work answers "not yet" and leaves no error for the next
**     launch's check;
**   - the op profile's marks are events: no host wait until its stop, kernel time per row;
**   - copies between the CPU and the GPU with strides on both sides, and a cast (a
**     checkpoint resumed in another tensor-parallel layout narrows row-parallel weights
**     along dim 1 on the host and on the device), equal the CPU's own copies.
** Without a GPU the program exits 77: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "tt_cuda_ops.h"

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

/* A CUDA graph's GEMM nodes name the workspace of the stream it was captured on: the
** graph must keep it when that stream is destroyed first. A new stream must then get
** another workspace (cudaMalloc would hand the freed address straight back), and the
** graph, replayed on it, must still give the product. */
Test(cuda_runtime, graph_keeps_its_gemm_workspace) {
  int64_t sa[2] = {256, 384}, sb[2] = {384, 320};
  tt_tensor *a_c = randn(sa, 2, 1.0), *b_c = randn(sb, 2, 1.0), *ref = NULL;
  tt_tensor *a = to_dev(a_c, GPU), *b = to_dev(b_c, GPU), *warm = NULL, *out = NULL;
  cr_assert_eq(tt_matmul(a_c, b_c, NULL, 0, 0, &ref), 0, "%s", tt_last_error());
  tt_cuda_stream *s = new_stream();
  cr_assert_eq(tt_cuda_set_stream(s), 0);
  cr_assert_eq(tt_matmul(a, b, NULL, 0, 0, &warm), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_synchronize(), 0, "%s", tt_last_error());
  tt_tensor_release(warm);
  void *ws = NULL, *ws2 = NULL;
  cr_assert_eq(tt_cuda_gemm_workspace(s, &ws), 0, "%s", tt_last_error());
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(GPU, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(GPU, pool), 0, "%s", tt_last_error());
  tt_cuda_graph *g = NULL;
  cr_assert_eq(tt_cuda_graph_begin(), 0, "%s", tt_last_error());
  cr_assert_eq(tt_matmul(a, b, NULL, 0, 0, &out), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_graph_end(&g), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(GPU, NULL), 0);
  tt_cuda_stream_destroy(s);
  tt_cuda_stream *s2 = new_stream();
  cr_assert_eq(tt_cuda_set_stream(s2), 0);
  cr_assert_eq(tt_cuda_gemm_workspace(s2, &ws2), 0, "%s", tt_last_error());
  cr_assert_neq(ws2, ws, "a new stream got the workspace a live graph's GEMM uses");
  cr_assert_eq(tt_cuda_graph_replay(g), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_synchronize(), 0, "%s", tt_last_error());
  double e = rel_err(out, ref);
  cr_assert(e < 2e-3, "the graph's GEMM after its stream went: relative error %g", e);
  tt_cuda_graph_destroy(g);   /* the last holder: the workspace is freed now */
  cr_assert_eq(tt_cuda_set_stream(NULL), 0);
  tt_cuda_stream_destroy(s2);
  tt_tensor_release(out);
  tt_alloc_pool_release(pool);
  tt_tensor *list[] = {a_c, b_c, a, b, ref};
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

/* An event query of work still running answers 0 (not yet), and CUDA records that "not
** ready" as the thread's last error: the query must clear it, or the next launch's check
** (cudaGetLastError, kernels/kernel_cuda.h) fails a kernel that launched fine. The
** training loop's upload ring and the step timer both poll events so. */
Test(cuda_runtime, event_query_of_pending_work_leaves_no_error) {
  tt_tensor *x = full(1024, 1024, 1.0), *y = NULL, *z = NULL;
  tt_cuda_event *e = NULL;
  cr_assert_eq(tt_cuda_event_create(0, &e), 0, "%s", tt_last_error());
  int pending = 0;
  for (int round = 0; round < 8 && !pending; round++) {
    for (int i = 0; i < 8; i++) {   /* about a millisecond of GEMMs on an H100 */
      tt_tensor_release(y);
      y = NULL;
      cr_assert_eq(tt_matmul(x, x, NULL, 0, 0, &y), 0, "%s", tt_last_error());
    }
    cr_assert_eq(tt_cuda_event_record(e, tt_cuda_get_stream()), 0, "%s", tt_last_error());
    const int q = tt_cuda_event_query(e);
    cr_assert_geq(q, 0, "the query failed: %s", tt_last_error());
    pending = q == 0;
    tt_tensor_release(z);
    z = NULL;
    cr_assert_eq(tt_add(y, y, &z), 0, "the launch after a query of %s work failed: %s",
                 pending ? "pending" : "finished", tt_last_error());
  }
  cr_assert(pending, "every query found the GEMMs done: nothing was tested");
  cr_assert_eq(tt_cuda_event_synchronize(e), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_event_query(e), 1, "the query after a wait: %s", tt_last_error());
  tt_tensor *h = to_dev(z, TT_CPU);
  cr_assert_float_eq(tt_tensor_get(h, 777), 2048.0, 0);
  tt_cuda_event_destroy(e);
  tt_tensor *all[] = {h, z, y, x};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
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

Test(cuda_runtime, strided_copies_across_cpu_and_gpu) {
  const int64_t shape[2] = {5, 8};
  tt_tensor *h = NULL, *ref = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 2, TT_F32, TT_CPU, &h), 0, "%s", tt_last_error());
  for (int i = 0; i < 40; i++) tt_tensor_set(h, i, i * 0.37 - 3.0);
  cr_assert_eq(tt_tensor_zeros(shape, 2, TT_F32, TT_CPU, &ref), 0);
  tt_tensor *d = NULL;
  cr_assert_eq(tt_tensor_zeros(shape, 2, TT_BF16, GPU, &d), 0, "%s", tt_last_error());
  tt_tensor *dcopy = NULL;
  cr_assert_eq(tt_tensor_zeros(shape, 2, TT_BF16, TT_CPU, &dcopy), 0);
  /* up: host columns 1..3 into device columns 4..6 (strided both sides, f32 -> bf16) */
  tt_tensor *hs = NULL, *ds = NULL, *cs = NULL;
  cr_assert_eq(tt_narrow(h, 1, 1, 3, &hs), 0);
  cr_assert_eq(tt_narrow(d, 1, 4, 3, &ds), 0);
  cr_assert_eq(tt_narrow(dcopy, 1, 4, 3, &cs), 0);
  cr_assert_eq(tt_copy_(ds, hs), 0, "up: %s", tt_last_error());
  cr_assert_eq(tt_copy_(cs, hs), 0, "%s", tt_last_error());   /* the CPU's own */
  tt_tensor *back = to_dev(d, TT_CPU);
  const uint16_t *a = tt_tensor_data(back), *b = tt_tensor_data(dcopy);
  for (int i = 0; i < 40; i++) cr_assert_eq(a[i], b[i], "up: element %d", i);
  /* down: device columns 4..6 into host columns 0..2 of ref (bf16 -> f32) */
  tt_tensor *rs = NULL;
  cr_assert_eq(tt_narrow(ref, 1, 0, 3, &rs), 0);
  cr_assert_eq(tt_copy_(rs, ds), 0, "down: %s", tt_last_error());
  for (int r = 0; r < 5; r++)
    for (int c = 0; c < 8; c++) {
      double want = c < 3 ? tt_elem_bf16_to_float(b[r * 8 + 4 + c]) : 0.0;
      cr_assert_eq(tt_tensor_get(ref, r * 8 + c), want, "down (%d, %d)", r, c);
    }
  tt_tensor *list[] = {rs, back, cs, ds, hs, dcopy, d, ref, h};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) tt_tensor_release(list[i]);
}

/* The strided copy kernels (engine/cuda/copy.cu: element bits for one dtype, direct float
** casts, any other pair through double) on a transposed, narrowed source into a contiguous
** and into a transposed destination, every pair of f32, bf16, f16, i32 and i64 (and e4m3
** to itself), byte for byte the CPU's copy of the same views. The values are integers in
** [-100, 99], exact in every one of these dtypes. */
static tt_tensor *permuted_view(tt_tensor *t) {   /* (7, 6, 5) -> (5, 4, 7) */
  tt_tensor *tr = NULL, *v = NULL;
  cr_assert_eq(tt_transpose(t, 0, 2, &tr), 0, "%s", tt_last_error());
  cr_assert_eq(tt_narrow(tr, 1, 1, 4, &v), 0, "%s", tt_last_error());
  tt_tensor_release(tr);
  return v;
}

static void expect_same_bytes(tt_tensor *gpu, tt_tensor *cpu, const char *what) {
  tt_tensor *g = NULL, *h = to_dev(gpu, TT_CPU);
  cr_assert_eq(tt_contiguous(h, &g), 0);
  tt_tensor *c = NULL;
  cr_assert_eq(tt_contiguous(cpu, &c), 0);
  const size_t bytes = (size_t)tt_tensor_numel(c) * tt_dtype_size(c->dtype);
  cr_assert(memcmp(tt_tensor_data(g), tt_tensor_data(c), bytes) == 0,
            "%s: the GPU's copy differs from the CPU's", what);
  tt_tensor_release(c);
  tt_tensor_release(g);
  tt_tensor_release(h);
}

Test(cuda_runtime, strided_copies_every_dtype_pair) {
  const int64_t shape[3] = {7, 6, 5}, out[3] = {5, 4, 7};
  tt_tensor *base = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 3, TT_F32, TT_CPU, &base), 0);
  float *p = tt_tensor_data(base);
  for (int64_t i = 0; i < 210; i++) p[i] = (float)((i * 37) % 200 - 100);
  const int dts[6] = {TT_F32, TT_BF16, TT_F16, TT_I32, TT_I64, TT_E4M3};
  for (int a = 0; a < 6; a++)
    for (int b = 0; b < 6; b++) {
      if ((dts[a] == TT_E4M3 || dts[b] == TT_E4M3) && a != b) continue;
      char what[64];
      snprintf(what, sizeof what, "%s <- %s", tt_dtype_name(dts[b]), tt_dtype_name(dts[a]));
      tt_tensor *hs = NULL, *hd = NULL, *dd = NULL, *hd2 = NULL, *dd2 = NULL;
      cr_assert_eq(tt_cast(base, dts[a], &hs), 0, "%s", tt_last_error());
      tt_tensor *ds = to_dev(hs, GPU), *hv = permuted_view(hs), *dv = permuted_view(ds);
      /* Into a contiguous destination. */
      cr_assert_eq(tt_tensor_empty(out, 3, dts[b], TT_CPU, &hd), 0);
      cr_assert_eq(tt_tensor_empty(out, 3, dts[b], GPU, &dd), 0);
      cr_assert_eq(tt_copy_(hd, hv), 0, "%s: %s", what, tt_last_error());
      cr_assert_eq(tt_copy_(dd, dv), 0, "%s: %s", what, tt_last_error());
      expect_same_bytes(dd, hd, what);
      /* Into a transposed destination. */
      const int64_t back[3] = {7, 4, 5};
      tt_tensor *hd2v = NULL, *dd2v = NULL;
      cr_assert_eq(tt_tensor_empty(back, 3, dts[b], TT_CPU, &hd2), 0);
      cr_assert_eq(tt_tensor_empty(back, 3, dts[b], GPU, &dd2), 0);
      cr_assert_eq(tt_transpose(hd2, 0, 2, &hd2v), 0);
      cr_assert_eq(tt_transpose(dd2, 0, 2, &dd2v), 0);
      cr_assert_eq(tt_copy_(hd2v, hv), 0, "%s: %s", what, tt_last_error());
      cr_assert_eq(tt_copy_(dd2v, dv), 0, "%s: %s", what, tt_last_error());
      expect_same_bytes(dd2, hd2, what);
      tt_tensor *all[] = {hs, ds, hv, dv, hd, dd, hd2, dd2, hd2v, dd2v};
      for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
    }
  tt_tensor_release(base);
}

/* The same dtype moves bits: int64 ids above 2^53 (which double cannot hold) stay exact
** through a strided copy. */
Test(cuda_runtime, strided_int64_copy_is_exact) {
  const int64_t shape[2] = {3, 8};
  tt_tensor *h = NULL, *got = NULL, *tr = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 2, TT_I64, TT_CPU, &h), 0);
  int64_t *p = tt_tensor_data(h);
  for (int64_t i = 0; i < 24; i++) p[i] = ((int64_t)1 << 60) + 2 * i + 1;
  tt_tensor *d = to_dev(h, GPU);
  cr_assert_eq(tt_transpose(d, 0, 1, &tr), 0);
  cr_assert_eq(tt_contiguous(tr, &got), 0, "%s", tt_last_error());
  tt_tensor *back = to_dev(got, TT_CPU);
  const int64_t *q = tt_tensor_data(back);
  for (int64_t r = 0; r < 8; r++)
    for (int64_t c = 0; c < 3; c++)
      cr_assert_eq(q[r * 3 + c], p[c * 8 + r], "[%lld, %lld]: %lld, want %lld", (long long)r,
                   (long long)c, (long long)q[r * 3 + c], (long long)p[c * 8 + r]);
  tt_tensor *all[] = {h, d, tr, got, back};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
}

/* Offsets past 2^31 take the 64-bit index path (engine/core/copy_geom.h): three rows
** 2^30 + 16 bytes apart, their first 8 bytes written through a strided view and read
** back through another, and row 2 checked through a plain contiguous copy as well (a
** path that truncated offsets would write and read the same wrong places). */
Test(cuda_runtime, strided_copy_past_2_to_the_31) {
  const int64_t row = ((int64_t)1 << 30) + 16, big[2] = {3, row}, small[2] = {3, 8};
  tt_tensor *store = NULL, *h = NULL, *hd = NULL, *view = NULL, *again = NULL;
  cr_assert_eq(tt_tensor_zeros(big, 2, TT_E4M3, GPU, &store), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_empty(small, 2, TT_E4M3, TT_CPU, &h), 0);
  uint8_t *p = tt_tensor_data(h);
  for (int i = 0; i < 24; i++) p[i] = (uint8_t)(0x30 + i);
  hd = to_dev(h, GPU);
  cr_assert_eq(tt_narrow(store, 1, 0, 8, &view), 0);
  cr_assert_eq(tt_copy_(view, hd), 0, "%s", tt_last_error());
  cr_assert_eq(tt_contiguous(view, &again), 0, "%s", tt_last_error());
  tt_tensor *back = to_dev(again, TT_CPU);
  cr_assert(memcmp(tt_tensor_data(back), p, 24) == 0, "the round trip changed the bytes");
  tt_tensor *r2 = NULL, *r2c = NULL;
  cr_assert_eq(tt_narrow(store, 0, 2, 1, &r2), 0);
  cr_assert_eq(tt_contiguous(r2, &r2c), 0);
  tt_tensor *r2h = to_dev(r2c, TT_CPU);
  cr_assert(memcmp(tt_tensor_data(r2h), p + 16, 8) == 0, "row 2 was written elsewhere");
  tt_tensor *all[] = {store, h, hd, view, again, back, r2, r2c, r2h};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
}

/* cuBLASLt plans (kernels/cuda/matmul.cu) are made once per GEMM shape and reused: the
** second call of the same shape on other buffers makes none, and what a reused plan
** takes from the call (its bias pointer, alpha, beta) is this call's, not the first's.
** A third call's bias is a view one element into its buffer (4-byte aligned, where the
** others were 256): the heuristic read the first bias pointer for the alignment it may
** assume, so that call gets a plan of its own. C (m, n) = A (m, k) B (k, n) + bias, bf16
** operands, f32 C, against the CPU. */
static tt_tensor *host_matrix(int64_t r, int64_t c, int dtype, double scale) {
  const int64_t shape[2] = {r, c};
  tt_tensor *f = randn(shape, 2, scale), *t = NULL;
  cr_assert_eq(tt_cast(f, dtype, &t), 0);
  tt_tensor_release(f);
  return t;
}

Test(cuda_runtime, gemm_plans_reused_with_this_calls_pointers) {
  enum { M = 48, N = 40, K = 32 };
  tt_tensor *a = host_matrix(M, K, TT_BF16, 1.0), *b = host_matrix(K, N, TT_BF16, 1.0);
  tt_tensor *da = to_dev(a, GPU), *db = to_dev(b, GPU), *af = NULL, *bf = NULL;
  cr_assert_eq(tt_cast(a, TT_F32, &af), 0);
  cr_assert_eq(tt_cast(b, TT_F32, &bf), 0);
  int64_t made0, reused0, made[3], reused[3];
  tt_cuda_gemm_plan_counts(&made0, &reused0);
  for (int call = 0; call < 3; call++) {
    /* A new bias and a new C each time; the second call also scales by alpha 2; the
    ** third's bias starts one element into its buffer. */
    const float alpha = call ? 2.0f : 1.0f;
    tt_tensor *bias_buf = host_matrix(1, N + 1, TT_F32, 1.0), *bias = NULL;
    cr_assert_eq(tt_narrow(bias_buf, 1, call == 2 ? 1 : 0, N, &bias), 0);
    tt_tensor *dbias_buf = to_dev(bias_buf, GPU), *dbias = NULL, *c = NULL;
    cr_assert_eq(tt_narrow(dbias_buf, 1, call == 2 ? 1 : 0, N, &dbias), 0);
    const int64_t cs[2] = {M, N};
    cr_assert_eq(tt_tensor_zeros(cs, 2, TT_F32, GPU, &c), 0);
    tt_cuda_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = tt_tensor_data(da); g.lda = K; g.a_dtype = TT_BF16;
    g.b = tt_tensor_data(db); g.ldb = N; g.b_dtype = TT_BF16;
    g.c = tt_tensor_data(c); g.ldc = N; g.c_dtype = TT_F32;
    g.batch = 1;
    g.alpha = alpha;
    g.bias = tt_tensor_data(dbias);
    cr_assert_eq(tt_cuda_lt_gemm(&g), 0, "%s", tt_last_error());
    tt_cuda_gemm_plan_counts(&made[call], &reused[call]);
    tt_tensor *got = to_dev(c, TT_CPU);
    const float *p = tt_tensor_data(got), *x = tt_tensor_data(af), *y = tt_tensor_data(bf),
                *bb = tt_tensor_data(bias);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += (double)x[i * K + k] * y[k * N + j];
        const double want = alpha * s + bb[j];
        cr_assert(fabs(p[i * N + j] - want) <= 1e-4 * (1 + fabs(want)),
                  "call %d, C[%d, %d] = %g, want %g", call, i, j, p[i * N + j], want);
      }
    tt_tensor *all[] = {bias_buf, bias, dbias_buf, dbias, c, got};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
  }
  cr_assert_eq(made[0] - made0, 1, "the first GEMM of its shape made %lld plans",
               (long long)(made[0] - made0));
  cr_assert(made[1] == made[0] && reused[1] - reused[0] == 1,
            "the second GEMM made %lld plans and reused %lld", (long long)(made[1] - made[0]),
            (long long)(reused[1] - reused[0]));
  cr_assert(made[2] - made[1] == 1 && reused[2] == reused[1],
            "the GEMM with a 4-byte aligned bias made %lld plans and reused %lld",
            (long long)(made[2] - made[1]), (long long)(reused[2] - reused[1]));
  tt_tensor *all[] = {a, b, da, db, af, bf};
  for (size_t k = 0; k < sizeof all / sizeof *all; k++) tt_tensor_release(all[k]);
}

/* The op profile on the GPU (engine/core/op_profile.c with the backend's events): the
** marks cost the host no wait until the stop; a 4096^3 GEMM's forward row is longer than
** the mean after it (the rows are kernel time); the rows add up to the profile's whole,
** which matches a pair of events of our own around it. */
Test(cuda_runtime, op_profile_times_kernels_without_host_waits) {
  tt_tensor *a = full(4096, 4096, 0.5), *b = full(4096, 4096, 0.25), *y = NULL, *loss = NULL;
  cr_assert_eq(tt_set_requires_grad(a, 1), 0);
  cr_assert_eq(tt_set_requires_grad(b, 1), 0);
  tt_cuda_event *e0 = NULL, *e1 = NULL;
  cr_assert_eq(tt_cuda_event_create(1, &e0), 0);
  cr_assert_eq(tt_cuda_event_create(1, &e1), 0);
  for (int run = 0; run < 2; run++) {   /* the first warms cuBLASLt and the cache */
    cr_assert_eq(tt_cuda_event_record(e0, tt_cuda_get_stream()), 0);
    cr_assert_eq(tt_op_profile_start(GPU), 0, "%s", tt_last_error());
    int64_t waits = tt_cuda_host_sync_count();
    cr_assert_eq(tt_matmul(a, b, NULL, 0, 0, &y), 0, "%s", tt_last_error());
    cr_assert_eq(tt_mean(y, NULL, 0, 0, &loss), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward(loss), 0, "%s", tt_last_error());
    cr_assert_eq(tt_cuda_host_sync_count(), waits, "the marks made the host wait");
    double total = 0.0;
    int n = tt_op_profile_stop(&total);
    cr_assert(n > 0, "%s", tt_last_error());
    cr_assert_eq(tt_cuda_event_record(e1, tt_cuda_get_stream()), 0);
    cr_assert_eq(tt_cuda_event_synchronize(e1), 0);
    float own_ms = 0.0f;
    cr_assert_eq(tt_cuda_event_elapsed_ms(e0, e1, &own_ms), 0);
    tt_op_profile_entry e[32];
    n = tt_op_profile_take(e, 32);
    double sum = 0.0, mm = -1.0, mean = -1.0;
    for (int i = 0; i < n; i++) {
      sum += e[i].seconds;
      if (e[i].phase != TT_OP_FORWARD) continue;
      if (strcmp(e[i].name, "tt_matmul") == 0) mm = e[i].seconds;
      if (strcmp(e[i].name, "tt_mean") == 0) mean = e[i].seconds;
    }
    cr_assert(fabs(sum - total) <= 1e-9 + 1e-6 * total, "rows %g, whole %g", sum, total);
    cr_assert(total <= 1e-3 * own_ms + 1e-4 && total >= 0.9 * 1e-3 * own_ms - 1e-4,
              "profile %g s, events around it %g ms", total, own_ms);
    if (run == 1)
      cr_assert(mm > 0 && mean >= 0 && mm > 10 * mean, "matmul forward %g s, mean %g s", mm,
                mean);
    tt_tensor_release(y);
    tt_tensor_release(loss);
    tt_zero_grad(a);
    tt_zero_grad(b);
  }
  tt_cuda_event_destroy(e0);
  tt_cuda_event_destroy(e1);
  tt_tensor_release(a);
  tt_tensor_release(b);
}
