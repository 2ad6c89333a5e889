/*
** bpe_load.c — reading tokenizer files: GPT-2 vocab.json + merges.txt, Hugging Face
** tokenizer.json (BPE model, ByteLevel pre-tokenizer, added tokens) and tiktoken rank
** files. Every error names the file (and line or JSON offset where there is one).
*/
#include "data/bpe_internal.h"

static int new_bpe(int32_t hint, tt_bpe **out) {
  tt_bpe *bpe = malloc(sizeof *bpe);
  if (!bpe) return tt_set_error("out of host memory (tokenizer)");
  if (tt_bpe_init(bpe, hint) != 0) {
    tt_bpe_free(bpe);
    return -1;
  }
  *out = bpe;
  return 0;
}

/* Sets id from a byte-level vocabulary string; strings outside the byte alphabet (added
** tokens such as "<|endoftext|>" are inside it) are taken as their UTF-8 bytes. */
static int set_vocab_string(tt_bpe *bpe, int32_t id, const char *s, size_t len) {
  uint8_t small[512];
  uint8_t *bytes = len <= sizeof small ? small : malloc(len);
  if (!bytes) return tt_set_error("out of host memory (tokenizer)");
  int64_t n = tt_bytelevel_decode(s, len, bytes);
  int rc = n >= 0 ? tt_bpe_set_token(bpe, id, bytes, (size_t)n)
                  : tt_bpe_set_token(bpe, id, (const uint8_t *)s, len);
  if (bytes != small) free(bytes);
  return rc;
}

/* Adds merge `rank` of the byte-level strings a and b. */
static int add_merge(tt_bpe *bpe, const char *a, size_t alen, const char *b, size_t blen,
                     uint32_t rank) {
  uint8_t small[1024];
  size_t cap = alen + blen;
  uint8_t *bytes = cap <= sizeof small ? small : malloc(cap);
  if (!bytes) return tt_set_error("out of host memory (merges)");
  int64_t na = tt_bytelevel_decode(a, alen, bytes);
  int64_t nb = na < 0 ? -1 : tt_bytelevel_decode(b, blen, bytes + na);
  int rc = 0;
  if (na < 0 || nb < 0) {
    rc = tt_set_error("merge %u: '%.*s %.*s' is not byte-level text", rank, (int)alen, a,
                      (int)blen, b);
  } else {
    int32_t l = tt_bpe_lookup(bpe, bytes, (size_t)na);
    int32_t r = tt_bpe_lookup(bpe, bytes + na, (size_t)nb);
    int32_t m = tt_bpe_lookup(bpe, bytes, (size_t)(na + nb));
    if (l < 0 || r < 0 || m < 0)
      rc = tt_set_error("merge %u: '%.*s %.*s' uses a token missing from the vocabulary", rank,
                        (int)alen, a, (int)blen, b);
    else
      rc = tt_bpe_add_pair(bpe, l, r, rank, m);
  }
  if (bytes != small) free(bytes);
  return rc;
}

/* Reads a JSON object of string -> id into bpe. */
static int load_vocab_object(tt_bpe *bpe, const tt_json *doc, int32_t obj) {
  tt_buf key = {0};
  int rc = 0;
  for (int32_t k = doc->nodes[obj].child; k >= 0 && rc == 0; k = doc->nodes[doc->nodes[k].next].next) {
    int32_t v = doc->nodes[k].next;
    double id;
    if (tt_json_number(doc, v, &id) != 0 || id < 0 || id >= (1 << 30) || id != (int32_t)id) {
      rc = tt_set_error("vocabulary entry %d: id is not a non-negative integer", (int)(k / 2));
      break;
    }
    rc = tt_json_string(doc, k, &key);
    if (rc == 0) rc = set_vocab_string(bpe, (int32_t)id, key.data, key.len);
  }
  tt_buf_free(&key);
  return rc;
}

/* Any single byte missing from a vocabulary is a byte the encoder must drop; note them
** by the id table already built; nothing else to do here. */
static int check_nonempty(const char *path, const tt_bpe *bpe) {
  if (bpe->n_ids == 0) return tt_set_error("%s: empty vocabulary", path);
  return 0;
}

/* -- vocab.json + merges.txt -------------------------------------------------------- */

static int parse_merges_text(tt_bpe *bpe, const char *path, const char *text, size_t len) {
  size_t pos = 0;
  uint32_t rank = 0;
  int line = 0;
  while (pos < len) {
    const char *s = text + pos;
    const char *nl = memchr(s, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    pos += n + (nl ? 1 : 0);
    line++;
    if (n > 0 && s[n - 1] == '\r') n--;
    if (n == 0 || (line == 1 && n >= 8 && memcmp(s, "#version", 8) == 0)) continue;
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
      return tt_set_error("%s:%d: expected two tokens separated by one space", path, line);
    if (add_merge(bpe, s, (size_t)(sp - s), sp + 1, (size_t)(s + n - sp - 1), rank++) != 0)
      return tt_error_context("%s:%d", path, line);
  }
  return 0;
}

int tt_bpe_load_vocab_merges(const char *vocab_path, const char *merges_path, tt_bpe **out) {
  char *vtext = NULL, *mtext = NULL;
  size_t vlen, mlen;
  tt_bpe *bpe = NULL;
  tt_json doc = {0};
  int rc = -1;
  if (tt_read_file(vocab_path, &vtext, &vlen) != 0) goto done;
  if (tt_read_file(merges_path, &mtext, &mlen) != 0) goto done;
  if (tt_json_parse(&doc, vtext, vlen) != 0) {
    tt_error_context("%s", vocab_path);
    goto done;
  }
  if (doc.nodes[0].type != TT_JSON_OBJECT) {
    tt_set_error("%s: expected a JSON object of token -> id", vocab_path);
    goto done;
  }
  if (new_bpe(doc.nodes[0].count, &bpe) != 0) goto done;
  if (load_vocab_object(bpe, &doc, 0) != 0) {
    tt_error_context("%s", vocab_path);
    goto done;
  }
  if (check_nonempty(vocab_path, bpe) != 0) goto done;
  if (parse_merges_text(bpe, merges_path, mtext, mlen) != 0) goto done;
  if (tt_bpe_finish(bpe) != 0) goto done;
  int32_t eot = tt_bpe_token_id(bpe, "<|endoftext|>");
  if (eot >= 0 && tt_bpe_add_special(bpe, "<|endoftext|>", eot) != 0) goto done;
  rc = 0;
done:
  free(vtext);
  free(mtext);
  tt_json_free(&doc);
  if (rc == 0) *out = bpe;
  else tt_bpe_free(bpe);
  return rc;
}

/* -- tokenizer.json ----------------------------------------------------------------- */

static int is_null_or_empty(const tt_json *doc, int32_t v) {
  return v < 0 || doc->nodes[v].type == TT_JSON_NULL ||
         (doc->nodes[v].type == TT_JSON_STRING && doc->nodes[v].len == 0);
}

/* Accepts a ByteLevel pre-tokenizer (alone or as the only member of a Sequence). */
static int read_pretokenizer(tt_bpe *bpe, const tt_json *doc, int32_t pt) {
  if (pt < 0 || doc->nodes[pt].type == TT_JSON_NULL)
    return tt_set_error("pre_tokenizer is null; only the ByteLevel pre-tokenizer is supported");
  int32_t type = tt_json_get(doc, pt, "type");
  if (type >= 0 && tt_json_string_eq(doc, type, "Sequence")) {
    int32_t list = tt_json_get(doc, pt, "pretokenizers");
    if (list < 0 || doc->nodes[list].count != 1)
      return tt_set_error("pre_tokenizer: only a Sequence of one ByteLevel is supported");
    return read_pretokenizer(bpe, doc, doc->nodes[list].child);
  }
  if (type < 0 || !tt_json_string_eq(doc, type, "ByteLevel"))
    return tt_set_error("pre_tokenizer: only ByteLevel is supported");
  int32_t aps = tt_json_get(doc, pt, "add_prefix_space");
  bpe->add_prefix_space = aps >= 0 && doc->nodes[aps].type == TT_JSON_TRUE;
  int32_t regex = tt_json_get(doc, pt, "use_regex");
  if (regex >= 0 && doc->nodes[regex].type == TT_JSON_FALSE)
    return tt_set_error("pre_tokenizer: ByteLevel with use_regex=false is not supported");
  return 0;
}

static int read_merges_array(tt_bpe *bpe, const tt_json *doc, int32_t merges) {
  tt_buf a = {0}, b = {0};
  uint32_t rank = 0;
  int rc = 0;
  for (int32_t m = doc->nodes[merges].child; m >= 0 && rc == 0; m = doc->nodes[m].next, rank++) {
    const tt_json_node *n = &doc->nodes[m];
    if (n->type == TT_JSON_STRING) {
      rc = tt_json_string(doc, m, &a);
      if (rc) break;
      char *sp = memchr(a.data, ' ', a.len);
      if (!sp || sp == a.data || sp == a.data + a.len - 1) {
        rc = tt_set_error("model.merges[%u]: expected \"left right\"", rank);
        break;
      }
      rc = add_merge(bpe, a.data, (size_t)(sp - a.data), sp + 1, (size_t)(a.data + a.len - sp - 1), rank);
    } else if (n->type == TT_JSON_ARRAY && n->count == 2) {
      rc = tt_json_string(doc, n->child, &a);
      if (rc == 0) rc = tt_json_string(doc, doc->nodes[n->child].next, &b);
      if (rc == 0) rc = add_merge(bpe, a.data, a.len, b.data, b.len, rank);
    } else {
      rc = tt_set_error("model.merges[%u]: expected a string or a pair of strings", rank);
    }
  }
  tt_buf_free(&a);
  tt_buf_free(&b);
  return rc;
}

static int read_added_tokens(tt_bpe *bpe, const tt_json *doc, int32_t list) {
  tt_buf content = {0};
  int rc = 0;
  for (int32_t t = doc->nodes[list].child; t >= 0 && rc == 0; t = doc->nodes[t].next) {
    int32_t idn = tt_json_get(doc, t, "id"), cn = tt_json_get(doc, t, "content");
    double id;
    if (idn < 0 || cn < 0 || tt_json_number(doc, idn, &id) != 0 || id < 0 || id >= (1 << 30) ||
        tt_json_string(doc, cn, &content) != 0 || content.len == 0) {
      rc = tt_set_error("added_tokens: each entry needs an integer id and a content string");
      break;
    }
    rc = tt_bpe_add_special(bpe, content.data, (int32_t)id);
  }
  tt_buf_free(&content);
  return rc;
}

int tt_bpe_load_hf_json(const char *path, const char *text, size_t len, tt_bpe **out) {
  tt_json doc = {0};
  tt_bpe *bpe = NULL;
  tt_buf unk = {0};
  int rc = -1;
  if (tt_json_parse(&doc, text, len) != 0) goto fail;
  int32_t model = tt_json_get(&doc, 0, "model");
  if (model < 0) {
    tt_set_error("no \"model\" object (not a tokenizer.json?)");
    goto fail;
  }
  int32_t type = tt_json_get(&doc, model, "type");
  if (type >= 0 && !tt_json_string_eq(&doc, type, "BPE")) {
    tt_set_error("model.type must be \"BPE\"");
    goto fail;
  }
  int32_t vocab = tt_json_get(&doc, model, "vocab"), merges = tt_json_get(&doc, model, "merges");
  if (vocab < 0 || doc.nodes[vocab].type != TT_JSON_OBJECT || merges < 0 ||
      doc.nodes[merges].type != TT_JSON_ARRAY) {
    tt_set_error("model needs a \"vocab\" object and a \"merges\" array");
    goto fail;
  }
  if (!is_null_or_empty(&doc, tt_json_get(&doc, model, "continuing_subword_prefix")) ||
      !is_null_or_empty(&doc, tt_json_get(&doc, model, "end_of_word_suffix"))) {
    tt_set_error("model: continuing_subword_prefix / end_of_word_suffix are not supported");
    goto fail;
  }
  int32_t dropout = tt_json_get(&doc, model, "dropout");
  if (dropout >= 0 && doc.nodes[dropout].type != TT_JSON_NULL) {
    double p = 0;
    tt_json_number(&doc, dropout, &p);
    if (p != 0) {
      tt_set_error("model.dropout is not supported");
      goto fail;
    }
  }
  int32_t norm = tt_json_get(&doc, 0, "normalizer");
  if (norm >= 0 && doc.nodes[norm].type != TT_JSON_NULL) {
    tt_set_error("normalizer must be null (byte-level BPE reads raw text)");
    goto fail;
  }
  if (new_bpe(doc.nodes[vocab].count, &bpe) != 0) goto fail;
  if (read_pretokenizer(bpe, &doc, tt_json_get(&doc, 0, "pre_tokenizer")) != 0) goto fail;
  int32_t im = tt_json_get(&doc, model, "ignore_merges");
  bpe->ignore_merges = im >= 0 && doc.nodes[im].type == TT_JSON_TRUE;
  if (load_vocab_object(bpe, &doc, vocab) != 0) goto fail;
  if (check_nonempty(path, bpe) != 0) goto fail;
  if (read_merges_array(bpe, &doc, merges) != 0) goto fail;
  int32_t unk_node = tt_json_get(&doc, model, "unk_token");
  if (unk_node >= 0 && doc.nodes[unk_node].type == TT_JSON_STRING) {
    if (tt_json_string(&doc, unk_node, &unk) != 0) goto fail;
    bpe->unk_id = tt_bpe_token_id(bpe, unk.data);
  }
  int32_t added = tt_json_get(&doc, 0, "added_tokens");
  if (added >= 0 && doc.nodes[added].type == TT_JSON_ARRAY &&
      read_added_tokens(bpe, &doc, added) != 0)
    goto fail;
  if (tt_bpe_finish(bpe) != 0) goto fail;
  rc = 0;
  *out = bpe;
fail:
  if (rc != 0) {
    tt_error_context("%s", path);
    tt_bpe_free(bpe);
  }
  tt_json_free(&doc);
  tt_buf_free(&unk);
  return rc;
}

/* -- tiktoken rank files ------------------------------------------------------------ */

static int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decodes standard base64 (with '=' padding) into dst; returns the length or -1. */
static int64_t b64_decode(const char *s, size_t n, uint8_t *dst) {
  if (n % 4 != 0) return -1;
  int64_t o = 0;
  for (size_t i = 0; i < n; i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; k++) {
      if (s[i + k] == '=' && i + 4 == n && k >= 2) { v[k] = 0; pad++; continue; }
      if (pad) return -1;
      v[k] = b64val((unsigned char)s[i + k]);
      if (v[k] < 0) return -1;
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    dst[o++] = (uint8_t)(w >> 16);
    if (pad < 2) dst[o++] = (uint8_t)(w >> 8);
    if (pad < 1) dst[o++] = (uint8_t)w;
  }
  return o;
}

/* Real rank files give their N tokens the ranks 0..N-1 (GPT-2, cl100k, o200k), and the id
** tables are sized by the largest rank. So a rank the file is far too short to reach is
** refused before anything is sized by it: at most this many ranks per line of the file,
** and below TT_BPE_MAX_IDS. */
enum { TIKTOKEN_RANKS_PER_LINE = 16 };

/* Reads one "<base64 token> <rank>" line (without its newline) into bpe; ranks must be below
** max_rank. *tok (*tok_cap bytes) is the caller's scratch buffer for the decoded token.
** Messages leave the place to the caller. */
static int read_rank_line(tt_bpe *bpe, const char *s, size_t n, int64_t max_rank,
                          int64_t lines, uint8_t **tok, size_t *tok_cap) {
  const char *sp = memchr(s, ' ', n);
  if (!sp || sp == s || sp + 1 == s + n)
    return tt_set_error("expected \"<base64 token> <rank>\"");
  const char *digits = sp + 1;
  int nd = (int)(s + n - digits);
  int64_t rank = 0;
  for (int i = 0; i < nd; i++) {
    if (digits[i] < '0' || digits[i] > '9')
      return tt_set_error("expected \"<base64 token> <rank>\"");
    /* Stops growing past max_rank, so any number of digits is compared without overflow. */
    if (rank <= max_rank) rank = rank * 10 + (digits[i] - '0');
  }
  if (rank >= max_rank)
    return tt_set_error("rank %.*s is out of range: ranks number the tokens from 0, and a "
                        "file of %lld line%s may use ranks below %lld", nd, digits,
                        (long long)lines, lines == 1 ? "" : "s", (long long)max_rank);
  /* The token text is never empty here, so the buffer never shrinks to 0 bytes (which
  ** realloc may answer by freeing it). Base64 decodes to fewer bytes than its text. */
  size_t tlen = (size_t)(sp - s);
  if (tlen > *tok_cap) {
    uint8_t *t = realloc(*tok, tlen);
    if (!t) return tt_set_error("out of host memory (tokenizer)");
    *tok = t;
    *tok_cap = tlen;
  }
  int64_t tl = b64_decode(s, tlen, *tok);
  if (tl <= 0) return tt_set_error("bad base64 token");
  return tt_bpe_set_token(bpe, (int32_t)rank, *tok, (size_t)tl);
}

/* tiktoken merges any two adjacent parts whose concatenation is a token, at that token's
** rank: enumerate every split of every token into two tokens. */
static int add_tiktoken_merges(tt_bpe *bpe) {
  for (int32_t id = 0; id < bpe->n_ids; id++) {
    int32_t l = bpe->tok_len[id];
    if (l < 2) continue;
    const uint8_t *b = (const uint8_t *)bpe->tok_bytes.data + bpe->tok_off[id];
    for (int32_t k = 1; k < l; k++) {
      int32_t a = tt_bpe_lookup(bpe, b, (size_t)k), c = tt_bpe_lookup(bpe, b + k, (size_t)(l - k));
      if (a >= 0 && c >= 0) TT_TRY(tt_bpe_add_pair(bpe, a, c, (uint32_t)id, id));
    }
  }
  return 0;
}

int tt_bpe_load_tiktoken_text(const char *path, const char *text, size_t len, tt_bpe **out) {
  int64_t lines = len > 0 && text[len - 1] != '\n';
  for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + len - p))) != NULL; p++)
    lines++;
  /* One id stays free for <|endoftext|>, which follows the last rank. */
  int64_t max_rank = lines * TIKTOKEN_RANKS_PER_LINE;
  if (max_rank > TT_BPE_MAX_IDS - 1) max_rank = TT_BPE_MAX_IDS - 1;
  tt_bpe *bpe = NULL;
  uint8_t *tok = NULL;
  size_t tok_cap = 0;
  if (new_bpe((int32_t)(len / 8), &bpe) != 0) return -1;
  size_t pos = 0;
  int line = 0;
  while (pos < len) {
    const char *s = text + pos;
    const char *nl = memchr(s, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - s) : len - pos;
    pos += n + (nl ? 1 : 0);
    line++;
    if (n > 0 && s[n - 1] == '\r') n--;
    if (n == 0) continue;
    if (read_rank_line(bpe, s, n, max_rank, lines, &tok, &tok_cap) != 0) {
      tt_error_context("%s:%d", path, line);
      goto fail;
    }
  }
  if (check_nonempty(path, bpe) != 0) goto fail;
  /* tiktoken takes a pre-token that is itself a token as is. */
  bpe->ignore_merges = 1;
  if (add_tiktoken_merges(bpe) != 0 || tt_bpe_finish(bpe) != 0 ||
      tt_bpe_add_special(bpe, "<|endoftext|>", bpe->n_ids) != 0) {
    tt_error_context("%s", path);
    goto fail;
  }
  free(tok);
  *out = bpe;
  return 0;
fail:
  free(tok);
  tt_bpe_free(bpe);
  return -1;
}

int tt_bpe_load(const char *path, tt_bpe **out) {
  if (strcmp(path, "byte") == 0) return tt_bpe_bytes(out);
  char *text;
  size_t len;
  TT_TRY(tt_read_file(path, &text, &len));
  size_t i = 0;
  while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) i++;
  int rc;
  if (i == len) rc = tt_set_error("%s: empty tokenizer file", path);
  else if (text[i] == '{') rc = tt_bpe_load_hf_json(path, text, len, out);
  else rc = tt_bpe_load_tiktoken_text(path, text, len, out);
  free(text);
  return rc;
}
