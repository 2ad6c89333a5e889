/*
** test_step.c — the optimizer side of a CUDA step against its CPU twins: the multi-tensor
** AdamW over more tensors than one launch takes (odd sizes, one over a chunk, bf16 copies
** on some, the gradient scale and found_inf read from the device stats), the
** deterministic gradient sum of squares and clip coefficient, unscaling into the stats;
** then the step's synchronisation: none between backward and the optimizer, one for the
** stats read, embedding ids and cross-entropy targets checked on the device and reported
** at that read, and a CUDA graph of the optimizer step replayed bitwise like eager runs;
** the host-set slots: the spike limit (the loss against it on the device) and fp16's
** loss scale (the unscale reading it there) against the CPU.
**
** Without a GPU the program exits 77 before running anything: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "tetra_amp.h"

enum { NT = 331 };   /* more than TT_OPTIM_MULTI_MAX (320): two launches */

typedef struct {
  tt_tensor *p[NT], *m[NT], *v[NT], *bf[NT];
} set;

static int64_t size_of(int i) {
  if (i == 7) return 200003;   /* more than one 65536-element chunk */
  return 1 + (i * 37) % 613;
}

static tt_tensor *vec_randn(int64_t n, double std) { return randn(&n, 1, std); }

/* CPU parameters, moments and grads (v >= 0 as squares); bf16 copies on every third. */
static void make_cpu(set *s) {
  for (int i = 0; i < NT; i++) {
    int64_t n = size_of(i);
    s->p[i] = vec_randn(n, 1.0);
    s->m[i] = vec_randn(n, 0.1);
    tt_tensor *r = vec_randn(n, 0.1);
    cr_assert_eq(tt_mul(r, r, &s->v[i]), 0);
    tt_tensor_release(r);
    s->p[i]->grad = vec_randn(n, 1.0);
    s->bf[i] = NULL;
    if (i % 3 == 0) cr_assert_eq(tt_tensor_zeros(&n, 1, TT_BF16, TT_CPU, &s->bf[i]), 0);
  }
}

static void to_gpu(set *g, const set *c) {
  for (int i = 0; i < NT; i++) {
    g->p[i] = to_dev(c->p[i], GPU);
    g->m[i] = to_dev(c->m[i], GPU);
    g->v[i] = to_dev(c->v[i], GPU);
    g->p[i]->grad = to_dev(c->p[i]->grad, GPU);
    g->bf[i] = c->bf[i] ? to_dev(c->bf[i], GPU) : NULL;
  }
}

static void free_set(set *s) {
  for (int i = 0; i < NT; i++) {
    tt_zero_grad(s->p[i]);
    tt_tensor_release(s->p[i]);
    tt_tensor_release(s->m[i]);
    tt_tensor_release(s->v[i]);
    tt_tensor_release(s->bf[i]);
  }
}

static tt_tensor *stats_on(int device, float grad_scale, float found_inf) {
  tt_tensor *s = NULL, *h = NULL;
  cr_assert_eq(tt_step_stats_new(TT_CPU, &h), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_set(h, TT_STAT_GRAD_SCALE, grad_scale), 0);
  cr_assert_eq(tt_tensor_set(h, TT_STAT_FOUND_INF, found_inf), 0);
  if (device == TT_CPU) return h;
  s = to_dev(h, device);
  tt_tensor_release(h);
  return s;
}

static void assert_same_bits(tt_tensor *gpu, tt_tensor *cpu_before, const char *what, int i) {
  tt_tensor *h = to_dev(gpu, TT_CPU);
  size_t bytes = (size_t)tt_tensor_numel(h) * (h->dtype == TT_BF16 ? 2 : 4);
  cr_assert(memcmp(tt_tensor_data(h), tt_tensor_data(cpu_before), bytes) == 0,
            "%s[%d] changed", what, i);
  tt_tensor_release(h);
}

static tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};

/* -- Kernels against their CPU twins -------------------------------------------------- */

Test(step, adamw_multi_matches_cpu_twin) {
  set c, g;
  make_cpu(&c);
  to_gpu(&g, &c);
  tt_tensor *sc = stats_on(TT_CPU, 0.37f, 0.0f), *sg = stats_on(GPU, 0.37f, 0.0f);
  for (int64_t step = 1; step <= 3; step++) {
    cr_assert_eq(tt_adamw_multi(c.p, c.m, c.v, c.bf, NT, &cfg, step, sc), 0, "%s",
                 tt_last_error());
    cr_assert_eq(tt_adamw_multi(g.p, g.m, g.v, g.bf, NT, &cfg, step, sg), 0, "%s",
                 tt_last_error());
  }
  for (int i = 0; i < NT; i++) {
    double ep = rel_err(g.p[i], c.p[i]), em = rel_err(g.m[i], c.m[i]),
           ev = rel_err(g.v[i], c.v[i]);
    cr_assert(ep <= 1e-6 && em <= 1e-6 && ev <= 1e-6,
              "tensor %d (%lld): relative errors p %g, m %g, v %g", i, (long long)size_of(i),
              ep, em, ev);
    if (!g.bf[i]) continue;
    /* the copy is the GPU's own new weight rounded to nearest even */
    tt_tensor *hp = to_dev(g.p[i], TT_CPU), *hb = to_dev(g.bf[i], TT_CPU);
    const float *p = tt_tensor_data(hp);
    const uint16_t *b = tt_tensor_data(hb);
    for (int64_t j = 0; j < tt_tensor_numel(hp); j++)
      cr_assert_eq(b[j], tt_float_to_bf16(p[j]), "bf16[%d][%lld]", i, (long long)j);
    tt_tensor_release(hp);
    tt_tensor_release(hb);
  }
  tt_tensor_release(sc);
  tt_tensor_release(sg);
  free_set(&c);
  free_set(&g);
}

Test(step, adamw_multi_found_inf_writes_nothing) {
  set c, g;
  make_cpu(&c);
  to_gpu(&g, &c);
  tt_tensor *sg = stats_on(GPU, 1.0f, 1.0f);
  cr_assert_eq(tt_adamw_multi(g.p, g.m, g.v, g.bf, NT, &cfg, 1, sg), 0, "%s", tt_last_error());
  for (int i = 0; i < NT; i++) {
    assert_same_bits(g.p[i], c.p[i], "p", i);
    assert_same_bits(g.m[i], c.m[i], "m", i);
    assert_same_bits(g.v[i], c.v[i], "v", i);
    if (g.bf[i]) assert_same_bits(g.bf[i], c.bf[i], "bf16", i);
  }
  tt_tensor_release(sg);
  free_set(&c);
  free_set(&g);
}

Test(step, sumsq_clip_and_unscale_match_cpu_and_are_deterministic) {
  set c, g;
  make_cpu(&c);
  to_gpu(&g, &c);
  tt_tensor *sc = stats_on(TT_CPU, 1.0f, 0.0f), *sg = stats_on(GPU, 1.0f, 0.0f);
  cr_assert_eq(tt_grads_unscale_to_stats(c.p, NT, 0.25, sc), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grads_unscale_to_stats(g.p, NT, 0.25, sg), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grad_sumsq(c.p, NT, sc), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grad_sumsq(g.p, NT, sg), 0, "%s", tt_last_error());
  cr_assert_eq(tt_clip_finish(sc, NULL, 1.0, 1.0), 0);
  cr_assert_eq(tt_clip_finish(sg, NULL, 1.0, 1.0), 0);
  float a[TT_STEP_STATS_N], b[TT_STEP_STATS_N], again[TT_STEP_STATS_N];
  cr_assert_eq(tt_step_stats_read(sc, a), 0);
  cr_assert_eq(tt_step_stats_read(sg, b), 0, "%s", tt_last_error());
  double sa = (double)a[TT_STAT_SUMSQ_HI] + a[TT_STAT_SUMSQ_LO];
  double sb = (double)b[TT_STAT_SUMSQ_HI] + b[TT_STAT_SUMSQ_LO];
  cr_assert(fabs(sa - sb) <= 1e-12 * sa, "sum of squares: cuda %.17g, cpu %.17g", sb, sa);
  cr_assert(fabs(a[TT_STAT_GRAD_NORM] - b[TT_STAT_GRAD_NORM]) <= 1e-6 * a[TT_STAT_GRAD_NORM]);
  cr_assert(fabs(a[TT_STAT_GRAD_SCALE] - b[TT_STAT_GRAD_SCALE]) <= 1e-6);
  cr_assert(b[TT_STAT_GRAD_SCALE] < 1.0f && b[TT_STAT_FOUND_INF] == 0.0f);
  for (int i = 0; i < NT; i++) cr_assert(rel_err(g.p[i]->grad, c.p[i]->grad) == 0.0);
  /* the same grads give the same bits */
  cr_assert_eq(tt_grad_sumsq(g.p, NT, sg), 0);
  cr_assert_eq(tt_step_stats_read(sg, again), 0);
  cr_assert(memcmp(again, b, sizeof b) == 0, "two sums of squares differ");
  /* an inf grad: found_inf from the unscale pass, on the device */
  cr_assert_eq(tt_fill_(g.p[5]->grad, INFINITY), 0);
  cr_assert_eq(tt_step_stats_reset(sg), 0);
  cr_assert_eq(tt_grads_unscale_to_stats(g.p, NT, 0.5, sg), 0);
  cr_assert_eq(tt_step_stats_read(sg, b), 0);
  cr_assert(b[TT_STAT_FOUND_INF] == 1.0f, "an inf grad must set found_inf on the device");
  tt_tensor_release(sc);
  tt_tensor_release(sg);
  free_set(&c);
  free_set(&g);
}

/* The loss's flags against the limit, and the unscale by the stats' scale, on both sides:
** the same flags, the same grads bit for bit. */
Test(step, spike_limit_and_stats_scale_match_the_cpu) {
  const double loss_values[3] = {3.0, 1.5, NAN};
  const float want_inf[3] = {1.0f, 0.0f, 1.0f}, want_spike[3] = {1.0f, 0.0f, 0.0f};
  for (int d = 0; d < 2; d++) {
    int dev = d ? GPU : TT_CPU;
    tt_tensor *stats = stats_on(dev, 1.0f, 0.0f);
    cr_assert_eq(tt_step_stats_set_loss_limit(stats, 2.0), 0, "%s", tt_last_error());
    for (int i = 0; i < 3; i++) {
      tt_tensor *loss = NULL;
      cr_assert_eq(tt_tensor_full(NULL, 0, TT_F32, dev, loss_values[i], &loss), 0);
      cr_assert_eq(tt_step_stats_reset(stats), 0);
      cr_assert_eq(tt_step_stats_set_loss(stats, loss), 0, "%s", tt_last_error());
      float out[TT_STEP_STATS_N];
      cr_assert_eq(tt_step_stats_read(stats, out), 0, "%s", tt_last_error());
      cr_assert(out[TT_STAT_FOUND_INF] == want_inf[i] && out[TT_STAT_SPIKE] == want_spike[i],
                "%s, loss %g: found_inf %g spike %g", d ? "cuda" : "cpu", loss_values[i],
                out[TT_STAT_FOUND_INF], out[TT_STAT_SPIKE]);
      tt_tensor_release(loss);
    }
    tt_tensor_release(stats);
  }
  set c, g;
  make_cpu(&c);
  to_gpu(&g, &c);
  tt_tensor *sc = stats_on(TT_CPU, 1.0f, 0.0f), *sg = stats_on(GPU, 1.0f, 0.0f);
  cr_assert_eq(tt_step_stats_set_scale(sc, 512.0), 0);
  cr_assert_eq(tt_step_stats_set_scale(sg, 512.0), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grads_unscale_by_stats(c.p, NT, sc), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grads_unscale_by_stats(g.p, NT, sg), 0, "%s", tt_last_error());
  for (int i = 0; i < NT; i++) {
    if (c.p[i]->grad) assert_same_bits(g.p[i]->grad, c.p[i]->grad, "grad unscaled", i);
  }
  tt_tensor_release(sc);
  tt_tensor_release(sg);
  free_set(&c);
  free_set(&g);
}

/* -- Synchronisation ------------------------------------------------------------------ */

/* The optimizer half of a step (what train.lua runs after backward), on stats. */
static void optimizer_half(set *g, tt_tensor *stats, int64_t step) {
  cr_assert_eq(tt_step_stats_reset(stats), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grads_unscale_to_stats(g->p, NT, 1.0, stats), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grad_sumsq(g->p, NT, stats), 0, "%s", tt_last_error());
  cr_assert_eq(tt_clip_finish(stats, NULL, 1.0, 1.0), 0, "%s", tt_last_error());
  cr_assert_eq(tt_adamw_multi(g->p, g->m, g->v, g->bf, NT, &cfg, step, stats), 0, "%s",
               tt_last_error());
}

Test(step, one_host_wait_per_step) {
  set c, g;
  make_cpu(&c);
  to_gpu(&g, &c);
  tt_tensor *sg = stats_on(GPU, 1.0f, 0.0f);
  tt_tensor *loss = NULL;
  cr_assert_eq(tt_tensor_full(NULL, 0, TT_F32, GPU, 2.5, &loss), 0);
  cr_assert_eq(tt_cuda_set_deferred_checks(1), 0, "%s", tt_last_error());
  float out[TT_STEP_STATS_N];
  for (int64_t step = 1; step <= 3; step++) {
    int64_t before = tt_cuda_host_sync_count();
    optimizer_half(&g, sg, step);
    cr_assert_eq(tt_step_stats_set_loss(sg, loss), 0, "%s", tt_last_error());
    cr_assert_eq(tt_cuda_host_sync_count() - before, 0,
                 "step %lld: the optimizer half waited for the device %lld times",
                 (long long)step, (long long)(tt_cuda_host_sync_count() - before));
    cr_assert_eq(tt_step_stats_read(sg, out), 0, "%s", tt_last_error());
    cr_assert_eq(tt_cuda_host_sync_count() - before, 1, "step %lld: %lld host waits, want 1",
                 (long long)step, (long long)(tt_cuda_host_sync_count() - before));
    cr_assert(out[TT_STAT_LOSS] == 2.5f && out[TT_STAT_GRAD_NORM] > 0.0f);
  }
  cr_assert_eq(tt_cuda_set_deferred_checks(0), 0);
  tt_tensor_release(loss);
  tt_tensor_release(sg);
  free_set(&c);
  free_set(&g);
}

/* ids: n values with `bad` at position `at`, i32 on the GPU. */
static tt_tensor *ids_with(int64_t n, int64_t at, int32_t bad, int64_t hi) {
  tt_tensor *h = NULL;
  cr_assert_eq(tt_tensor_zeros(&n, 1, TT_I32, TT_CPU, &h), 0);
  for (int64_t i = 0; i < n; i++) tt_tensor_set(h, i, (double)(i % hi));
  tt_tensor_set(h, at, bad);
  tt_tensor *d = to_dev(h, GPU);
  tt_tensor_release(h);
  return d;
}

Test(step, deferred_checks_report_at_the_read) {
  int64_t wshape[2] = {50, 24}, lshape[2] = {9, 50};
  tt_tensor *wc = randn(wshape, 2, 1.0), *lc = randn(lshape, 2, 1.0);
  tt_tensor *w = to_dev(wc, GPU), *out = NULL, *logits = to_dev(lc, GPU), *loss = NULL;
  tt_tensor_release(wc);
  tt_tensor_release(lc);
  tt_tensor *sg = stats_on(GPU, 1.0f, 0.0f);
  float st[TT_STEP_STATS_N];
  /* off: the op itself fails */
  tt_tensor *ids = ids_with(11, 3, 70, 50);
  cr_assert_neq(tt_embedding(w, ids, &out), 0);
  cr_assert(strstr(tt_last_error(), "embedding: id 70 at position 3 is outside the vocabulary "
                                    "[0, 50)"), "%s", tt_last_error());
  /* on: the op returns without a host wait, the read reports it */
  cr_assert_eq(tt_cuda_set_deferred_checks(1), 0);
  int64_t before = tt_cuda_host_sync_count();
  cr_assert_eq(tt_embedding(w, ids, &out), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_host_sync_count(), before, "the embedding waited for the device");
  cr_assert_neq(tt_step_stats_read(sg, st), 0, "a bad id must fail the step's read");
  cr_assert(strstr(tt_last_error(), "embedding: id 70 at position 3 is outside the vocabulary "
                                    "[0, 50)"), "%s", tt_last_error());
  tt_tensor_release(out);
  /* cleared after the report; the cross-entropy targets alike */
  cr_assert_eq(tt_step_stats_reset(sg), 0);
  cr_assert_eq(tt_step_stats_read(sg, st), 0, "%s", tt_last_error());
  tt_tensor *targets = ids_with(9, 6, -4, 50);
  before = tt_cuda_host_sync_count();
  cr_assert_eq(tt_cross_entropy(logits, targets, -100, &loss), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_host_sync_count(), before, "the cross-entropy waited for the device");
  cr_assert_neq(tt_step_stats_read(sg, st), 0);
  cr_assert(strstr(tt_last_error(), "cross_entropy: target -4 at row 6 is outside [0, 50)"),
            "%s", tt_last_error());
  cr_assert_eq(tt_cuda_set_deferred_checks(0), 0);
  tt_tensor_release(loss);
  tt_tensor_release(targets);
  tt_tensor_release(ids);
  tt_tensor_release(sg);
  tt_tensor_release(logits);
  tt_tensor_release(w);
}

/* -- CUDA graphs ---------------------------------------------------------------------- */

/* Steps 2 and 3 with their own learning rates and bias corrections: eager, and one
** capture replayed twice with the values written into the stats before each replay
** (lr_from_stats), its memory from a private pool. Bitwise the same. */
Test(step, graph_replay_equals_eager_steps) {
  set c, eager, graphed;
  make_cpu(&c);
  to_gpu(&eager, &c);
  to_gpu(&graphed, &c);
  tt_cuda_stream *stream = NULL;
  cr_assert_eq(tt_cuda_stream_create(&stream), 0);
  cr_assert_eq(tt_cuda_set_stream(stream), 0);
  tt_tensor *se = stats_on(GPU, 1.0f, 0.0f), *sgr = stats_on(GPU, 1.0f, 0.0f);
  tt_adamw_config dev = cfg;
  dev.lr_from_stats = 1;
  const double lrs[4] = {0, 1e-2, 4e-3, 1e-3};
  /* warm-up step on both (the allocator's cache grows outside the capture) */
  optimizer_half(&eager, se, 1);
  optimizer_half(&graphed, sgr, 1);
  tt_cuda_graph *graph = NULL;
  tt_alloc_pool *pool = NULL;
  cr_assert_eq(tt_alloc_pool_new(GPU, &pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(GPU, pool), 0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_graph_begin(), 0, "%s", tt_last_error());
  cr_assert(tt_cuda_graph_capturing());
  optimizer_half(&graphed, sgr, 2);
  float st[TT_STEP_STATS_N];
  cr_assert_neq(tt_step_stats_read(sgr, st), 0, "a host wait must fail while capturing");
  cr_assert_neq(tt_cuda_graph_end(&graph), 0, "a capture with a host wait must fail");
  /* again, cleanly, the update reading lr and the bias corrections from the stats */
  cr_assert_eq(tt_cuda_graph_begin(), 0, "%s", tt_last_error());
  cr_assert_eq(tt_step_stats_reset(sgr), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grads_unscale_to_stats(graphed.p, NT, 1.0, sgr), 0, "%s", tt_last_error());
  cr_assert_eq(tt_grad_sumsq(graphed.p, NT, sgr), 0, "%s", tt_last_error());
  cr_assert_eq(tt_clip_finish(sgr, NULL, 1.0, 1.0), 0, "%s", tt_last_error());
  cr_assert_eq(tt_adamw_multi(graphed.p, graphed.m, graphed.v, graphed.bf, NT, &dev, 1, sgr),
               0, "%s", tt_last_error());
  cr_assert_eq(tt_cuda_graph_end(&graph), 0, "%s", tt_last_error());
  cr_assert_eq(tt_alloc_pool_use(GPU, NULL), 0);
  for (int64_t step = 2; step <= 3; step++) {
    tt_adamw_config e = cfg;
    e.lr = lrs[step];
    cr_assert_eq(tt_step_stats_reset(se), 0);
    cr_assert_eq(tt_grads_unscale_to_stats(eager.p, NT, 1.0, se), 0);
    cr_assert_eq(tt_grad_sumsq(eager.p, NT, se), 0);
    cr_assert_eq(tt_clip_finish(se, NULL, 1.0, 1.0), 0);
    cr_assert_eq(tt_adamw_multi(eager.p, eager.m, eager.v, eager.bf, NT, &e, step, se), 0);
    cr_assert_eq(tt_step_stats_set_update(sgr, lrs[step], cfg.beta1, cfg.beta2, step), 0,
                 "%s", tt_last_error());
    cr_assert_eq(tt_cuda_graph_replay(graph), 0, "%s", tt_last_error());
  }
  for (int i = 0; i < NT; i++) {
    tt_tensor *h = to_dev(eager.p[i], TT_CPU);
    assert_same_bits(graphed.p[i], h, "graph-replayed p", i);
    tt_tensor_release(h);
  }
  tt_cuda_graph_destroy(graph);
  tt_alloc_pool_release(pool);
  cr_assert_eq(tt_cuda_set_stream(NULL), 0);
  tt_cuda_stream_destroy(stream);
  tt_tensor_release(se);
  tt_tensor_release(sgr);
  free_set(&c);
  free_set(&eager);
  free_set(&graphed);
}
