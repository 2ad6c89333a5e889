/* libFuzzer target: arbitrary bytes through the pre-tokenizer and encoder of a fixed
** byte-level vocabulary (all 256 bytes plus merges of common pairs). Checks: pieces tile
** the repaired text, and decode(encode(x)) equals x with ill-formed UTF-8 repaired. */
#include "data/bpe_internal.h"

static tt_bpe *vocab(void) {
  static tt_bpe *bpe;
  if (bpe) return bpe;
  bpe = malloc(sizeof *bpe);
  if (!bpe || tt_bpe_init(bpe, 512) != 0) __builtin_trap();
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    tt_bpe_set_token(bpe, b, &c, 1);
  }
  static const char *pairs[] = {"th", "he", "in", "er", "an", " t", " a", "  ", "\xe6\x97", "00"};
  int32_t id = 256;
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++, id++) {
    tt_bpe_set_token(bpe, id, (const uint8_t *)pairs[i], 2);
    tt_bpe_add_pair(bpe, (uint8_t)pairs[i][0], (uint8_t)pairs[i][1], (uint32_t)i, id);
  }
  tt_bpe_finish(bpe);
  tt_bpe_add_special(bpe, "<|endoftext|>", id);
  return bpe;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tt_bpe *bpe = vocab();
  uint8_t *clean = malloc(size * 3 + 1);
  size_t n = tt_utf8_sanitize(data, size, clean);
  if (tt_utf8_valid_prefix(clean, n) != n) __builtin_trap();
  for (size_t pos = 0; pos < n;) {
    size_t end = tt_pretok_next(clean, n, pos);
    if (end <= pos || end > n) __builtin_trap();
    pos = end;
  }
  tt_ids ids = {0};
  if (tt_bpe_encode_append(bpe, bpe->cache, (const char *)data, size, 0, &ids) != 0) __builtin_trap();
  char *back = malloc(n + 1);
  size_t m;
  if (tt_bpe_decode(bpe, ids.data, ids.len, back, n, &m) != 0 || m != n || memcmp(back, clean, n) != 0)
    __builtin_trap();
  free(back);
  free(clean);
  tt_ids_free(&ids);
  return 0;
}
