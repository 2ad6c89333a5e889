/*
** bpe_train.c — learning a byte-level BPE vocabulary from a corpus.
**
** 1. Count words: files are cut into chunks at places where the GPT-2 pattern cannot
**    join text across the cut; threads pre-tokenize chunks and count words in their own
**    hash maps, merged at the end (words sorted by bytes so the result is the same for any
**    thread count).
** 2. Merge: every adjacent symbol pair has a count (summed over words, weighted by word
**    count) and a list of the words it occurs in. A max-heap gives the most frequent pair
**    (ties: smaller left id, then smaller right id). Merging rewrites only the words that
**    contain the pair and adjusts the counts of the neighbouring pairs: no full recount.
** 3. Write tokenizer.json (Hugging Face format), vocab.json and merges.txt.
*/
#include "data/bpe_internal.h"
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

/* -- Word counting ------------------------------------------------------------------ */

typedef struct word_map {
  uint64_t *hash;        /* 0 = empty slot */
  uint32_t *off, *len;   /* bytes in arena */
  int64_t *count;
  uint32_t mask, n;
  tt_buf arena;
} word_map;

static int word_map_init(word_map *m, uint32_t cap) {
  memset(m, 0, sizeof *m);
  m->hash = calloc(cap, sizeof *m->hash);
  m->off = malloc(cap * sizeof *m->off);
  m->len = malloc(cap * sizeof *m->len);
  m->count = malloc(cap * sizeof *m->count);
  m->mask = cap - 1;
  if (!m->hash || !m->off || !m->len || !m->count) return tt_set_error("out of host memory (word counts)");
  return 0;
}

static void word_map_free(word_map *m) {
  free(m->hash);
  free(m->off);
  free(m->len);
  free(m->count);
  tt_buf_free(&m->arena);
}

static int word_map_add(word_map *m, const uint8_t *w, size_t n, int64_t count);

static int word_map_grow(word_map *m) {
  word_map big;
  TT_TRY(word_map_init(&big, (m->mask + 1) * 2));
  big.arena = m->arena;
  for (uint32_t i = 0; i <= m->mask; i++) {
    if (!m->hash[i]) continue;
    uint32_t j = (uint32_t)m->hash[i] & big.mask;
    while (big.hash[j]) j = (j + 1) & big.mask;
    big.hash[j] = m->hash[i];
    big.off[j] = m->off[i];
    big.len[j] = m->len[i];
    big.count[j] = m->count[i];
    big.n++;
  }
  m->arena = (tt_buf){0};
  word_map_free(m);
  *m = big;
  return 0;
}

static int word_map_add(word_map *m, const uint8_t *w, size_t n, int64_t count) {
  uint64_t h = tt_hash_bytes(w, n) | 1;
  uint32_t i = (uint32_t)h & m->mask;
  while (m->hash[i]) {
    if (m->hash[i] == h && m->len[i] == n && memcmp(m->arena.data + m->off[i], w, n) == 0) {
      m->count[i] += count;
      return 0;
    }
    i = (i + 1) & m->mask;
  }
  if (m->arena.len + n > 0xFFFFFFF0u) return tt_set_error("too many distinct words");
  m->hash[i] = h;
  m->off[i] = (uint32_t)m->arena.len;
  m->len[i] = (uint32_t)n;
  m->count[i] = count;
  TT_TRY(tt_buf_append(&m->arena, w, n));
  if (++m->n * 2 > m->mask) TT_TRY(word_map_grow(m));
  return 0;
}

typedef struct chunk {
  const char *text;
  size_t len;
  int jsonl;
  const char *path;
} chunk;

typedef struct count_job {
  chunk *chunks;
  size_t n_chunks;
  size_t next;            /* next chunk to take (under mu) */
  pthread_mutex_t mu;
  int failed;
  char err[512];
} count_job;

static int count_text(word_map *m, tt_buf *clean, const char *text, size_t len) {
  const uint8_t *s = (const uint8_t *)text;
  if (tt_utf8_valid_prefix(s, len) != len) {
    clean->len = 0;
    TT_TRY(tt_buf_reserve(clean, len * 3));
    len = tt_utf8_sanitize(s, len, (uint8_t *)clean->data);
    s = (const uint8_t *)clean->data;
  }
  size_t pos = 0;
  while (pos < len) {
    size_t end = tt_pretok_next(s, len, pos);
    TT_TRY(word_map_add(m, s + pos, end - pos, 1));
    pos = end;
  }
  return 0;
}

static int count_chunk(word_map *m, const chunk *c, tt_json *doc, tt_buf *str, tt_buf *clean) {
  if (!c->jsonl) return count_text(m, clean, c->text, c->len);
  size_t pos = 0;
  while (pos < c->len) {
    const char *s = c->text + pos;
    const char *nl = memchr(s, '\n', c->len - pos);
    size_t n = nl ? (size_t)(nl - s) : c->len - pos;
    pos += n + (nl ? 1 : 0);
    if (n == 0) continue;
    /* Malformed lines are the loader's business (with file:line warnings); the trainer
    ** just skips them. */
    if (tt_json_parse(doc, s, n) != 0) continue;
    int32_t v = tt_json_get(doc, 0, "text");
    if (v < 0 || doc->nodes[v].type != TT_JSON_STRING) continue;
    TT_TRY(tt_json_string(doc, v, str));
    TT_TRY(count_text(m, clean, str->data, str->len));
  }
  return 0;
}

typedef struct count_worker {
  count_job *job;
  word_map map;
} count_worker;

static void *count_main(void *arg) {
  count_worker *w = arg;
  count_job *job = w->job;
  tt_json doc = {0};
  tt_buf str = {0}, clean = {0};
  for (;;) {
    pthread_mutex_lock(&job->mu);
    size_t i = job->failed ? job->n_chunks : job->next++;
    pthread_mutex_unlock(&job->mu);
    if (i >= job->n_chunks) break;
    if (count_chunk(&w->map, &job->chunks[i], &doc, &str, &clean) != 0) {
      pthread_mutex_lock(&job->mu);
      if (!job->failed) snprintf(job->err, sizeof job->err, "%s: %s", job->chunks[i].path, tt_last_error());
      job->failed = 1;
      pthread_mutex_unlock(&job->mu);
      break;
    }
  }
  tt_json_free(&doc);
  tt_buf_free(&str);
  tt_buf_free(&clean);
  return NULL;
}

static int is_plain_ascii(char c) { return c > 0x20 && c < 0x7F; }

/* Cuts a text file into chunks of about `target` bytes at a safe place: after a newline
** that follows a printable ASCII character and precedes one (the pattern never joins
** across such a newline). JSONL files are cut at any newline. */
static int add_chunks(chunk **chunks, size_t *n, size_t *cap, const char *path, const char *text,
                      size_t len, int jsonl, size_t target) {
  size_t start = 0;
  while (start < len) {
    size_t end = start + target;
    if (end >= len) {
      end = len;
    } else {
      size_t limit = end + (1u << 20) < len ? end + (1u << 20) : len;
      while (end < limit) {
        if (text[end - 1] == '\n' &&
            (jsonl || (end >= 2 && is_plain_ascii(text[end - 2]) && is_plain_ascii(text[end]))))
          break;
        end++;
      }
    }
    if (*n == *cap) {
      size_t c2 = *cap ? *cap * 2 : 64;
      chunk *p = realloc(*chunks, c2 * sizeof *p);
      if (!p) return tt_set_error("out of host memory (chunks)");
      *chunks = p;
      *cap = c2;
    }
    (*chunks)[(*n)++] = (chunk){text + start, end - start, jsonl, path};
    start = end;
  }
  return 0;
}

static int has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Counts the words of all files into *out (one map), using num_threads threads. */
static int count_words(const char *const *files, int n_files, int num_threads, word_map *out,
                       int64_t *bytes_read) {
  char **texts = calloc((size_t)n_files, sizeof *texts);
  chunk *chunks = NULL;
  size_t n_chunks = 0, cap = 0;
  count_worker *workers = NULL;
  pthread_t *tids = NULL;
  int rc = -1, started = 0;
  count_job job = {0};
  pthread_mutex_init(&job.mu, NULL);
  if (!texts) { tt_set_error("out of host memory"); goto done; }
  *bytes_read = 0;
  for (int f = 0; f < n_files; f++) {
    size_t len;
    if (tt_read_file(files[f], &texts[f], &len) != 0) goto done;
    *bytes_read += (int64_t)len;
    if (add_chunks(&chunks, &n_chunks, &cap, files[f], texts[f], len, has_suffix(files[f], ".jsonl"),
                   1u << 20) != 0)
      goto done;
  }
  if (num_threads < 1) num_threads = 1;
  workers = calloc((size_t)num_threads, sizeof *workers);
  tids = calloc((size_t)num_threads, sizeof *tids);
  if (!workers || !tids) { tt_set_error("out of host memory"); goto done; }
  job.chunks = chunks;
  job.n_chunks = n_chunks;
  for (int t = 0; t < num_threads; t++) {
    workers[t].job = &job;
    if (word_map_init(&workers[t].map, 1u << 16) != 0) goto done;
  }
  for (; started < num_threads; started++)
    if (pthread_create(&tids[started], NULL, count_main, &workers[started]) != 0) {
      tt_set_error("cannot start a counting thread");
      pthread_mutex_lock(&job.mu);
      job.failed = 1;
      pthread_mutex_unlock(&job.mu);
      break;
    }
  for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
  if (job.failed) {
    if (job.err[0]) tt_set_error("%s", job.err);
    goto done;
  }
  *out = workers[0].map;
  workers[0].map = (word_map){0};
  for (int t = 1; t < num_threads; t++) {
    word_map *m = &workers[t].map;
    for (uint32_t i = 0; i <= m->mask; i++)
      if (m->hash[i] &&
          word_map_add(out, (const uint8_t *)m->arena.data + m->off[i], m->len[i], m->count[i]) != 0)
        goto done;
  }
  rc = 0;
done:
  for (int f = 0; texts && f < n_files; f++) free(texts[f]);
  free(texts);
  free(chunks);
  if (workers)
    for (int t = 0; t < num_threads; t++) word_map_free(&workers[t].map);
  free(workers);
  free(tids);
  pthread_mutex_destroy(&job.mu);
  if (rc != 0 && out->hash) {
    word_map_free(out);
    *out = (word_map){0};
  }
  return rc;
}

/* -- Merging ------------------------------------------------------------------------ */

typedef struct pair_info {
  int32_t a, b;
  int64_t count;
  tt_ids words;          /* words that held the pair at some point (may repeat, may be stale) */
  uint32_t stamp;        /* merge step that last changed the count */
} pair_info;

typedef struct heap_entry {
  int64_t count;
  int32_t a, b;
  int32_t pair;
} heap_entry;

typedef struct trainer {
  /* Words: symbols sym[woff[w] .. woff[w] + wlen[w]), count wcount[w]. */
  int32_t *sym;
  int64_t *woff;
  int32_t *wlen;
  int64_t *wcount;
  uint32_t *wstamp;
  int64_t n_words;
  /* Pairs: (a, b) -> index into pairs (open addressing, value index + 1). */
  pair_info *pairs;
  int64_t n_pairs, pairs_cap;
  int64_t *pmap;
  uint64_t pmask;
  heap_entry *heap;
  int64_t heap_n, heap_cap;
  int32_t *changed;      /* pairs changed in the current step */
  int64_t n_changed, changed_cap;
} trainer;

static int heap_better(const heap_entry *x, const heap_entry *y) {
  if (x->count != y->count) return x->count > y->count;
  if (x->a != y->a) return x->a < y->a;
  return x->b < y->b;
}

static int heap_push(trainer *t, heap_entry e) {
  if (t->heap_n == t->heap_cap) {
    int64_t cap = t->heap_cap ? t->heap_cap * 2 : 1 << 16;
    heap_entry *h = realloc(t->heap, (size_t)cap * sizeof *h);
    if (!h) return tt_set_error("out of host memory (pair heap)");
    t->heap = h;
    t->heap_cap = cap;
  }
  int64_t k = t->heap_n++;
  t->heap[k] = e;
  while (k > 0 && heap_better(&t->heap[k], &t->heap[(k - 1) / 2])) {
    heap_entry tmp = t->heap[k];
    t->heap[k] = t->heap[(k - 1) / 2];
    t->heap[(k - 1) / 2] = tmp;
    k = (k - 1) / 2;
  }
  return 0;
}

static heap_entry heap_pop(trainer *t) {
  heap_entry top = t->heap[0];
  t->heap[0] = t->heap[--t->heap_n];
  for (int64_t k = 0;;) {
    int64_t l = 2 * k + 1, r = l + 1, m = k;
    if (l < t->heap_n && heap_better(&t->heap[l], &t->heap[m])) m = l;
    if (r < t->heap_n && heap_better(&t->heap[r], &t->heap[m])) m = r;
    if (m == k) break;
    heap_entry tmp = t->heap[k];
    t->heap[k] = t->heap[m];
    t->heap[m] = tmp;
    k = m;
  }
  return top;
}

static int grow_pmap(trainer *t) {
  uint64_t cap = t->pmap ? (t->pmask + 1) * 2 : 1 << 16;
  int64_t *m = calloc(cap, sizeof *m);
  if (!m) return tt_set_error("out of host memory (pair map)");
  free(t->pmap);
  t->pmap = m;
  t->pmask = cap - 1;
  for (int64_t p = 0; p < t->n_pairs; p++) {
    uint64_t key = ((uint64_t)(uint32_t)t->pairs[p].a << 32) | (uint32_t)t->pairs[p].b;
    uint64_t i = tt_hash_u64(key) & t->pmask;
    while (m[i]) i = (i + 1) & t->pmask;
    m[i] = p + 1;
  }
  return 0;
}

/* Index of pair (a, b), created with count 0 when new; -1 on allocation failure. */
static int64_t pair_index(trainer *t, int32_t a, int32_t b) {
  if (!t->pmap || (uint64_t)(t->n_pairs + 1) * 2 > t->pmask + 1)
    if (grow_pmap(t) != 0) return -1;
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint64_t i = tt_hash_u64(key) & t->pmask;
  while (t->pmap[i]) {
    pair_info *p = &t->pairs[t->pmap[i] - 1];
    if (p->a == a && p->b == b) return t->pmap[i] - 1;
    i = (i + 1) & t->pmask;
  }
  if (t->n_pairs == t->pairs_cap) {
    int64_t cap = t->pairs_cap ? t->pairs_cap * 2 : 1 << 16;
    pair_info *np = realloc(t->pairs, (size_t)cap * sizeof *np);
    if (!np) {
      tt_set_error("out of host memory (pairs)");
      return -1;
    }
    t->pairs = np;
    t->pairs_cap = cap;
  }
  int64_t idx = t->n_pairs++;
  t->pairs[idx] = (pair_info){a, b, 0, {0}, 0};
  t->pmap[i] = idx + 1;
  return idx;
}

/* Adds delta to pair (a, b) for word w (recorded in the pair's word list when delta > 0). */
static int pair_update(trainer *t, int32_t a, int32_t b, int64_t delta, int64_t w, uint32_t step) {
  int64_t idx = pair_index(t, a, b);
  if (idx < 0) return -1;
  pair_info *p = &t->pairs[idx];
  p->count += delta;
  if (delta > 0 && (p->words.len == 0 || p->words.data[p->words.len - 1] != (int32_t)w)) {
    TT_TRY(tt_ids_reserve(&p->words, 1));
    p->words.data[p->words.len++] = (int32_t)w;
  }
  if (p->stamp != step) {
    p->stamp = step;
    if (t->n_changed == t->changed_cap) {
      int64_t cap = t->changed_cap ? t->changed_cap * 2 : 1024;
      int32_t *c = realloc(t->changed, (size_t)cap * sizeof *c);
      if (!c) return tt_set_error("out of host memory");
      t->changed = c;
      t->changed_cap = cap;
    }
    t->changed[t->n_changed++] = (int32_t)idx;
  }
  return 0;
}

static int push_changed(trainer *t) {
  for (int64_t k = 0; k < t->n_changed; k++) {
    pair_info *p = &t->pairs[t->changed[k]];
    if (p->count > 0) TT_TRY(heap_push(t, (heap_entry){p->count, p->a, p->b, t->changed[k]}));
  }
  t->n_changed = 0;
  return 0;
}

/* Replaces every (a, b) in the words listed for pair pi by z, adjusting neighbours. */
static int apply_merge(trainer *t, int64_t pi, int32_t z, uint32_t step) {
  int32_t a = t->pairs[pi].a, b = t->pairs[pi].b;
  tt_ids words = t->pairs[pi].words;
  t->pairs[pi].words = (tt_ids){0};
  int rc = 0;
  for (size_t k = 0; k < words.len && rc == 0; k++) {
    int64_t w = words.data[k];
    if (t->wstamp[w] == step) continue;
    t->wstamp[w] = step;
    int32_t *s = t->sym + t->woff[w];
    int32_t n = t->wlen[w], j = 0;
    int64_t c = t->wcount[w];
    for (int32_t i = 0; i < n && rc == 0;) {
      if (i + 1 < n && s[i] == a && s[i + 1] == b) {
        if (j > 0) {
          rc |= pair_update(t, s[j - 1], a, -c, w, step);
          rc |= pair_update(t, s[j - 1], z, c, w, step);
        }
        if (i + 2 < n) {
          rc |= pair_update(t, b, s[i + 2], -c, w, step);
          rc |= pair_update(t, z, s[i + 2], c, w, step);
        }
        s[j++] = z;
        i += 2;
      } else {
        s[j++] = s[i++];
      }
    }
    t->wlen[w] = j;
  }
  tt_ids_free(&words);
  t->pairs[pi].count = 0;
  return rc ? -1 : 0;
}

static void trainer_free(trainer *t) {
  free(t->sym);
  free(t->woff);
  free(t->wlen);
  free(t->wcount);
  free(t->wstamp);
  for (int64_t p = 0; p < t->n_pairs; p++) tt_ids_free(&t->pairs[p].words);
  free(t->pairs);
  free(t->pmap);
  free(t->heap);
  free(t->changed);
}

static const word_map *sort_map;
static int cmp_words(const void *x, const void *y) {
  uint32_t i = *(const uint32_t *)x, j = *(const uint32_t *)y;
  uint32_t li = sort_map->len[i], lj = sort_map->len[j];
  int c = memcmp(sort_map->arena.data + sort_map->off[i], sort_map->arena.data + sort_map->off[j],
                 li < lj ? li : lj);
  return c ? c : (li > lj) - (li < lj);
}

/* Builds the word arrays (sorted by bytes: deterministic ids and ties) and pair counts. */
static int trainer_init(trainer *t, const word_map *m) {
  memset(t, 0, sizeof *t);
  uint32_t *order = malloc((size_t)m->n * sizeof *order);
  if (!order) return tt_set_error("out of host memory");
  uint32_t k = 0;
  for (uint32_t i = 0; i <= m->mask; i++) if (m->hash[i]) order[k++] = i;
  sort_map = m;
  qsort(order, m->n, sizeof *order, cmp_words);
  t->n_words = m->n;
  t->sym = malloc((m->arena.len + 1) * sizeof *t->sym);
  t->woff = malloc((size_t)(m->n + 1) * sizeof *t->woff);
  t->wlen = malloc((size_t)(m->n + 1) * sizeof *t->wlen);
  t->wcount = malloc((size_t)(m->n + 1) * sizeof *t->wcount);
  t->wstamp = calloc((size_t)m->n + 1, sizeof *t->wstamp);
  if (!t->sym || !t->woff || !t->wlen || !t->wcount || !t->wstamp) {
    free(order);
    return tt_set_error("out of host memory (words)");
  }
  int64_t off = 0;
  for (int64_t w = 0; w < t->n_words; w++) {
    uint32_t i = order[w];
    const uint8_t *bytes = (const uint8_t *)m->arena.data + m->off[i];
    t->woff[w] = off;
    t->wlen[w] = (int32_t)m->len[i];
    t->wcount[w] = m->count[i];
    for (uint32_t b = 0; b < m->len[i]; b++) t->sym[off + b] = bytes[b];
    off += m->len[i];
  }
  free(order);
  for (int64_t w = 0; w < t->n_words; w++) {
    const int32_t *s = t->sym + t->woff[w];
    for (int32_t i = 0; i + 1 < t->wlen[w]; i++)
      TT_TRY(pair_update(t, s[i], s[i + 1], t->wcount[w], w, 1));
  }
  return push_changed(t);
}

/* -- Output ------------------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const tt_buf *b) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return tt_set_error("%s: cannot create: %s", path, strerror(errno));
  size_t n = fwrite(b->data, 1, b->len, f);
  int bad = n != b->len;
  bad |= fclose(f) != 0;
  if (bad) return tt_set_error("%s: write failed", path);
  return 0;
}

/* Byte-level string of id's bytes appended as a JSON string. */
static int put_token(tt_buf *out, const tt_bpe *bpe, int32_t id, tt_buf *tmp, int json) {
  size_t l = (size_t)bpe->tok_len[id];
  tmp->len = 0;
  TT_TRY(tt_buf_reserve(tmp, 2 * l));
  tmp->len = tt_bytelevel_encode((const uint8_t *)bpe->tok_bytes.data + bpe->tok_off[id], l, tmp->data);
  return json ? tt_buf_json_string(out, tmp->data, tmp->len) : tt_buf_append(out, tmp->data, tmp->len);
}

static int write_outputs(const char *dir, const tt_bpe *bpe, const int32_t (*merges)[2],
                         int n_merges, int n_byte_ids) {
  tt_buf vocab = {0}, mtxt = {0}, js = {0}, tmp = {0};
  int rc = -1;
  /* vocab.json: byte-level string -> id, skipping ids that are special tokens. */
  if (tt_buf_append(&vocab, "{", 1)) goto done;
  int first = 1;
  for (int32_t id = 0; id < n_byte_ids; id++) {
    if (bpe->tok_len[id] < 0) continue;
    if (!first && tt_buf_append(&vocab, ",", 1)) goto done;
    first = 0;
    if (put_token(&vocab, bpe, id, &tmp, 1) || tt_buf_printf(&vocab, ":%d", (int)id)) goto done;
  }
  for (int i = 0; i < bpe->n_specials; i++) {
    if (tt_buf_append(&vocab, ",", 1) ||
        tt_buf_json_string(&vocab, bpe->specials[i].content, bpe->specials[i].len) ||
        tt_buf_printf(&vocab, ":%d", (int)bpe->specials[i].id))
      goto done;
  }
  if (tt_buf_append(&vocab, "}", 1)) goto done;
  if (tt_buf_append(&mtxt, "#version: 0.2\n", 14)) goto done;
  for (int k = 0; k < n_merges; k++) {
    if (put_token(&mtxt, bpe, merges[k][0], &tmp, 0) || tt_buf_append(&mtxt, " ", 1) ||
        put_token(&mtxt, bpe, merges[k][1], &tmp, 0) || tt_buf_append(&mtxt, "\n", 1))
      goto done;
  }
  if (tt_buf_printf(&js, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
                         "  \"added_tokens\": ["))
    goto done;
  for (int i = 0; i < bpe->n_specials; i++) {
    if (tt_buf_printf(&js, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", (int)bpe->specials[i].id) ||
        tt_buf_json_string(&js, bpe->specials[i].content, bpe->specials[i].len) ||
        tt_buf_printf(&js, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                           "\"normalized\": false, \"special\": true}"))
      goto done;
  }
  if (tt_buf_printf(&js,
        "\n  ],\n  \"normalizer\": null,\n"
        "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"trim_offsets\": true, \"use_regex\": true},\n"
        "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
        "\"trim_offsets\": false, \"use_regex\": true},\n"
        "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
        "\"trim_offsets\": true, \"use_regex\": true},\n"
        "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
        "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, "
        "\"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
        "    \"vocab\": ") ||
      tt_buf_append(&js, vocab.data, vocab.len) || tt_buf_printf(&js, ",\n    \"merges\": ["))
    goto done;
  for (int k = 0; k < n_merges; k++) {
    /* "left right" as one JSON string. */
    tmp.len = 0;
    tt_buf pair = {0};
    int bad = put_token(&pair, bpe, merges[k][0], &tmp, 0) || tt_buf_append(&pair, " ", 1) ||
              put_token(&pair, bpe, merges[k][1], &tmp, 0) ||
              tt_buf_append(&js, k ? ",\n      " : "\n      ", k ? 8 : 7) ||
              tt_buf_json_string(&js, pair.data, pair.len);
    tt_buf_free(&pair);
    if (bad) goto done;
  }
  if (tt_buf_printf(&js, "\n    ]\n  }\n}\n")) goto done;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    tt_set_error("%s: cannot create directory: %s", dir, strerror(errno));
    goto done;
  }
  if (write_file(dir, "vocab.json", &vocab) || write_file(dir, "merges.txt", &mtxt) ||
      write_file(dir, "tokenizer.json", &js))
    goto done;
  rc = 0;
done:
  tt_buf_free(&vocab);
  tt_buf_free(&mtxt);
  tt_buf_free(&js);
  tt_buf_free(&tmp);
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tt_bpe_train(const char *const *files, int n_files, int vocab_size, const char *out_dir,
                 const char *specials, int num_threads, int verbose) {
  if (n_files <= 0) return tt_set_error("tokenizer train: no input files");
  const char *spec = specials ? specials : "<|endoftext|>\0";
  int n_specials = 0;
  for (const char *s = spec; *s; s += strlen(s) + 1) n_specials++;
  if (vocab_size < 256 + n_specials)
    return tt_set_error("tokenizer train: --vocab-size %d is below 256 bytes + %d special tokens",
                        vocab_size, n_specials);
  double t0 = now_s();
  word_map words = {0};
  int64_t bytes = 0;
  TT_TRY(count_words(files, n_files, num_threads, &words, &bytes));
  if (verbose)
    fprintf(stderr, "tokenizer train: %.1f MB, %u distinct words counted in %.2f s\n",
            (double)bytes / 1e6, words.n, now_s() - t0);
  trainer t;
  tt_bpe *bpe = malloc(sizeof *bpe);
  int32_t (*merges)[2] = malloc((size_t)vocab_size * sizeof *merges);
  int rc = -1, n_merges = 0;
  if (!bpe || !merges) {
    free(bpe);
    free(merges);
    word_map_free(&words);
    return tt_set_error("out of host memory");
  }
  if (tt_bpe_init(bpe, vocab_size) != 0) {
    free(bpe);
    bpe = NULL;
    goto done;
  }
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    if (tt_bpe_set_token(bpe, b, &byte, 1) != 0) goto done;
  }
  if (trainer_init(&t, &words) != 0) goto done_t;
  word_map_free(&words);
  words = (word_map){0};
  int32_t next_id = 256;
  uint32_t step = 1;
  while (next_id + n_specials < vocab_size && t.heap_n > 0) {
    heap_entry e = heap_pop(&t);
    if (t.pairs[e.pair].count != e.count || e.count <= 0) continue;
    int32_t a = e.a, b = e.b;
    /* The merged token's bytes may already be a token (reached by another split):
    ** reuse its id, as Hugging Face's trainer does. */
    size_t la = (size_t)bpe->tok_len[a], lb = (size_t)bpe->tok_len[b];
    uint8_t *cat = malloc(la + lb);
    if (!cat) { tt_set_error("out of host memory"); goto done_t; }
    memcpy(cat, bpe->tok_bytes.data + bpe->tok_off[a], la);
    memcpy(cat + la, bpe->tok_bytes.data + bpe->tok_off[b], lb);
    int32_t z = tt_bpe_lookup(bpe, cat, la + lb);
    int fresh = z < 0;
    if (fresh) z = next_id;
    int bad = fresh && tt_bpe_set_token(bpe, z, cat, la + lb) != 0;
    free(cat);
    if (bad) goto done_t;
    if (fresh) next_id++;
    merges[n_merges][0] = a;
    merges[n_merges][1] = b;
    n_merges++;
    step++;
    if (apply_merge(&t, e.pair, z, step) != 0 || push_changed(&t) != 0) goto done_t;
    if (verbose && n_merges % 5000 == 0)
      fprintf(stderr, "tokenizer train: %d merges, %.2f s\n", n_merges, now_s() - t0);
  }
  int32_t n_byte_ids = next_id;
  for (const char *s = spec; *s; s += strlen(s) + 1)
    if (tt_bpe_add_special(bpe, s, next_id++) != 0) goto done_t;
  if (write_outputs(out_dir, bpe, (const int32_t (*)[2])merges, n_merges, n_byte_ids) != 0) goto done_t;
  if (verbose)
    fprintf(stderr, "tokenizer train: %d merges, vocabulary %d, %.2f s total -> %s\n", n_merges,
            (int)next_id, now_s() - t0, out_dir);
  rc = 0;
done_t:
  trainer_free(&t);
done:
  word_map_free(&words);
  tt_bpe_free(bpe);
  free(merges);
  return rc;
}
