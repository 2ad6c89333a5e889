/*
** buf.c — growable buffers and whole-file reading.
*/
#include "common/common.h"
#include <errno.h>

int tt_buf_reserve(tt_buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) return tt_set_error("out of host memory (%zu bytes)", cap);
  b->data = p;
  b->cap = cap;
  return 0;
}

int tt_buf_append(tt_buf *b, const void *p, size_t n) {
  TT_TRY(tt_buf_reserve(b, n));
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int tt_buf_printf(tt_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return tt_set_error("tt_buf_printf: bad format");
  TT_TRY(tt_buf_reserve(b, (size_t)n));
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

void tt_buf_free(tt_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

int tt_buf_json_string(tt_buf *b, const char *s, size_t n) {
  TT_TRY(tt_buf_reserve(b, n * 6 + 2));
  char *o = b->data + b->len;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
    else if (c == '\n') { *o++ = '\\'; *o++ = 'n'; }
    else if (c == '\t') { *o++ = '\\'; *o++ = 't'; }
    else if (c == '\r') { *o++ = '\\'; *o++ = 'r'; }
    else if (c < 0x20) o += sprintf(o, "\\u%04x", c);
    else *o++ = (char)c;
  }
  *o++ = '"';
  b->len = (size_t)(o - b->data);
  b->data[b->len] = '\0';
  return 0;
}

int tt_ids_reserve(tt_ids *v, size_t extra) {
  if (v->len + extra <= v->cap) return 0;
  size_t cap = v->cap ? v->cap : 256;
  while (cap < v->len + extra) cap *= 2;
  int32_t *p = realloc(v->data, cap * sizeof *p);
  if (!p) return tt_set_error("out of host memory (%zu ids)", cap);
  v->data = p;
  v->cap = cap;
  return 0;
}

void tt_ids_free(tt_ids *v) {
  free(v->data);
  v->data = NULL;
  v->len = v->cap = 0;
}

int tt_read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return tt_set_error("%s: cannot open: %s", path, strerror(errno));
  tt_buf b = {0};
  char chunk[1 << 16];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (tt_buf_append(&b, chunk, n) != 0) {
      fclose(f);
      tt_buf_free(&b);
      return tt_error_context("%s", path);
    }
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    tt_buf_free(&b);
    return tt_set_error("%s: read error", path);
  }
  if (tt_buf_append(&b, "", 0) != 0) return -1;
  *out = b.data;
  *len = b.len;
  return 0;
}

int tt_utf8_put(uint32_t cp, uint8_t *out) {
  if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
  if (cp < 0x800) {
    out[0] = (uint8_t)(0xC0 | (cp >> 6));
    out[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}
