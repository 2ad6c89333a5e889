/*
** reducer.c — data-parallel gradient averaging in buckets, overlapped with backward.
**
** Parameters are packed, in the order backward finishes their gradients (by default the
** reverse parameter order), into flat buckets of at most bucket_mb megabytes, smaller toward the end
** of backward (group_from_tail says how). The autograd grad-ready hook copies each
** finished gradient into its bucket; a full bucket starts a non-blocking all-reduce (or
** reduce-scatter for ZeRO-1) while backward keeps running. Buckets always start in
** bucket order, so every rank issues the same sequence of collectives even if its
** gradients finish in a different order. Each hook call also tests the in-flight
** buckets: MPI progresses non-blocking collectives only inside MPI calls, so this is
** what moves the bytes during backward.
**
** Row-sparse parameters (an embedding table (V, D): a step's tokens touch few of its
** rows, and its gradient is the last one backward produces, so its reduction can
** overlap nothing) get a bucket of their own that moves only the rows some rank
** touched: first every rank's nonzero rows (a bit per row, all-gathered, their union
** taken), then the average of just those rows, packed (k, D) and scattered back into
** zeros. Rows that are zero on every rank average to zero, so this is the dense
** average; when the union is more than half the table the bucket falls back to the
** dense collective. The union decides the second collective, so it is issued at a
** point every rank agrees on: just before the next bucket starts, or at once when it
** is the last bucket.
**
** ZeRO-1: each bucket is padded to a multiple of the group size n; rank r owns elements
** [r*len, (r+1)*len) of every bucket (len = padded / n). Its shards are 1-D or (1, k)
** views into the parameters over that range (2-D when the param is a matrix, so the
** optimizer's weight-decay rule by ndim still applies); their ->grad is set to the
** matching slice of the reduce-scattered gradient after finish (of the averaged rows'
** bucket for a sparse bucket). After the optimizer has updated the shards in place,
** gather_params all-gathers every bucket's owned range.
**
** ZeRO-2: the same shards, and each rank keeps only its share of the gradients. A
** parameter's gradient is released as soon as it is copied into its bucket, and a
** bucket's flat buffer as soon as its reduce-scatter has landed in the shard gradients;
** the buffer is made again (zeros) when the next armed backward fills its first slot.
** Between the end of backward and the next step a rank holds 1/n of the gradients.
** Earlier micro-batches of an accumulation are not armed: they accumulate whole-size
** gradients as in stages 0 and 1, and only the last one's backward reduce-scatters and
** releases them (one reduce-scatter per step, as ZeRO-1; reduce-scattering each
** micro-batch would keep the shard only but send accumulation-steps times the bytes).
**
** ZeRO-3: the parameters too. Buckets are not sized but given (opts.unit_of): one per
** unit, a block of the model or the parameters before or after the blocks, so a bucket
** is what one block gathers. Each rank keeps its share of every bucket in a buffer of its
** own (owned: the master weights the optimizer updates; the shards are views into it),
** and a unit's parameters hold memory only while gathered: unit_gather all-gathers the
** owned shares and copies them into the parameters (storage restored, bf16 / fp16 copies
** recast), unit_release gives the memory back (tt_storage_evict) while every header over
** it stays, so the tensors backward saved are whole again once the unit is gathered
** again. unit_enter and unit_exit are identity ops recorded around a block: exit
** releases the unit after the block's forward, and its backward, which the tape runs
** before any of the block's, gathers it again (and starts the gather of the unit
** backward needs next); enter's backward, which runs after all of the block's, releases
** it. Gradients then go as under stage 2.
*/
#include "dist/dist_internal.h"
#include "embedding.h"

typedef struct {
  int param;
  int bucket;
  int64_t offset;   /* element offset in the bucket */
  int64_t numel;
  int ready;        /* gradient copied into the bucket during this backward */
  int64_t vec_offset;   /* ZeRO-3 compute-precision gathers: where an f32 parameter sits
                        ** in its bucket's vec buffer */
} grad_slot;

typedef struct {
  int first_slot;
  int n_slots;
  int n_ready;
  int64_t numel;    /* padded to a multiple of the group size for ZeRO-1 and 2 */
  int started;
  int finished;
  tt_tensor *buf;   /* (numel) gradients, then averages; ZeRO-2: NULL between the
                    ** landing of its reduce-scatter and the next backward's fill */
  tt_tensor *shard_grad;   /* ZeRO-1 and 2: (numel / n) averaged share after finish */
  tt_comm_handle *h;
  int sparse;       /* one row-sparse (V, D) parameter: only touched rows travel */
  int phase;        /* sparse: 1 while the row masks travel, 2 once the rows do */
  tt_tensor *mask;  /* sparse: (V / 32) bits, set where this rank's row is nonzero, then
                    ** where any rank's is */
  tt_tensor *masks; /* sparse: every rank's mask, gathered */
  tt_tensor *dev_mask;  /* sparse, on a GPU: this rank's mask where the kernel writes it */
  tt_tensor *row_ids;   /* sparse: (k) i64 rows that travel, on the parameter's device */
  tt_tensor *rows;      /* sparse: (k, D) those rows, averaged in place; NULL when dense */
  int in_grad;          /* sparse: the average went straight into the parameter's grad */
  int landed;           /* averages written where the optimizer reads them (land_bucket) */
  tt_tensor *owned;     /* ZeRO-3: (numel / n) this rank's share of the parameters */
  tt_tensor *full;      /* ZeRO-3: (numel) the all-gather in flight (prefetch) */
  tt_comm_handle *gh;   /* ZeRO-3: its handle */
  int gathered;         /* ZeRO-3: the parameters hold memory and the current values */
  int lp;               /* ZeRO-3: the gather in flight is in the compute dtype */
  tt_tensor *vec;       /* ZeRO-3, lp: the f32 parameters' elements, summed over the ranks */
  tt_comm_handle *vh;   /* its all-reduce */
  int64_t vec_numel;    /* elements of the bucket's f32 parameters (lp gathers) */
  tt_tensor *owned_lp;  /* ZeRO-3, shares away: (numel / n) owned cast to gather_dtype */
  tt_tensor *owned_vec; /* and (vec_numel) f32: this rank's part of vec, zeros elsewhere */
  int evicted;          /* owned's memory given back while the shares are away */
} grad_bucket;

typedef struct {
  tt_tensor *view;  /* piece of a parameter (detached view), updated by the optimizer */
  int param;
  int bucket;
  int64_t shard_offset;   /* element offset inside the bucket's owned range */
  int64_t param_offset;   /* element offset inside the flattened parameter */
} zero_shard;

struct tt_dist_reducer {
  tt_comm *comm;
  int zero_stage;
  int n_params;
  tt_tensor **params;          /* retained */
  unsigned char *row_sparse;   /* param -> 1 when its gradient travels as touched rows */
  int *tail;                   /* i -> the parameter whose gradient is i-th from the end */
  int *unit_of;                /* ZeRO-3: param -> unit (bucket n_buckets - 1 - unit) */
  int n_deferred;              /* tail[0 .. n_deferred) are computed last (deferred) */
  tt_tensor **deferred;        /* their tensors, for tt_set_deferred_grads */
  int *slot_of;                /* param -> slot */
  grad_slot *slots;
  int n_buckets;
  grad_bucket *buckets;
  int next_start;
  int hint;                    /* slot of the last gradient seen: the next is usually +1 */
  int armed;
  int failed;                  /* an error inside the hook; reported by finish */
  char error[256];
  double exposed_s;
  int held;                    /* buckets complete while an earlier one was not (per step) */
  int n_shards;
  zero_shard *shards;
  int64_t unit_gathers;        /* ZeRO-3: all-gathers of units so far */
  int64_t unit_gather_bytes;   /* ZeRO-3: bytes they brought (and the f32 sums) */
  int gather_dtype;            /* ZeRO-3: the dtype the blocks' matrices travel in */
  unsigned char *lowp_gather;  /* ZeRO-3: param -> 1 when it travels in gather_dtype */
  int away;                    /* ZeRO-3: the f32 shares on the host (shares_away) */
};

/* -- Bucket layout -------------------------------------------------------------------- */

/* Which bucket each parameter goes to, counted from the tail (group[i] for parameter
** tail[i]; group 0 holds tail[0], whose gradient backward produces last): walking from
** the tail, a group takes parameters until the next would pass its cap. The tail group's cap is 1/32 of all the
** gradient bytes and each earlier group's twice the next one's, up to bucket_mb: what is
** still in flight when backward ends is small, while large models keep bucket_mb
** buckets everywhere but at the very end. A row-sparse parameter is a group of its own. */
static int group_from_tail(tt_dist_reducer *r, double bucket_mb, int *group) {
  int64_t elem = (int64_t)tt_dtype_size(r->params[0]->dtype), total = 0;
  for (int p = 0; p < r->n_params; p++) total += tt_tensor_numel(r->params[p]) * elem;
  double max_cap = bucket_mb * 1024.0 * 1024.0, cap = total / 32.0;
  int g = -1;
  int64_t fill = 0;
  for (int i = 0; i < r->n_params; i++) {
    int p = r->tail[i], prev_sparse = i > 0 && r->row_sparse[r->tail[i - 1]];
    int64_t bytes = tt_tensor_numel(r->params[p]) * elem;
    double limit = cap < max_cap ? cap : max_cap;
    if (g < 0 || r->row_sparse[p] || prev_sparse ||
        (fill > 0 && (double)(fill + bytes) > limit)) {
      if (g >= 0 && !prev_sparse) cap *= 2.0;
      g++;
      fill = 0;
    }
    group[i] = g;
    fill += bytes;
  }
  return g + 1;
}

/* A bucket's flat buffer, zeros (the padding stays zero), unless it has one. */
static int bucket_buffer(tt_dist_reducer *r, grad_bucket *bk) {
  if (bk->buf) return 0;
  return tt_tensor_zeros(&bk->numel, 1, r->params[0]->dtype, r->params[0]->device, &bk->buf);
}

static int plan_buckets(tt_dist_reducer *r, double bucket_mb) {
  /* Bucket b holds consecutive slots; slot s is parameter tail[n-1-s]. */
  TT_ALLOC(r->slots, sizeof(grad_slot) * (size_t)r->n_params);
  TT_ALLOC(r->slot_of, sizeof(int) * (size_t)r->n_params);
  TT_ALLOC(r->buckets, sizeof(grad_bucket) * (size_t)r->n_params);
  memset(r->buckets, 0, sizeof(grad_bucket) * (size_t)r->n_params);
  int *group = NULL;
  TT_ALLOC(group, sizeof(int) * (size_t)r->n_params);
  if (r->zero_stage == 3) {   /* one bucket per unit; units were checked in order */
    for (int i = 0; i < r->n_params; i++) group[i] = r->unit_of[r->tail[i]];
    r->n_buckets = r->unit_of[r->tail[r->n_params - 1]] + 1;
  } else {
    r->n_buckets = group_from_tail(r, bucket_mb, group);
  }
  int64_t fill = 0;
  for (int s = 0; s < r->n_params; s++) {
    int i = r->n_params - 1 - s, p = r->tail[i], nb = r->n_buckets - 1 - group[i];
    grad_bucket *bk = &r->buckets[nb];
    if (bk->n_slots == 0) {
      bk->first_slot = s;
      bk->sparse = r->row_sparse[p];
      fill = 0;
    }
    int64_t numel = tt_tensor_numel(r->params[p]);
    r->slots[s] = (grad_slot){p, nb, fill, numel, 0, 0};
    r->slot_of[p] = s;
    bk->n_slots++;
    fill += numel;
    bk->numel = fill;
  }
  free(group);
  int n = r->comm->size;
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    if (r->zero_stage >= 1) bk->numel = (bk->numel + n - 1) / n * n;
    if (r->zero_stage < 2) TT_TRY(bucket_buffer(r, bk));
    if (r->zero_stage == 3) {
      int64_t len = bk->numel / n;
      TT_TRY(tt_tensor_zeros(&len, 1, r->params[0]->dtype, r->params[0]->device, &bk->owned));
      bk->gathered = 1;   /* the parameters hold their values until released */
      for (int k = 0; k < bk->n_slots; k++) {
        grad_slot *sl = &r->slots[bk->first_slot + k];
        if (r->lowp_gather[sl->param]) continue;
        sl->vec_offset = bk->vec_numel;
        bk->vec_numel += sl->numel;
      }
    }
  }
  return 0;
}

/* A view of `len` elements at `offset` of a flat tensor, shaped like `like` when given. */
static int flat_piece(tt_tensor *flat, int64_t offset, int64_t len, const tt_tensor *like,
                      tt_tensor **out) {
  tt_tensor *piece = NULL;
  TT_TRY(tt_narrow(flat, 0, offset, len, &piece));
  if (!like) {
    *out = piece;
    return 0;
  }
  int rc = tt_view(piece, like->shape, like->ndim, out);
  tt_tensor_release(piece);
  return rc;
}

/* The elements [*a, *e) of slot s inside a rank's range [lo, hi) of its bucket (bucket
** offsets); 0 when they do not meet. */
static int share_of(const grad_slot *s, int64_t lo, int64_t hi, int64_t *a, int64_t *e) {
  *a = s->offset > lo ? s->offset : lo;
  *e = s->offset + s->numel < hi ? s->offset + s->numel : hi;
  return *a < *e;
}

static int make_shards(tt_dist_reducer *r) {
  int n = r->comm->size, me = r->comm->rank;
  TT_ALLOC(r->shards, sizeof(zero_shard) * (size_t)r->n_params * 2);
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    int64_t len = bk->numel / n, lo = me * len, hi = lo + len;
    for (int k = 0; k < bk->n_slots; k++) {
      grad_slot *s = &r->slots[bk->first_slot + k];
      int64_t a, e;
      if (!share_of(s, lo, hi, &a, &e)) continue;
      tt_tensor *p = r->params[s->param], *det = NULL, *flat = NULL, *piece = NULL;
      int64_t numel = s->numel;
      int rc = tt_detach(p, &det);
      if (rc == 0) rc = tt_view(det, &numel, 1, &flat);
      if (rc == 0) rc = flat_piece(flat, a - s->offset, e - a, NULL, &piece);
      if (rc == 0 && r->zero_stage == 3) {   /* the share moves to owned, the views too */
        tt_tensor *mine = NULL;
        rc = flat_piece(bk->owned, a - lo, e - a, NULL, &mine);
        if (rc == 0) rc = tt_copy_(mine, piece);
        tt_tensor_release(piece);
        piece = mine;
      }
      tt_tensor_release(det);
      tt_tensor_release(flat);
      TT_TRY(rc);
      if (p->ndim >= 2) {
        int64_t shape2[2] = {1, e - a};
        tt_tensor *p2 = NULL;
        rc = tt_view(piece, shape2, 2, &p2);
        tt_tensor_release(piece);
        TT_TRY(rc);
        piece = p2;
      }
      r->shards[r->n_shards++] = (zero_shard){piece, s->param, b, a - lo, a - s->offset};
    }
  }
  return 0;
}

static void on_gather_tick(void *userdata);

void tt_dist_reducer_free(tt_dist_reducer *r) {
  if (!r) return;
  tt_dist_reducer_arm(r, 0);
  if (r->zero_stage == 3) {
    tt_set_record_tick_hook(NULL, NULL);
    tt_set_backward_tick_hook(NULL, NULL);
  }
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    tt_comm_handle_free(bk->h);
    tt_tensor_release(bk->buf);
    tt_tensor_release(bk->shard_grad);
    tt_tensor_release(bk->mask);
    tt_tensor_release(bk->dev_mask);
    tt_tensor_release(bk->masks);
    tt_tensor_release(bk->row_ids);
    tt_tensor_release(bk->rows);
    tt_comm_handle_free(bk->gh);
    tt_comm_handle_free(bk->vh);
    tt_tensor_release(bk->full);
    tt_tensor_release(bk->vec);
    tt_tensor_release(bk->owned_lp);
    tt_tensor_release(bk->owned_vec);
    tt_tensor_release(bk->owned);
  }
  for (int i = 0; i < r->n_shards; i++) {
    tt_tensor_release(r->shards[i].view->grad);
    r->shards[i].view->grad = NULL;
    tt_tensor_release(r->shards[i].view);
  }
  for (int i = 0; r->params && i < r->n_params; i++) tt_tensor_release(r->params[i]);
  free(r->params);
  free(r->row_sparse);
  free(r->tail);
  free(r->deferred);
  free(r->slot_of);
  free(r->slots);
  free(r->buckets);
  free(r->shards);
  free(r->unit_of);
  free(r->lowp_gather);
  free(r);
}

int tt_dist_reducer_new(tt_comm *c, tt_tensor *const *params, int n,
                        const tt_dist_reducer_opts *o, tt_dist_reducer **out) {
  *out = NULL;
  TT_CHECK(c, "data parallel: no group");
  TT_CHECK(n > 0, "data parallel: no parameters to reduce");
  TT_CHECK(o->zero_stage >= 0 && o->zero_stage <= 3,
           "parallel.zero_stage = %d: only 0, 1, 2 and 3 are implemented", o->zero_stage);
  TT_CHECK(o->zero_stage != 3 || (o->unit_of && !o->tail_order && !o->row_sparse),
           "parallel.zero_stage = 3: needs the parameters' units, and neither a tail order "
           "nor row-sparse gradients");
  for (int i = 0; o->zero_stage == 3 && i < n; i++)
    TT_CHECK(o->unit_of[i] == (i == 0 ? 0 : o->unit_of[i - 1]) ||
             (i > 0 && o->unit_of[i] == o->unit_of[i - 1] + 1),
             "parallel.zero_stage = 3: parameter %d is in unit %d after unit %d: a unit's "
             "parameters must be consecutive and units numbered from 0", i, o->unit_of[i],
             i ? o->unit_of[i - 1] : -1);
  TT_CHECK(o->bucket_mb > 0, "dist.bucket_mb = %g: must be positive", o->bucket_mb);
  TT_CHECK(o->n_deferred >= 0 && o->n_deferred < n && (o->tail_order || !o->n_deferred),
           "data parallel: %d deferred gradients of %d parameters (and a tail order?)",
           o->n_deferred, n);
  for (int i = 0; i < n; i++) {
    const tt_tensor *p = params[i];
    TT_CHECK(p && tt_dtype_is_float(p->dtype), "data parallel: parameter %d is not a float "
             "tensor", i);
    TT_CHECK(p->dtype == params[0]->dtype && p->device == params[0]->device,
             "data parallel: parameters mix dtypes or devices (parameter %d is %s, "
             "parameter 0 is %s)", i, tt_dtype_name(p->dtype), tt_dtype_name(params[0]->dtype));
    TT_CHECK(tt_tensor_is_contiguous(p), "data parallel: parameter %d is not contiguous", i);
    TT_CHECK(!o->row_sparse || !o->row_sparse[i] || (p->ndim == 2 && p->dtype == TT_F32),
             "data parallel: parameter %d cannot travel as rows "
             "(dist.sparse_embedding_grad): it is %s with %d dims, not an f32 table (V, D)",
             i, tt_dtype_name(p->dtype), p->ndim);
  }
  tt_dist_reducer *r = calloc(1, sizeof *r);
  TT_CHECK(r, "data parallel: out of host memory");
  r->comm = c;
  r->zero_stage = o->zero_stage;
  r->n_params = n;
  r->params = calloc((size_t)n, sizeof(tt_tensor *));
  r->row_sparse = calloc((size_t)n, 1);
  r->tail = calloc((size_t)n, sizeof(int));
  r->deferred = calloc((size_t)n, sizeof(tt_tensor *));
  if (o->zero_stage == 3) {
    r->unit_of = calloc((size_t)n, sizeof(int));
    if (r->unit_of) memcpy(r->unit_of, o->unit_of, sizeof(int) * (size_t)n);
    r->lowp_gather = calloc((size_t)n, 1);
    r->gather_dtype = o->gather_dtype == TT_BF16 || o->gather_dtype == TT_F16 ? o->gather_dtype
                                                                               : TT_F32;
    for (int i = 0; r->lowp_gather && o->gather_lowp && i < n; i++)
      r->lowp_gather[i] = r->gather_dtype != TT_F32 && o->gather_lowp[i] != 0;
  }
  unsigned char *seen = calloc((size_t)n, 1);
  int rc = r->params && r->row_sparse && r->tail && r->deferred && seen &&
                   (o->zero_stage != 3 || (r->unit_of && r->lowp_gather))
               ? 0 : tt_set_error("data parallel: out of host memory");
  for (int i = 0; i < n && rc == 0; i++) {
    tt_tensor_retain(params[i]);
    r->params[i] = params[i];
    r->row_sparse[i] = o->row_sparse && o->row_sparse[i];
    int p = o->tail_order ? o->tail_order[i] : i;
    if (p < 0 || p >= n || seen[p])
      rc = tt_set_error("data parallel: tail order entry %d (%d) is not a new parameter "
                        "index below %d", i, p, n);
    else
      seen[p] = 1;
    r->tail[i] = p;
  }
  free(seen);
  r->n_deferred = o->n_deferred;
  for (int i = 0; i < r->n_deferred && rc == 0; i++) r->deferred[i] = params[r->tail[i]];
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  if (rc == 0) rc = plan_buckets(r, o->bucket_mb);
  if (rc == 0 && o->zero_stage >= 1) rc = make_shards(r);
  tt_set_grad_enabled(prev);
  if (rc != 0) {
    tt_dist_reducer_free(r);
    return -1;
  }
  /* ZeRO-3: MPI moves a prefetched gather's bytes only inside MPI calls; a test of the
  ** handles after every op of forward and backward keeps it moving while the block before
  ** it computes. */
  if (r->zero_stage == 3) {
    tt_set_record_tick_hook(on_gather_tick, r);
    tt_set_backward_tick_hook(on_gather_tick, r);
  }
  *out = r;
  return 0;
}

/* -- During backward ------------------------------------------------------------------ */

static void remember_failure(tt_dist_reducer *r) {
  if (r->failed) return;
  r->failed = 1;
  snprintf(r->error, sizeof r->error, "%s", tt_last_error());
}

static int slot_of_leaf(tt_dist_reducer *r, const tt_tensor *leaf) {
  for (int k = 0; k < r->n_params; k++) {
    int s = (r->hint + k) % r->n_params;
    if (r->params[r->slots[s].param] == leaf) return s;
  }
  return -1;
}

/* Copies a parameter's gradient (zeros when it has none) into its bucket place; under
** ZeRO-2 the whole-size gradient is released then (only the shard's share stays). */
static int fill_slot(tt_dist_reducer *r, int slot) {
  grad_slot *s = &r->slots[slot];
  tt_tensor *p = r->params[s->param], *dst = NULL;
  TT_TRY(bucket_buffer(r, &r->buckets[s->bucket]));
  TT_TRY(flat_piece(r->buckets[s->bucket].buf, s->offset, s->numel, p, &dst));
  int rc = p->grad ? tt_copy_(dst, p->grad) : tt_fill_(dst, 0.0);
  tt_tensor_release(dst);
  TT_TRY(rc);
  if (r->zero_stage >= 2) tt_zero_grad(p);
  s->ready = 1;
  r->buckets[s->bucket].n_ready++;
  return 0;
}

/* The dense collective of a bucket: all-reduce, or reduce-scatter under ZeRO-1 and 2. */
static int start_dense(tt_dist_reducer *r, grad_bucket *bk) {
  if (r->zero_stage >= 1) {
    tt_tensor_release(bk->shard_grad);
    bk->shard_grad = NULL;
    return tt_comm_reduce_scatter_async(r->comm, bk->buf, 0, TT_REDUCE_AVG, &bk->shard_grad,
                                        &bk->h);
  }
  return tt_comm_all_reduce_async(r->comm, bk->buf, TT_REDUCE_AVG, &bk->h);
}

/* The (V, D) table of a sparse bucket's only parameter. */
static const tt_tensor *sparse_param(const tt_dist_reducer *r, const grad_bucket *bk) {
  return r->params[r->slots[bk->first_slot].param];
}

/* Sparse bucket, first collective: a bit per row, set where this rank's row is nonzero
** (NaN and inf count, so a non-finite gradient is seen everywhere), 32 rows a word;
** every rank's words are gathered (a few hundred bytes: one eager message). */
static int start_sparse_mask(tt_dist_reducer *r, grad_bucket *bk) {
  const tt_tensor *p = sparse_param(r, bk);
  int64_t V = p->shape[0], D = p->shape[1], words = (V + 31) / 32;
  const tt_embedding_kernels *kern = TT_KERNELS(tt_embedding, p->device);
  if (!kern || !kern->row_mask) return tt_no_kernel("sparse gradient rows", p->device);
  if (!bk->mask) TT_TRY(tt_tensor_zeros(&words, 1, TT_I32, TT_CPU, &bk->mask));
  /* On a GPU the bits are found there and only they come to the host (V / 8 bytes, not
  ** the table's V * D * 4). */
  tt_tensor *at = bk->mask;
  if (p->device != TT_CPU) {
    if (!bk->dev_mask) TT_TRY(tt_tensor_empty(&words, 1, TT_I32, p->device, &bk->dev_mask));
    at = bk->dev_mask;
  }
  TT_TRY(kern->row_mask(tt_tensor_data(at), tt_tensor_data(bk->buf), V, D));
  if (at != bk->mask) TT_TRY(tt_copy_(bk->mask, at));
  tt_comm_handle_free(bk->h);
  bk->h = NULL;
  tt_tensor_release(bk->masks);
  bk->masks = NULL;
  bk->phase = 1;
  return tt_comm_all_gather_async(r->comm, bk->mask, 0, &bk->masks, &bk->h);
}

/* Where a sparse bucket's averaged rows land: straight into the parameter's gradient
** (bk->in_grad: land_bucket then leaves it alone; NULL when it has none here, and it
** stays without one), or into the bucket (ZeRO-1 keeps its share of it). */
static tt_tensor *sparse_dst(tt_dist_reducer *r, grad_bucket *bk) {
  tt_tensor *g = r->params[r->slots[bk->first_slot].param]->grad;
  bk->in_grad = r->zero_stage == 0 && (!g || tt_tensor_is_contiguous(g));
  return !bk->in_grad ? bk->buf : g;
}

/* Sparse bucket, second collective (the mask gathered): the average of the touched rows,
** packed, or the dense collective when they are more than half the table. */
static int start_sparse_rows(tt_dist_reducer *r, grad_bucket *bk) {
  TT_TRY(tt_comm_wait(bk->h));
  const tt_tensor *p = sparse_param(r, bk);
  int64_t V = p->shape[0], D = p->shape[1], k = 0, words = (V + 31) / 32;
  /* The union of every rank's rows, into this rank's words. */
  uint32_t *m = tt_tensor_data(bk->mask);
  const uint32_t *all = tt_tensor_data(bk->masks);
  for (int q = 0; q < r->comm->size; q++)
    for (int64_t w = 0; w < words; w++) m[w] |= all[q * words + w];
  for (int64_t v = 0; v < V; v++) k += (m[v / 32] >> (v % 32)) & 1u;
  tt_comm_handle_free(bk->h);
  bk->h = NULL;
  bk->phase = 2;
  tt_tensor_release(bk->row_ids);
  tt_tensor_release(bk->rows);
  bk->row_ids = bk->rows = NULL;
  bk->in_grad = 0;
  if (k == 0 || 2 * k > V) return start_dense(r, bk);
  tt_tensor *host_ids = NULL;
  TT_TRY(tt_tensor_empty(&k, 1, TT_I64, TT_CPU, &host_ids));
  int64_t *ids = tt_tensor_data(host_ids);
  for (int64_t v = 0, i = 0; v < V; v++)
    if ((m[v / 32] >> (v % 32)) & 1u) ids[i++] = v;
  int rc = tt_to_device(host_ids, p->device, &bk->row_ids);
  tt_tensor_release(host_ids);
  TT_TRY(rc);
  const tt_embedding_kernels *kern = TT_KERNELS(tt_embedding, p->device);
  if (!kern || !kern->forward) return tt_no_kernel("sparse gradient rows", p->device);
  int64_t shape[2] = {k, D};
  TT_TRY(tt_tensor_empty(shape, 2, TT_F32, p->device, &bk->rows));
  TT_TRY(kern->forward(tt_tensor_data(bk->rows), tt_tensor_data(bk->buf),
                       tt_tensor_data(bk->row_ids), 1, k, V, D, TT_F32, 0, 0));
  TT_TRY(tt_comm_all_reduce_async(r->comm, bk->rows, TT_REDUCE_AVG, &bk->h));
  /* While the rows travel: zeros where the average will land. */
  tt_tensor *dst = sparse_dst(r, bk);
  return dst ? tt_fill_(dst, 0.0) : 0;
}

/* Sparse bucket, after the rows arrived: the averaged rows added into the zeros. */
static int unpack_sparse_rows(tt_dist_reducer *r, grad_bucket *bk) {
  if (!bk->rows) return 0;   /* the dense collective ran */
  tt_tensor *dst = sparse_dst(r, bk);
  if (!dst) return 0;
  const tt_tensor *p = sparse_param(r, bk);
  int64_t V = p->shape[0], D = p->shape[1], k = bk->rows->shape[0];
  const tt_embedding_kernels *kern = TT_KERNELS(tt_embedding, p->device);
  if (!kern || !kern->backward) return tt_no_kernel("sparse gradient rows", p->device);
  TT_TRY(kern->backward(tt_tensor_data(dst), tt_tensor_data(bk->rows),
                        tt_tensor_data(bk->row_ids), 1, k, V, D, TT_F32, 0));
  if (r->zero_stage == 0) return 0;
  int64_t len = bk->numel / r->comm->size;
  tt_tensor *owned = NULL;
  TT_TRY(tt_narrow(bk->buf, 0, r->comm->rank * len, len, &owned));
  tt_tensor_release(bk->shard_grad);
  bk->shard_grad = NULL;
  int rc = tt_clone(owned, &bk->shard_grad);
  tt_tensor_release(owned);
  return rc;
}

/* Starts every complete bucket that follows the started ones, in bucket order. A sparse
** bucket's rows go out before the next bucket starts, so every rank issues them at the
** same point of the sequence. */
static int start_ready_buckets(tt_dist_reducer *r) {
  while (r->next_start < r->n_buckets) {
    grad_bucket *bk = &r->buckets[r->next_start];
    if (bk->n_ready < bk->n_slots) break;
    if (r->next_start > 0) {
      grad_bucket *prev = &r->buckets[r->next_start - 1];
      if (prev->sparse && prev->phase == 1) TT_TRY(start_sparse_rows(r, prev));
    }
    if (bk->sparse) {
      TT_TRY(start_sparse_mask(r, bk));
    } else {
      tt_comm_handle_free(bk->h);
      bk->h = NULL;
      TT_TRY(start_dense(r, bk));
    }
    bk->started = 1;
    r->next_start++;
  }
  return 0;
}

/* A bucket whose collective completed: its averages go where the optimizer reads them,
** into every param's grad (stage 0; a sparse bucket's rows unpacked), or as this
** rank's shard gradients (stages 1 and 2; stage 2 then releases the flat buffer). Runs
** as soon as a bucket completes, during backward when it can: its gradients are final
** once it started. */
static int land_bucket(tt_dist_reducer *r, int b) {
  grad_bucket *bk = &r->buckets[b];
  if (bk->landed) return 0;
  bk->landed = 1;
  if (bk->sparse) TT_TRY(unpack_sparse_rows(r, bk));
  if (r->zero_stage >= 1) {
    for (int i = 0; i < r->n_shards; i++) {
      zero_shard *z = &r->shards[i];
      if (z->bucket != b) continue;
      tt_tensor *g = NULL;
      TT_TRY(flat_piece(bk->shard_grad, z->shard_offset, tt_tensor_numel(z->view), z->view,
                        &g));
      tt_tensor_release(z->view->grad);
      z->view->grad = g;
    }
    if (r->zero_stage >= 2) {
      tt_tensor_release(bk->buf);
      bk->buf = NULL;
    }
    return 0;
  }
  if (bk->in_grad) return 0;
  /* A parameter without a gradient here stays without one, as in a single process
  ** (the optimizer skips it). */
  for (int k = 0; k < bk->n_slots; k++) {
    grad_slot *sl = &r->slots[bk->first_slot + k];
    tt_tensor *p = r->params[sl->param], *src = NULL;
    if (!p->grad) continue;
    TT_TRY(flat_piece(bk->buf, sl->offset, sl->numel, p, &src));
    int rc = tt_copy_(p->grad, src);
    tt_tensor_release(src);
    TT_TRY(rc);
  }
  return 0;
}

/* Lets MPI move the bytes of the buckets in flight. The last bucket's sparse rows start
** as soon as its mask is in: no collective can follow it on any rank. */
static int progress(tt_dist_reducer *r) {
  for (int b = 0; b < r->next_start; b++) {
    grad_bucket *bk = &r->buckets[b];
    if (bk->finished) continue;
    int done = 0;
    TT_TRY(tt_comm_test(bk->h, &done));
    if (!done) continue;
    if (bk->sparse && bk->phase == 1) {
      if (b == r->n_buckets - 1) TT_TRY(start_sparse_rows(r, bk));
      continue;
    }
    bk->finished = 1;
    TT_TRY(land_bucket(r, b));
  }
  return 0;
}

/* ZeRO-3: lets the unit gathers in flight (a prefetch) progress, between ops of forward and
** of backward; finish_gather waits for whatever is left. A failure here is left for that
** wait to report (the handle keeps it). */
static void progress_gathers(tt_dist_reducer *r) {
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    int done = 0;
    if (bk->gh && tt_comm_test(bk->gh, &done) != 0) return;
    if (bk->vh && tt_comm_test(bk->vh, &done) != 0) return;
  }
}

static void on_gather_tick(void *userdata) {
  tt_dist_reducer *r = userdata;
  if (!r->failed) progress_gathers(r);
}

static void on_grad_ready(tt_tensor *leaf, void *userdata) {
  tt_dist_reducer *r = userdata;
  if (r->failed) return;
  int s = slot_of_leaf(r, leaf);
  if (s < 0 || r->slots[s].ready) return;
  r->hint = s + 1 < r->n_params ? s + 1 : 0;
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  if (fill_slot(r, s) != 0) remember_failure(r);
  const grad_bucket *bk = &r->buckets[r->slots[s].bucket];
  if (bk->n_ready == bk->n_slots && r->slots[s].bucket > r->next_start) r->held++;
  if (!r->failed && (start_ready_buckets(r) != 0 || progress(r) != 0)) remember_failure(r);
  tt_set_grad_enabled(prev);
}

/* Between backward nodes: lets the buckets in flight progress. */
static void on_backward_tick(void *userdata) {
  tt_dist_reducer *r = userdata;
  if (r->failed) return;
  if (r->zero_stage == 3) progress_gathers(r);
  if (r->next_start == 0) return;
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  if (progress(r) != 0) remember_failure(r);
  tt_set_grad_enabled(prev);
}

static void reset_step(tt_dist_reducer *r) {
  for (int s = 0; s < r->n_params; s++) r->slots[s].ready = 0;
  for (int b = 0; b < r->n_buckets; b++) {
    r->buckets[b].n_ready = 0;
    r->buckets[b].started = 0;
    r->buckets[b].finished = 0;
    r->buckets[b].phase = 0;
    r->buckets[b].landed = 0;
    r->buckets[b].in_grad = 0;
  }
  r->next_start = 0;
  r->hint = 0;
  r->failed = 0;
  r->held = 0;
}

int tt_dist_reducer_arm(tt_dist_reducer *r, int armed) {
  if (armed && !r->armed) {
    reset_step(r);
    TT_TRY(tt_set_deferred_grads(r->deferred, r->n_deferred));
    tt_set_grad_ready_hook(on_grad_ready, r);
    tt_set_backward_tick_hook(on_backward_tick, r);
  } else if (!armed && r->armed) {
    tt_set_deferred_grads(NULL, 0);
    tt_set_grad_ready_hook(NULL, NULL);
    /* ZeRO-3: earlier micro-batches' backward lets the gathers progress too. */
    tt_set_backward_tick_hook(r->zero_stage == 3 ? on_gather_tick : NULL, r);
  }
  r->armed = armed != 0;
  return 0;
}

/* -- After backward ------------------------------------------------------------------- */

static int finish(tt_dist_reducer *r) {
  if (r->failed) return tt_set_error("data parallel: %s", r->error);
  for (int s = 0; s < r->n_params; s++)
    if (!r->slots[s].ready) TT_TRY(fill_slot(r, s));
  TT_TRY(start_ready_buckets(r));
  grad_bucket *last = &r->buckets[r->n_buckets - 1];
  if (last->sparse && last->phase == 1) TT_TRY(start_sparse_rows(r, last));
  for (int b = 0; b < r->n_buckets; b++) {
    TT_TRY(tt_comm_wait(r->buckets[b].h));
    TT_TRY(land_bucket(r, b));
  }
  return 0;
}

int tt_dist_reducer_finish(tt_dist_reducer *r) {
  double t0 = tt_dist_now();
  if (!r->armed) reset_step(r);
  tt_dist_reducer_arm(r, 0);
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = finish(r);
  tt_set_grad_enabled(prev);
  r->exposed_s = tt_dist_now() - t0;
  return rc;
}

int tt_dist_reducer_num_buckets(const tt_dist_reducer *r) { return r->n_buckets; }
int64_t tt_dist_reducer_sparse_rows(const tt_dist_reducer *r) {
  int64_t rows = -1;
  for (int b = 0; b < r->n_buckets; b++)
    if (r->buckets[b].sparse && r->buckets[b].rows)
      rows = (rows < 0 ? 0 : rows) + r->buckets[b].rows->shape[0];
  return rows;
}
double tt_dist_reducer_exposed_s(const tt_dist_reducer *r) { return r->exposed_s; }
int tt_dist_reducer_held(const tt_dist_reducer *r) { return r->held; }
int tt_dist_reducer_num_shards(const tt_dist_reducer *r) { return r->n_shards; }
tt_tensor *tt_dist_reducer_shard(const tt_dist_reducer *r, int i) {
  return i >= 0 && i < r->n_shards ? r->shards[i].view : NULL;
}
int tt_dist_reducer_shard_param(const tt_dist_reducer *r, int i) {
  return i >= 0 && i < r->n_shards ? r->shards[i].param : -1;
}
int64_t tt_dist_reducer_shard_offset(const tt_dist_reducer *r, int i) {
  return i >= 0 && i < r->n_shards ? r->shards[i].param_offset : -1;
}

int tt_dist_reducer_param_piece(const tt_dist_reducer *r, int param, int rank, int64_t *offset,
                                int64_t *len) {
  *offset = *len = 0;
  if (r->zero_stage < 1 || param < 0 || param >= r->n_params || rank < 0 ||
      rank >= r->comm->size)
    return 0;
  const grad_slot *s = &r->slots[r->slot_of[param]];
  int64_t n = r->buckets[s->bucket].numel / r->comm->size, a, e;
  if (!share_of(s, rank * n, (rank + 1) * n, &a, &e)) return 0;
  *offset = a - s->offset;
  *len = e - a;
  return 1;
}

/* -- ZeRO-1 and 2 ---------------------------------------------------------------------- */

int tt_dist_reducer_grad_sq_norm(tt_dist_reducer *r, double *out) {
  *out = 0.0;
  TT_CHECK(r->zero_stage >= 1, "grad_sq_norm: only for parallel.zero_stage 1 to 3");
  double local = 0.0;
  if (r->n_shards > 0) {
    tt_tensor **views = malloc(sizeof(tt_tensor *) * (size_t)r->n_shards);
    TT_CHECK(views, "grad_sq_norm: out of host memory");
    for (int i = 0; i < r->n_shards; i++) views[i] = r->shards[i].view;
    int rc = tt_grad_norm(views, r->n_shards, &local);
    free(views);
    TT_TRY(rc);
    local *= local;
  }
  /* Each rank's double travels as a (hi, lo) pair of floats; gathering (not reducing)
  ** the pairs keeps the sum in double precision. */
  double pair[2] = {(double)(float)local, 0.0};
  pair[1] = local - pair[0];
  int64_t two = 2;
  tt_tensor *t = NULL, *all = NULL;
  TT_TRY(tt_tensor_from_f64(pair, &two, 1, TT_F32, &t));
  int rc = tt_comm_all_gather(r->comm, t, 0, &all);
  tt_tensor_release(t);
  TT_TRY(rc);
  double sum = 0.0;
  for (int64_t i = 0; i < 2 * (int64_t)r->comm->size; i++) sum += tt_tensor_get(all, i);
  tt_tensor_release(all);
  *out = sum;
  return 0;
}

static int gather_params(tt_dist_reducer *r, tt_tensor **full, tt_comm_handle **hs) {
  int n = r->comm->size, me = r->comm->rank;
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    int64_t len = bk->numel / n;
    tt_tensor *owned = NULL;
    /* ZeRO-2 has released the flat buffer: the owned share travels from a buffer of its
    ** own (the padding in it is never copied into a parameter). */
    if (bk->buf) TT_TRY(tt_narrow(bk->buf, 0, me * len, len, &owned));
    else TT_TRY(tt_tensor_zeros(&len, 1, r->params[0]->dtype, r->params[0]->device, &owned));
    int rc = 0;
    for (int i = 0; i < r->n_shards && rc == 0; i++) {
      zero_shard *z = &r->shards[i];
      if (z->bucket != b) continue;
      tt_tensor *dst = NULL;
      rc = flat_piece(owned, z->shard_offset, tt_tensor_numel(z->view), z->view, &dst);
      if (rc == 0) rc = tt_copy_(dst, z->view);
      tt_tensor_release(dst);
    }
    if (rc == 0) rc = tt_comm_all_gather_async(r->comm, owned, 0, &full[b], &hs[b]);
    tt_tensor_release(owned);
    TT_TRY(rc);
  }
  for (int b = 0; b < r->n_buckets; b++) {
    TT_TRY(tt_comm_wait(hs[b]));
    grad_bucket *bk = &r->buckets[b];
    for (int k = 0; k < bk->n_slots; k++) {
      grad_slot *s = &r->slots[bk->first_slot + k];
      tt_tensor *p = r->params[s->param], *src = NULL;
      TT_TRY(flat_piece(full[b], s->offset, s->numel, p, &src));
      int rc = tt_copy_(p, src);
      tt_tensor_release(src);
      TT_TRY(rc);
    }
  }
  return 0;
}

static int refresh_gathered_units(tt_dist_reducer *r);

int tt_dist_reducer_gather_params(tt_dist_reducer *r) {
  TT_CHECK(r->zero_stage >= 1, "gather_params: only for parallel.zero_stage 1 to 3");
  if (r->zero_stage == 3) return refresh_gathered_units(r);
  tt_tensor **full = calloc((size_t)r->n_buckets, sizeof *full);
  tt_comm_handle **hs = calloc((size_t)r->n_buckets, sizeof *hs);
  if (!full || !hs) {
    free(full);
    free(hs);
    return tt_set_error("gather_params: out of host memory");
  }
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = gather_params(r, full, hs);
  tt_set_grad_enabled(prev);
  for (int b = 0; b < r->n_buckets; b++) {
    tt_comm_handle_free(hs[b]);
    tt_tensor_release(full[b]);
  }
  free(full);
  free(hs);
  return rc;
}

/* -- ZeRO-3: units gathered for their block ------------------------------------------ */

static int unit_bucket(const tt_dist_reducer *r, int unit, const char *op) {
  TT_CHECK(r->zero_stage == 3, "%s: only under parallel.zero_stage = 3", op);
  TT_CHECK(unit >= 0 && unit < r->n_buckets, "%s: unit %d of %d", op, unit, r->n_buckets);
  return r->n_buckets - 1 - unit;
}

int tt_dist_reducer_num_units(const tt_dist_reducer *r) {
  return r->zero_stage == 3 ? r->n_buckets : 0;
}
int64_t tt_dist_reducer_unit_gathers(const tt_dist_reducer *r) { return r->unit_gathers; }
int64_t tt_dist_reducer_unit_gather_bytes(const tt_dist_reducer *r) {
  return r->unit_gather_bytes;
}

int tt_dist_reducer_unit_is_gathered(const tt_dist_reducer *r, int unit) {
  if (r->zero_stage != 3 || unit < 0 || unit >= r->n_buckets) return -1;
  return r->buckets[r->n_buckets - 1 - unit].gathered;
}

static void release_bucket(tt_dist_reducer *r, grad_bucket *bk) {
  for (int k = 0; k < bk->n_slots; k++) {
    tt_tensor *p = r->params[r->slots[bk->first_slot + k].param];
    tt_storage_evict(p->storage);
    if (p->lowp) tt_storage_evict(p->lowp->storage);
  }
  bk->gathered = 0;
}

/* This rank's f32 parameters' elements of bucket bk (norm weights, biases: those that do
** not travel in the compute dtype) copied from its owned share into their places in vec
** (bk->vec_numel elements, zeros elsewhere): summed over the ranks, vec is all of them. */
static int vec_share(tt_dist_reducer *r, grad_bucket *bk, tt_tensor *vec) {
  int n = r->comm->size, me = r->comm->rank;
  int64_t len = bk->numel / n, lo = me * len, hi = lo + len;
  int rc = 0;
  for (int k = 0; k < bk->n_slots && rc == 0; k++) {
    grad_slot *sl = &r->slots[bk->first_slot + k];
    if (r->lowp_gather[sl->param]) continue;
    int64_t a, e;
    if (!share_of(sl, lo, hi, &a, &e)) continue;
    tt_tensor *src = NULL, *dst = NULL;
    rc = flat_piece(bk->owned, a - lo, e - a, NULL, &src);
    if (rc == 0) rc = flat_piece(vec, sl->vec_offset + (a - sl->offset), e - a, NULL, &dst);
    if (rc == 0) rc = tt_copy_(dst, src);
    tt_tensor_release(src);
    tt_tensor_release(dst);
  }
  return rc;
}

/* Whether bucket bk gathers in the compute dtype (lp) unless f32 is wanted. */
static int lp_bucket(const tt_dist_reducer *r, const grad_bucket *bk) {
  return r->gather_dtype != TT_F32 && bk->vec_numel < bk->numel;
}

/* Starts bucket bk's gather unless it is gathered or on its way: an all-gather of the
** owned shares, in f32, or (lp: ZeRO-3 with a compute dtype, unless f32 is wanted) cast
** to the compute dtype, with the f32 parameters' elements (norm weights, biases) summed
** over the ranks from zeros beside it, exactly. While the shares are away (shares_away)
** an lp gather sends the copies made then, the same values. */
static int start_gather(tt_dist_reducer *r, grad_bucket *bk, int want_f32) {
  if (bk->gathered || bk->gh) return 0;
  int n = r->comm->size;
  int64_t len = bk->numel / n;
  bk->lp = lp_bucket(r, bk) && !want_f32;
  if (bk->evicted && !(bk->lp && bk->owned_lp)) {
    return tt_set_error("zero-3 gather (bucket %d, in f32): its f32 shares are on the host "
                        "(AdamW:masters_on_host); bring them back first "
                        "(tt_dist_reducer_shares_home)", (int)(bk - r->buckets));
  }
  r->unit_gathers++;
  if (!bk->lp) {
    r->unit_gather_bytes += bk->numel * (int64_t)tt_dtype_size(bk->owned->dtype);
    return tt_comm_all_gather_async(r->comm, bk->owned, 0, &bk->full, &bk->gh);
  }
  int rc = 0;
  if (bk->evicted) {
    rc = tt_comm_all_gather_async(r->comm, bk->owned_lp, 0, &bk->full, &bk->gh);
  } else {
    tt_tensor *cast = NULL;
    TT_TRY(tt_tensor_empty(&len, 1, r->gather_dtype, bk->owned->device, &cast));
    rc = tt_copy_(cast, bk->owned);
    if (rc == 0) rc = tt_comm_all_gather_async(r->comm, cast, 0, &bk->full, &bk->gh);
    tt_tensor_release(cast);
  }
  TT_TRY(rc);
  r->unit_gather_bytes += bk->numel * (int64_t)tt_dtype_size(r->gather_dtype);
  if (bk->vec_numel == 0) return 0;
  if (bk->evicted) {
    TT_TRY(tt_tensor_empty(&bk->vec_numel, 1, TT_F32, bk->owned->device, &bk->vec));
    rc = tt_copy_(bk->vec, bk->owned_vec);
  } else {
    TT_TRY(tt_tensor_zeros(&bk->vec_numel, 1, TT_F32, bk->owned->device, &bk->vec));
    rc = vec_share(r, bk, bk->vec);
  }
  if (rc == 0) rc = tt_comm_all_reduce_async(r->comm, bk->vec, TT_REDUCE_SUM, &bk->vh);
  r->unit_gather_bytes += bk->vec_numel * 4;
  return rc;
}

/* One parameter of a bucket whose gather has landed: its values from the gathered
** buffer; the bf16 / fp16 copy the GEMMs read (tensors saved for backward hold its header)
** cast again in place, or, for a matrix that came in the compute dtype and has such a copy
** already, written straight into the copy while the f32 parameter stays without memory. */
static int fill_param(tt_dist_reducer *r, grad_bucket *bk, grad_slot *s) {
  tt_tensor *p = r->params[s->param], *src = NULL;
  int rc = 0;
  if (bk->lp && r->lowp_gather[s->param] && p->lowp && p->lowp->dtype == r->gather_dtype) {
    rc = tt_storage_restore(p->lowp->storage);
    if (rc == 0) rc = flat_piece(bk->full, s->offset, s->numel, p, &src);
    if (rc == 0) rc = tt_copy_(p->lowp, src);
    if (rc == 0) p->lowp_version = p->storage->version;
    tt_tensor_release(src);
    return rc;
  }
  rc = tt_storage_restore(p->storage);
  if (rc == 0) {
    if (bk->lp && !r->lowp_gather[s->param])
      rc = flat_piece(bk->vec, s->vec_offset, s->numel, p, &src);
    else
      rc = flat_piece(bk->full, s->offset, s->numel, p, &src);
  }
  if (rc == 0) rc = tt_copy_(p, src);
  tt_tensor_release(src);
  if (rc == 0 && p->lowp) {
    rc = tt_storage_restore(p->lowp->storage);
    if (rc == 0) rc = tt_copy_(p->lowp, p);
    if (rc == 0) p->lowp_version = p->storage->version;
  }
  return rc;
}

/* Waits for bucket bk's gather (started now when none is in flight) and fills its
** parameters. want_f32: every parameter whole in f32 (a checkpoint reads them); a gather
** in flight in the compute dtype is then finished and made again in f32. */
static int finish_gather(tt_dist_reducer *r, grad_bucket *bk, int want_f32) {
  if (bk->gathered && !(want_f32 && bk->lp)) return 0;
  if (bk->gathered) release_bucket(r, bk);
  TT_TRY(start_gather(r, bk, want_f32));
  int rc = tt_comm_wait(bk->gh);
  if (bk->vh && tt_comm_wait(bk->vh) != 0 && rc == 0) rc = -1;
  tt_comm_handle_free(bk->gh);
  tt_comm_handle_free(bk->vh);
  bk->gh = bk->vh = NULL;
  if (rc == 0 && want_f32 && bk->lp) {   /* a prefetch in the compute dtype: again */
    tt_tensor_release(bk->full);
    tt_tensor_release(bk->vec);
    bk->full = bk->vec = NULL;
    return finish_gather(r, bk, want_f32);
  }
  for (int k = 0; k < bk->n_slots && rc == 0; k++)
    rc = fill_param(r, bk, &r->slots[bk->first_slot + k]);
  tt_tensor_release(bk->full);
  tt_tensor_release(bk->vec);
  bk->full = bk->vec = NULL;
  if (rc != 0) return tt_error_context("zero-3 gather (bucket %d)", (int)(bk - r->buckets));
  bk->gathered = 1;
  return 0;
}

int tt_dist_reducer_unit_prefetch(tt_dist_reducer *r, int unit) {
  if (r->zero_stage != 3 || unit < 0 || unit >= r->n_buckets) return 0;   /* none next */
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = start_gather(r, &r->buckets[r->n_buckets - 1 - unit], 0);
  tt_set_grad_enabled(prev);
  return rc;
}

static int unit_gather(tt_dist_reducer *r, int unit, int whole) {
  int b = unit_bucket(r, unit, "zero-3 gather");
  if (b < 0) return -1;
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = finish_gather(r, &r->buckets[b], whole);
  tt_set_grad_enabled(prev);
  return rc;
}

int tt_dist_reducer_unit_gather(tt_dist_reducer *r, int unit) {
  return unit_gather(r, unit, 0);
}
int tt_dist_reducer_unit_gather_whole(tt_dist_reducer *r, int unit) {
  return unit_gather(r, unit, 1);
}

int tt_dist_reducer_unit_release(tt_dist_reducer *r, int unit) {
  int b = unit_bucket(r, unit, "zero-3 release");
  if (b < 0) return -1;
  TT_CHECK(!r->buckets[b].gh, "zero-3 release: unit %d has a gather in flight", unit);
  release_bucket(r, &r->buckets[b]);
  return 0;
}

/* After the optimizer step: the units that stay gathered (those outside the blocks) get
** the updated shares; released ones are gathered fresh when next used. */
static int refresh_gathered_units(tt_dist_reducer *r) {
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    TT_CHECK(!bk->gh, "zero-3: bucket %d has a gather in flight at the optimizer step", b);
    if (!bk->gathered) continue;
    bk->gathered = 0;
    int prev = tt_is_grad_enabled();
    tt_set_grad_enabled(0);
    int rc = finish_gather(r, bk, 1);
    tt_set_grad_enabled(prev);
    TT_TRY(rc);
  }
  return 0;
}

/* -- ZeRO-3: the f32 shares on the host ----------------------------------------------- */

/* Optimizer offload in bf16 / fp16 (AdamW:masters_on_host): the optimizer's host copies of
** this rank's shares are the masters, and the device gives the owned buffers' memory back
** from before the forward to the update. A bucket the blocks gather in the compute dtype
** keeps what those gathers send instead: owned cast to it (owned_lp, half the bytes under
** bf16) and its f32 parameters' part of vec (owned_vec, the norm weights: small). A bucket
** that gathers in f32 (those outside the blocks) is given back only while it is gathered:
** it stays so until the update, and a gather of it while away is refused. */
int tt_dist_reducer_shares_away(tt_dist_reducer *r) {
  TT_CHECK(r->zero_stage == 3, "shares_away: only under parallel.zero_stage = 3");
  if (r->away) return 0;
  int n = r->comm->size, prev = tt_is_grad_enabled(), rc = 0;
  tt_set_grad_enabled(0);
  for (int b = 0; b < r->n_buckets && rc == 0; b++) {
    grad_bucket *bk = &r->buckets[b];
    if (bk->gh) {
      rc = tt_set_error("shares_away: bucket %d has a gather in flight", b);
      break;
    }
    int64_t len = bk->numel / n;
    if (lp_bucket(r, bk)) {
      rc = tt_tensor_empty(&len, 1, r->gather_dtype, bk->owned->device, &bk->owned_lp);
      if (rc == 0) rc = tt_copy_(bk->owned_lp, bk->owned);
      if (rc == 0 && bk->vec_numel > 0)
        rc = tt_tensor_zeros(&bk->vec_numel, 1, TT_F32, bk->owned->device, &bk->owned_vec);
      if (rc == 0 && bk->owned_vec) rc = vec_share(r, bk, bk->owned_vec);
    } else if (!bk->gathered) {
      continue;
    }
    if (rc != 0) break;
    tt_storage_evict(bk->owned->storage);
    bk->evicted = 1;
  }
  tt_set_grad_enabled(prev);
  r->away = 1;   /* also after an error: shares_home takes back what was given */
  if (rc != 0) return tt_error_context("zero-3 shares away");
  return 0;
}

/* The owned buffers' memory taken again, zeroed (the padding past the last parameter is
** never written otherwise), and the copies dropped. The caller then writes every share
** (the optimizer's update, or its host masters' upload). */
int tt_dist_reducer_shares_home(tt_dist_reducer *r) {
  TT_CHECK(r->zero_stage == 3, "shares_home: only under parallel.zero_stage = 3");
  if (!r->away) return 0;
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    tt_tensor_release(bk->owned_lp);
    tt_tensor_release(bk->owned_vec);
    bk->owned_lp = bk->owned_vec = NULL;
    if (!bk->evicted) continue;
    if (tt_storage_restore(bk->owned->storage) != 0 || tt_fill_(bk->owned, 0.0) != 0)
      return tt_error_context("zero-3 shares home (bucket %d)", b);
    bk->evicted = 0;
  }
  r->away = 0;
  return 0;
}

/* What shares_away gives back now (the buckets' memory as the allocator granted it) and
** what it keeps instead: the allocator's step peak is lower by the difference. */
int64_t tt_dist_reducer_shares_away_bytes(const tt_dist_reducer *r, int64_t *kept) {
  int64_t away = 0, copies = 0;
  int n = r->zero_stage == 3 ? r->comm->size : 0;
  for (int b = 0; n > 0 && b < r->n_buckets; b++) {
    const grad_bucket *bk = &r->buckets[b];
    if (lp_bucket(r, bk)) {
      copies += (int64_t)tt_alloc_granted_bytes((size_t)(bk->numel / n) *
                                                tt_dtype_size(r->gather_dtype));
      if (bk->vec_numel > 0)
        copies += (int64_t)tt_alloc_granted_bytes((size_t)bk->vec_numel * 4);
    } else if (!bk->gathered && !bk->evicted) {
      continue;
    }
    away += (int64_t)bk->owned->storage->nbytes;
  }
  if (kept) *kept = copies;
  return away;
}

/* The identity ops around a block. ctx: the reducer; i[0]: the unit; i[1]: the unit whose
** gather to start (exit's backward), -1 for none. */
static int pass_grad(tt_node *node, tt_tensor *g) {
  tt_tensor *x = node->inputs[0];
  return tt_needs_grad(x) ? tt_accumulate_grad(x, g) : 0;
}

static int unit_enter_backward(tt_node *node, tt_tensor *g) {
  TT_TRY(pass_grad(node, g));
  return tt_dist_reducer_unit_release(node->ctx, (int)node->i[0]);
}

static int unit_exit_backward(tt_node *node, tt_tensor *g) {
  TT_TRY(tt_dist_reducer_unit_gather(node->ctx, (int)node->i[0]));
  TT_TRY(tt_dist_reducer_unit_prefetch(node->ctx, (int)node->i[1]));
  return pass_grad(node, g);
}

static int unit_op(const char *name, tt_backward_fn backward, tt_dist_reducer *r, int unit,
                   int next, tt_tensor *x, tt_tensor **out) {
  *out = NULL;
  if (unit_bucket(r, unit, name) < 0) return -1;
  int record = tt_should_record(&x, 1);
  tt_tensor *y = tt_tensor_header_alias(x);
  TT_CHECK(y, "%s: out of host memory", name);
  if (record) {
    tt_node *node = tt_record(name, backward, y, &x, 1);
    if (!node) {
      tt_tensor_release(y);
      return -1;
    }
    node->ctx = r;
    node->i[0] = unit;
    node->i[1] = next;
    node->whole = 1;   /* gathers and releases: never split by deferred gradients */
  }
  *out = y;
  return 0;
}

int tt_dist_reducer_unit_enter(tt_dist_reducer *r, int unit, tt_tensor *x, tt_tensor **out) {
  return unit_op("zero3_enter", unit_enter_backward, r, unit, -1, x, out);
}

int tt_dist_reducer_unit_exit(tt_dist_reducer *r, int unit, int next, tt_tensor *y,
                              tt_tensor **out) {
  TT_TRY(unit_op("zero3_exit", unit_exit_backward, r, unit, next, y, out));
  return tt_dist_reducer_unit_release(r, unit);
}
