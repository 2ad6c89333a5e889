/*
** lowp_weight.c — the bf16 / fp16 copy of an f32 master weight that the low-precision
** GEMMs read (tetra_amp.h), made once per change of the weight instead of once per GEMM.
**
** A weight is read by several GEMMs per step (every micro-batch's forward, and the dX
** GEMM of every backward), but changes once: at the optimizer step. The copy hangs off
** the weight's header (w->lowp) with the storage version it was cast from
** (w->lowp_version); the storage's version counts in-place writes (tt_copy_, tt_fill_,
** tt_axpy_, tt_tensor_set, and tt_tensor_bump_version for writes made elsewhere), so a
** copy is current exactly when the two versions agree. The version lives on the storage,
** not the header, so that a write through any view of the weight (a checkpoint load into
** a shard, a collective into a flat buffer) makes the copy stale.
*/
#include "core/tt_internal.h"
#include "tetra_amp.h"

static int64_t lowp_casts;

int64_t tt_tensor_version(const tt_tensor *t) { return t ? t->storage->version : 0; }

void tt_tensor_bump_version(tt_tensor *t) {
  if (t) t->storage->version++;
}

int64_t tt_lowp_weight_casts(void) { return lowp_casts; }

void tt_lowp_weight_drop(tt_tensor *w) {
  if (!w) return;
  tt_tensor_release(w->lowp);
  w->lowp = NULL;
}

static int check_args(const char *op, const tt_tensor *w, int dtype, tt_tensor **out) {
  TT_CHECK(out, "%s: out is NULL", op);
  *out = NULL;
  TT_CHECK(w, "%s: w is NULL", op);
  TT_CHECK(dtype == TT_BF16 || dtype == TT_F16, "%s: dtype %s; expected bf16 or f16", op,
           tt_dtype_name(dtype));
  TT_CHECK(w->dtype == TT_F32 || w->dtype == TT_BF16 || w->dtype == TT_F16,
           "%s: w is %s; expected a float weight (f32, bf16 or f16)", op,
           tt_dtype_name(w->dtype));
  return 0;
}

/* w->lowp as a buffer of dtype, made when absent or of another dtype. No cast. */
static int ensure_buffer(tt_tensor *w, int dtype) {
  if (w->lowp && w->lowp->dtype == dtype) return 0;
  tt_lowp_weight_drop(w);
  TT_TRY(tt_tensor_empty(w->shape, w->ndim, dtype, w->device, &w->lowp));
  w->lowp_version = -1;   /* holds nothing yet */
  return 0;
}

int tt_lowp_weight(tt_tensor *w, int dtype, tt_tensor **out) {
  TT_TRY(check_args("tt_lowp_weight", w, dtype, out));
  TT_TRY(ensure_buffer(w, dtype));
  if (w->lowp_version != w->storage->version) {
    TT_CHECK(w->storage->data || tt_tensor_is_lazy(w), "tt_lowp_weight: the weight's f32 master is in host memory "
             "(optimizer offload) and its %s copy is stale: restore the master first "
             "(tt_lowp_weight_restore_master)", tt_dtype_name(dtype));
    if (tt_copy_(w->lowp, w) != 0) {
      tt_lowp_weight_drop(w);
      return tt_error_context("tt_lowp_weight");
    }
    w->lowp_version = w->storage->version;
    lowp_casts++;
  }
  tt_tensor_retain(w->lowp);
  *out = w->lowp;
  return 0;
}

int tt_lowp_weight_buffer(tt_tensor *w, int dtype, tt_tensor **out) {
  TT_TRY(check_args("tt_lowp_weight_buffer", w, dtype, out));
  TT_TRY(ensure_buffer(w, dtype));
  tt_tensor_retain(w->lowp);
  *out = w->lowp;
  return 0;
}

int tt_tensor_resident(const tt_tensor *t) {
  return t && (t->storage->data != NULL || tt_tensor_is_lazy(t));   /* lazy: not drawn yet */
}

int tt_lowp_weight_release_master(tt_tensor *w) {
  TT_CHECK(w, "tt_lowp_weight_release_master: w is NULL");
  TT_CHECK(w->lowp && w->lowp_version == w->storage->version,
           "tt_lowp_weight_release_master: w has no current low-precision copy (the GEMMs "
           "would cast one from the released master)");
  TT_CHECK(!w->storage->external && w->offset == 0 && tt_tensor_is_contiguous(w),
           "tt_lowp_weight_release_master: w does not own its storage whole (a view or a "
           "shard)");
  tt_storage_evict(w->storage);
  return 0;
}

int tt_lowp_weight_restore_master(tt_tensor *w) {
  TT_CHECK(w, "tt_lowp_weight_restore_master: w is NULL");
  if (tt_storage_restore(w->storage) != 0)
    return tt_error_context("tt_lowp_weight_restore_master");
  return 0;
}

int tt_lowp_weight_mark_fresh(tt_tensor *w) {
  TT_CHECK(w, "tt_lowp_weight_mark_fresh: w is NULL");
  TT_CHECK(w->lowp, "tt_lowp_weight_mark_fresh: w has no low-precision copy (get its "
           "buffer with tt_lowp_weight_buffer first)");
  w->lowp_version = w->storage->version;
  return 0;
}

/* -- Grouped copies (one GEMM for several weights that read the same input) ----------- */

/* The group's buffer when ws' copies already are consecutive row blocks of one buffer of
** dtype (a new header over all of them), else NULL. */
static tt_tensor *group_view(tt_tensor *const *ws, int n, int dtype, int64_t rows) {
  const tt_tensor *first = ws[0]->lowp;
  if (!first) return NULL;
  const int64_t k = ws[0]->shape[1];
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    const tt_tensor *l = ws[i]->lowp;
    if (!l || l->dtype != dtype || l->storage != first->storage || l->ndim != 2 ||
        l->stride[0] != k || l->stride[1] != 1 || l->offset != first->offset + at * k)
      return NULL;
    at += l->shape[0];
  }
  tt_tensor *whole = tt_tensor_header_alias(ws[0]->lowp);
  if (whole) whole->shape[0] = rows;
  return whole;
}

int tt_lowp_weight_group(tt_tensor *const *ws, int n, int dtype, tt_tensor **out) {
  TT_CHECK(out, "tt_lowp_weight_group: out is NULL");
  *out = NULL;
  TT_CHECK(ws && n >= 1, "tt_lowp_weight_group: no weights");
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    tt_tensor *tmp = NULL;
    TT_TRY(check_args("tt_lowp_weight_group", ws[i], dtype, &tmp));
    TT_CHECK(ws[i]->ndim == 2 && ws[i]->shape[1] == ws[0]->shape[1] &&
                 ws[i]->device == ws[0]->device,
             "tt_lowp_weight_group: weight %d is not a matrix of %lld columns on device %d "
             "like weight 0", i, (long long)ws[0]->shape[1], ws[0]->device);
    for (int j = 0; j < i; j++)
      TT_CHECK(ws[j] != ws[i], "tt_lowp_weight_group: weight %d appears twice", i);
    rows += ws[i]->shape[0];
  }
  tt_tensor *whole = group_view(ws, n, dtype, rows);
  if (!whole) {
    /* One buffer, each weight's copy a row block of it (cast below, being new). */
    const int64_t shape[2] = {rows, ws[0]->shape[1]};
    TT_TRY(tt_tensor_empty(shape, 2, dtype, ws[0]->device, &whole));
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
      tt_lowp_weight_drop(ws[i]);
      if (tt_narrow(whole, 0, at, ws[i]->shape[0], &ws[i]->lowp) != 0) {
        tt_tensor_release(whole);
        return tt_error_context("tt_lowp_weight_group");
      }
      ws[i]->lowp_version = -1;
      at += ws[i]->shape[0];
    }
  }
  for (int i = 0; i < n; i++) {   /* stale blocks cast again, in place */
    tt_tensor *l = NULL;
    if (tt_lowp_weight(ws[i], dtype, &l) != 0) {
      tt_tensor_release(whole);
      return -1;
    }
    tt_tensor_release(l);
  }
  *out = whole;
  return 0;
}
