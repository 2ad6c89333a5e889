/*
** test_ops_embedding.c — token embedding lookup and its scatter-add backward against
** float64 loops; repeated ids; bitwise determinism across thread counts; bad ids; the
** touched rows of a gradient.
*/
#include "tt_test.h"
#include "embedding.h"

typedef struct { int64_t n, V, D; } emb_ctx;   /* n ids, weight (V, D) */

/* in[0]: weight (V, D), in[1]: ids (n) as doubles -> out (n, D) */
static void emb_ref(double *const *in, double *out, void *ctx) {
  emb_ctx *c = ctx;
  for (int64_t i = 0; i < c->n; i++) {
    int64_t id = (int64_t)in[1][i];
    for (int64_t j = 0; j < c->D; j++) out[i * c->D + j] = in[0][id * c->D + j];
  }
}

static int emb_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  (void)ctx;
  return tt_embedding(in[0], in[1], out);
}

Test(embedding, forward_contiguous_and_strided) {
  int64_t wshape[2] = {11, 13}, ishape[3] = {2, 3, 5};
  for (int variant = 0; variant < 4; variant++) {
    int strided = variant & 1, dtype = variant & 2 ? TT_I64 : TT_I32;
    tt_tensor *in[2] = {strided ? tt_test_rand_strided(wshape, 2, 7) : tt_test_rand(wshape, 2, 7),
                        tt_test_index(ishape, 3, 11, dtype, 8 + variant)};
    emb_ctx c = {30, 11, 13};
    tt_test_check_forward(emb_op, emb_ref, in, 2, &c, 0.0, 0.0);
    tt_tensor *y = NULL;
    cr_assert(tt_embedding(in[0], in[1], &y) == 0, "%s", tt_last_error());
    cr_assert(y->ndim == 4 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 5 &&
              y->shape[3] == 13);
    tt_tensor_release(y);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* ids given as a transposed (non-contiguous) view: rows follow the view's logical order. */
Test(embedding, strided_ids) {
  int64_t wshape[2] = {9, 5}, ishape[2] = {3, 7};
  tt_tensor *w = tt_test_rand(wshape, 2, 1), *ids = tt_test_index(ishape, 2, 9, TT_I64, 2);
  tt_tensor *idt = NULL;
  cr_assert(tt_transpose(ids, 0, 1, &idt) == 0);
  cr_assert(!tt_tensor_is_contiguous(idt));
  tt_tensor *in[2] = {w, idt};
  emb_ctx c = {21, 9, 5};
  tt_test_check_forward(emb_op, emb_ref, in, 2, &c, 0.0, 0.0);
  tt_tensor_release(idt);
  tt_tensor_release(ids);
  tt_tensor_release(w);
}

/* Few rows, many ids: most rows are hit several times, so the scatter-add must sum. */
Test(embedding, backward_repeated_ids) {
  int64_t wshape[2] = {7, 9}, ishape[2] = {5, 7};
  int check[2] = {1, 0};
  for (int strided = 0; strided < 2; strided++) {
    tt_tensor *in[2] = {strided ? tt_test_rand_strided(wshape, 2, 3) : tt_test_rand(wshape, 2, 3),
                        tt_test_index(ishape, 2, 7, TT_I32, 4)};
    emb_ctx c = {35, 7, 9};
    tt_test_check_backward(emb_op, emb_ref, in, 2, check, &c, 1e-6, 1e-6);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* Threaded backward (n * D above the grain) equals the float64 scatter-add, and the bits
** do not depend on the thread count. */
static tt_tensor *embedding_grad(tt_tensor *w, tt_tensor *ids, tt_tensor *up) {
  tt_tensor *y = NULL, *g = NULL;
  tt_zero_grad(w);
  cr_assert(tt_set_requires_grad(w, 1) == 0);
  cr_assert(tt_embedding(w, ids, &y) == 0, "%s", tt_last_error());
  cr_assert(tt_backward_with(y, up) == 0, "%s", tt_last_error());
  cr_assert(tt_clone(w->grad, &g) == 0);
  tt_tensor_release(y);
  return g;
}

Test(embedding, backward_threaded_deterministic) {
  int64_t V = 257, D = 67, n = 1031;
  int64_t wshape[2] = {V, D}, ishape[1] = {n}, yshape[2] = {n, D};
  tt_tensor *w = tt_test_rand(wshape, 2, 5), *ids = tt_test_index(ishape, 1, V, TT_I64, 6);
  tt_tensor *up = tt_test_rand(yshape, 2, 7);
  int keep = tt_get_num_threads();
  tt_set_num_threads(1);
  tt_tensor *g1 = embedding_grad(w, ids, up);
  tt_set_num_threads(2);
  tt_tensor *g2 = embedding_grad(w, ids, up);
  tt_set_num_threads(keep);
  cr_assert(memcmp(tt_tensor_data(g1), tt_tensor_data(g2), sizeof(float) * V * D) == 0,
            "gradient differs between 1 and 2 threads");
  double *want = calloc((size_t)(V * D), sizeof(double));
  const float *u = tt_tensor_data(up);
  const int64_t *id = tt_tensor_data(ids);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < D; j++) want[id[i] * D + j] += u[i * D + j];
  tt_test_assert_close(g2, want, V * D, 1e-5, 1e-6, "threaded embedding gradient");
  free(want);
  tt_tensor_release(g1);
  tt_tensor_release(g2);
  tt_tensor_release(up);
  tt_tensor_release(ids);
  tt_tensor_release(w);
}

/* A vocabulary-parallel share (tt_embedding_band): the table holds the rows of ids
** [start, start + V) of a larger vocabulary; other ids give zero rows and no gradient. */
typedef struct { int64_t n, V, D, start; } band_ctx;

static void band_ref(double *const *in, double *out, void *ctx) {
  band_ctx *c = ctx;
  for (int64_t i = 0; i < c->n; i++) {
    int64_t row = (int64_t)in[1][i] - c->start;
    for (int64_t j = 0; j < c->D; j++)
      out[i * c->D + j] = row >= 0 && row < c->V ? in[0][row * c->D + j] : 0.0;
  }
}

static int band_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  return tt_embedding_band(in[0], in[1], ((band_ctx *)ctx)->start, TT_F32, out);
}

Test(embedding, band_of_a_larger_vocabulary) {
  int64_t wshape[2] = {5, 13}, ishape[2] = {4, 9};   /* rows of ids 4..8 of 0..11 */
  int check[2] = {1, 0};
  for (int dtype = 0; dtype < 2; dtype++) {
    tt_tensor *in[2] = {tt_test_rand(wshape, 2, 12),
                        tt_test_index(ishape, 2, 12, dtype ? TT_I64 : TT_I32, 13)};
    band_ctx c = {36, 5, 13, 4};
    /* (memory of the output's size full of 7s given back first, so that zero rows are
    ** written, not found) */
    int64_t yshape[3] = {4, 9, 13};
    tt_tensor *junk = NULL;
    cr_assert_eq(tt_tensor_full(yshape, 3, TT_F32, TT_CPU, 7.0, &junk), 0);
    tt_tensor_release(junk);
    tt_test_check_forward(band_op, band_ref, in, 2, &c, 0.0, 0.0);
    tt_test_check_backward(band_op, band_ref, in, 2, check, &c, 1e-6, 1e-6);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
  /* The plain lookup still refuses those ids, naming the table's range. */
  tt_tensor *w = tt_test_rand(wshape, 2, 12), *ids = tt_test_index(ishape, 2, 12, TT_I64, 13);
  tt_tensor *y = NULL;
  cr_assert_eq(tt_embedding(w, ids, &y), -1);
  cr_assert(strstr(tt_last_error(), "outside the vocabulary [0, 5)") != NULL, "%s",
            tt_last_error());
  tt_tensor_release(w);
  tt_tensor_release(ids);
}

Test(embedding, rejects_bad_arguments) {
  int64_t wshape[2] = {5, 3}, ishape[1] = {4}, w1[1] = {5};
  tt_tensor *w = tt_test_rand(wshape, 2, 1), *ids = tt_test_index(ishape, 1, 5, TT_I32, 2);
  tt_tensor *wflat = tt_test_rand(w1, 1, 3), *fids = tt_test_rand(ishape, 1, 4), *y = NULL;
  tt_test_assert_error(tt_embedding(w, fids, &y), "embedding: ids must be i32 or i64, got f32");
  tt_test_assert_error(tt_embedding(wflat, ids, &y), "embedding: weight f32[5] cpu must be 2-D");
  tt_test_assert_error(tt_embedding(ids, ids, &y), "embedding: weight must be f32");
  ((int32_t *)tt_tensor_data(ids))[2] = 5;
  tt_test_assert_error(tt_embedding(w, ids, &y), "id 5 at position 2 is outside the vocabulary [0, 5)");
  ((int32_t *)tt_tensor_data(ids))[2] = -1;
  tt_test_assert_error(tt_embedding(w, ids, &y), "id -1 at position 2");
  cr_assert_null(y);
  tt_tensor_release(w);
  tt_tensor_release(ids);
  tt_tensor_release(wflat);
  tt_tensor_release(fids);
}

/* bf16 rows (tt_embedding_ex): each row is the f32 table's rounded once, exactly; a bf16
** upstream gradient is summed into the f32 table's gradient exactly as the f32 op sums
** the same values (one id repeated, so a row gets several contributions in order). */
Test(embedding, bf16_rows) {
  int64_t ws[2] = {9, 13}, is[2] = {2, 5};
  tt_tensor *w = tt_test_rand(ws, 2, 61), *ids = tt_test_index(is, 2, 9, TT_I64, 62);
  tt_tensor_set(ids, 3, tt_tensor_get(ids, 0));
  tt_tensor *y = NULL, *y32 = NULL, *g = NULL, *g32 = NULL;
  cr_assert(tt_set_requires_grad(w, 1) == 0);
  cr_assert(tt_embedding_ex(w, ids, TT_BF16, &y) == 0, "%s", tt_last_error());
  cr_assert_eq(y->dtype, TT_BF16);
  for (int64_t i = 0; i < 10; i++)
    for (int64_t j = 0; j < 13; j++) {
      const double want = tt_bf16_to_float(tt_float_to_bf16(
          (float)tt_tensor_get(w, (int64_t)tt_tensor_get(ids, i) * 13 + j)));
      cr_assert_eq(tt_tensor_get(y, i * 13 + j), want, "row %lld col %lld", (long long)i,
                   (long long)j);
    }
  int64_t gs[3] = {2, 5, 13};
  tt_tensor *gr = tt_test_rand(gs, 3, 63);
  cr_assert(tt_tensor_empty(gs, 3, TT_BF16, TT_CPU, &g) == 0 && tt_copy_(g, gr) == 0);
  cr_assert(tt_tensor_empty(gs, 3, TT_F32, TT_CPU, &g32) == 0 && tt_copy_(g32, g) == 0);
  cr_assert(tt_backward_with(y, g) == 0, "%s", tt_last_error());
  tt_tensor *wl = tt_test_rand(ws, 2, 61);   /* the same values, a fresh leaf */
  cr_assert(tt_set_requires_grad(wl, 1) == 0);
  cr_assert(tt_embedding(wl, ids, &y32) == 0);
  cr_assert(tt_backward_with(y32, g32) == 0, "%s", tt_last_error());
  cr_assert(memcmp(tt_tensor_data(w->grad), tt_tensor_data(wl->grad), sizeof(float) * 9 * 13) == 0,
            "bf16 rows' gradient differs from the f32 sums of the same values");
  tt_tensor *all[] = {w, ids, y, y32, g, g32, gr, wl};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* The touched rows of a gradient (the row-sparse reduction's mask, engine/dist/reducer.c)
** against a row-by-row loop: zero rows, rows whose only nonzero is the last or the first
** element, NaN and inf rows (touched), -0.0 rows (untouched), a V that is no multiple of
** 32, on 1 and 2 threads. Every word is written, whatever the buffer held. */
Test(embedding, row_mask) {
  const int64_t sizes[3][2] = {{1000, 67}, {33, 5}, {7, 1}};
  for (int c = 0; c < 3; c++) {
    const int64_t V = sizes[c][0], D = sizes[c][1], words = (V + 31) / 32;
    float *g = calloc((size_t)(V * D), sizeof *g);
    uint32_t *m = malloc(sizeof *m * (size_t)words);
    for (int64_t v = 0; v < V; v++) {
      if (v % 7 == 1) g[v * D + D - 1] = 1e-30f;
      if (v % 7 == 2) g[v * D] = -3.0f;
      if (v % 7 == 3) g[v * D + D / 2] = NAN;
      if (v % 7 == 4) g[v * D + v % D] = INFINITY;
      if (v % 7 == 5) g[v * D + v % D] = -0.0f;
    }
    int keep = tt_get_num_threads();
    for (int threads = 1; threads <= 2; threads++) {
      tt_set_num_threads(threads);
      memset(m, 0xa5, sizeof *m * (size_t)words);
      cr_assert_eq(tt_embedding_cpu.row_mask(m, g, V, D), 0);
      for (int64_t v = 0; v < V; v++) {
        int want = v % 7 >= 1 && v % 7 <= 4, got = (m[v / 32] >> (v % 32)) & 1u;
        cr_assert_eq(got, want, "V %lld, D %lld, %d threads: row %lld %s", (long long)V,
                     (long long)D, threads, (long long)v, want ? "missed" : "taken");
      }
      for (int64_t v = V; v < words * 32; v++)
        cr_assert_eq((m[v / 32] >> (v % 32)) & 1u, 0u, "bit %lld past the table", (long long)v);
    }
    tt_set_num_threads(keep);
    free(g);
    free(m);
  }
}
