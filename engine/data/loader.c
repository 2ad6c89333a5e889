/*
** loader.c — the streaming data loader.
**
** Layout invariance: the global batch (B rows) is filled by S independent streams, each
** giving B/S consecutive rows per step (row j comes from stream j / (B/S)). A stream owns
** a 1/S share of every source (a byte range of its files, or a token range of its
** shards), its own random state and its own shuffle buffer. The batches are therefore
** the same for every data-parallel size; DP rank r runs only the streams whose rows fall
** in its slice (a stream shared by two ranks runs on both). State records are per
** stream, so a run can resume on another DP size from the concatenated states of all
** ranks.
**
** Per stream and per step: for each sequence, a source is drawn by weight; its packer
** tokenizes documents (EOS after each) until seq_len + 1 tokens are ready; consecutive
** sequences of a source share one token (targets of one are inputs of the next, as in
** Megatron). The shuffle buffer swaps each new sequence with a random held one.
**
** Threads: workers produce sequences into per-stream bounded queues (back-pressure: a
** worker only produces into a queue with room); next_batch pops them. Stream state is
** touched only by the worker holding the stream (busy flag) or, while workers are paused,
** by state save/restore.
*/
#include "data/bpe_internal.h"
#include <pthread.h>
#include <time.h>

/* -- Per stream and source state ---------------------------------------------------- */

typedef struct source {
  tt_doc_files files;
  double weight;
  const char *field;
  tt_token_shard **shards;   /* TT_DATA_TOKENS */
} source;

typedef struct packer {
  tt_doc_reader rd;          /* text / JSONL sources */
  int64_t tok_start, tok_end, tok_pos;   /* token sources: global token range and position */
  int64_t epoch;
  int64_t pass_tokens;       /* tokens produced since the last rewind */
  tt_ids pending;            /* tokenized but not yet packed: data[head .. len) */
  size_t head;
} packer;

typedef struct stream {
  int index;
  packer *pk;                /* one per source */
  uint64_t rng;
  int32_t *shuf;             /* shuffle buffer: shuf_n sequences of seq_len + 1 */
  int64_t shuf_n;
  int32_t *q;                /* ring of q_cap sequences */
  int64_t q_head, q_len, q_cap;
  int busy;
  int worker;
  int64_t produced;
} stream;

struct tt_data_loader {
  tt_data_config cfg;
  int64_t T, B, L, R;        /* seq_len, global rows, local rows, rows per stream */
  int S;
  source *src;
  int n_src;
  double *cum_weight;
  tt_bpe *bpe;
  int32_t eos;
  stream *streams;           /* the streams this rank runs: first_stream .. */
  int n_streams, first_stream;
  int n_workers;
  pthread_t *threads;
  tt_bpe_cache **caches;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cond_work, cond_data, cond_idle;
  int stop, paused, failed;
  char err[1024];
  int64_t tokens, batches;
  double t_start, wait_last, wait_total;
  tt_buf state;
  char *owned_strings;       /* copies of config strings */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
  /* splitmix64: tiny state (one word to save) and good enough for sampling. */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* -- Producing sequences ------------------------------------------------------------ */

static int copy_tokens(const tt_data_loader *ld, const source *s, int64_t pos, int64_t n, int32_t *dst) {
  const tt_doc_files *fs = &s->files;
  int f = 0;
  while (f + 1 < fs->n && fs->starts[f + 1] <= pos) f++;
  while (n > 0) {
    int64_t local = pos - fs->starts[f];
    int64_t k = fs->sizes[f] - local < n ? fs->sizes[f] - local : n;
    TT_TRY(tt_token_shard_read(s->shards[f], local, k, dst));
    dst += k;
    pos += k;
    n -= k;
    f++;
  }
  (void)ld;
  return 0;
}

/* Next packed sequence (seq_len + 1 tokens) of source d into dst. */
static int pack_next(tt_data_loader *ld, stream *st, int d, tt_bpe_cache *cache, int32_t *dst) {
  const source *s = &ld->src[d];
  packer *p = &st->pk[d];
  int64_t need = ld->T + 1;
  if (s->files.type == TT_DATA_TOKENS) {
    if (p->tok_pos + need > p->tok_end) {
      p->tok_pos = p->tok_start;
      p->epoch++;
    }
    TT_TRY(copy_tokens(ld, s, p->tok_pos, need, dst));
    p->tok_pos += ld->T;
    return 0;
  }
  while ((int64_t)(p->pending.len - p->head) < need) {
    const char *text;
    size_t len;
    int end_doc;
    int got = tt_doc_reader_next(&p->rd, &text, &len, &end_doc);
    if (got < 0) return -1;
    if (got == 0) {
      if (p->pass_tokens == 0)
        return tt_set_error("data source %d (%s...): stream %d got no documents in its share "
                            "(fewer documents than data.num_streams?)",
                            d + 1, s->files.paths[0], st->index);
      tt_doc_reader_rewind(&p->rd);
      p->epoch++;
      p->pass_tokens = 0;
      continue;
    }
    if (p->head > 0 && p->head * 2 >= p->pending.len) {
      memmove(p->pending.data, p->pending.data + p->head, (p->pending.len - p->head) * sizeof(int32_t));
      p->pending.len -= p->head;
      p->head = 0;
    }
    size_t before = p->pending.len;
    TT_TRY(tt_bpe_encode_append(ld->bpe, cache, text, len, 0, &p->pending));
    if (end_doc) {
      TT_TRY(tt_ids_reserve(&p->pending, 1));
      p->pending.data[p->pending.len++] = ld->eos;
    }
    p->pass_tokens += (int64_t)(p->pending.len - before);
  }
  memcpy(dst, p->pending.data + p->head, (size_t)need * sizeof(int32_t));
  p->head += (size_t)ld->T;
  return 0;
}

static int pull(tt_data_loader *ld, stream *st, tt_bpe_cache *cache, int32_t *dst) {
  int d = 0;
  if (ld->n_src > 1) {
    double u = (double)(rng_next(&st->rng) >> 11) * 0x1.0p-53 * ld->cum_weight[ld->n_src - 1];
    while (d + 1 < ld->n_src && u >= ld->cum_weight[d]) d++;
  }
  return pack_next(ld, st, d, cache, dst);
}

/* The stream's next sequence after shuffling. */
static int produce(tt_data_loader *ld, stream *st, tt_bpe_cache *cache, int32_t *dst) {
  int64_t K = ld->cfg.shuffle_buffer, n = ld->T + 1;
  if (K <= 0) return pull(ld, st, cache, dst);
  while (st->shuf_n < K) {
    TT_TRY(pull(ld, st, cache, st->shuf + st->shuf_n * n));
    st->shuf_n++;
  }
  int64_t i = (int64_t)(rng_next(&st->rng) % (uint64_t)K);
  memcpy(dst, st->shuf + i * n, (size_t)n * sizeof(int32_t));
  return pull(ld, st, cache, st->shuf + i * n);
}

/* -- Workers ------------------------------------------------------------------------ */

typedef struct worker_arg {
  tt_data_loader *ld;
  int w;
} worker_arg;

static void *worker_main(void *arg) {
  worker_arg *wa = arg;
  tt_data_loader *ld = wa->ld;
  int w = wa->w;
  free(wa);
  int64_t n = ld->T + 1;
  int32_t *seq = malloc((size_t)n * sizeof *seq);
  pthread_mutex_lock(&ld->mu);
  if (!seq) {
    snprintf(ld->err, sizeof ld->err, "data loader: out of host memory");
    ld->failed = 1;
    pthread_cond_broadcast(&ld->cond_data);
  }
  while (!ld->stop && !ld->failed) {
    stream *st = NULL;
    if (!ld->paused) {
      /* The stream of this worker with the emptiest queue goes first. */
      for (int k = 0; k < ld->n_streams; k++) {
        stream *c = &ld->streams[k];
        if (c->worker == w && !c->busy && c->q_len < c->q_cap && (!st || c->q_len < st->q_len)) st = c;
      }
    }
    if (!st) {
      pthread_cond_wait(&ld->cond_work, &ld->mu);
      continue;
    }
    st->busy = 1;
    pthread_mutex_unlock(&ld->mu);
    int rc = produce(ld, st, ld->caches[w], seq);
    char msg[1024];
    if (rc != 0) snprintf(msg, sizeof msg, "%s", tt_last_error());
    pthread_mutex_lock(&ld->mu);
    st->busy = 0;
    if (rc != 0) {
      if (!ld->failed) snprintf(ld->err, sizeof ld->err, "%s", msg);
      ld->failed = 1;
    } else {
      memcpy(st->q + ((st->q_head + st->q_len) % st->q_cap) * n, seq, (size_t)n * sizeof *seq);
      st->q_len++;
      st->produced++;
      ld->tokens += ld->T;
    }
    pthread_cond_broadcast(&ld->cond_data);
    pthread_cond_broadcast(&ld->cond_idle);
  }
  pthread_mutex_unlock(&ld->mu);
  free(seq);
  return NULL;
}

static void stop_workers(tt_data_loader *ld) {
  pthread_mutex_lock(&ld->mu);
  ld->stop = 1;
  pthread_cond_broadcast(&ld->cond_work);
  pthread_mutex_unlock(&ld->mu);
  for (int i = 0; i < ld->started; i++) pthread_join(ld->threads[i], NULL);
  ld->started = 0;
}

/* Waits (mu held) until no worker is inside produce(). */
static void pause_workers(tt_data_loader *ld) {
  ld->paused = 1;
  for (;;) {
    int busy = 0;
    for (int k = 0; k < ld->n_streams; k++) busy |= ld->streams[k].busy;
    if (!busy) break;
    pthread_cond_wait(&ld->cond_idle, &ld->mu);
  }
}

static void resume_workers(tt_data_loader *ld) {
  ld->paused = 0;
  pthread_cond_broadcast(&ld->cond_work);
}

/* -- Construction ------------------------------------------------------------------- */

void tt_data_loader_free(tt_data_loader *ld) {
  if (!ld) return;
  if (ld->threads) stop_workers(ld);
  free(ld->threads);
  for (int k = 0; ld->streams && k < ld->n_streams; k++) {
    stream *st = &ld->streams[k];
    for (int d = 0; st->pk && d < ld->n_src; d++) {
      tt_doc_reader_free(&st->pk[d].rd);
      tt_ids_free(&st->pk[d].pending);
    }
    free(st->pk);
    free(st->shuf);
    free(st->q);
  }
  free(ld->streams);
  for (int i = 0; ld->caches && i < ld->n_workers; i++) tt_bpe_cache_free(ld->caches[i]);
  free(ld->caches);
  for (int d = 0; ld->src && d < ld->n_src; d++) {
    source *s = &ld->src[d];
    for (int f = 0; s->shards && f < s->files.n; f++) tt_token_shard_close(s->shards[f]);
    free(s->shards);
    tt_doc_files_free(&s->files);
  }
  free(ld->src);
  free(ld->cum_weight);
  tt_bpe_free(ld->bpe);
  tt_buf_free(&ld->state);
  free(ld->owned_strings);
  pthread_mutex_destroy(&ld->mu);
  pthread_cond_destroy(&ld->cond_work);
  pthread_cond_destroy(&ld->cond_data);
  pthread_cond_destroy(&ld->cond_idle);
  free(ld);
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) { int64_t t = a % b; a = b; b = t; }
  return a;
}

/* The part of a source's byte (token) space this loader reads: [range_lo, range_hi) of it
** (which = 0: its first byte; 1: its length). A held-out evaluation split is the end of
** every training source, and the training loader stops before it. */
static int64_t span(const tt_data_loader *ld, const source *s, int which) {
  double lo = ld->cfg.range_lo, hi = ld->cfg.range_hi > 0 ? ld->cfg.range_hi : 1.0;
  int64_t a = (int64_t)((double)s->files.total * lo), b = (int64_t)((double)s->files.total * hi);
  return which == 0 ? a : b - a;
}

static int open_sources(tt_data_loader *ld) {
  const tt_data_config *c = &ld->cfg;
  int need_tokenizer = 0;
  ld->src = calloc((size_t)c->n_sources, sizeof *ld->src);
  ld->cum_weight = calloc((size_t)c->n_sources, sizeof *ld->cum_weight);
  if (!ld->src || !ld->cum_weight) return tt_set_error("out of host memory");
  ld->n_src = c->n_sources;
  double cum = 0;
  for (int d = 0; d < c->n_sources; d++) {
    const tt_data_source *in = &c->sources[d];
    source *s = &ld->src[d];
    if (!(in->weight > 0)) return tt_set_error("data source %d: weight must be > 0", d + 1);
    if (tt_doc_files_expand(in->paths, in->type, &s->files) != 0)
      return tt_error_context("data source %d", d + 1);
    s->weight = in->weight;
    s->field = in->text_field;
    cum += in->weight;
    ld->cum_weight[d] = cum;
    if (s->files.type != TT_DATA_TOKENS) {
      need_tokenizer = 1;
      continue;
    }
    s->shards = calloc((size_t)s->files.n, sizeof *s->shards);
    if (!s->shards) return tt_set_error("out of host memory");
    for (int f = 0; f < s->files.n; f++) TT_TRY(tt_token_shard_open(s->files.paths[f], &s->shards[f]));
    if (span(ld, s, 1) / ld->S < ld->T + 1)
      return tt_set_error("data source %d: %lld tokens are too few for %d streams of seq_len %lld",
                          d + 1, (long long)s->files.total, ld->S, (long long)ld->T);
  }
  if (c->tokenizer) TT_TRY(tt_bpe_load(c->tokenizer, &ld->bpe));
  else if (c->vocab_file && c->merges_file) TT_TRY(tt_bpe_load_vocab_merges(c->vocab_file, c->merges_file, &ld->bpe));
  else if (need_tokenizer) return tt_set_error("data: text sources need a tokenizer (data.tokenizer)");
  ld->eos = c->eos_id;
  if (ld->eos < 0 && ld->bpe) ld->eos = tt_bpe_eos_id(ld->bpe);
  if (ld->eos < 0 && ld->src[0].shards) ld->eos = ld->src[0].shards[0]->eos;
  if (ld->eos < 0 && need_tokenizer)
    return tt_set_error("data: the tokenizer has no end-of-text token; set data.eos_id");
  return 0;
}

static int make_streams(tt_data_loader *ld) {
  /* Streams whose rows intersect this rank's slice [r*L, (r+1)*L). */
  int64_t lo = ld->cfg.dp_rank * ld->L, hi = lo + ld->L;
  ld->first_stream = (int)(lo / ld->R);
  int last = (int)((hi - 1) / ld->R);
  ld->n_streams = last - ld->first_stream + 1;
  ld->streams = calloc((size_t)ld->n_streams, sizeof *ld->streams);
  if (!ld->streams) return tt_set_error("out of host memory");
  int64_t n = ld->T + 1;
  for (int k = 0; k < ld->n_streams; k++) {
    stream *st = &ld->streams[k];
    st->index = ld->first_stream + k;
    st->worker = k % ld->n_workers;
    st->rng = ld->cfg.seed ^ ((uint64_t)(st->index + 1) * 0xd1b54a32d192ed03ull);
    rng_next(&st->rng);
    st->pk = calloc((size_t)ld->n_src, sizeof *st->pk);
    st->q_cap = ld->cfg.queue_depth > 0 ? ld->cfg.queue_depth
                : (ld->cfg.prefetch_steps > 0 ? ld->cfg.prefetch_steps : 2) * ld->R;
    st->q = malloc((size_t)(st->q_cap * n) * sizeof *st->q);
    if (ld->cfg.shuffle_buffer > 0)
      st->shuf = malloc((size_t)(ld->cfg.shuffle_buffer * n) * sizeof *st->shuf);
    if (!st->pk || !st->q || (ld->cfg.shuffle_buffer > 0 && !st->shuf))
      return tt_set_error("out of host memory (stream buffers)");
    for (int d = 0; d < ld->n_src; d++) {
      const source *s = &ld->src[d];
      packer *p = &st->pk[d];
      int64_t lo = span(ld, s, 0), n = span(ld, s, 1);
      int64_t a = lo + n * st->index / ld->S, b = lo + n * (st->index + 1) / ld->S;
      if (s->files.type == TT_DATA_TOKENS) {
        p->tok_start = p->tok_pos = a;
        p->tok_end = b;
      } else {
        tt_doc_reader_init(&p->rd, &s->files, s->field, a, b,
                           ld->cfg.max_bad_lines < 0 ? 100 : ld->cfg.max_bad_lines);
      }
    }
  }
  return 0;
}

static int start_workers(tt_data_loader *ld) {
  ld->threads = calloc((size_t)ld->n_workers, sizeof *ld->threads);
  if (!ld->threads) return tt_set_error("out of host memory");
  for (int w = 0; w < ld->n_workers; w++) {
    worker_arg *wa = malloc(sizeof *wa);
    if (!wa) return tt_set_error("out of host memory");
    wa->ld = ld;
    wa->w = w;
    if (pthread_create(&ld->threads[w], NULL, worker_main, wa) != 0) {
      free(wa);
      return tt_set_error("data loader: cannot start worker thread %d", w);
    }
    ld->started++;
  }
  return 0;
}

/* Keeps private copies of the text field names (the readers point at them). */
static int copy_fields(tt_data_loader *ld, const tt_data_config *cfg) {
  size_t total = 0;
  for (int d = 0; d < ld->n_src; d++)
    total += strlen(cfg->sources[d].text_field ? cfg->sources[d].text_field : "text") + 1;
  ld->owned_strings = malloc(total);
  if (!ld->owned_strings) return tt_set_error("out of host memory");
  char *p = ld->owned_strings;
  for (int d = 0; d < ld->n_src; d++) {
    const char *f = cfg->sources[d].text_field ? cfg->sources[d].text_field : "text";
    size_t n = strlen(f) + 1;
    memcpy(p, f, n);
    ld->src[d].field = p;
    p += n;
  }
  return 0;
}

int tt_data_loader_new(const tt_data_config *cfg, tt_data_loader **out) {
  if (!cfg || cfg->n_sources < 1 || !cfg->sources) return tt_set_error("data: no sources (data.input_path or data.datasets)");
  if (cfg->seq_len < 1) return tt_set_error("data: seq_len must be >= 1");
  if (cfg->global_batch < 1) return tt_set_error("data: the global batch size must be >= 1");
  int dp = cfg->dp_size > 0 ? cfg->dp_size : 1;
  if (cfg->dp_rank < 0 || cfg->dp_rank >= dp) return tt_set_error("data: dp_rank %d outside 0..%d", cfg->dp_rank, dp - 1);
  if (cfg->global_batch % dp != 0)
    return tt_set_error("data: global batch %lld is not divisible by the data-parallel size %d",
                        (long long)cfg->global_batch, dp);
  int64_t S = cfg->num_streams > 0 ? cfg->num_streams : gcd64(cfg->global_batch, 8);
  if (cfg->global_batch % S != 0)
    return tt_set_error("data.num_streams (%lld) must divide the global batch size (%lld)",
                        (long long)S, (long long)cfg->global_batch);
  if (cfg->shuffle_buffer < 0) return tt_set_error("data.shuffle_buffer_size must be >= 0");
  tt_data_loader *ld = calloc(1, sizeof *ld);
  if (!ld) return tt_set_error("out of host memory");
  pthread_mutex_init(&ld->mu, NULL);
  pthread_cond_init(&ld->cond_work, NULL);
  pthread_cond_init(&ld->cond_data, NULL);
  pthread_cond_init(&ld->cond_idle, NULL);
  ld->cfg = *cfg;
  ld->cfg.dp_size = dp;
  ld->T = cfg->seq_len;
  ld->B = cfg->global_batch;
  ld->L = ld->B / dp;
  ld->S = (int)S;
  ld->R = ld->B / S;
  ld->t_start = now_s();
  ld->n_workers = 0;
  if (open_sources(ld) != 0) goto fail;
  /* Sources and file names were copied: the caller's config may go away now. */
  ld->cfg.sources = NULL;
  ld->cfg.tokenizer = ld->cfg.vocab_file = ld->cfg.merges_file = NULL;
  for (int d = 0; d < ld->n_src; d++) ld->src[d].field = NULL;
  if (copy_fields(ld, cfg) != 0) goto fail;
  /* Workers: the configured count, at most one per stream this rank runs. */
  int64_t lo = cfg->dp_rank * ld->L;
  int n_local = (int)((lo + ld->L - 1) / ld->R - lo / ld->R + 1);
  int want = cfg->num_workers > 0 ? cfg->num_workers : 2;
  ld->n_workers = want < n_local ? want : n_local;
  ld->caches = calloc((size_t)ld->n_workers, sizeof *ld->caches);
  if (!ld->caches) {
    tt_set_error("out of host memory");
    goto fail;
  }
  for (int w = 0; w < ld->n_workers; w++)
    if (tt_bpe_cache_new(&ld->caches[w]) != 0) goto fail;
  if (make_streams(ld) != 0 || start_workers(ld) != 0) goto fail;
  *out = ld;
  return 0;
fail:;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tt_last_error());
  tt_data_loader_free(ld);
  return tt_set_error("%s", msg);
}

int64_t tt_data_loader_local_batch(const tt_data_loader *ld) { return ld->L; }

/* -- Batches ------------------------------------------------------------------------ */

int tt_data_loader_next(tt_data_loader *ld, int64_t *inputs, int64_t *targets) {
  int64_t T = ld->T, n = T + 1, lo = ld->cfg.dp_rank * ld->L;
  double t0 = now_s();
  pthread_mutex_lock(&ld->mu);
  for (int k = 0; k < ld->n_streams; k++) {
    stream *st = &ld->streams[k];
    for (int64_t i = 0; i < ld->R; i++) {
      while (st->q_len == 0 && !ld->failed) pthread_cond_wait(&ld->cond_data, &ld->mu);
      if (ld->failed) {
        pthread_mutex_unlock(&ld->mu);
        return tt_set_error("%s", ld->err);
      }
      const int32_t *seq = st->q + st->q_head * n;
      int64_t row = (int64_t)st->index * ld->R + i - lo;
      if (row >= 0 && row < ld->L) {
        for (int64_t t = 0; t < T; t++) {
          inputs[row * T + t] = seq[t];
          targets[row * T + t] = seq[t + 1];
        }
      }
      st->q_head = (st->q_head + 1) % st->q_cap;
      st->q_len--;
      pthread_cond_broadcast(&ld->cond_work);
    }
  }
  ld->batches++;
  ld->wait_last = now_s() - t0;
  ld->wait_total += ld->wait_last;
  pthread_mutex_unlock(&ld->mu);
  return 0;
}

int tt_data_loader_next_tensors(tt_data_loader *ld, tt_tensor **inputs, tt_tensor **targets) {
  int64_t shape[2] = {ld->L, ld->T};
  tt_tensor *x = NULL, *y = NULL;
  if (tt_tensor_empty(shape, 2, TT_I64, TT_CPU, &x) != 0 || tt_tensor_empty(shape, 2, TT_I64, TT_CPU, &y) != 0 ||
      tt_data_loader_next(ld, tt_tensor_data(x), tt_tensor_data(y)) != 0) {
    tt_tensor_release(x);
    tt_tensor_release(y);
    return -1;
  }
  *inputs = x;
  *targets = y;
  return 0;
}

int tt_data_loader_stats(tt_data_loader *ld, tt_data_stats *out) {
  pthread_mutex_lock(&ld->mu);
  memset(out, 0, sizeof *out);
  double el = now_s() - ld->t_start;
  out->tokens = ld->tokens;
  out->tokens_per_s = el > 0 ? (double)ld->tokens / el : 0;
  out->wait_s = ld->wait_last;
  out->total_wait_s = ld->wait_total;
  out->batches = ld->batches;
  for (int k = 0; k < ld->n_streams; k++) {
    out->queue_depth += ld->streams[k].q_len;
    for (int d = 0; d < ld->n_src; d++) {
      out->bad_lines += ld->streams[k].pk[d].rd.bad_lines;
      if (ld->streams[k].pk[d].epoch > out->epochs) out->epochs = ld->streams[k].pk[d].epoch;
    }
  }
  pthread_mutex_unlock(&ld->mu);
  return 0;
}

/* -- State -------------------------------------------------------------------------- */

/* Blob: header {magic "TTDLSTA1", i64 S, T, B, n_src, K, seed}, then per stream a record
** {i64 index, rng, produced, shuf_n, shuf tokens, q_len, queued sequences, per source
** {file, off, need_align, tok_pos, epoch, pass_tokens, bad_lines, n_pending, tokens}}.
** Several blobs (one per DP rank) may be concatenated; load_state takes the records of
** the streams this rank runs. */

static int put64(tt_buf *b, int64_t v) { return tt_buf_append(b, &v, 8); }

typedef struct rdr {
  const uint8_t *p;
  size_t n, pos;
} rdr;

static int get64(rdr *r, int64_t *v) {
  if (r->pos + 8 > r->n) return tt_set_error("data loader state: truncated");
  memcpy(v, r->p + r->pos, 8);
  r->pos += 8;
  return 0;
}

static int get_tokens(rdr *r, int32_t *dst, int64_t n) {
  if (n < 0 || r->pos + (size_t)n * 4 > r->n) return tt_set_error("data loader state: truncated");
  memcpy(dst, r->p + r->pos, (size_t)n * 4);
  r->pos += (size_t)n * 4;
  return 0;
}

int tt_data_loader_state(tt_data_loader *ld, const uint8_t **data, size_t *len) {
  int64_t n = ld->T + 1;
  tt_buf *b = &ld->state;
  b->len = 0;
  pthread_mutex_lock(&ld->mu);
  pause_workers(ld);
  int bad = tt_buf_append(b, "TTDLSTA1", 8) || put64(b, ld->S) || put64(b, ld->T) || put64(b, ld->B) ||
            put64(b, ld->n_src) || put64(b, ld->cfg.shuffle_buffer) || put64(b, (int64_t)ld->cfg.seed) ||
            put64(b, ld->n_streams);
  for (int k = 0; k < ld->n_streams && !bad; k++) {
    stream *st = &ld->streams[k];
    bad |= put64(b, st->index) || put64(b, (int64_t)st->rng) || put64(b, st->produced) ||
           put64(b, st->shuf_n) ||
           tt_buf_append(b, st->shuf, (size_t)(st->shuf_n * n) * sizeof(int32_t)) || put64(b, st->q_len);
    for (int64_t i = 0; i < st->q_len && !bad; i++)
      bad |= tt_buf_append(b, st->q + ((st->q_head + i) % st->q_cap) * n, (size_t)n * sizeof(int32_t));
    for (int d = 0; d < ld->n_src && !bad; d++) {
      packer *p = &st->pk[d];
      int64_t pend = (int64_t)(p->pending.len - p->head);
      bad |= put64(b, p->rd.file) || put64(b, p->rd.off) || put64(b, p->rd.need_align) ||
             put64(b, p->tok_pos) || put64(b, p->epoch) || put64(b, p->pass_tokens) ||
             put64(b, p->rd.bad_lines) || put64(b, pend) ||
             tt_buf_append(b, p->pending.data + p->head, (size_t)pend * sizeof(int32_t));
    }
  }
  resume_workers(ld);
  pthread_mutex_unlock(&ld->mu);
  if (bad) return -1;
  *data = (const uint8_t *)b->data;
  *len = b->len;
  return 0;
}

/* Reads one stream record into st (workers paused). When st is NULL the record is
** skipped. */
static int read_record(tt_data_loader *ld, rdr *r, stream *st) {
  int64_t n = ld->T + 1, rng = 0, produced = 0, shuf_n = 0, q_len = 0;
  TT_TRY(get64(r, &rng));
  TT_TRY(get64(r, &produced));
  TT_TRY(get64(r, &shuf_n));
  if (shuf_n < 0 || shuf_n > ld->cfg.shuffle_buffer) return tt_set_error("data loader state: bad shuffle buffer");
  if (st) {
    st->rng = (uint64_t)rng;
    st->produced = produced;
    st->shuf_n = shuf_n;
    TT_TRY(get_tokens(r, st->shuf, shuf_n * n));
  } else {
    r->pos += (size_t)(shuf_n * n) * 4;
  }
  TT_TRY(get64(r, &q_len));
  if (q_len < 0 || r->pos + (size_t)(q_len * n) * 4 > r->n) return tt_set_error("data loader state: truncated");
  if (st) {
    if (q_len > st->q_cap) {
      int32_t *q = malloc((size_t)(q_len * n) * sizeof *q);
      if (!q) return tt_set_error("out of host memory");
      free(st->q);
      st->q = q;
      st->q_cap = q_len;
    }
    TT_TRY(get_tokens(r, st->q, q_len * n));
    st->q_head = 0;
    st->q_len = q_len;
  } else {
    r->pos += (size_t)(q_len * n) * 4;
  }
  for (int d = 0; d < ld->n_src; d++) {
    int64_t file = 0, off = 0, align = 0, tok_pos = 0, epoch = 0, pass = 0, bad_lines = 0, pend = 0;
    TT_TRY(get64(r, &file));
    TT_TRY(get64(r, &off));
    TT_TRY(get64(r, &align));
    TT_TRY(get64(r, &tok_pos));
    TT_TRY(get64(r, &epoch));
    TT_TRY(get64(r, &pass));
    TT_TRY(get64(r, &bad_lines));
    TT_TRY(get64(r, &pend));
    if (pend < 0 || r->pos + (size_t)pend * 4 > r->n) return tt_set_error("data loader state: truncated");
    if (!st) {
      r->pos += (size_t)pend * 4;
      continue;
    }
    packer *p = &st->pk[d];
    if (file < 0 || file > ld->src[d].files.n) return tt_set_error("data loader state: bad file index");
    p->rd.file = (int32_t)file;
    p->rd.off = off;
    p->rd.need_align = (int)align;
    p->rd.bad_lines = bad_lines;
    if (p->rd.f) {
      fclose(p->rd.f);
      p->rd.f = NULL;
      p->rd.open_file = -1;
    }
    p->tok_pos = tok_pos;
    p->epoch = epoch;
    p->pass_tokens = pass;
    p->pending.len = 0;
    p->head = 0;
    TT_TRY(tt_ids_reserve(&p->pending, (size_t)pend));
    TT_TRY(get_tokens(r, p->pending.data, pend));
    p->pending.len = (size_t)pend;
  }
  return 0;
}

int tt_data_loader_load_state(tt_data_loader *ld, const uint8_t *data, size_t len) {
  rdr r = {data, len, 0};
  int rc = 0;
  pthread_mutex_lock(&ld->mu);
  pause_workers(ld);
  int *seen = calloc((size_t)ld->n_streams, sizeof *seen);
  if (!seen) rc = tt_set_error("out of host memory");
  while (rc == 0 && r.pos < r.n) {
    int64_t S = 0, T = 0, B = 0, n_src = 0, K = 0, seed = 0, n_rec = 0;
    if (r.pos + 8 > r.n || memcmp(data + r.pos, "TTDLSTA1", 8) != 0) {
      rc = tt_set_error("data loader state: bad magic (not a loader state)");
      break;
    }
    r.pos += 8;
    if (get64(&r, &S) || get64(&r, &T) || get64(&r, &B) || get64(&r, &n_src) || get64(&r, &K) ||
        get64(&r, &seed) || get64(&r, &n_rec)) {
      rc = -1;
      break;
    }
    if (S != ld->S || T != ld->T || n_src != ld->n_src || K != ld->cfg.shuffle_buffer ||
        (uint64_t)seed != ld->cfg.seed || B / S != ld->R) {
      rc = tt_set_error("data loader state was saved with another configuration (streams %lld, "
                        "seq_len %lld, sources %lld, shuffle buffer %lld, seed %lld, rows/stream %lld)",
                        (long long)S, (long long)T, (long long)n_src, (long long)K, (long long)seed,
                        (long long)(B / S));
      break;
    }
    for (int64_t i = 0; i < n_rec && rc == 0; i++) {
      int64_t index = -1;
      if (get64(&r, &index) != 0) { rc = -1; break; }
      int64_t k = index - ld->first_stream;
      stream *st = k >= 0 && k < ld->n_streams ? &ld->streams[k] : NULL;
      if (st) seen[k] = 1;
      rc = read_record(ld, &r, st);
    }
  }
  for (int k = 0; rc == 0 && k < ld->n_streams; k++)
    if (!seen[k]) rc = tt_set_error("data loader state has no record of stream %d (resuming on "
                                    "another DP size needs the states of all ranks)", ld->streams[k].index);
  free(seen);
  resume_workers(ld);
  pthread_mutex_unlock(&ld->mu);
  return rc;
}
