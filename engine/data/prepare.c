/*
** prepare.c — `tetra data prepare`: documents (engine/data/docs.c) tokenized in parallel
** and written as token shards in the format engine/data/bpe_internal.h describes (read
** back by engine/data/shards.c).
*/
#include "data/bpe_internal.h"
#include <errno.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

/* -- Writer ------------------------------------------------------------------------- */

typedef struct shard_writer {
  const char *dir;
  int index;
  FILE *f;
  char tmp[4096], final[4096];
  int64_t n, max;
  int tb;
  int32_t vocab, eos;
  int64_t total;
} shard_writer;

static int writer_close(shard_writer *w) {
  if (!w->f) return 0;
  uint8_t h[SHARD_HEADER] = {0};
  uint32_t version = SHARD_VERSION, tb = (uint32_t)w->tb;
  memcpy(h, "TTTOKENS", 8);
  memcpy(h + 8, &version, 4);
  memcpy(h + 12, &tb, 4);
  memcpy(h + 16, &w->n, 8);
  memcpy(h + 24, &w->vocab, 4);
  memcpy(h + 28, &w->eos, 4);
  int bad = fseeko(w->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->f) != sizeof h;
  bad |= fflush(w->f) != 0 || fsync(fileno(w->f)) != 0;
  bad |= fclose(w->f) != 0;
  w->f = NULL;
  if (bad) return tt_set_error("%s: write failed: %s", w->tmp, strerror(errno));
  if (rename(w->tmp, w->final) != 0) return tt_set_error("%s: rename failed: %s", w->final, strerror(errno));
  w->total += w->n;
  return 0;
}

static int writer_open(shard_writer *w) {
  snprintf(w->final, sizeof w->final, "%s/%05d.tok", w->dir, w->index);
  snprintf(w->tmp, sizeof w->tmp, "%s/%05d.tok.tmp", w->dir, w->index);
  w->index++;
  w->f = fopen(w->tmp, "wb");
  if (!w->f) return tt_set_error("%s: cannot create: %s", w->tmp, strerror(errno));
  uint8_t h[SHARD_HEADER] = {0};
  if (fwrite(h, 1, sizeof h, w->f) != sizeof h) return tt_set_error("%s: write failed", w->tmp);
  w->n = 0;
  return 0;
}

static int writer_put(shard_writer *w, const int32_t *ids, size_t n) {
  uint16_t small[4096];
  while (n > 0) {
    if (!w->f) TT_TRY(writer_open(w));
    size_t k = n;
    if ((int64_t)k > w->max - w->n) k = (size_t)(w->max - w->n);
    if (w->tb == 4) {
      if (fwrite(ids, 4, k, w->f) != k) return tt_set_error("%s: write failed", w->tmp);
    } else {
      for (size_t i = 0; i < k;) {
        size_t m = k - i < 4096 ? k - i : 4096;
        for (size_t j = 0; j < m; j++) small[j] = (uint16_t)ids[i + j];
        if (fwrite(small, 2, m, w->f) != m) return tt_set_error("%s: write failed", w->tmp);
        i += m;
      }
    }
    w->n += (int64_t)k;
    ids += k;
    n -= k;
    if (w->n == w->max) TT_TRY(writer_close(w));
  }
  return 0;
}

/* -- Prepare ------------------------------------------------------------------------ */

enum { PREPARE_BATCH_BYTES = 8 << 20 };

int tt_data_prepare(const char *const *files, int n_files, const char *tokenizer,
                    const char *text_field, const char *out_dir, int64_t shard_tokens,
                    int num_threads, int verbose) {
  tt_buf patterns = {0};
  for (int i = 0; i < n_files; i++)
    if (tt_buf_append(&patterns, files[i], strlen(files[i])) || tt_buf_append(&patterns, "\n", 1)) {
      tt_buf_free(&patterns);
      return -1;
    }
  tt_doc_files fs;
  tt_bpe *bpe = NULL;
  int rc = tt_doc_files_expand(patterns.data, -1, &fs);
  tt_buf_free(&patterns);
  if (rc != 0) return -1;
  rc = -1;
  tt_doc_reader rd;
  tt_doc_reader_init(&rd, &fs, text_field, 0, fs.total, 100);
  tt_bpe_cache **caches = NULL;
  tt_ids *outs = NULL;
  size_t docs_cap = 0;
  tt_buf batch = {0};
  size_t *doc_off = NULL;
  int *doc_end = NULL;
  shard_writer w = {0};
  if (num_threads < 1) num_threads = 1;
  if (fs.type == TT_DATA_TOKENS) {
    tt_set_error("data prepare: the inputs are token shards already");
    goto done;
  }
  if (tt_bpe_load(tokenizer, &bpe) != 0) goto done;
  int32_t eos = tt_bpe_eos_id(bpe);
  if (eos < 0) {
    tt_set_error("%s: the tokenizer has no end-of-text token", tokenizer);
    goto done;
  }
  if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
    tt_set_error("%s: cannot create directory: %s", out_dir, strerror(errno));
    goto done;
  }
  w.dir = out_dir;
  w.max = shard_tokens;
  w.tb = tt_bpe_vocab_size(bpe) <= 65536 ? 2 : 4;
  w.vocab = tt_bpe_vocab_size(bpe);
  w.eos = eos;
  caches = calloc((size_t)num_threads, sizeof *caches);
  if (!caches) { tt_set_error("out of host memory"); goto done; }
  for (int t = 0; t < num_threads; t++)
    if (tt_bpe_cache_new(&caches[t]) != 0) goto done;
  for (int more = 1; more;) {
    /* Gather documents up to a batch, tokenize them in parallel, write them in order. */
    size_t n_docs = 0;
    batch.len = 0;
    while (batch.len < PREPARE_BATCH_BYTES) {
      const char *text;
      size_t len;
      int end_doc;
      int got = tt_doc_reader_next(&rd, &text, &len, &end_doc);
      if (got < 0) goto done;
      if (got == 0) { more = 0; break; }
      if (n_docs == docs_cap) {
        size_t cap = docs_cap ? docs_cap * 2 : 1024;
        size_t *o = realloc(doc_off, (cap + 1) * sizeof *o);
        if (o) doc_off = o;
        int *e = realloc(doc_end, cap * sizeof *e);
        if (e) doc_end = e;
        tt_ids *v = realloc(outs, cap * sizeof *v);
        if (v) {
          memset(v + docs_cap, 0, (cap - docs_cap) * sizeof *v);
          outs = v;
        }
        if (!o || !e || !v) { tt_set_error("out of host memory"); goto done; }
        docs_cap = cap;
      }
      doc_off[n_docs] = batch.len;
      doc_end[n_docs] = end_doc;
      if (tt_buf_append(&batch, text, len) != 0) goto done;
      n_docs++;
    }
    if (n_docs == 0) break;
    doc_off[n_docs] = batch.len;
    int failed = 0;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) reduction(| : failed)
    for (size_t d = 0; d < n_docs; d++) {
      outs[d].len = 0;
      if (tt_bpe_encode_append(bpe, caches[omp_get_thread_num()], batch.data + doc_off[d],
                               doc_off[d + 1] - doc_off[d], 0, &outs[d]) != 0 ||
          (doc_end[d] && tt_ids_reserve(&outs[d], 1) != 0))
        failed = 1;
      else if (doc_end[d])
        outs[d].data[outs[d].len++] = eos;
    }
    if (failed) {
      tt_set_error("data prepare: out of host memory while tokenizing");
      goto done;
    }
    for (size_t d = 0; d < n_docs; d++)
      if (writer_put(&w, outs[d].data, outs[d].len) != 0) goto done;
    if (verbose)
      fprintf(stderr, "tetra data prepare: %lld tokens written\n", (long long)(w.total + w.n));
  }
  if (writer_close(&w) != 0) goto done;
  if (verbose)
    fprintf(stderr, "tetra data prepare: %lld tokens in %d shard(s) under %s\n", (long long)w.total,
            w.index, out_dir);
  rc = 0;
done:
  if (w.f) {
    fclose(w.f);
    remove(w.tmp);
  }
  for (size_t d = 0; d < docs_cap; d++) tt_ids_free(&outs[d]);
  free(outs);
  free(doc_off);
  free(doc_end);
  tt_buf_free(&batch);
  if (caches)
    for (int t = 0; t < num_threads; t++) tt_bpe_cache_free(caches[t]);
  free(caches);
  tt_doc_reader_free(&rd);
  tt_doc_files_free(&fs);
  tt_bpe_free(bpe);
  return rc;
}
