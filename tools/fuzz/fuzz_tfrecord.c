/* libFuzzer target: a TFRecord file of any bytes through the document reader, read whole
** and from a cut point the input's first bytes choose (the alignment streams use). Any
** file must give its records or one error; a record's text never runs past the file. */
#include "data/bpe_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char path[4096];

/* The scratch file goes when libFuzzer exits (its time limit ends in exit()). */
static void remove_scratch(void) { unlink(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!path[0]) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/fuzz_tfrecord_%d.tfrecord", dir && dir[0] ? dir : "/tmp", (int)getpid());
    atexit(remove_scratch);
  }
  if (size < 2) return 0;
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data + 2, 1, size - 2, f);
  fclose(f);
  tt_doc_files fs;
  if (tt_doc_files_expand(path, TT_DATA_TFRECORD, &fs) != 0) return 0;
  int64_t cut = fs.total > 0 ? (int64_t)((data[0] << 8 | data[1]) % (uint64_t)fs.total) : 0;
  int64_t starts[2] = {0, cut};
  for (int k = 0; k < 2; k++) {
    tt_doc_reader r;
    tt_doc_reader_init(&r, &fs, data[0] & 1 ? "text" : "t", starts[k], fs.total, 0);
    const char *text;
    size_t len;
    int end_doc, got;
    while ((got = tt_doc_reader_next(&r, &text, &len, &end_doc)) == 1)
      if (len > (size_t)fs.total) __builtin_trap();
    tt_doc_reader_free(&r);
  }
  tt_doc_files_free(&fs);
  return 0;
}
