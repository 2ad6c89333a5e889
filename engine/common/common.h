/*
** common.h — what every layer may use: the thread-local error message, dtype metadata,
** growable byte and id buffers, hashing, reading a whole file, and the one JSON reader (a
** read-only DOM over the source text). The lowest layer: it includes only the public
** header and kernels/kernel.h (whose tt_set_error and dtype names it defines).
*/
#ifndef TT_COMMON_H
#define TT_COMMON_H
#include "tetra.h"
#include "kernel.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Errors (error.c; tt_set_error, TT_CHECK and TT_TRY are in kernel.h) --------------- */

/* Prefixes the current message with "where: ". Returns -1. */
int tt_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checked allocation: `p = malloc(n)` or fail with file and line. */
#define TT_ALLOC(p, n) \
  do { (p) = malloc(n); \
       if (!(p) && (n) != 0) return tt_set_error("%s:%d: out of host memory (%zu bytes)", \
                                                  __FILE__, __LINE__, (size_t)(n)); } while (0)

/* -- Buffers and hashing ------------------------------------------------------------ */

typedef struct tt_buf {
  char *data;
  size_t len, cap;
} tt_buf;

int tt_buf_reserve(tt_buf *b, size_t extra);
int tt_buf_append(tt_buf *b, const void *p, size_t n);
int tt_buf_printf(tt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tt_buf_free(tt_buf *b);
/* Appends s as a JSON string literal (quotes and escapes). */
int tt_buf_json_string(tt_buf *b, const char *s, size_t n);

typedef struct tt_ids {
  int32_t *data;
  size_t len, cap;
} tt_ids;

int tt_ids_reserve(tt_ids *v, size_t extra);
void tt_ids_free(tt_ids *v);

static inline uint64_t tt_hash_bytes(const void *p, size_t n) {
  /* FNV-1a over 8-byte words, then a 64-bit finaliser: fast enough and well mixed. */
  const uint8_t *s = (const uint8_t *)p;
  uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9e3779b97f4a7c15ull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x100000001b3ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

static inline uint64_t tt_hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* Appends the UTF-8 encoding of cp (<= 0x10FFFF) to out; returns its length. */
int tt_utf8_put(uint32_t cp, uint8_t *out);

/* Reads a whole file into *out (NUL-terminated, *len excludes the NUL). */
int tt_read_file(const char *path, char **out, size_t *len);

/* -- JSON (read-only DOM over the source text) -------------------------------------- */

enum { TT_JSON_NULL, TT_JSON_FALSE, TT_JSON_TRUE, TT_JSON_NUMBER, TT_JSON_STRING,
       TT_JSON_ARRAY, TT_JSON_OBJECT };

typedef struct tt_json_node {
  uint8_t type;
  uint32_t start, len;   /* source span; strings: between the quotes */
  int32_t next;          /* next sibling, -1 at the end */
  int32_t child;         /* first child (objects: key, value, key, value ...), -1 if none */
  int32_t count;         /* children (objects: key/value pairs) */
} tt_json_node;

typedef struct tt_json {
  const char *src;
  tt_json_node *nodes;
  int32_t n, cap;
  size_t err_pos;        /* byte offset of a parse error */
} tt_json;

/* Parses one JSON value (surrounding whitespace allowed). On error sets a message with
** the byte offset and returns -1. Reusable: nodes are kept between calls. */
int tt_json_parse(tt_json *doc, const char *src, size_t len);
void tt_json_free(tt_json *doc);
/* Value node of `key` in object node `obj`, or -1. */
int32_t tt_json_get(const tt_json *doc, int32_t obj, const char *key);
/* Decodes string node idx (escapes, \u surrogate pairs; lone surrogates -> U+FFFD) into b
** (replacing its contents). */
int tt_json_string(const tt_json *doc, int32_t idx, tt_buf *b);
/* True when string node idx equals s. */
int tt_json_string_eq(const tt_json *doc, int32_t idx, const char *s);
int tt_json_number(const tt_json *doc, int32_t idx, double *out);

#endif
