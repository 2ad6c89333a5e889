/*
** bpe.c — byte-level BPE encoding and decoding, GPT-2 style.
**
** Text is split into pre-tokens by the GPT-2 pattern (unicode.c); each pre-token's bytes
** start as single-byte ids and adjacent pairs are merged lowest rank first (leftmost on
** ties) until no adjacent pair has a rank. A pair's rank and merged id come from one hash
** lookup keyed by (left id, right id): merges.txt order for GPT-2/HF files, the merged
** token's rank for tiktoken files (bpe_load.c builds both into the same table). Encoded
** pre-tokens are remembered in a word cache, which is what makes natural text fast.
*/
#define _GNU_SOURCE   /* memmem */
#include "data/bpe_internal.h"

/* -- Building ----------------------------------------------------------------------- */

int tt_bpe_init(tt_bpe *bpe, int32_t n_ids_hint) {
  memset(bpe, 0, sizeof *bpe);
  bpe->unk_id = -1;
  for (int b = 0; b < 256; b++) bpe->byte_id[b] = -1;
  uint32_t cap = 1024;
  while (cap < (uint32_t)n_ids_hint * 2u) cap *= 2;
  bpe->bytes_map = calloc(cap, sizeof *bpe->bytes_map);
  if (!bpe->bytes_map) return tt_set_error("out of host memory (tokenizer)");
  bpe->bytes_mask = cap - 1;
  return tt_bpe_cache_new(&bpe->cache);
}

static int32_t *bytes_slot(const tt_bpe *bpe, const uint8_t *bytes, size_t len) {
  uint32_t i = (uint32_t)tt_hash_bytes(bytes, len) & bpe->bytes_mask;
  for (;;) {
    int32_t *slot = &bpe->bytes_map[i];
    if (*slot == 0) return slot;
    int32_t id = *slot - 1;
    if ((size_t)bpe->tok_len[id] == len &&
        memcmp(bpe->tok_bytes.data + bpe->tok_off[id], bytes, len) == 0)
      return slot;
    i = (i + 1) & bpe->bytes_mask;
  }
}

int32_t tt_bpe_lookup(const tt_bpe *bpe, const uint8_t *bytes, size_t len) {
  int32_t s = *bytes_slot(bpe, bytes, len);
  return s - 1;
}

static int grow_bytes_map(tt_bpe *bpe) {
  uint32_t cap = (bpe->bytes_mask + 1) * 2;
  int32_t *old = bpe->bytes_map;
  uint32_t old_cap = bpe->bytes_mask + 1;
  bpe->bytes_map = calloc(cap, sizeof *bpe->bytes_map);
  if (!bpe->bytes_map) {
    bpe->bytes_map = old;
    return tt_set_error("out of host memory (tokenizer)");
  }
  bpe->bytes_mask = cap - 1;
  for (uint32_t i = 0; i < old_cap; i++) {
    if (old[i] == 0) continue;
    int32_t id = old[i] - 1;
    *bytes_slot(bpe, (const uint8_t *)bpe->tok_bytes.data + bpe->tok_off[id],
                (size_t)bpe->tok_len[id]) = old[i];
  }
  free(old);
  return 0;
}

int tt_bpe_set_token(tt_bpe *bpe, int32_t id, const uint8_t *bytes, size_t len) {
  if (id < 0 || id >= TT_BPE_MAX_IDS)
    return tt_set_error("token id %d out of range (at most %d ids)", (int)id, TT_BPE_MAX_IDS);
  if (len > (1u << 20)) return tt_set_error("token %d is %zu bytes long", (int)id, len);
  if (id >= bpe->ids_cap) {
    int32_t n = bpe->ids_cap ? bpe->ids_cap : 256;
    while (n <= id) n *= 2;
    uint32_t *off = realloc(bpe->tok_off, (size_t)n * sizeof *off);
    if (!off) return tt_set_error("out of host memory (tokenizer)");
    bpe->tok_off = off;
    int32_t *tl = realloc(bpe->tok_len, (size_t)n * sizeof *tl);
    if (!tl) return tt_set_error("out of host memory (tokenizer)");
    bpe->tok_len = tl;
    for (int32_t i = bpe->ids_cap; i < n; i++) tl[i] = -1;
    bpe->ids_cap = n;
  }
  if (id >= bpe->n_ids) bpe->n_ids = id + 1;
  if (bpe->tok_bytes.len + len > 0xFFFFFFF0u) return tt_set_error("vocabulary too large");
  if ((uint64_t)bpe->n_ids * 2 > bpe->bytes_mask) TT_TRY(grow_bytes_map(bpe));
  bpe->tok_off[id] = (uint32_t)bpe->tok_bytes.len;
  bpe->tok_len[id] = (int32_t)len;
  TT_TRY(tt_buf_append(&bpe->tok_bytes, bytes, len));
  int32_t *slot = bytes_slot(bpe, bytes, len);
  /* The first id with given bytes wins the reverse lookup (as for duplicate HF entries). */
  if (*slot == 0) *slot = id + 1;
  if (len == 1 && bpe->byte_id[bytes[0]] < 0) bpe->byte_id[bytes[0]] = id;
  return 0;
}

static uint32_t pair_slot(const tt_bpe *bpe, uint64_t key) {
  uint32_t i = (uint32_t)tt_hash_u64(key) & bpe->pair_mask;
  while (bpe->pair_keys[i] != ~0ull && bpe->pair_keys[i] != key) i = (i + 1) & bpe->pair_mask;
  return i;
}

static int grow_pairs(tt_bpe *bpe) {
  uint32_t old_cap = bpe->pair_keys ? bpe->pair_mask + 1 : 0;
  uint32_t cap = old_cap ? old_cap * 2 : 4096;
  uint64_t *ok = bpe->pair_keys, *ov = bpe->pair_vals;
  bpe->pair_keys = malloc((size_t)cap * sizeof(uint64_t));
  bpe->pair_vals = malloc((size_t)cap * sizeof(uint64_t));
  if (!bpe->pair_keys || !bpe->pair_vals) {
    free(bpe->pair_keys);
    free(bpe->pair_vals);
    bpe->pair_keys = ok;
    bpe->pair_vals = ov;
    return tt_set_error("out of host memory (merge table)");
  }
  memset(bpe->pair_keys, 0xFF, (size_t)cap * sizeof(uint64_t));
  bpe->pair_mask = cap - 1;
  for (uint32_t i = 0; i < old_cap; i++) {
    if (ok[i] == ~0ull) continue;
    uint32_t s = pair_slot(bpe, ok[i]);
    bpe->pair_keys[s] = ok[i];
    bpe->pair_vals[s] = ov[i];
  }
  free(ok);
  free(ov);
  return 0;
}

static inline uint64_t pair_key(int32_t left, int32_t right) {
  return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

int tt_bpe_add_pair(tt_bpe *bpe, int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  if (!bpe->pair_keys || (uint64_t)(bpe->n_pairs + 1) * 2 > (uint64_t)bpe->pair_mask + 1)
    TT_TRY(grow_pairs(bpe));
  uint64_t key = pair_key(left, right);
  uint32_t s = pair_slot(bpe, key);
  /* A pair listed twice keeps its first (lowest) rank, as in the reference loaders. */
  if (bpe->pair_keys[s] == key) return 0;
  bpe->pair_keys[s] = key;
  bpe->pair_vals[s] = ((uint64_t)rank << 32) | (uint32_t)merged;
  bpe->n_pairs++;
  return 0;
}

int tt_bpe_finish(tt_bpe *bpe) {
  if (!bpe->pair_keys) TT_TRY(grow_pairs(bpe));
  return 0;
}

/* The byte tokenizer is a vocabulary of the 256 single bytes with no merges, so the
** queries, decoding, the loader and `tetra data prepare` treat it as any other. Encoding
** skips the pre-tokenizer (with no merges it changes nothing) and the UTF-8 clean-up
** (raw_bytes): an ill-formed byte stays one id instead of becoming U+FFFD's three. */
int tt_bpe_bytes(tt_bpe **out) {
  *out = NULL;
  tt_bpe *bpe = calloc(1, sizeof *bpe);
  if (!bpe) return tt_set_error("out of host memory (tokenizer)");
  int rc = tt_bpe_init(bpe, 256);
  for (int b = 0; b < 256 && rc == 0; b++) {
    uint8_t byte = (uint8_t)b;
    rc = tt_bpe_set_token(bpe, b, &byte, 1);
  }
  if (rc == 0) rc = tt_bpe_finish(bpe);
  if (rc != 0) {
    tt_bpe_free(bpe);
    return rc;
  }
  bpe->raw_bytes = 1;
  *out = bpe;
  return 0;
}

/* Rank << 32 | merged id of a pair, or ~0 when the pair never merges. */
static inline uint64_t pair_get(const tt_bpe *bpe, int32_t left, int32_t right) {
  uint64_t key = pair_key(left, right);
  uint32_t i = (uint32_t)tt_hash_u64(key) & bpe->pair_mask;
  for (;;) {
    uint64_t k = bpe->pair_keys[i];
    if (k == key) return bpe->pair_vals[i];
    if (k == ~0ull) return ~0ull;
    i = (i + 1) & bpe->pair_mask;
  }
}

void tt_bpe_free(tt_bpe *bpe) {
  if (!bpe) return;
  free(bpe->tok_off);
  free(bpe->tok_len);
  tt_buf_free(&bpe->tok_bytes);
  free(bpe->bytes_map);
  free(bpe->pair_keys);
  free(bpe->pair_vals);
  for (int i = 0; i < bpe->n_specials; i++) free(bpe->specials[i].content);
  free(bpe->specials);
  tt_bpe_cache_free(bpe->cache);
  free(bpe);
}

/* -- Queries ------------------------------------------------------------------------ */

int32_t tt_bpe_vocab_size(const tt_bpe *bpe) { return bpe->n_ids; }

int32_t tt_bpe_token_id(const tt_bpe *bpe, const char *token) {
  size_t len = strlen(token);
  for (int i = 0; i < bpe->n_specials; i++)
    if (bpe->specials[i].len == len && memcmp(bpe->specials[i].content, token, len) == 0)
      return bpe->specials[i].id;
  uint8_t small[256];
  uint8_t *bytes = len <= sizeof small ? small : malloc(len);
  if (!bytes) return -1;
  int64_t n = tt_bytelevel_decode(token, len, bytes);
  int32_t id = n >= 0 ? tt_bpe_lookup(bpe, bytes, (size_t)n)
                      : tt_bpe_lookup(bpe, (const uint8_t *)token, len);
  if (bytes != small) free(bytes);
  return id;
}

int32_t tt_bpe_eos_id(const tt_bpe *bpe) {
  if (bpe->raw_bytes) return '\n';
  static const char *names[] = {"<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    for (int i = 0; i < bpe->n_specials; i++)
      if (strcmp(bpe->specials[i].content, names[k]) == 0) return bpe->specials[i].id;
  return -1;
}

int tt_bpe_add_special(tt_bpe *bpe, const char *content, int32_t id) {
  size_t len = strlen(content);
  if (len == 0) return tt_set_error("special token: empty text");
  if (id < 0) id = bpe->n_ids;
  for (int i = 0; i < bpe->n_specials; i++)
    if (strcmp(bpe->specials[i].content, content) == 0) {
      bpe->specials[i].id = id;
      return tt_bpe_set_token(bpe, id, (const uint8_t *)content, len);
    }
  tt_bpe_special *sp = realloc(bpe->specials, (size_t)(bpe->n_specials + 1) * sizeof *sp);
  if (!sp) return tt_set_error("out of host memory (special tokens)");
  bpe->specials = sp;
  char *copy = strdup(content);
  if (!copy) return tt_set_error("out of host memory (special tokens)");
  sp[bpe->n_specials].content = copy;
  sp[bpe->n_specials].len = len;
  sp[bpe->n_specials].id = id;
  bpe->n_specials++;
  return tt_bpe_set_token(bpe, id, (const uint8_t *)content, len);
}

/* -- Word cache --------------------------------------------------------------------- */

enum { CACHE_SLOTS = 1 << 16, CACHE_MAX_WORD = 128, CACHE_MAX_BYTES = 8 << 20 };

typedef struct cache_slot {
  uint64_t hash;        /* 0 = empty */
  uint32_t key_off, ids_off;
  uint16_t key_len, n_ids;
} cache_slot;

struct tt_bpe_cache {
  cache_slot *slots;
  uint32_t used;
  tt_buf keys;
  tt_ids ids;
  const tt_bpe *owner;
  tt_ids scratch;       /* symbols of the word being merged */
  tt_ids seg;           /* ids of one piece */
  tt_buf clean;         /* sanitised text */
};

int tt_bpe_cache_new(tt_bpe_cache **out) {
  tt_bpe_cache *c = calloc(1, sizeof *c);
  if (!c) return tt_set_error("out of host memory (word cache)");
  c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
  if (!c->slots) {
    free(c);
    return tt_set_error("out of host memory (word cache)");
  }
  *out = c;
  return 0;
}

void tt_bpe_cache_free(tt_bpe_cache *c) {
  if (!c) return;
  free(c->slots);
  tt_buf_free(&c->keys);
  tt_ids_free(&c->ids);
  tt_ids_free(&c->scratch);
  tt_ids_free(&c->seg);
  tt_buf_free(&c->clean);
  free(c);
}

static void cache_clear(tt_bpe_cache *c) {
  memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
  c->used = 0;
  c->keys.len = 0;
  c->ids.len = 0;
}

/* -- Merging one pre-token ---------------------------------------------------------- */

enum { SCAN_MAX = 256 };   /* longer words use the heap */

/* Symbols s[0..n) merged in place by repeated "lowest rank, leftmost" scans. Words are
** short in natural text, where one linear pass per merge beats any heap. */
static int merge_scan(const tt_bpe *bpe, int32_t *s, int n) {
  uint64_t r[SCAN_MAX];
  for (int i = 0; i + 1 < n; i++) r[i] = pair_get(bpe, s[i], s[i + 1]);
  while (n > 1) {
    int best = 0;
    for (int i = 1; i + 1 < n; i++) if ((r[i] >> 32) < (r[best] >> 32)) best = i;
    if (r[best] == ~0ull) break;
    s[best] = (int32_t)(uint32_t)r[best];
    memmove(s + best + 1, s + best + 2, (size_t)(n - best - 2) * sizeof *s);
    memmove(r + best, r + best + 1, (size_t)(n - best - 2) * sizeof *r);
    n--;
    if (best > 0) r[best - 1] = pair_get(bpe, s[best - 1], s[best]);
    if (best + 1 < n) r[best] = pair_get(bpe, s[best], s[best + 1]);
  }
  return n;
}

/* The same merge order for long words (runs of CJK, long digit or symbol runs) with a
** min-heap of (rank, position) over a linked list: O(n log n). */
static int merge_heap(const tt_bpe *bpe, int32_t *s, int n) {
  int32_t *prev = malloc((size_t)n * sizeof *prev), *next = malloc((size_t)n * sizeof *next);
  uint64_t *heap = malloc((size_t)n * 2 * sizeof *heap);
  if (!prev || !next || !heap) {
    free(prev); free(next); free(heap);
    return tt_set_error("out of host memory (BPE merge of a %d-byte word)", n);
  }
  size_t hn = 0, hcap = (size_t)n * 2;
#define HEAP_PUSH(v) do { \
    if (hn == hcap) { \
      uint64_t *h2 = realloc(heap, hcap * 2 * sizeof *heap); \
      if (!h2) { free(prev); free(next); free(heap); \
                 return tt_set_error("out of host memory (BPE heap)"); } \
      heap = h2; hcap *= 2; } \
    size_t k_ = hn++; heap[k_] = (v); \
    while (k_ > 0 && heap[(k_ - 1) / 2] > heap[k_]) { \
      uint64_t t_ = heap[k_]; heap[k_] = heap[(k_ - 1) / 2]; heap[(k_ - 1) / 2] = t_; \
      k_ = (k_ - 1) / 2; } } while (0)
  for (int i = 0; i < n; i++) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int i = 0; i + 1 < n; i++) {
    uint64_t v = pair_get(bpe, s[i], s[i + 1]);
    if (v != ~0ull) HEAP_PUSH(((v >> 32) << 32) | (uint32_t)i);
  }
  while (hn > 0) {
    uint64_t top = heap[0];
    heap[0] = heap[--hn];
    for (size_t k = 0;;) {
      size_t a = 2 * k + 1, b = a + 1, m = k;
      if (a < hn && heap[a] < heap[m]) m = a;
      if (b < hn && heap[b] < heap[m]) m = b;
      if (m == k) break;
      uint64_t t = heap[k]; heap[k] = heap[m]; heap[m] = t;
      k = m;
    }
    int32_t i = (int32_t)(uint32_t)top;
    /* Stale entries: the left symbol was merged away or its pair changed. */
    if (s[i] < 0 || next[i] < 0) continue;
    uint64_t v = pair_get(bpe, s[i], s[next[i]]);
    if (v == ~0ull || (v >> 32) != (top >> 32)) continue;
    int32_t j = next[i];
    s[i] = (int32_t)(uint32_t)v;
    s[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) {
      uint64_t w = pair_get(bpe, s[prev[i]], s[i]);
      if (w != ~0ull) HEAP_PUSH(((w >> 32) << 32) | (uint32_t)prev[i]);
    }
    if (next[i] >= 0) {
      uint64_t w = pair_get(bpe, s[i], s[next[i]]);
      if (w != ~0ull) HEAP_PUSH(((w >> 32) << 32) | (uint32_t)i);
    }
  }
#undef HEAP_PUSH
  int m = 0;
  for (int i = 0; i < n; i++) if (s[i] >= 0) s[m++] = s[i];
  free(prev); free(next); free(heap);
  return m;
}

/* Appends the ids of one pre-token (raw bytes w[0..n)) to out. */
static int encode_word(const tt_bpe *bpe, tt_bpe_cache *c, const uint8_t *w, size_t n,
                       tt_ids *out) {
  if (bpe->ignore_merges) {
    int32_t id = tt_bpe_lookup(bpe, w, n);
    if (id >= 0) {
      TT_TRY(tt_ids_reserve(out, 1));
      out->data[out->len++] = id;
      return 0;
    }
  }
  if (n == 1 && bpe->byte_id[w[0]] >= 0) {
    TT_TRY(tt_ids_reserve(out, 1));
    out->data[out->len++] = bpe->byte_id[w[0]];
    return 0;
  }
  if (n > (size_t)INT32_MAX / 4) return tt_set_error("pre-token of %zu bytes is too long", n);
  c->scratch.len = 0;
  TT_TRY(tt_ids_reserve(&c->scratch, n));
  int32_t *s = c->scratch.data;
  int m = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = bpe->byte_id[w[i]];
    /* A byte missing from the vocabulary becomes the unknown token, or is dropped
    ** when there is none (as Hugging Face's BPE model does). */
    if (id < 0) id = bpe->unk_id;
    if (id >= 0) s[m++] = id;
  }
  m = m <= SCAN_MAX ? merge_scan(bpe, s, m) : merge_heap(bpe, s, m);
  if (m <= 0) return m;
  TT_TRY(tt_ids_reserve(out, (size_t)m));
  memcpy(out->data + out->len, s, (size_t)m * sizeof *s);
  out->len += (size_t)m;
  return 0;
}

static int encode_word_cached(const tt_bpe *bpe, tt_bpe_cache *c, const uint8_t *w, size_t n,
                              tt_ids *out) {
  if (n > CACHE_MAX_WORD || n == 1) return encode_word(bpe, c, w, n, out);
  uint64_t h = tt_hash_bytes(w, n) | 1;
  uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
  for (;;) {
    cache_slot *sl = &c->slots[i];
    if (sl->hash == 0) break;
    if (sl->hash == h && sl->key_len == n && memcmp(c->keys.data + sl->key_off, w, n) == 0) {
      if (sl->n_ids == 0) return 0;
      TT_TRY(tt_ids_reserve(out, sl->n_ids));
      memcpy(out->data + out->len, c->ids.data + sl->ids_off, sl->n_ids * sizeof(int32_t));
      out->len += sl->n_ids;
      return 0;
    }
    i = (i + 1) & (CACHE_SLOTS - 1);
  }
  size_t before = out->len;
  TT_TRY(encode_word(bpe, c, w, n, out));
  size_t k = out->len - before;
  if (c->used * 2 >= CACHE_SLOTS || c->keys.len + n > CACHE_MAX_BYTES) {
    cache_clear(c);
    i = (uint32_t)h & (CACHE_SLOTS - 1);
  }
  TT_TRY(tt_buf_reserve(&c->keys, n));
  TT_TRY(tt_ids_reserve(&c->ids, k));
  cache_slot *sl = &c->slots[i];
  sl->hash = h;
  sl->key_off = (uint32_t)c->keys.len;
  sl->key_len = (uint16_t)n;
  sl->ids_off = (uint32_t)c->ids.len;
  sl->n_ids = (uint16_t)k;
  memcpy(c->keys.data + c->keys.len, w, n);
  c->keys.len += n;
  if (k) memcpy(c->ids.data + c->ids.len, out->data + before, k * sizeof(int32_t));
  c->ids.len += k;
  c->used++;
  return 0;
}

/* Encodes text containing no special tokens. */
static int encode_plain(const tt_bpe *bpe, tt_bpe_cache *c, const uint8_t *s, size_t len,
                        tt_ids *out) {
  if (len == 0) return 0;
  if (tt_utf8_valid_prefix(s, len) != len) {
    c->clean.len = 0;
    TT_TRY(tt_buf_reserve(&c->clean, len * 3 + 1));
    len = tt_utf8_sanitize(s, len, (uint8_t *)c->clean.data);
    s = (const uint8_t *)c->clean.data;
  }
  if (bpe->add_prefix_space && s[0] != ' ') TT_TRY(encode_word_cached(bpe, c, (const uint8_t *)" ", 1, out));
  size_t pos = 0;
  while (pos < len) {
    size_t end = tt_pretok_next(s, len, pos);
    TT_TRY(encode_word_cached(bpe, c, s + pos, end - pos, out));
    pos = end;
  }
  return 0;
}

int tt_bpe_encode_append(const tt_bpe *bpe, tt_bpe_cache *c, const char *text, size_t len,
                         int allow_special, tt_ids *out) {
  if (c->owner != bpe) {
    cache_clear(c);
    c->owner = bpe;
  }
  const uint8_t *s = (const uint8_t *)text;
  if (bpe->raw_bytes) {
    TT_TRY(tt_ids_reserve(out, len));
    for (size_t i = 0; i < len; i++) out->data[out->len++] = s[i];
    return 0;
  }
  if (!allow_special || bpe->n_specials == 0) return encode_plain(bpe, c, s, len, out);
  size_t pos = 0;
  while (pos < len) {
    /* Leftmost special token, longest among those starting at the same place. */
    const uint8_t *best = NULL;
    int best_i = -1;
    for (int i = 0; i < bpe->n_specials; i++) {
      const tt_bpe_special *sp = &bpe->specials[i];
      const uint8_t *hit = memmem(s + pos, len - pos, sp->content, sp->len);
      if (!hit) continue;
      if (!best || hit < best || (hit == best && sp->len > bpe->specials[best_i].len)) {
        best = hit;
        best_i = i;
      }
    }
    size_t stop = best ? (size_t)(best - s) : len;
    TT_TRY(encode_plain(bpe, c, s + pos, stop - pos, out));
    if (!best) break;
    TT_TRY(tt_ids_reserve(out, 1));
    out->data[out->len++] = bpe->specials[best_i].id;
    pos = stop + bpe->specials[best_i].len;
  }
  return 0;
}

int tt_bpe_encode_with(const tt_bpe *bpe, tt_bpe_cache *cache, const char *text, size_t len,
                       int allow_special, int32_t *ids, size_t cap, size_t *n_out) {
  tt_ids *v = &cache->seg;
  v->len = 0;
  TT_TRY(tt_bpe_encode_append(bpe, cache, text, len, allow_special, v));
  if (v->len && cap) memcpy(ids, v->data, (v->len < cap ? v->len : cap) * sizeof(int32_t));
  *n_out = v->len;
  return 0;
}

int tt_bpe_encode(tt_bpe *bpe, const char *text, size_t len, int allow_special, int32_t *ids,
                  size_t cap, size_t *n_out) {
  return tt_bpe_encode_with(bpe, bpe->cache, text, len, allow_special, ids, cap, n_out);
}

int tt_bpe_decode(const tt_bpe *bpe, const int32_t *ids, size_t n, char *buf, size_t cap,
                  size_t *n_out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (bpe->raw_bytes && (id < 0 || id > 255)) {
      if (o + 3 <= cap) memcpy(buf + o, "\xEF\xBF\xBD", 3);
      o += 3;
      continue;
    }
    if (id < 0 || id >= bpe->n_ids || bpe->tok_len[id] < 0)
      return tt_set_error("decode: unknown token id %d (vocabulary has %d ids)", (int)id,
                          (int)bpe->n_ids);
    size_t l = (size_t)bpe->tok_len[id];
    if (o + l <= cap) memcpy(buf + o, bpe->tok_bytes.data + bpe->tok_off[id], l);
    o += l;
  }
  *n_out = o;
  return 0;
}
