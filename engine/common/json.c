/*
** json.c — a small JSON reader: one pass builds a flat node array over the source text;
** strings stay as spans and are decoded on demand. Used for tokenizer files and for each
** line of JSONL data, so it never recurses deeper than a fixed limit and never trusts
** its input.
*/
#include "common/common.h"

enum { JSON_MAX_DEPTH = 512 };

typedef struct parser {
  tt_json *doc;
  const char *s;
  size_t len, pos;
} parser;

static int fail(parser *p, const char *what) {
  p->doc->err_pos = p->pos;
  return tt_set_error("invalid JSON at byte %zu: %s", p->pos, what);
}

static void skip_ws(parser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static int32_t new_node(parser *p, int type) {
  tt_json *d = p->doc;
  if (d->n == d->cap) {
    int32_t cap = d->cap ? d->cap * 2 : 64;
    tt_json_node *nodes = realloc(d->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return -1;
    d->nodes = nodes;
    d->cap = cap;
  }
  tt_json_node *n = &d->nodes[d->n];
  n->type = (uint8_t)type;
  n->start = (uint32_t)p->pos;
  n->len = 0;
  n->next = -1;
  n->child = -1;
  n->count = 0;
  return d->n++;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int parse_string(parser *p, int32_t *out) {
  p->pos++;   /* opening quote */
  int32_t idx = new_node(p, TT_JSON_STRING);
  if (idx < 0) return tt_set_error("out of host memory parsing JSON");
  while (p->pos < p->len) {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->doc->nodes[idx].len = (uint32_t)(p->pos - p->doc->nodes[idx].start);
      p->pos++;
      *out = idx;
      return 0;
    }
    if (c < 0x20) return fail(p, "control character in string");
    if (c == '\\') {
      if (p->pos + 1 >= p->len) break;
      char e = p->s[p->pos + 1];
      if (e == 'u') {
        if (p->pos + 5 >= p->len) break;
        for (int k = 2; k < 6; k++)
          if (hexval(p->s[p->pos + k]) < 0) return fail(p, "bad \\u escape");
        p->pos += 6;
        continue;
      }
      if (!strchr("\"\\/bfnrt", e) || e == '\0') return fail(p, "bad escape");
      p->pos += 2;
      continue;
    }
    p->pos++;
  }
  return fail(p, "unterminated string");
}

static int parse_value(parser *p, int depth, int32_t *out);

static int parse_container(parser *p, int depth, int type, int32_t *out) {
  char close = type == TT_JSON_OBJECT ? '}' : ']';
  int32_t idx = new_node(p, type);
  if (idx < 0) return tt_set_error("out of host memory parsing JSON");
  p->pos++;
  skip_ws(p);
  int32_t last = -1;
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    *out = idx;
    return 0;
  }
  for (;;) {
    int32_t child;
    skip_ws(p);
    if (type == TT_JSON_OBJECT) {
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a key");
      TT_TRY(parse_string(p, &child));
      if (last < 0) p->doc->nodes[idx].child = child;
      else p->doc->nodes[last].next = child;
      last = child;
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
      p->pos++;
      skip_ws(p);
    }
    TT_TRY(parse_value(p, depth + 1, &child));
    if (last < 0) p->doc->nodes[idx].child = child;
    else p->doc->nodes[last].next = child;
    last = child;
    p->doc->nodes[idx].count++;
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unterminated container");
    char c = p->s[p->pos++];
    if (c == close) break;
    if (c != ',') return fail(p, "expected ',' or a closing bracket");
  }
  p->doc->nodes[idx].len = (uint32_t)(p->pos - p->doc->nodes[idx].start);
  *out = idx;
  return 0;
}

static int parse_number(parser *p, int32_t *out) {
  int32_t idx = new_node(p, TT_JSON_NUMBER);
  if (idx < 0) return tt_set_error("out of host memory parsing JSON");
  size_t i = p->pos;
  if (i < p->len && p->s[i] == '-') i++;
  size_t digits = i;
  while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
  if (i == digits) return fail(p, "bad number");
  if (i < p->len && p->s[i] == '.') {
    i++;
    size_t f = i;
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    if (i == f) return fail(p, "bad number");
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    size_t e = i;
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    if (i == e) return fail(p, "bad number");
  }
  p->doc->nodes[idx].len = (uint32_t)(i - p->pos);
  p->pos = i;
  *out = idx;
  return 0;
}

static int parse_literal(parser *p, const char *word, int type, int32_t *out) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "unexpected token");
  int32_t idx = new_node(p, type);
  if (idx < 0) return tt_set_error("out of host memory parsing JSON");
  p->doc->nodes[idx].len = (uint32_t)n;
  p->pos += n;
  *out = idx;
  return 0;
}

static int parse_value(parser *p, int depth, int32_t *out) {
  if (depth > JSON_MAX_DEPTH) return fail(p, "nested too deeply");
  skip_ws(p);
  if (p->pos >= p->len) return fail(p, "unexpected end");
  char c = p->s[p->pos];
  switch (c) {
  case '{': return parse_container(p, depth, TT_JSON_OBJECT, out);
  case '[': return parse_container(p, depth, TT_JSON_ARRAY, out);
  case '"': return parse_string(p, out);
  case 't': return parse_literal(p, "true", TT_JSON_TRUE, out);
  case 'f': return parse_literal(p, "false", TT_JSON_FALSE, out);
  case 'n': return parse_literal(p, "null", TT_JSON_NULL, out);
  default:
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
    return fail(p, "unexpected character");
  }
}

int tt_json_parse(tt_json *doc, const char *src, size_t len) {
  if (len > 0xFFFFFFF0u) return tt_set_error("JSON text too large (%zu bytes)", len);
  parser p = {doc, src, len, 0};
  doc->src = src;
  doc->n = 0;
  doc->err_pos = 0;
  int32_t root;
  TT_TRY(parse_value(&p, 0, &root));
  skip_ws(&p);
  if (p.pos != len) return fail(&p, "trailing characters");
  return 0;
}

void tt_json_free(tt_json *doc) {
  free(doc->nodes);
  doc->nodes = NULL;
  doc->n = doc->cap = 0;
}

int tt_json_string_eq(const tt_json *doc, int32_t idx, const char *s) {
  const tt_json_node *n = &doc->nodes[idx];
  size_t len = strlen(s);
  /* Keys in the files we read never use escapes; compare the raw span. */
  return n->type == TT_JSON_STRING && n->len == len && memcmp(doc->src + n->start, s, len) == 0;
}

int32_t tt_json_get(const tt_json *doc, int32_t obj, const char *key) {
  if (obj < 0 || doc->nodes[obj].type != TT_JSON_OBJECT) return -1;
  for (int32_t k = doc->nodes[obj].child; k >= 0; k = doc->nodes[doc->nodes[k].next].next) {
    if (tt_json_string_eq(doc, k, key)) return doc->nodes[k].next;
  }
  return -1;
}

static uint32_t hex4(const char *s) {
  return (uint32_t)(hexval(s[0]) << 12 | hexval(s[1]) << 8 | hexval(s[2]) << 4 | hexval(s[3]));
}

int tt_json_string(const tt_json *doc, int32_t idx, tt_buf *b) {
  const tt_json_node *n = &doc->nodes[idx];
  if (n->type != TT_JSON_STRING) return tt_set_error("JSON value is not a string");
  b->len = 0;
  TT_TRY(tt_buf_reserve(b, n->len));
  const char *s = doc->src + n->start;
  uint8_t *o = (uint8_t *)b->data;
  size_t i = 0;
  while (i < n->len) {
    const char *bs = memchr(s + i, '\\', n->len - i);
    size_t plain = bs ? (size_t)(bs - (s + i)) : n->len - i;
    memcpy(o, s + i, plain);
    o += plain;
    i += plain;
    if (i >= n->len) break;
    char e = s[i + 1];
    i += 2;
    switch (e) {
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      uint32_t cp = hex4(s + i);
      i += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 <= n->len && s[i] == '\\' && s[i + 1] == 'u') {
        uint32_t lo = hex4(s + i + 2);
        if (lo >= 0xDC00 && lo <= 0xDFFF) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          i += 6;
        }
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
      o += tt_utf8_put(cp, o);
      break;
    }
    default: *o++ = (uint8_t)e; break;
    }
  }
  b->len = (size_t)(o - (uint8_t *)b->data);
  b->data[b->len] = '\0';
  return 0;
}

int tt_json_number(const tt_json *doc, int32_t idx, double *out) {
  const tt_json_node *n = &doc->nodes[idx];
  if (n->type != TT_JSON_NUMBER) return tt_set_error("JSON value is not a number");
  char tmp[64];
  size_t len = n->len < sizeof tmp - 1 ? n->len : sizeof tmp - 1;
  memcpy(tmp, doc->src + n->start, len);
  tmp[len] = '\0';
  *out = strtod(tmp, NULL);
  return 0;
}
