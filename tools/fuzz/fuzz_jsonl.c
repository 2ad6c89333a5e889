/* libFuzzer target: one JSONL line through the reader's JSON parser and string decoder.
** Any input must parse or fail cleanly; decoded strings never exceed their source. */
#include "data/bpe_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static tt_json doc;
  static tt_buf str;
  if (tt_json_parse(&doc, (const char *)data, size) != 0) return 0;
  for (int32_t i = 0; i < doc.n; i++) {
    if (doc.nodes[i].type != TT_JSON_STRING) continue;
    if (tt_json_string(&doc, i, &str) != 0) __builtin_trap();
    if (str.len > doc.nodes[i].len) __builtin_trap();
  }
  int32_t v = tt_json_get(&doc, 0, "text");
  if (v >= 0 && doc.nodes[v].type == TT_JSON_STRING) tt_json_string(&doc, v, &str);
  return 0;
}
