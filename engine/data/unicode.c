/*
** unicode.c — UTF-8 handling, Unicode classes and the GPT-2 pre-tokenizer.
**
** The pre-tokenizer is the regular expression
**   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
** written out by hand: at each position the first alternative that matches wins, and
** each run is greedy. The only backtracking is in \s+(?!\S): a whitespace run followed
** by a non-space gives its last character to the next token.
*/
#include "data/bpe_internal.h"
#include <pthread.h>

/* -- Character classes -------------------------------------------------------------- */

/* Class of every BMP code point, built once from the range tables; code points above
** the BMP use a binary search. */
static uint8_t bmp_class[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static int is_white_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid][0]) hi = mid;
    else if (cp > r[mid][1]) lo = mid + 1;
    else return 1;
  }
  return 0;
}

static int slow_class(uint32_t cp) {
  if (is_white_space(cp)) return TT_CC_SPACE;
  if (in_ranges(tt_unicode_letter_ranges, tt_unicode_letter_ranges_count, cp))
    return TT_CC_LETTER;
  if (in_ranges(tt_unicode_number_ranges, tt_unicode_number_ranges_count, cp))
    return TT_CC_NUMBER;
  return TT_CC_OTHER;
}

static void build_bmp_class(void) {
  for (uint32_t cp = 0; cp < 0x10000; cp++) bmp_class[cp] = (uint8_t)slow_class(cp);
}

int tt_char_class(uint32_t cp) {
  if (cp < 0x10000) {
    pthread_once(&bmp_once, build_bmp_class);
    return bmp_class[cp];
  }
  return slow_class(cp);
}

/* -- UTF-8 -------------------------------------------------------------------------- */

/* Length of the well-formed sequence at s[0..n), 0 when ill-formed. When ill-formed,
** *bad is the length of the maximal ill-formed subsequence (at least 1). */
static int utf8_seq(const uint8_t *s, size_t n, int *bad) {
  uint8_t c = s[0];
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) { need = 2; lo = 0xA0; }
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
  else if (c == 0xED) { need = 2; hi = 0x9F; }
  else if (c == 0xF0) { need = 3; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) { need = 3; hi = 0x8F; }
  else { *bad = 1; return 0; }
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n || s[i] < lo || s[i] > hi) { *bad = i; return 0; }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

size_t tt_utf8_valid_prefix(const uint8_t *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    if (s[i] < 0x80) { i++; continue; }
    int bad, k = utf8_seq(s + i, len - i, &bad);
    if (k == 0) return i;
    i += (size_t)k;
  }
  return len;
}

size_t tt_utf8_sanitize(const uint8_t *s, size_t len, uint8_t *dst) {
  size_t i = 0, o = 0;
  while (i < len) {
    if (s[i] < 0x80) { dst[o++] = s[i++]; continue; }
    int bad, k = utf8_seq(s + i, len - i, &bad);
    if (k > 0) {
      memcpy(dst + o, s + i, (size_t)k);
      o += (size_t)k;
      i += (size_t)k;
    } else {
      dst[o++] = 0xEF; dst[o++] = 0xBF; dst[o++] = 0xBD;
      i += (size_t)bad;
    }
  }
  return o;
}

/* Decodes the code point at s[i] of well-formed text; *n gets its byte length. */
static inline uint32_t utf8_get(const uint8_t *s, size_t i, int *n) {
  uint8_t c = s[i];
  if (c < 0x80) { *n = 1; return c; }
  if (c < 0xE0) { *n = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
  if (c < 0xF0) {
    *n = 3;
    return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  *n = 4;
  return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
         ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

/* -- Pre-tokenizer ------------------------------------------------------------------ */

/* ASCII classes, so that the common case needs no decoding. */
static const uint8_t ascii_class[128] = {
  0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 3, 0, 0,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0,
  0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
  0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
  1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
};

static inline int class_at(const uint8_t *s, size_t i, int *n) {
  if (s[i] < 0x80) { *n = 1; return ascii_class[s[i]]; }
  return tt_char_class(utf8_get(s, i, n));
}

/* End of the run of characters of class `cls` (or, for TT_CC_OTHER, of the characters
** that are not letters, numbers or spaces) starting at i. */
static inline size_t run_end(const uint8_t *s, size_t len, size_t i, int cls) {
  while (i < len) {
    int n, c = class_at(s, i, &n);
    if (c != cls) break;
    i += (size_t)n;
  }
  return i;
}

size_t tt_pretok_next(const uint8_t *s, size_t len, size_t pos) {
  size_t i = pos;
  int n;
  if (s[i] == '\'' && i + 1 < len) {
    uint8_t a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < len) {
      uint8_t b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 3;
    }
  }
  int c = class_at(s, i, &n);
  if (c == TT_CC_SPACE && s[i] == ' ' && i + 1 < len) {
    int n2, c2 = class_at(s, i + 1, &n2);
    if (c2 != TT_CC_SPACE) return run_end(s, len, i + 1 + (size_t)n2, c2);
  }
  if (c != TT_CC_SPACE) return run_end(s, len, i + (size_t)n, c);
  /* Whitespace run: \s+(?!\S) keeps all of it at the end of the text or leaves the last
  ** space to the next token; a single space before a non-space falls to \s+. */
  size_t last = i, j = i + (size_t)n;
  while (j < len) {
    int n2, c2 = class_at(s, j, &n2);
    if (c2 != TT_CC_SPACE) break;
    last = j;
    j += (size_t)n2;
  }
  if (j == len || last == i) return j;
  return last;
}

/* -- Byte-level strings ------------------------------------------------------------- */

int64_t tt_bytelevel_decode(const char *str, size_t len, uint8_t *dst) {
  const uint8_t *s = (const uint8_t *)str;
  size_t i = 0;
  int64_t o = 0;
  if (tt_utf8_valid_prefix(s, len) != len) return -1;
  while (i < len) {
    int n;
    uint32_t cp = utf8_get(s, i, &n);
    int b = tt_cp_to_byte(cp);
    if (b < 0) return -1;
    dst[o++] = (uint8_t)b;
    i += (size_t)n;
  }
  return o;
}

size_t tt_bytelevel_encode(const uint8_t *s, size_t len, char *dst) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) o += (size_t)tt_utf8_put(tt_byte_to_cp(s[i]), (uint8_t *)dst + o);
  return o;
}
