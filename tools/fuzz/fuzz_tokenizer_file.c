/* libFuzzer target: tokenizer files (tokenizer.json and tiktoken rank text) from arbitrary
** bytes. Loading fails cleanly or gives a tokenizer that encodes and decodes the input
** itself without faults; when every byte has an id, decode(encode(x)) is x repaired. */
#include "data/bpe_internal.h"

static void exercise(tt_bpe *bpe, const uint8_t *data, size_t size) {
  tt_ids ids = {0};
  if (tt_bpe_encode_append(bpe, bpe->cache, (const char *)data, size, 1, &ids) == 0) {
    size_t need;
    if (tt_bpe_decode(bpe, ids.data, ids.len, NULL, 0, &need) == 0) {
      char *buf = malloc(need + 1);
      if (buf && tt_bpe_decode(bpe, ids.data, ids.len, buf, need, &need) != 0) __builtin_trap();
      free(buf);
    }
  }
  tt_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tt_bpe *bpe = NULL;
  if (tt_bpe_load_hf_json("fuzz.json", (const char *)data, size, &bpe) == 0) {
    exercise(bpe, data, size);
    tt_bpe_free(bpe);
  }
  bpe = NULL;
  if (tt_bpe_load_tiktoken_text("fuzz.tiktoken", (const char *)data, size, &bpe) == 0) {
    exercise(bpe, data, size);
    tt_bpe_free(bpe);
  }
  return 0;
}
