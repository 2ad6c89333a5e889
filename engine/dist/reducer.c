/*
** reducer.c — data-parallel gradient averaging in buckets, overlapped with backward.
**
** Parameters are packed, in reverse order (roughly the order backward finishes their
** gradients), into flat buckets of about bucket_mb megabytes. The autograd grad-ready
** hook copies each finished gradient into its bucket; a full bucket starts a
** non-blocking all-reduce (or reduce-scatter for ZeRO-1) while backward keeps running.
** Buckets always start in bucket order, so every rank issues the same sequence of
** collectives even if its gradients finish in a different order. Each hook call also
** tests the in-flight buckets: MPI progresses non-blocking collectives only inside MPI
** calls, so this is what moves the bytes during backward.
**
** ZeRO-1: each bucket is padded to a multiple of the group size n; rank r owns elements
** [r*len, (r+1)*len) of every bucket (len = padded / n). Its shards are 1-D or (1, k)
** views into the parameters over that range (2-D when the param is a matrix, so the
** optimizer's weight-decay rule by ndim still applies); their ->grad is set to the
** matching slice of the reduce-scattered gradient after finish. After the optimizer has
** updated the shards in place, gather_params all-gathers every bucket's owned range.
*/
#include "dist_internal.h"

typedef struct {
  int param;
  int bucket;
  int64_t offset;   /* element offset in the bucket */
  int64_t numel;
  int ready;        /* gradient copied into the bucket during this backward */
} grad_slot;

typedef struct {
  int first_slot;
  int n_slots;
  int n_ready;
  int64_t numel;    /* padded to a multiple of the group size for ZeRO-1 */
  int started;
  int finished;
  tt_tensor *buf;   /* (numel) gradients, then averages */
  tt_tensor *shard_grad;   /* ZeRO-1: (numel / n) averaged share after finish */
  tt_comm_handle *h;
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
  int n_shards;
  zero_shard *shards;
};

/* -- Bucket layout -------------------------------------------------------------------- */

static int plan_buckets(tt_dist_reducer *r, double bucket_mb) {
  /* Bucket b holds consecutive slots; slot s is parameter n-1-s. */
  int64_t cap = (int64_t)(bucket_mb * 1024.0 * 1024.0);
  size_t elem = tt_dtype_size(r->params[0]->dtype);
  TT_ALLOC(r->slots, sizeof(grad_slot) * (size_t)r->n_params);
  TT_ALLOC(r->slot_of, sizeof(int) * (size_t)r->n_params);
  TT_ALLOC(r->buckets, sizeof(grad_bucket) * (size_t)r->n_params);
  memset(r->buckets, 0, sizeof(grad_bucket) * (size_t)r->n_params);
  int nb = -1;
  int64_t fill = 0;
  for (int s = 0; s < r->n_params; s++) {
    int p = r->n_params - 1 - s;
    int64_t numel = tt_tensor_numel(r->params[p]);
    if (nb < 0 || (fill > 0 && (fill + numel) * (int64_t)elem > cap)) {
      nb++;
      r->buckets[nb].first_slot = s;
      fill = 0;
    }
    r->slots[s] = (grad_slot){p, nb, fill, numel, 0};
    r->slot_of[p] = s;
    r->buckets[nb].n_slots++;
    fill += numel;
    r->buckets[nb].numel = fill;
  }
  r->n_buckets = nb + 1;
  int n = r->comm->size;
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    if (r->zero_stage == 1) bk->numel = (bk->numel + n - 1) / n * n;
    TT_TRY(tt_tensor_zeros(&bk->numel, 1, r->params[0]->dtype, r->params[0]->device,
                           &bk->buf));
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

static int make_shards(tt_dist_reducer *r) {
  int n = r->comm->size, me = r->comm->rank;
  TT_ALLOC(r->shards, sizeof(zero_shard) * (size_t)r->n_params * 2);
  for (int b = 0; b < r->n_buckets; b++) {
    grad_bucket *bk = &r->buckets[b];
    int64_t len = bk->numel / n, lo = me * len, hi = lo + len;
    for (int k = 0; k < bk->n_slots; k++) {
      grad_slot *s = &r->slots[bk->first_slot + k];
      int64_t a = s->offset > lo ? s->offset : lo;
      int64_t e = s->offset + s->numel < hi ? s->offset + s->numel : hi;
      if (a >= e) continue;
      tt_tensor *p = r->params[s->param], *det = NULL, *flat = NULL, *piece = NULL;
      int64_t numel = s->numel;
      int rc = tt_detach(p, &det);
      if (rc == 0) rc = tt_view(det, &numel, 1, &flat);
      if (rc == 0) rc = flat_piece(flat, a - s->offset, e - a, NULL, &piece);
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

void tt_dist_reducer_free(tt_dist_reducer *r) {
  if (!r) return;
  tt_dist_reducer_arm(r, 0);
  for (int b = 0; b < r->n_buckets; b++) {
    tt_comm_handle_free(r->buckets[b].h);
    tt_tensor_release(r->buckets[b].buf);
    tt_tensor_release(r->buckets[b].shard_grad);
  }
  for (int i = 0; i < r->n_shards; i++) {
    tt_tensor_release(r->shards[i].view->grad);
    r->shards[i].view->grad = NULL;
    tt_tensor_release(r->shards[i].view);
  }
  for (int i = 0; i < r->n_params; i++) tt_tensor_release(r->params[i]);
  free(r->params);
  free(r->slot_of);
  free(r->slots);
  free(r->buckets);
  free(r->shards);
  free(r);
}

int tt_dist_reducer_new(tt_comm *c, tt_tensor *const *params, int n, double bucket_mb,
                        int zero_stage, tt_dist_reducer **out) {
  *out = NULL;
  TT_CHECK(c, "data parallel: no group");
  TT_CHECK(n > 0, "data parallel: no parameters to reduce");
  TT_CHECK(zero_stage == 0 || zero_stage == 1,
           "parallel.zero_stage = %d: only 0 and 1 are implemented", zero_stage);
  TT_CHECK(bucket_mb > 0, "dist.bucket_mb = %g: must be positive", bucket_mb);
  for (int i = 0; i < n; i++) {
    const tt_tensor *p = params[i];
    TT_CHECK(p && tt_dtype_is_float(p->dtype), "data parallel: parameter %d is not a float "
             "tensor", i);
    TT_CHECK(p->dtype == params[0]->dtype && p->device == params[0]->device,
             "data parallel: parameters mix dtypes or devices (parameter %d is %s, "
             "parameter 0 is %s)", i, tt_dtype_name(p->dtype), tt_dtype_name(params[0]->dtype));
    TT_CHECK(tt_tensor_is_contiguous(p), "data parallel: parameter %d is not contiguous", i);
  }
  tt_dist_reducer *r = calloc(1, sizeof *r);
  TT_CHECK(r, "data parallel: out of host memory");
  r->comm = c;
  r->zero_stage = zero_stage;
  r->params = malloc(sizeof(tt_tensor *) * (size_t)n);
  if (!r->params) {
    free(r);
    return tt_set_error("data parallel: out of host memory");
  }
  for (int i = 0; i < n; i++) {
    tt_tensor_retain(params[i]);
    r->params[i] = params[i];
  }
  r->n_params = n;
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = plan_buckets(r, bucket_mb);
  if (rc == 0 && zero_stage == 1) rc = make_shards(r);
  tt_set_grad_enabled(prev);
  if (rc != 0) {
    tt_dist_reducer_free(r);
    return -1;
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

/* Copies a parameter's gradient (zeros when it has none) into its bucket place. */
static int fill_slot(tt_dist_reducer *r, int slot) {
  grad_slot *s = &r->slots[slot];
  tt_tensor *p = r->params[s->param], *dst = NULL;
  TT_TRY(flat_piece(r->buckets[s->bucket].buf, s->offset, s->numel, p, &dst));
  int rc = p->grad ? tt_copy_(dst, p->grad) : tt_fill_(dst, 0.0);
  tt_tensor_release(dst);
  TT_TRY(rc);
  s->ready = 1;
  r->buckets[s->bucket].n_ready++;
  return 0;
}

/* Starts every complete bucket that follows the started ones, in bucket order. */
static int start_ready_buckets(tt_dist_reducer *r) {
  while (r->next_start < r->n_buckets) {
    grad_bucket *bk = &r->buckets[r->next_start];
    if (bk->n_ready < bk->n_slots) break;
    tt_comm_handle_free(bk->h);
    bk->h = NULL;
    if (r->zero_stage == 1) {
      tt_tensor_release(bk->shard_grad);
      bk->shard_grad = NULL;
      TT_TRY(tt_comm_reduce_scatter_async(r->comm, bk->buf, 0, TT_REDUCE_AVG,
                                          &bk->shard_grad, &bk->h));
    } else {
      TT_TRY(tt_comm_all_reduce_async(r->comm, bk->buf, TT_REDUCE_AVG, &bk->h));
    }
    bk->started = 1;
    r->next_start++;
  }
  return 0;
}

/* Lets MPI move the bytes of the buckets in flight. */
static int progress(tt_dist_reducer *r) {
  for (int b = 0; b < r->next_start; b++) {
    grad_bucket *bk = &r->buckets[b];
    if (bk->finished) continue;
    TT_TRY(tt_comm_test(bk->h, &bk->finished));
  }
  return 0;
}

static void on_grad_ready(tt_tensor *leaf, void *userdata) {
  tt_dist_reducer *r = userdata;
  if (r->failed) return;
  int s = slot_of_leaf(r, leaf);
  if (s < 0 || r->slots[s].ready) return;
  r->hint = s + 1 < r->n_params ? s + 1 : 0;
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  if (fill_slot(r, s) != 0 || start_ready_buckets(r) != 0 || progress(r) != 0)
    remember_failure(r);
  tt_set_grad_enabled(prev);
}

/* Between backward nodes: lets the buckets in flight progress. */
static void on_backward_tick(void *userdata) {
  tt_dist_reducer *r = userdata;
  if (r->failed || r->next_start == 0) return;
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
  }
  r->next_start = 0;
  r->hint = 0;
  r->failed = 0;
}

int tt_dist_reducer_arm(tt_dist_reducer *r, int armed) {
  if (armed && !r->armed) {
    reset_step(r);
    tt_set_grad_ready_hook(on_grad_ready, r);
    tt_set_backward_tick_hook(on_backward_tick, r);
  } else if (!armed && r->armed) {
    tt_set_grad_ready_hook(NULL, NULL);
    tt_set_backward_tick_hook(NULL, NULL);
  }
  r->armed = armed != 0;
  return 0;
}

/* -- After backward ------------------------------------------------------------------- */

static int write_back(tt_dist_reducer *r) {
  if (r->zero_stage == 1) {
    for (int i = 0; i < r->n_shards; i++) {
      zero_shard *z = &r->shards[i];
      tt_tensor *g = NULL;
      TT_TRY(flat_piece(r->buckets[z->bucket].shard_grad, z->shard_offset,
                        tt_tensor_numel(z->view), z->view, &g));
      tt_tensor_release(z->view->grad);
      z->view->grad = g;
    }
    return 0;
  }
  /* A parameter without a gradient here stays without one, as in a single process
  ** (the optimizer skips it). */
  for (int s = 0; s < r->n_params; s++) {
    grad_slot *sl = &r->slots[s];
    tt_tensor *p = r->params[sl->param], *src = NULL;
    if (!p->grad) continue;
    TT_TRY(flat_piece(r->buckets[sl->bucket].buf, sl->offset, sl->numel, p, &src));
    int rc = tt_copy_(p->grad, src);
    tt_tensor_release(src);
    TT_TRY(rc);
  }
  return 0;
}

static int finish(tt_dist_reducer *r) {
  if (r->failed) return tt_set_error("data parallel: %s", r->error);
  for (int s = 0; s < r->n_params; s++)
    if (!r->slots[s].ready) TT_TRY(fill_slot(r, s));
  TT_TRY(start_ready_buckets(r));
  for (int b = 0; b < r->n_buckets; b++) TT_TRY(tt_comm_wait(r->buckets[b].h));
  return write_back(r);
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
double tt_dist_reducer_exposed_s(const tt_dist_reducer *r) { return r->exposed_s; }
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

/* -- ZeRO-1 ---------------------------------------------------------------------------- */

int tt_dist_reducer_grad_sq_norm(tt_dist_reducer *r, double *out) {
  *out = 0.0;
  TT_CHECK(r->zero_stage == 1, "grad_sq_norm: only for parallel.zero_stage = 1");
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
    TT_TRY(tt_narrow(bk->buf, 0, me * len, len, &owned));
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

int tt_dist_reducer_gather_params(tt_dist_reducer *r) {
  TT_CHECK(r->zero_stage == 1, "gather_params: only for parallel.zero_stage = 1");
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
